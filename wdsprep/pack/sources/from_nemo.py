"""NeMo's manifests (``--from nemo``) and tarred audio datasets (``--from nemo-tarred``), read as NeMo reads them.

A manifest is JSON lines: ``audio_filepath`` (or ``audio_filename``), ``duration``, ``text`` (else
``normalized_text``, else the file ``text_filepath`` names: read only under the manifest's folder
or ``text_root``, see ``untrusted.py``), and optionally ``offset``, ``lang`` and ``speaker``.  A
relative audio path is the file beside the manifest when there is one (NeMo's
``manifest.get_full_path``), else the path as given, from where the pack runs.  An entry with an
``offset`` is the segment ``[offset, offset + duration)``; one without is the whole file (its
``duration`` is checked against the file).  The utterance's id is the entry's ``id`` (or
``utt_id``) when it has one, else the audio file's name without its extension, with the segment's
times (``-START-END`` in centiseconds, as Kaldi names segments) when it has an offset.

A tarred dataset (``convert_to_tarred_audio_dataset.py``) is ``tarred_audio_manifest.json`` beside
``audio_0.tar`` .. ``audio_N.tar``: each entry's ``audio_filepath`` names a member of the tar its
``shard_id`` numbers; a ``-subN`` entry (an audio file listed again) is the member without it, at
the entry's offset.  Read without NeMo: plain JSON and tar.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from wdsprep.pack.sources.items import Blob, Imported, Item, TarMember, tar_members
from wdsprep.pack.sources.untrusted import Bad, item, json_lines, read_text_file, seconds
from wdsprep.report import Report

TARRED_MANIFEST = "tarred_audio_manifest.json"
_SUB = re.compile(r"-sub\d+(?=\.[^./]+$|$)")  # a repeated file's entry: NeMo's "-subN" before the extension


def read_manifest(path: str, *, text_root: str | None = None) -> Imported:
    """The utterances of a NeMo manifest (see the module's doc); ``text_root``: a folder besides the
    manifest's whose files ``text_filepath`` may name."""
    report = Report()
    items, audio = [], []
    here = os.path.dirname(path)
    for line, entry in json_lines(path, report, "NeMo"):
        try:
            name = _audio_name(entry, path, line)
            full = _full_path(os.path.expanduser(name), here)
            items.append(_item(entry, path, line, full, name, text_root))
        except Bad as e:
            e.count(report, f"{path}:{line}")
            continue
        audio.append(full)
    return Imported("nemo", items, report, files={"manifest": [path]}, data=audio, given=_given(text_root))


def read_tarred(path: str, *, text_root: str | None = None) -> Imported:
    """The utterances of a NeMo tarred audio dataset: its folder, or its manifest with the tars beside it."""
    manifest = os.path.join(path, TARRED_MANIFEST) if os.path.isdir(path) else path
    if not os.path.isfile(manifest):
        raise FileNotFoundError(f"{path}: no {TARRED_MANIFEST} there; give the tarred dataset's folder or its "
                                f"manifest")
    folder = os.path.dirname(manifest)
    tars: dict[str, dict[str, TarMember]] = {}

    def members(tar: str) -> dict[str, TarMember]:
        if tar not in tars:
            tars[tar] = tar_members(tar) if os.path.isfile(tar) else {}
        return tars[tar]

    everywhere = sorted(str(p) for p in Path(folder).glob("audio_*.tar"))
    report = Report()
    items = []
    for line, entry in json_lines(manifest, report, "NeMo"):
        try:
            name = _audio_name(entry, manifest, line)
            member = _SUB.sub("", name)
            shard = entry.get("shard_id")
            if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or shard < 0):
                raise Bad("bad_line", f"{manifest}:{line}: shard_id must be a whole number, got {shard!r}")
            candidates = [os.path.join(folder, f"audio_{shard}.tar")] if shard is not None else everywhere
            found: Blob | None = next((members(t)[member] for t in candidates if member in members(t)), None)
            if found is None:
                where = candidates[0] if len(candidates) == 1 else f"any audio_*.tar in {folder}"
                raise Bad("missing_file", f"{manifest}:{line}: no member {member!r} in {where}",
                          _uttid(entry, name, manifest, line))
            items.append(_item(entry, manifest, line, found, name, text_root))
        except Bad as e:
            e.count(report, f"{manifest}:{line}")
    return Imported("nemo-tarred", items, report, files={"manifest": [manifest]}, data=sorted(tars),
                    given=_given(text_root))


def _given(text_root: str | None) -> dict[str, Any]:
    """How the manifest was read, for a resume to hold: the text root, when one was given."""
    return {} if text_root is None else {"text_root": os.path.abspath(text_root)}


def _audio_name(entry: dict[str, Any], path: str, line: int) -> str:
    name = entry.get("audio_filepath", entry.get("audio_filename"))
    if not isinstance(name, str) or not name or "\0" in name:
        raise Bad("bad_line", f"{path}:{line}: no audio_filepath (a path); each entry of a NeMo manifest names its "
                              f"audio file")
    return name


def _full_path(name: str, here: str) -> str:
    """NeMo's resolution: a relative path is the file beside the manifest when that exists."""
    if os.path.isabs(name):
        return name
    beside = os.path.join(here, name)
    return os.path.abspath(beside) if os.path.isfile(beside) else name


def _text(entry: dict[str, Any], path: str, line: int, uttid: str, text_root: str | None) -> Any:
    """The entry's transcript: ``text``, else ``normalized_text``, else the file ``text_filepath``
    names (read only as :func:`~wdsprep.pack.sources.untrusted.read_text_file` reads one)."""
    text = entry.get("text", entry.get("normalized_text"))
    named = entry.get("text_filepath")
    if text is None and named is not None:
        if not isinstance(named, str) or not named or "\0" in named:
            raise Bad("bad_text", f"{path}:{line}: text_filepath must be a path, got {named!r}", uttid)
        text = read_text_file(named, path, [text_root] if text_root else [], f"{path}:{line}", uttid)
    return text


def _uttid(entry: dict[str, Any], name: str, path: str, line: int) -> Any:
    """The entry's id, else its audio file's name (and segment times)."""
    if "id" in entry or "utt_id" in entry:
        return entry.get("id", entry.get("utt_id"))
    stem = os.path.splitext(os.path.basename(name))[0]
    where = f"{path}:{line}"
    offset = seconds(entry.get("offset"), "offset", where)
    if offset is None:
        return stem
    duration = seconds(entry.get("duration"), "duration", where)
    end = "" if duration is None else f"-{round((offset + duration) * 100):07d}"
    return f"{stem}-{round(offset * 100):07d}{end}"


def _item(entry: dict[str, Any], path: str, line: int, audio: str | Blob, name: str, text_root: str | None) -> Item:
    where = f"{path}:{line}"
    uttid = _uttid(entry, name, path, line)
    try:
        duration = seconds(entry.get("duration"), "duration", where)
        offset = seconds(entry.get("offset"), "offset", where)
    except Bad as e:
        e.uttid = uttid if isinstance(uttid, str) else None
        raise
    text = _text(entry, path, line, uttid if isinstance(uttid, str) else where, text_root)
    return item(path, line, uttid=uttid, audio=audio, text_value=text, speaker=entry.get("speaker"),
                language=entry.get("lang"), start=offset, end=None if offset is None or duration is None
                else offset + duration, duration=duration if offset is None else None)
