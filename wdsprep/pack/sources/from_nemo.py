"""NeMo's manifests (``--from nemo``) and tarred audio datasets (``--from nemo-tarred``), read as NeMo reads them.

A manifest is JSON lines: ``audio_filepath`` (or ``audio_filename``), ``duration``, ``text`` (else
``normalized_text``, else Canary's ``answer``, else the file ``text_filepath`` names: read only
under the manifest's folder or ``text_root``, see ``untrusted.py``), and optionally ``offset``,
``lang`` (else Canary's ``target_lang``) and ``speaker``; which key holds what may be named
(``keys.py``), and Canary's ``source_lang``, ``target_lang``, ``pnc`` and ``taskname`` are carried
as fields.  Every key but the audio's is optional per line, as NeMo's ``dict.get`` reads them.  A
relative audio path is the file beside the manifest when there is one (NeMo's
``manifest.get_full_path``), else the path as given, from where the pack runs.  An entry with an
``offset`` is the segment ``[offset, offset + duration)``; one without is the whole file (its
``duration`` is checked against the file).  The utterance's id is the entry's ``id`` (or
``utt_id``) when it has one, else the audio file's name without its extension, with the segment's
times (``-START-END`` in centiseconds, as Kaldi names segments) when it has an offset.

A tarred dataset (``convert_to_tarred_audio_dataset.py``) is ``tarred_audio_manifest.json`` beside
``audio_0.tar`` .. ``audio_N.tar``: each entry's ``audio_filepath`` names a member of the tar its
``shard_id`` numbers; a ``-subN`` entry (an audio file listed again) is the member without it, at
the entry's offset.  A folder without that manifest is read from its ``sharded_manifests/
manifest_N.json`` (each the entries of ``audio_N.tar``), and one the converter wrote with
``--buckets_num`` from each of its ``bucketN`` folders in turn: one command packs them all.  Read
without NeMo: plain JSON and tar.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

from wdsprep.pack.sources.items import Blob, Imported, Item, TarMember, tar_members
from wdsprep.pack.sources.keys import Keys
from wdsprep.pack.sources.untrusted import Bad, item, json_lines, read_text_file, seconds
from wdsprep.report import Report

TARRED_MANIFEST = "tarred_audio_manifest.json"
SHARDED = "sharded_manifests"
_SUB = re.compile(r"-sub\d+(?=\.[^./]+$|$)")  # a repeated file's entry: NeMo's "-subN" before the extension
_SHARD = re.compile(r"manifest_(\d+)\.json$")
_BUCKET = re.compile(r"bucket(\d+)$")


def read_manifest(path: str, *, keys: Keys | None = None, text_root: str | None = None) -> Imported:
    """The utterances of a NeMo manifest (see the module's doc); ``keys``: which key holds what
    (NeMo's own by default); ``text_root``: a folder besides the manifest's whose files
    ``text_filepath`` may name."""
    keys = keys or Keys("nemo")
    report = Report()
    items, audio = [], []
    here = os.path.dirname(path)

    def found(name: str) -> str:
        full = _full_path(os.path.expanduser(name), here)
        audio.append(full)
        return full

    for line, entry in json_lines(path, report, "NeMo"):
        try:
            items.append(_item(keys.line(entry), path, line, keys, found, text_root))
        except Bad as e:
            e.count(report, f"{path}:{line}")
    keys.check_named(path)
    return Imported("nemo", items, report, files={"manifest": [path]}, data=audio, given=_given(keys, text_root))


def read_tarred(path: str, *, keys: Keys | None = None, text_root: str | None = None) -> Imported:
    """The utterances of a NeMo tarred audio dataset: its folder (or its buckets' folder, or its
    ``sharded_manifests``), or its manifest with the tars beside it."""
    keys = keys or Keys("nemo-tarred")
    report = Report()
    items: list[Item] = []
    manifests, tars = [], []
    for manifest, folder, shard in _tarred_manifests(path):
        got, used = _read_tarred_manifest(manifest, folder, shard, keys, text_root, report)
        items += got
        manifests.append(manifest)
        tars += used
    keys.check_named(path)
    return Imported("nemo-tarred", items, report, files={"manifest": manifests}, data=sorted(set(tars)),
                    given=_given(keys, text_root))


def _tarred_manifests(path: str) -> list[tuple[str, str, int | None]]:
    """(manifest, its tars' folder, the shard its entries are in when the manifest is one shard's)
    of a tarred dataset: its manifest, else its sharded manifests, else each bucket's, in order."""
    p = Path(path)
    if not p.is_dir():
        m = _SHARD.search(p.name)
        if m and p.parent.name == SHARDED:  # one shard's manifest: its tars are beside sharded_manifests/
            return [(path, str(p.parent.parent), int(m.group(1)))]
        return [(path, str(p.parent), None)]
    if (p / TARRED_MANIFEST).is_file():
        return [(str(p / TARRED_MANIFEST), path, None)]
    shards = sorted((int(m.group(1)), str(f)) for f in (p / SHARDED).glob("manifest_*.json")
                    if (m := _SHARD.search(f.name)))
    if shards:
        return [(f, path, n) for n, f in shards]
    buckets = sorted((int(m.group(1)), b) for b in p.iterdir() if b.is_dir() and (m := _BUCKET.fullmatch(b.name)))
    if buckets:
        return [got for _, b in buckets for got in _tarred_manifests(str(b))]
    raise FileNotFoundError(f"{path}: no {TARRED_MANIFEST}, {SHARDED}/manifest_N.json or bucketN folders there; give "
                            f"the tarred dataset's folder (what convert_to_tarred_audio_dataset.py wrote) or its "
                            f"manifest")


def _read_tarred_manifest(manifest: str, folder: str, sharded: int | None, keys: Keys, text_root: str | None,
                          report: Report) -> tuple[list[Item], list[str]]:
    """The items of one tarred manifest whose tars are in ``folder`` (``sharded``: the one shard a
    sharded manifest's entries are in, when they do not say), and the tars read."""
    tars: dict[str, dict[str, TarMember]] = {}

    def members(tar: str) -> dict[str, TarMember]:
        if tar not in tars:
            tars[tar] = tar_members(tar) if os.path.isfile(tar) else {}
        return tars[tar]

    everywhere = sorted(str(p) for p in Path(folder).glob("audio_*.tar"))
    items = []
    for line, entry in json_lines(manifest, report, "NeMo"):
        shard = entry.get("shard_id", sharded)

        def found(name: str, shard: Any = shard, line: int = line) -> Blob:
            member = _SUB.sub("", name)
            if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or shard < 0):
                raise Bad("bad_line", f"{manifest}:{line}: shard_id must be a whole number, got {shard!r}")
            candidates = [os.path.join(folder, f"audio_{shard}.tar")] if shard is not None else everywhere
            blob = next((members(t)[member] for t in candidates if member in members(t)), None)
            if blob is None:
                where = candidates[0] if len(candidates) == 1 else f"any audio_*.tar in {folder}"
                raise Bad("missing_file", f"{manifest}:{line}: no member {member!r} in {where}")
            return blob

        try:
            items.append(_item(keys.line(entry), manifest, line, keys, found, text_root))
        except Bad as e:
            e.count(report, f"{manifest}:{line}")
    return items, [t for t, m in tars.items() if m]


def _given(keys: Keys, text_root: str | None) -> dict[str, Any]:
    """How the manifest was read, for a resume to hold: the keys named and the text root, when given."""
    return {**keys.given(), **({} if text_root is None else {"text_root": os.path.abspath(text_root)})}


def _full_path(name: str, here: str) -> str:
    """NeMo's resolution: a relative path is the file beside the manifest when that exists."""
    if os.path.isabs(name):
        return name
    beside = os.path.join(here, name)
    return os.path.abspath(beside) if os.path.isfile(beside) else name


def _text(entry: dict[str, Any], keys: Keys, where: str, manifest: str, uttid: Any, text_root: str | None) -> Any:
    """The entry's transcript: the text key's value, else the file ``text_filepath`` names (read only
    as :func:`~wdsprep.pack.sources.untrusted.read_text_file` reads one)."""
    text = keys.value("text", entry)
    named = entry.get("text_filepath")
    if text is None and named is not None:
        if not isinstance(named, str) or not named or "\0" in named:
            raise Bad("bad_text", f"{where}: text_filepath must be a path, got {named!r}", uttid)
        text = read_text_file(named, manifest, [text_root] if text_root else [], where, uttid)
    return text


def _uttid(entry: dict[str, Any], keys: Keys, name: str, offset: float | None, duration: float | None) -> Any:
    """The entry's id, else its audio file's name (and segment times)."""
    key = keys.key("id", entry)
    if key is not None and key in entry:
        return entry[key]
    stem = os.path.splitext(os.path.basename(name))[0]
    if offset is None:
        return stem
    end = "" if duration is None else f"-{round((offset + duration) * 100):07d}"
    return f"{stem}-{round(offset * 100):07d}{end}"


def _item(entry: dict[str, Any], path: str, line: int, keys: Keys, found: Callable[[str], str | Blob],
          text_root: str | None) -> Item:
    """One entry's item (``found``: its audio from the name the entry gives); :class:`Bad` naming
    every problem of the entry."""
    where = f"{path}:{line}"
    problems: list[Bad] = []

    def check(make: Callable[[], Any]) -> Any:
        try:
            return make()
        except Bad as e:
            problems.append(e)
            return None

    name = keys.value("audio", entry)
    audio: str | Blob = ""
    if not isinstance(name, str) or not name or "\0" in name:
        key = keys.key("audio", entry) or "audio_filepath"
        problems.append(Bad("bad_line", f"{where}: no {key} (a path); each entry of a NeMo manifest names its audio "
                                        f"file"))
        name = ""
    else:
        audio = check(lambda: found(name)) or ""
    duration = check(lambda: seconds(keys.value("duration", entry), "duration", where))
    offset = check(lambda: seconds(keys.value("offset", entry), "offset", where))
    uttid = _uttid(entry, keys, name or where, offset, duration)
    text = check(lambda: _text(entry, keys, where, path, uttid if isinstance(uttid, str) else where, text_root))
    return item(path, line, uttid=uttid, audio=audio, text_value=text, speaker=keys.value("speaker", entry),
                language=keys.value("lang", entry), start=offset, end=None if offset is None or duration is None
                else offset + duration, duration=duration if offset is None else None, fields=keys.raw_fields(entry),
                problems=problems)
