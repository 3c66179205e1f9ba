"""An index's files on disk, read the one safe way: the bottom of the index reader.

Per folder, beside its shards:

- ``index.json``: layout, dims, dtype and per shard its name, byte size, mtime, utterances, frames,
  a digest of its frame column and the SHA-256 of its bytes (``sha256``: a remote shard is checked
  against it when downloaded; version 2 may lack it, and a shard without one is checked by its
  size alone): small, read in O(shards);
- ``index.frames.npy``, ``index.text_lens.npy``: int32 per utterance, in shard order, memory-mapped
  when read, so a process touches only the pages it uses;
- ``index.keys.txt``: the sample keys, one per line, read only by what needs them (``verify``);
- ``index.speakers.npy`` (int32 per utterance) and ``index.speaker_names.txt`` (the names it
  numbers, one per line): each utterance's speaker, from the ``utt2spk`` given to ``pack``, else
  by the key rule (:func:`~wdsprep.format.keys.speaker_of`); ``index.json`` says which.  Version 2
  without them gets its speakers from the keys when asked.
- ``index.field.NAME.npy`` (int32 per utterance) and ``index.field.NAME.txt`` (the values it
  numbers, one per line), for each indexed field (the language ``lang``, ``pack --index-field``'s),
  and in ``index.json`` a ``fields`` object naming every field the samples carry as members, an
  indexed one with its count of values (``{"lang": {"values": 3}, "prev_text": {}}``).  Optional
  in version 2: a reader that knows no fields ignores the object and the files, and reads the
  samples as ever (their field members are extra members of a known key);
- audio folders only (layout ``flac`` or ``wav``): ``index.samples.npy``, int32 per utterance, its
  sample count, and in ``index.json`` an ``audio`` object (:class:`~wdsprep.format.index.model.AudioIndex`:
  the format, sample rate and bits, and the fbank options the loader computes the features with).
  Their ``frames`` are the fbank frames of those samples (``units.fbank_frames``), so the plan
  works unchanged, ``dims`` is the mel bins and ``dtype`` float32, what the loader delivers.
  Speed perturbation plans with the sample counts.

``index.json`` is written last: a folder whose ``index.json`` is there has the rest.  Version 1 is
one JSON holding every shard's keys, frames and transcript lengths, without sizes, mtimes, digests,
checksums or speakers; it is read too.

Every file is opened here, regular files only (a FIFO in a column's place would block the open),
and anything not as the writer writes it is one :class:`DamagedIndexError` naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import naming
from wdsprep.format.commit import ENTRIES_DIR
from wdsprep.format.npy import npy_header_end, parse_npy_header
from wdsprep.format.shardlist import file_kind

INDEX_NAME = "index.json"
INDEX_VERSION = 2
FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE = "index.frames.npy", "index.text_lens.npy", "index.keys.txt"
SPEAKERS_FILE, SPEAKER_NAMES_FILE = "index.speakers.npy", "index.speaker_names.txt"
SAMPLES_FILE = "index.samples.npy"
FIELD_PREFIX = "index.field."  # an indexed field's column and values: index.field.NAME.npy, .txt
# everything an index writes; an audio folder's also AUDIO_INDEX_FILES
INDEX_FILES = (INDEX_NAME, FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE, SPEAKERS_FILE, SPEAKER_NAMES_FILE)
AUDIO_INDEX_FILES = (SAMPLES_FILE,)
COLUMN_DTYPE = np.dtype(np.int32)  # every column file: native int32, as np.save writes it
_MAX_NPY_HEADER = 1 << 16  # numpy itself refuses headers over 10,000 bytes
REINDEX = "re-index the folder (wdsprep index --force)"


def field_files(name: str) -> tuple[str, str]:
    """(column, values) file names of indexed field ``name``."""
    return f"{FIELD_PREFIX}{name}.npy", f"{FIELD_PREFIX}{name}.txt"


def is_index_file(name: str) -> bool:
    """Whether a file name is one an index writes (its fixed files, an indexed field's)."""
    return name in (*INDEX_FILES, *AUDIO_INDEX_FILES) or (name.startswith(FIELD_PREFIX)
                                                          and name.endswith((".npy", ".txt")))


class DamagedIndexError(DataError):
    """A file of a folder's index is not what the index writer writes (missing, not a regular file,
    a field of the wrong type or range, columns that disagree): ``path`` names it, ``what`` says how."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path, self.what = str(path), what
        entry = next((p for p in Path(path).parents if p.parent.name == ENTRIES_DIR), None)
        if entry is not None:  # a growing pack's published entry: index --force refuses an unfinished pack
            super().__init__(f"{path}: {what}; a published shard's entry is damaged: remove {entry} and run the pack "
                             f"again with --resume (the shards from there on are written again), or pack again with "
                             f"--overwrite")
            return
        super().__init__(f"{path}: {what}; the index is damaged: {REINDEX}, or delete {', '.join(INDEX_FILES)} to "
                         f"read the shards without one")

    def __reduce__(self) -> tuple:  # to cross a process boundary whole (its args are not the message's)
        return type(self), (self.path, self.what)


def read_file(path: Path, *, required: bool = True) -> bytes | None:
    """The bytes of index file ``path``: only a regular file is opened; None when it is missing
    and not ``required``."""
    f = open_regular(path)
    if f is None:
        if required:
            raise DamagedIndexError(path, "is missing")
        return None
    with f, naming(path):
        return f.read()


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 index file, one item each, every one ended by a newline."""
    data = read_file(path)
    assert data is not None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedIndexError(path, f"not UTF-8 ({e})") from None
    if text and not text.endswith("\n"):
        raise DamagedIndexError(path, "does not end in a newline (cut short?)")
    return text.split("\n")[:-1]


def open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened for reading, or None when there is none.  Anything but a regular file (a
    FIFO, a device, a folder) is damage, found by ``stat`` before any open: opening a FIFO blocks."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise DamagedIndexError(path, f"is a {file_kind(mode)}, not a regular file")
        # O_NONBLOCK: a FIFO put in its place since the stat does not block the open either.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DamagedIndexError(path, f"cannot be opened ({e.strerror})") from None
    f = os.fdopen(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        f.close()
        raise DamagedIndexError(path, f"is a {file_kind(mode)}, not a regular file")
    return f


def read_column(path: Path, rows: int) -> np.ndarray:
    """Column file ``path`` of ``rows`` int32 values, memory-mapped; its header, dtype, shape and
    byte size are checked first, so nothing past the file is mapped."""
    f = open_regular(path)
    if f is None:
        raise DamagedIndexError(path, "is missing")
    with f, naming(path):
        size = os.fstat(f.fileno()).st_size
        head = f.read(12)
        try:
            end = npy_header_end(head)
            if not 12 <= end <= min(size, _MAX_NPY_HEADER):
                raise ValueError(f"a header of {end:,} bytes in a file of {size:,}")
            head += f.read(end - len(head))
            descr, _, shape = parse_npy_header(head[10 if head[6] == 1 else 12:end].decode("latin1"))
        except ValueError as e:
            raise DamagedIndexError(path, f"not an .npy column ({e})") from None
        if descr != COLUMN_DTYPE.str:
            raise DamagedIndexError(path, f"holds values of type {descr!r}; an index column is {COLUMN_DTYPE.str!r} "
                                          f"(int32)")
        if shape != (rows,):
            raise DamagedIndexError(path, f"has shape {shape}; index.json's shards hold {rows:,} utterances")
        if size != end + rows * COLUMN_DTYPE.itemsize:
            raise DamagedIndexError(path, f"has {size:,} bytes; a column of {rows:,} rows has "
                                          f"{end + rows * COLUMN_DTYPE.itemsize:,}")
        if not rows:
            return np.zeros(0, COLUMN_DTYPE)
        return np.memmap(f, COLUMN_DTYPE, "r", end, (rows,))
