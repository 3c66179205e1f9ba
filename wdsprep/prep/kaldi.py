"""Reading Kaldi data-dir tables (``text``, ``feats.scp``, ``wav.scp``, ``segments``, ...).

Every error names the file and the line, so a user can open the file and fix it.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from wdsprep.errors import DataError
from wdsprep.files import MAX_LINE_BYTES, bounded_lines, naming
from wdsprep.format.keys import name_problem

PathLike = str | os.PathLike
BOM = "\ufeff"


class KaldiDataError(DataError):
    """Bad input in a Kaldi data-dir file; the message names file and line."""


@dataclass(frozen=True)
class Entry:
    """One line of a Kaldi table: ``uttid value`` and where it came from."""

    uttid: str
    value: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


GZIP_MAGIC = b"\x1f\x8b"


def iter_table(path: PathLike, *, allow_empty_value: bool = False) -> Iterator[Entry]:
    """Lines ``uttid<whitespace>value`` of a Kaldi table, UTF-8, blank lines skipped.

    The value is everything after the first run of whitespace, trailing whitespace removed,
    inner whitespace kept (the Kaldi ``text`` convention).  A UTF-8 byte-order mark at the start
    of the file (Notepad and some exporters write one) is not part of the first id.
    """
    path = str(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
    with f, naming(path):  # a read error (EIO) names the table
        for lineno, raw in bounded_lines(f):
            if raw is None:  # /dev/zero has one endless line
                raise KaldiDataError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES:,} bytes, which no Kaldi "
                                     f"table has; is it the right file?")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if lineno == 1 and raw.startswith(GZIP_MAGIC):
                    raise KaldiDataError(f"{path}: gzip-compressed, not a Kaldi table (uttid value lines); a "
                                         f"manifest (JSON lines) is given with --from KIND PATH") from None
                raise KaldiDataError(
                    f"{path}:{lineno}: not UTF-8 ({e.reason} at byte {e.start}); convert the file, "
                    f"e.g. iconv -f GBK -t UTF-8"
                ) from None
            if lineno == 1 and line.startswith(BOM):
                line = line[1:]
            line = line.rstrip()
            if not line.strip():
                continue
            parts = line.split(maxsplit=1)
            uttid = parts[0]
            wrong = name_problem(uttid)
            if wrong is not None:  # a NUL or control character: the pack would make ids verify refuses
                raise KaldiDataError(f"{path}:{lineno}: id {uttid!r} {wrong}")
            value = parts[1] if len(parts) > 1 else ""
            if not value and not allow_empty_value:
                raise KaldiDataError(f"{path}:{lineno}: expected 'uttid value', got only {uttid!r}")
            yield Entry(uttid, value, path, lineno)


def read_tables(paths: Sequence[PathLike], what: str, *, allow_empty_value: bool = False) -> dict[str, Entry]:
    """Merge several tables into one dict; an id given twice is an error naming both places."""
    table: dict[str, Entry] = {}
    for path in paths:
        for e in iter_table(path, allow_empty_value=allow_empty_value):
            first = table.get(e.uttid)
            if first is not None:
                raise KaldiDataError(
                    f"{e.where}: duplicate {what} id {e.uttid!r} (first at {first.where}); "
                    f"each utterance may appear once across all {what} inputs"
                )
            table[e.uttid] = e
    return table


def read_text(paths: Sequence[PathLike]) -> dict[str, Entry]:
    """Kaldi ``text`` files: uttid -> transcript (may be empty)."""
    return read_tables(paths, "text", allow_empty_value=True)


# An ark rxfilename with an optional Kaldi range: ``path:offset`` or ``path:offset[r1:r2]``.
_ARK_OFFSET = re.compile(r"^(?P<path>.+):(?P<offset>\d+)(?P<range>\[[0-9:, ]*\])?$")


def ark_path(rxfile: str) -> str | None:
    """The ark file an scp value points into, or None for a pipe (``cmd |``)."""
    if rxfile.endswith("|"):
        return None
    m = _ARK_OFFSET.match(rxfile)
    return m.group("path") if m else rxfile


def ark_offset(rxfile: str) -> tuple[str, int] | None:
    """(ark file, byte offset) of an scp value ``path.ark:offset[range]``, or None for anything else (a pipe)."""
    if rxfile.endswith("|"):
        return None
    m = _ARK_OFFSET.match(rxfile)
    return (m.group("path"), int(m.group("offset"))) if m else None


def read_feats_scp(paths: Sequence[PathLike]) -> dict[str, Entry]:
    """``feats.scp`` files: uttid -> ark rxfilename; checks each line parses and its ark exists."""
    table = read_tables(paths, "feats.scp")
    seen: dict[str, bool] = {}
    for e in table.values():
        if len(e.value.split()) != 1:
            raise KaldiDataError(f"{e.where}: expected 'uttid ark:offset', got {e.value!r}")
        ark = ark_path(e.value)
        if ark is None:
            continue
        if not _ARK_OFFSET.match(e.value):
            raise KaldiDataError(f"{e.where}: expected 'uttid path.ark:offset', got {e.value!r}")
        exists = seen.get(ark)
        if exists is None:
            exists = seen[ark] = Path(ark).is_file()
        if not exists:
            raise KaldiDataError(
                f"{e.where}: ark {ark!r} for utterance {e.uttid!r} does not exist; "
                f"paths in feats.scp are relative to the directory you run from"
            )
    return table


def read_utt2lang(paths: Sequence[PathLike]) -> dict[str, Entry]:
    """Kaldi-style ``utt2lang`` files: uttid -> language (one token, as a speaker is in ``utt2spk``)."""
    table = read_tables(paths, "utt2lang")
    for e in table.values():
        if len(e.value.split()) != 1:
            raise KaldiDataError(f"{e.where}: expected 'uttid language' (one word, e.g. en), got {e.uttid} {e.value!r}")
    return table


def read_field(paths: Sequence[PathLike], name: str) -> dict[str, Entry]:
    """A field's Kaldi-style table (``uttid value``, the value the rest of the line, possibly empty)."""
    return read_tables(paths, f"field {name}", allow_empty_value=True)


def read_utt2spk(paths: Sequence[PathLike]) -> dict[str, str]:
    """Kaldi ``utt2spk`` files: uttid -> speaker id (one token, as Kaldi requires)."""
    out: dict[str, str] = {}
    for e in read_tables(paths, "utt2spk").values():
        if len(e.value.split()) != 1:
            raise KaldiDataError(f"{e.where}: expected 'uttid speaker', got {e.uttid} {e.value!r}")
        out[e.uttid] = e.value
    return out
