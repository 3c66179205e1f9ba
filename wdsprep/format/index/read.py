"""Which index a folder has: the one entry through which every reader gets an index.

A complete folder's ``index.json`` (:mod:`~wdsprep.format.index.check`), a folder a pack is still
writing by its published parts (:mod:`~wdsprep.format.index.entries`), or none.
"""

from __future__ import annotations

import os
from pathlib import Path

from wdsprep.format.commit import ENTRIES_DIR
from wdsprep.format.index.check import read_index_json
from wdsprep.format.index.entries import read_entries
from wdsprep.format.index.files import INDEX_NAME, DamagedIndexError
from wdsprep.format.index.model import FolderIndex


def read_index(folder: str | os.PathLike) -> FolderIndex | None:
    """The index of a shard folder, or None when it has none (e.g. shards CAT wrote).

    Every reader (the loader, ``verify``, ``inspect``, ``index``) gets its index from here, so all
    give one verdict on it: :func:`~wdsprep.format.index.check.check_index` holds every field and
    column against the others, and anything the writer would not have written is a
    :class:`~wdsprep.format.index.files.DamagedIndexError` naming the file and field.  Only regular
    files are opened (a FIFO in a column's place would block the open).  The keys are the one part
    read later, by what needs them (:meth:`FolderIndex.keys`): the loader does not, and remote
    loaders do not even fetch them.  A folder a pack is still writing (no ``index.json`` yet) gives
    the index of the shards it has published so far.
    """
    folder = Path(folder)
    index = read_index_json(folder)
    if index is not None:
        return index
    if not os.path.isdir(folder / ENTRIES_DIR):
        return None
    try:
        index = read_entries(folder)
    except DamagedIndexError:
        index = None
        if not (folder / INDEX_NAME).is_file():
            raise
    if index is None or not os.path.isdir(folder / ENTRIES_DIR):  # the pack finished while they were read
        if (folder / INDEX_NAME).is_file():
            return read_index(folder)
    return index
