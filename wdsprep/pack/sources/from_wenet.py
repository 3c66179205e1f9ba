"""WeNet's inputs (``--from wenet``): a ``data.list`` or a shard list, read as WeNet's dataset reads them.

- ``data.list`` (WeNet's ``raw`` data type): JSON lines ``{"key": ..., "wav": PATH, "txt": ...}``,
  optionally with ``start`` and ``end`` in seconds (a segment of the file, cut as WeNet and Kaldi
  cut one: the seconds times the rate, truncated) and ``lang`` / ``spk``.
- a shard list (``shard``, what ``tools/make_shard_list.py`` writes): one tar per line, each holding
  ``KEY.txt`` and ``KEY.wav`` (or ``.flac``, ``.mp3``, ``.m4a``, ``.ogg``, ``.opus``, ``.wma``) per
  utterance; a member's key is its name up to the last dot, as WeNet groups them.

Which one a file is, its first line says (a JSON object: a ``data.list``).  Paths are WeNet's: as
written, from where the pack runs.  Read without WeNet: plain JSON and tar.
"""

from __future__ import annotations

import json
import os
from typing import Any

from wdsprep.errors import DataError
from wdsprep.pack.sources.items import Imported, Item, TarMember, seconds, tar_members
from wdsprep.report import Report

AUDIO_EXTS = frozenset({"flac", "mp3", "m4a", "ogg", "opus", "wav", "wma"})  # WeNet's AUDIO_FORMAT_SETS


def read_list(path: str) -> Imported:
    """A ``data.list`` or a shard list (see the module's doc)."""
    with open(path, encoding="utf-8") as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1) if line.strip()]
    if lines and lines[0][1].startswith("{"):
        return _data_list(path, lines)
    return _shard_list(path, lines)


def _data_list(path: str, lines: list[tuple[int, str]]) -> Imported:
    items = []
    for n, text in lines:
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise DataError(f"{path}:{n}: not JSON ({e}); a WeNet data.list has one JSON object per line") from None
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("key", "wav")):
            raise DataError(f"{path}:{n}: expected {{\"key\": ..., \"wav\": ..., \"txt\": ...}}, got {text[:200]}")
        start, end = seconds(obj, "start", path, n), seconds(obj, "end", path, n)
        if (start is None) != (end is None):
            raise DataError(f"{path}:{n}: give both start and end (a segment), or neither (the whole file)")
        items.append(Item(obj["key"], path, n, obj["wav"], str(obj.get("txt", "")), speaker=_opt(obj, "spk"),
                          language=_opt(obj, "lang"), start=start or 0.0, end=-1.0 if end is None else end))
    return Imported("wenet", items, files={"data.list": [path]}, data=[it.audio for it in items
                                                                       if isinstance(it.audio, str)])


def _shard_list(path: str, lines: list[tuple[int, str]]) -> Imported:
    report = Report()
    items = []
    tars = []
    for n, tar in lines:
        if not os.path.isfile(tar):
            raise FileNotFoundError(f"{path}:{n}: {tar!r}: no such file (paths in a shard list are relative to where "
                                    f"you run)")
        tars.append(tar)
        texts: dict[str, TarMember] = {}
        audio: dict[str, TarMember] = {}
        for name, member in tar_members(tar).items():
            key, _, ext = name.rpartition(".")
            if ext == "txt":
                texts[key] = member
            elif ext in AUDIO_EXTS:
                audio[key] = member
        for k, key in enumerate(dict.fromkeys([*audio, *texts]), 1):
            if key not in audio:
                report.drop("missing_file", key, f"{tar}: {key}.txt has no audio member beside it")
                continue
            try:
                text = texts[key].read().decode("utf-8").strip() if key in texts else ""
            except UnicodeDecodeError as e:
                raise DataError(f"{texts[key].key}: not UTF-8 ({e.reason} at byte {e.start}); WeNet's transcripts "
                                f"are UTF-8: convert them and make the shards again") from None
            items.append(Item(key, tar, k, audio[key], text))
    return Imported("wenet", items, report, files={"shard list": [path]}, data=tars)


def _opt(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return None if value is None else str(value)
