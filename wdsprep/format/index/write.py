"""The index writer: a folder's index files from a :class:`~wdsprep.format.index.model.FolderIndex`,
written by ``pack`` (and by ``wdsprep index`` for shards packed elsewhere) beside the shards."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import atomic_path, write_text
from wdsprep.format.index.files import (
    AUDIO_INDEX_FILES,
    FRAMES_FILE,
    INDEX_FILES,
    INDEX_NAME,
    KEYS_FILE,
    SAMPLES_FILE,
    SPEAKER_NAMES_FILE,
    SPEAKERS_FILE,
    TEXT_LENS_FILE,
    field_files,
)
from wdsprep.format.index.model import FolderIndex


def index_file_names(index: FolderIndex) -> list[str]:
    """The names of the files :func:`write_index` writes for ``index``."""
    return [*INDEX_FILES, *(AUDIO_INDEX_FILES if index.samples is not None else ()),
            *(f for name in index.columns for f in field_files(name))]


def write_index(folder: str | os.PathLike, index: FolderIndex) -> Path:
    """Write a folder's index, every file atomically and ``index.json`` last.  Whatever stands in a
    file's place is replaced (a FIFO, an empty folder); a folder with files in it is an error naming it."""
    folder = Path(folder)
    for name in (*INDEX_FILES, *AUDIO_INDEX_FILES, *(f for n in index.columns for f in field_files(n))):
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            try:
                (folder / name).rmdir()
            except OSError:
                raise DataError(f"{folder / name} is a folder with files in it where the index writes its {name}; "
                                f"move it away and index again") from None
    keys = index.keys()
    bad = next((k for k in keys if "\n" in k), None)
    if bad is not None:
        raise ValueError(f"{folder}: sample key {bad!r} holds a newline; such a shard cannot be indexed")
    columns = [(FRAMES_FILE, index.frames), (TEXT_LENS_FILE, index.text_lens)]
    if index.samples is not None:
        columns.append((SAMPLES_FILE, index.samples))
    for name, column in columns:
        with atomic_path(folder / name) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(column, np.int32), allow_pickle=False)
    write_text(folder / KEYS_FILE, "".join(k + "\n" for k in keys))
    speakers = index.speakers()  # by the key rule when none were given
    bad = next((n for n in speakers.names if "\n" in n), None)
    if bad is not None:
        raise ValueError(f"{folder}: speaker name {bad!r} holds a newline; such a speaker cannot be indexed")
    with atomic_path(folder / SPEAKERS_FILE) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(speakers.ids, np.int32), allow_pickle=False)
    write_text(folder / SPEAKER_NAMES_FILE, "".join(n + "\n" for n in speakers.names))
    for name, values in index.columns.items():
        bad = next((v for v in values.names if "\n" in v), None)
        if bad is not None:
            raise ValueError(f"{folder}: field {name} value {bad!r} holds a newline; such a value cannot be indexed")
        ids_file, names_file = field_files(name)
        with atomic_path(folder / ids_file) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(values.ids, np.int32), allow_pickle=False)
        write_text(folder / names_file, "".join(v + "\n" for v in values.names))
    return write_text(folder / INDEX_NAME, json.dumps(index.summary(), ensure_ascii=False, separators=(",", ":")))
