"""WeNet's inputs (``--from wenet``): a ``data.list`` or a shard list, read as WeNet's dataset reads them.

- ``data.list`` (WeNet's ``raw`` data type): JSON lines ``{"key": ..., "wav": PATH, "txt": ...}``,
  optionally with ``start`` and ``end`` in seconds (a segment of the file, cut as WeNet and Kaldi
  cut one: the seconds times the rate, truncated) and ``lang`` / ``spk``; which key holds what
  may be named, and other keys carried as fields (``keys.py``).
- a shard list (``shard``, what ``tools/make_shard_list.py`` writes): one tar per line, each holding
  ``KEY.txt`` and ``KEY.wav`` (or ``.flac``, ``.mp3``, ``.m4a``, ``.ogg``, ``.opus``, ``.wma``) per
  utterance; a member's key is its name up to the last dot, as WeNet groups them.

Which one a file is, its first line says (a JSON object: a ``data.list``).  Paths are WeNet's: as
written, from where the pack runs.  Read without WeNet: plain JSON and tar.
"""

from __future__ import annotations

import os

from wdsprep.files import bounded_lines
from wdsprep.pack.sources.items import Imported, TarMember, tar_members
from wdsprep.pack.sources.keys import Keys
from wdsprep.pack.sources.untrusted import MAX_TEXT_FILE_BYTES, Bad, item, json_lines, open_input, seconds
from wdsprep.report import Report

MAX_PATH_LINE = 1 << 16  # a line of a shard list: a path
AUDIO_EXTS = frozenset({"flac", "mp3", "m4a", "ogg", "opus", "wav", "wma"})  # WeNet's AUDIO_FORMAT_SETS


def read_list(path: str, *, keys: Keys | None = None) -> Imported:
    """A ``data.list`` or a shard list (see the module's doc); ``keys``: which key of a ``data.list``
    line holds what (WeNet's own by default)."""
    keys = keys or Keys("wenet")
    report = Report()
    with open_input(path) as f:
        first = next((raw for _, raw in bounded_lines(f) if raw is None or raw.strip()), b"")
    if first is None or first.lstrip().startswith(b"{"):  # one too long to be a path: JSON lines say so
        return _data_list(path, keys, report)
    if keys.named or keys.fields:
        raise ValueError(f"{path}: a WeNet shard list (a tar per line) has no keys to name; --*-column and --field "
                         f"NAME=KEY are for a data.list")
    return _shard_list(path, report)


def _data_list(path: str, keys: Keys, report: Report) -> Imported:
    items = []
    for n, obj in json_lines(path, report, "WeNet data.list"):
        where = f"{path}:{n}"
        keys.line(obj)
        problems = []
        wav = keys.value("audio", obj)
        if not isinstance(wav, str) or not wav or "\0" in wav:
            problems.append(Bad("bad_line", f"{where}: expected {{\"key\": ..., \"wav\": PATH, \"txt\": ...}}, got "
                                            f"{keys.key('audio', obj) or 'wav'}={wav!r}"))
            wav = ""
        start = end = None
        try:
            start, end = seconds(obj.get("start"), "start", where), seconds(obj.get("end"), "end", where)
            if (start is None) != (end is None):
                raise Bad("bad_segment", f"{where}: give both start and end (a segment), or neither (the whole file)")
        except Bad as e:
            problems.append(e)
            start = end = None
        try:
            items.append(item(path, n, uttid=keys.value("id", obj), audio=wav, text_value=keys.value("text", obj),
                              speaker=keys.value("speaker", obj), language=keys.value("lang", obj), start=start,
                              end=end, fields=keys.raw_fields(obj), problems=problems))
        except Bad as e:
            e.count(report, where)
    keys.check_named(path)
    return Imported("wenet", items, report, files={"data.list": [path]},
                    data=[it.audio for it in items if isinstance(it.audio, str)], given=keys.given())


def _shard_list(path: str, report: Report) -> Imported:
    items = []
    tars = []
    with open_input(path) as f:
        lines = [(n, raw) for n, raw in bounded_lines(f, MAX_PATH_LINE) if raw is None or raw.strip()]
    for n, raw in lines:
        try:
            tar = parse_path(raw, f"{path}:{n}")
        except Bad as e:
            e.count(report, f"{path}:{n}")
            continue
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
            try:
                if key not in audio:
                    raise Bad("missing_file", f"{tar}: {key}.txt has no audio member beside it", key)
                text = _member_text(texts[key], key) if key in texts else ""
                items.append(item(tar, k, uttid=key, audio=audio[key], text_value=text))
            except Bad as e:
                e.count(report, f"{tar}:{k}")
    return Imported("wenet", items, report, files={"shard list": [path]}, data=tars)


def parse_path(raw: bytes | None, where: str) -> str:
    """A line of a list of paths; :class:`Bad` (``bad_line``) when it is none."""
    if raw is None:
        raise Bad("bad_line", f"{where}: a line longer than any path ({MAX_PATH_LINE:,} bytes); the list is not read "
                              f"on")
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise Bad("bad_line", f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
    if "\0" in line:
        raise Bad("bad_line", f"{where}: a NUL in a path")
    return line


def _member_text(member: TarMember, key: str) -> str:
    """A shard's ``KEY.txt``: UTF-8 of at most a transcript file's size; :class:`Bad` (``bad_text``)."""
    if member.size > MAX_TEXT_FILE_BYTES:
        raise Bad("bad_text", f"{member.key}: {member.size:,} bytes, more than a transcript ({MAX_TEXT_FILE_BYTES:,})",
                  key)
    try:
        return member.read().decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise Bad("bad_text", f"{member.key}: not UTF-8 ({e.reason} at byte {e.start}); WeNet's transcripts are "
                              f"UTF-8: convert them and make the shards again", key) from None
