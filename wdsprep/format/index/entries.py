"""A growing pack's index, one entry per published shard: what a loader follows while the pack writes.

A folder a pack is still writing has no ``index.json`` yet: each shard it publishes gets an index
of its own, in the format of a folder's, in ``FOLDER/.index.parts/NNNNNNNN/`` (:func:`write_entry`:
written whole in a hidden folder, synced, then renamed into place, so a reader sees a published
shard's entry whole or not at all).  :func:`read_entries` reads such a folder as the index of the
shards published so far (entries 0, 1, ... without a gap), every entry checked as a whole index is;
the pack's last step writes the folder's ``index.json`` from the entries and removes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from wdsprep.files import sync, write_text
from wdsprep.format.commit import ENTRIES_DIR, pending_folder, published_count
from wdsprep.format.index.check import check_index, read_index_json
from wdsprep.format.index.files import INDEX_NAME, DamagedIndexError, read_file
from wdsprep.format.index.model import FROM_KEYS, FolderIndex, Speakers, Values
from wdsprep.format.index.write import write_index

ENTRY_NAME = "part.json"  # in a published shard's entry, beside its index: which planned shard, what it dropped


def entry_dir(folder: str | os.PathLike, k: int) -> Path:
    """Where the ``k``-th published shard of a growing ``folder`` has its index entry."""
    return Path(folder) / ENTRIES_DIR / f"{k:08d}"


def write_entry(folder: str | os.PathLike, k: int, index: FolderIndex, record: dict[str, Any]) -> Path:
    """Publish shard ``k`` of a growing folder: its index (one shard, the format of a folder's) and
    ``record`` (JSON: which planned shard it is, what it dropped), written whole in a hidden
    folder, synced, and renamed into place: a reader sees all of it or nothing."""
    import shutil

    entries = Path(folder) / ENTRIES_DIR
    entries.mkdir(exist_ok=True)
    tmp = entries / f".tmp-{k:08d}"
    if tmp.exists():  # left by a pack that was killed here
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_index(tmp, index)
    write_text(tmp / ENTRY_NAME, json.dumps(record, ensure_ascii=False, separators=(",", ":")))
    for p in tmp.iterdir():
        sync(p)
    sync(tmp)
    final = entry_dir(folder, k)
    os.rename(tmp, final)
    sync(entries)
    return final


def read_entry_record(folder: str | os.PathLike, k: int) -> dict[str, Any]:
    """The record :func:`write_entry` stored with published shard ``k`` (a JSON object)."""
    path = entry_dir(folder, k) / ENTRY_NAME
    data = read_file(path)
    try:
        doc = json.loads(data.decode("utf-8"))  # type: ignore[union-attr]
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise DamagedIndexError(path, "not a JSON object")
    return doc


# A growing folder's entries, read once per process: (folder) -> (each entry's stat, their index).
_parts_read: dict[str, tuple[list[tuple[int, int]], FolderIndex]] = {}


def read_entries(folder: str | os.PathLike) -> FolderIndex:
    """The index of the shards a growing ``folder`` has published: its entries 0, 1, ... (up to the
    first gap), each read and checked as a folder's index is, holding one shard, all of one layout,
    dims and dtype.  Parts never change once published, so those read before are kept (by their
    files' identity) and only the new ones are read."""
    folder = Path(folder)
    count = published_count(folder)
    stats = []
    for k in range(count):
        try:
            st = os.stat(entry_dir(folder, k) / INDEX_NAME)
        except FileNotFoundError:  # an entry being removed (the pack just wrote index.json)
            count = k
            break
        stats.append((st.st_ino, st.st_mtime_ns))
    key = str(folder)
    known, have = _parts_read.get(key, ([], None))
    keep = 0
    while keep < min(len(known), count) and known[keep] == stats[keep]:
        keep += 1
    if have is not None and keep == len(known) == count:
        return have
    pieces = [have.head(keep)] if have is not None and keep else []
    fmt = _shard_format(folder) if count > keep else None
    for k in range(keep, count):
        d = entry_dir(folder, k)
        entry = read_index_json(d)
        if entry is None or len(entry.names) != 1:
            raise DamagedIndexError(d / INDEX_NAME, f"lists {0 if entry is None else len(entry.names)} shards; a "
                                                    f"published shard's entry lists one")
        if fmt is not None and entry.names[0] != fmt % k:  # it would hide the shard published here
            raise DamagedIndexError(d / INDEX_NAME, f"names shard {entry.names[0]!r}, but the pack names its "
                                                    f"published shard {k} {fmt % k!r}")
        pieces.append(_in_memory(entry))
    index = _concat(folder, pieces)
    _parts_read[key] = (stats, index)
    return index


def _shard_format(folder: Path) -> str | None:
    """The shard name format of the pack writing ``folder`` (its plan's), or None when not known."""
    g = pending_folder(folder)
    fmt = None if g is None or g.plan is None else g.plan.options.get("fmt")
    try:
        return fmt if isinstance(fmt, str) and isinstance(fmt % 0, str) else None
    except (TypeError, ValueError):
        return None


def _in_memory(entry: FolderIndex) -> FolderIndex:
    """An entry's index with its columns copied out of their memory maps: thousands of entries must
    not hold a file descriptor each (a map keeps one open).  Its keys are still read when asked."""
    sp = entry._speakers
    speakers = None if sp is None else Speakers(np.array(sp.ids, np.int32), sp.names, sp.source)
    return FolderIndex(entry.layout, entry.dims, entry.dtype, entry.names, entry.utts, np.array(entry.frames, np.int32),
                       np.array(entry.text_lens, np.int32), sizes=entry.sizes, mtimes=entry.mtimes,
                       digests=entry.digests, folder=entry.folder, lost=entry.lost, speakers=speakers,
                       checksums=entry.checksums, audio=entry.audio,
                       samples=None if entry.samples is None else np.array(entry.samples, np.int32),
                       fields=entry.fields,
                       columns={k: Values(np.array(c.ids, np.int32), c.names) for k, c in entry.columns.items()})


def _concat(folder: Path, pieces: Sequence[FolderIndex]) -> FolderIndex:
    """Indexes of consecutive shards of ``folder`` as one, checked whole (names unique, ...)."""
    if not pieces:
        return FolderIndex("cat", None, "float32", [], np.zeros(0, np.int64), np.zeros(0, np.int32),
                           np.zeros(0, np.int32), folder=folder, keys=[],
                           speakers=Speakers(np.zeros(0, np.int32), [], FROM_KEYS))
    first = pieces[0]
    for p in pieces[1:]:
        for what in ("layout", "dims", "dtype", "audio", "fields"):
            if getattr(p, what) != getattr(first, what):
                raise DamagedIndexError(Path(p.folder or folder) / INDEX_NAME,
                                        f"{what} {getattr(p, what)!r}, the folder's first shard has "
                                        f"{getattr(first, what)!r}")
    has = [p.has_speakers for p in pieces]
    speakers = Speakers.concat([p.speakers() for p in pieces]) if all(has) else None

    def keys() -> list[str]:
        return [k for p in pieces for k in p.keys()]

    index = FolderIndex(first.layout, first.dims, first.dtype, [n for p in pieces for n in p.names],
                        np.concatenate([p.utts for p in pieces]),
                        np.concatenate([np.asarray(p.frames, np.int32) for p in pieces]),
                        np.concatenate([np.asarray(p.text_lens, np.int32) for p in pieces]),
                        sizes=np.concatenate([p.sizes for p in pieces]),
                        mtimes=np.concatenate([p.mtimes for p in pieces]),
                        digests=[d for p in pieces for d in p.digests], keys=keys, folder=folder,
                        lost=np.concatenate([p.lost for p in pieces]), speakers=speakers,
                        checksums=[c for p in pieces for c in p.checksums], audio=first.audio,
                        samples=None if first.audio is None else np.concatenate([np.asarray(p.samples, np.int32)
                                                                                for p in pieces]),
                        fields=first.fields,
                        columns={k: Values.concat([p.columns[k] for p in pieces]) for k in first.columns
                                 if all(k in p.columns for p in pieces)})
    check_index(index)
    return index
