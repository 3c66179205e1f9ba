"""The indexed shard set an epoch is planned from: every shard's utterances and every utterance's frames.

Built once per loader from each folder's index (``format/index.py``): O(shards) JSON plus one
memory-mapped frame column per folder.  A shard that changed since it was indexed (its size or
mtime differ) is refused at once, naming it: it is never read against a stale index.  Shards
that no index lists (CAT's, a copied folder, pipes and URLs) are scanned here, headers only, with
a warning that ``wdsprep index`` would save that scan.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format.index import INDEX_NAME, FolderIndex, frames_digest, read_index, scan_shard, stale_reason
from wdsprep.format.shardlist import is_url


class StaleIndexError(DataError):
    """A shard differs from what its folder's index says; the message names it and what to do."""


@dataclass
class ShardSet:
    """Shards in list order, their utterances as rows ``starts[i]:starts[i + 1]`` of ``frames``."""

    urls: list[str]
    utts: np.ndarray  # int64 [S]
    frames: np.ndarray  # int32 [N]: every utterance's frames, shard after shard
    digests: list[str]  # per shard: frames_digest of its rows
    sizes: np.ndarray  # int64 [S]: bytes each shard should have, -1 where unknown
    dims: int | None = None  # feature dims, when an index or a scan says
    scanned: int = 0  # shards read here because no index listed them
    lost: np.ndarray | None = None  # int64 [S]: samples a scan found the loader cannot read (damage)
    corpora: tuple[str, ...] = ("",)  # the named corpora, in order (one unnamed without names)
    corpus: np.ndarray | None = None  # int64 [S]: each shard's corpus; its shards are contiguous

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.utts)]).astype(np.int64)
        if self.lost is None:
            self.lost = np.zeros(len(self.urls), np.int64)
        if self.corpus is None:
            self.corpus = np.zeros(len(self.urls), np.int64)

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def num_utts(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, utts: np.ndarray) -> np.ndarray:
        """The shard of each global utterance row."""
        return np.searchsorted(self.starts, utts, side="right") - 1

    def fingerprint(self) -> str:
        """What the plan depends on: per shard its last two path parts (a moved corpus keeps its
        fingerprint), utterance count and frame column; and the corpora's names, when named."""
        doc: list = [["/".join(u.rstrip("/").split("/")[-2:]), int(n), d]
                     for u, n, d in zip(self.urls, self.utts, self.digests)]
        if self.corpora != ("",):
            doc = [list(self.corpora), self.corpus.tolist(), doc]
        return hashlib.blake2b(json.dumps(doc).encode(), digest_size=8).hexdigest()

    def shards_of(self, corpus: int) -> slice:
        """The shards of corpus ``corpus`` (contiguous)."""
        at = np.flatnonzero(self.corpus == corpus)
        return slice(int(at[0]), int(at[-1]) + 1) if len(at) else slice(0, 0)

    def part(self, corpus: int) -> ShardSet:
        """Corpus ``corpus`` alone, as a shard set of its own (rows and shards counted from 0)."""
        sl = self.shards_of(corpus)
        rows = slice(int(self.starts[sl.start]), int(self.starts[sl.stop]))
        return ShardSet(self.urls[sl], self.utts[sl], self.frames[rows], self.digests[sl], self.sizes[sl], self.dims,
                        0, self.lost[sl])


def union(named: dict[str, ShardSet]) -> ShardSet:
    """Named corpora as one shard set, corpus after corpus: shard ``i``'s corpus is ``corpus[i]``."""
    parts = list(named.values())
    if not parts:
        raise ValueError("no corpora given")
    dims = {p.dims for p in parts if p.dims is not None}
    if len(dims) > 1:
        each = ", ".join(f"{n}: {p.dims}" for n, p in named.items())
        raise ValueError(f"the corpora's features differ in dimension ({each}): one model reads one dimension")
    seen: dict[str, str] = {}
    for name, p in named.items():
        for url in p.urls:
            if seen.setdefault(url, name) != name:
                raise ValueError(f"shard {url} is in corpus {seen[url]!r} and in corpus {name!r}: a shard belongs to "
                                 f"one corpus (narrow one of the patterns)")
    return ShardSet([u for p in parts for u in p.urls], np.concatenate([p.utts for p in parts]),
                    np.concatenate([p.frames for p in parts]), [d for p in parts for d in p.digests],
                    np.concatenate([p.sizes for p in parts]), dims.pop() if dims else None,
                    sum(p.scanned for p in parts), np.concatenate([p.lost for p in parts]), tuple(named),
                    np.concatenate([np.full(len(p), c, np.int64) for c, p in enumerate(parts)]))


def shard_set(urls: Sequence[str]) -> ShardSet:
    """The shard set of ``urls`` (in that order), from their folders' indexes, scanning what none lists."""
    indexes: dict[str, FolderIndex | None] = {}
    utts: list[int] = []
    sizes: list[int] = []
    digests: list[str] = []
    columns: list[np.ndarray] = []
    unlisted: list[int] = []
    dims: set[int] = set()
    lost_in = np.zeros(len(urls), np.int64)  # samples the loader cannot read, per shard
    for k, url in enumerate(urls):
        folder = url.rsplit("/", 1)[0] if is_url(url) else os.path.dirname(os.path.abspath(url))
        if folder not in indexes:
            indexes[folder] = None if is_url(url) else read_index(folder)
        index = indexes[folder]
        i = None if index is None else index.position(url.rsplit("/", 1)[-1])
        if i is None:
            unlisted.append(k)
            utts.append(0)
            sizes.append(-1)
            digests.append("")
            columns.append(np.zeros(0, np.int32))
            continue
        assert index is not None
        if index.dims is not None:
            dims.add(int(index.dims))
        why = stale_reason(index, i, os.stat(url))
        if why is not None:
            raise StaleIndexError(
                f"shard {url} changed since it was indexed ({why}): its utterances may not be the ones "
                f"{Path(folder) / INDEX_NAME} lists. If the folder was copied without keeping file times, "
                f"or the shard was replaced on purpose, re-index it (wdsprep index --refresh '{url}'); "
                f"otherwise restore the shard or repack")
        a, b = int(index.starts[i]), int(index.starts[i + 1])
        lost_in[k] = int(index.lost[i])
        utts.append(b - a)
        sizes.append(int(index.sizes[i]))
        digests.append(index.digests[i])
        columns.append(np.asarray(index.frames[a:b], np.int32))
    lost = lost_in
    if unlisted:
        t0 = time.perf_counter()
        for k in unlisted:
            scan = scan_shard(urls[k])
            lost[k] = scan.lost
            for problem in scan.problems:
                warnings.warn(problem, RuntimeWarning, stacklevel=3)
            frames = np.asarray(scan.info.frames, np.int32)
            utts[k], columns[k], digests[k] = len(frames), frames, frames_digest(frames)
            dims |= scan.dims
        some = urls[unlisted[0]]
        warnings.warn(f"{len(unlisted)} of {len(urls)} shards have no index entry (e.g. {some}): read their "
                      f"headers to plan the epochs ({time.perf_counter() - t0:.1f} s). `wdsprep index` writes "
                      f"the index beside them once", UserWarning, stacklevel=3)
    frames = np.concatenate(columns) if columns else np.zeros(0, np.int32)
    return ShardSet(list(urls), np.array(utts, np.int64), frames, digests, np.array(sizes, np.int64),
                    dims.pop() if len(dims) == 1 else None, len(unlisted), lost)
