"""NeMo's manifests (``--from nemo``) and tarred audio datasets (``--from nemo-tarred``), read as NeMo reads them.

A manifest is JSON lines: ``audio_filepath`` (or ``audio_filename``), ``duration``, ``text`` (else
``normalized_text``, else the file ``text_filepath`` names), and optionally ``offset``, ``lang`` and
``speaker``.  A relative audio path is the file beside the manifest when there is one (NeMo's
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

import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

from wdsprep.errors import DataError
from wdsprep.pack.sources.items import Blob, Imported, Item, TarMember, seconds, tar_members
from wdsprep.report import Report

TARRED_MANIFEST = "tarred_audio_manifest.json"
_SUB = re.compile(r"-sub\d+(?=\.[^./]+$|$)")  # a repeated file's entry: NeMo's "-subN" before the extension


def read_manifest(path: str) -> Imported:
    """The utterances of a NeMo manifest (see the module's doc)."""
    report = Report()
    items, audio = [], []
    here = os.path.dirname(path)
    for line, entry in _entries(path):
        name = _audio_name(entry, path, line)
        full = _full_path(os.path.expanduser(name), here)
        items.append(_item(entry, path, line, full, name))
        audio.append(full)
    return Imported("nemo", items, report, files={"manifest": [path]}, data=audio)


def read_tarred(path: str) -> Imported:
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
    for line, entry in _entries(manifest):
        name = _audio_name(entry, manifest, line)
        member = _SUB.sub("", name)
        shard = entry.get("shard_id")
        candidates = [os.path.join(folder, f"audio_{shard}.tar")] if shard is not None else everywhere
        found: Blob | None = next((members(t)[member] for t in candidates if member in members(t)), None)
        if found is None:
            where = candidates[0] if len(candidates) == 1 else f"any audio_*.tar in {folder}"
            report.drop("missing_file", _uttid(entry, name, manifest, line),
                        f"{manifest}:{line}: no member {member!r} in {where}")
        else:
            items.append(_item(entry, manifest, line, found, name))
    return Imported("nemo-tarred", items, report, files={"manifest": [manifest]}, data=sorted(tars))


def _entries(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, entry) of each non-blank line; a line that is not a JSON object fails naming it."""
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
            except ValueError as e:
                raise DataError(f"{path}:{line}: not JSON ({e}); a NeMo manifest has one JSON object per "
                                f"line") from None
            if not isinstance(entry, dict):
                raise DataError(f"{path}:{line}: a JSON {type(entry).__name__}, not an object")
            yield line, entry


def _audio_name(entry: dict[str, Any], path: str, line: int) -> str:
    name = entry.get("audio_filepath", entry.get("audio_filename"))
    if not isinstance(name, str) or not name:
        raise DataError(f"{path}:{line}: no audio_filepath; each entry of a NeMo manifest names its audio file")
    return name


def _full_path(name: str, here: str) -> str:
    """NeMo's resolution: a relative path is the file beside the manifest when that exists."""
    if os.path.isabs(name):
        return name
    beside = os.path.join(here, name)
    return os.path.abspath(beside) if os.path.isfile(beside) else name


def _text(entry: dict[str, Any], here: str) -> str:
    text = entry.get("text", entry.get("normalized_text"))
    if text is None and isinstance(entry.get("text_filepath"), str):
        with open(_full_path(entry["text_filepath"], here), encoding="utf-8") as f:
            text = f.read().replace("\n", "")
    return "" if text is None else str(text)


def _uttid(entry: dict[str, Any], name: str, path: str, line: int) -> str:
    """The entry's id, else its audio file's name (and segment times)."""
    if "id" in entry or "utt_id" in entry:
        return str(entry.get("id", entry.get("utt_id")))
    stem = os.path.splitext(os.path.basename(name))[0]
    offset = seconds(entry, "offset", path, line)
    if offset is None:
        return stem
    duration = seconds(entry, "duration", path, line)
    end = "" if duration is None else f"-{round((offset + duration) * 100):07d}"
    return f"{stem}-{round(offset * 100):07d}{end}"


def _item(entry: dict[str, Any], path: str, line: int, audio: str | Blob, name: str) -> Item:
    duration = seconds(entry, "duration", path, line)
    offset = seconds(entry, "offset", path, line)
    lang, speaker = entry.get("lang"), entry.get("speaker")
    return Item(_uttid(entry, name, path, line), path, line, audio, _text(entry, os.path.dirname(path)),
                speaker=None if speaker is None else str(speaker), language=None if lang is None else str(lang),
                start=offset or 0.0, end=-1.0 if offset is None or duration is None else offset + duration,
                duration=duration if offset is None else None)
