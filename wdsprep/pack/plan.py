"""Which utterance goes to which shard: decided before any feature is written (pure, no I/O).

Once every utterance's frame count is known (``pack`` reads it from the matrix headers), each
length group's utterances are put in one order and cut into shards of ``utts_per_shard``:

- ``shuffle`` (the default): a seeded random order, the same for a given seed whatever the input
  order, the number of workers or which other utterances are packed (each utterance's place is a
  hash of the seed and its id).  Speakers and recordings spread over every shard of the group.
- no shuffle: input order, as Kaldi keeps it (sorted by id, so by speaker).

Workers then write whole shards (:func:`write_order`), each taking the next one when it is free,
and shards are published and named in plan order (:mod:`wdsprep.pack.output`), so the shards and
their names depend on the seed alone, not on ``nj``; only the last shard of a group is short.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class PlannedShard:
    """One shard to write: its folder (length group) and its utterances (input positions), in order."""

    folder: str
    items: np.ndarray  # int64 positions in the pack's item list, in the order they are written
    frames: int  # total


@dataclass
class ShardPlan:
    """A pack's shard plan: its shards, every item's id and planned frames, and its folders."""

    shards: list[PlannedShard]
    uttids: Sequence[str]  # per item (the positions PlannedShard.items hold)
    frames: np.ndarray  # int64 per item: frames as planned (< 0: not packed)
    folders: list[str]  # every folder of the pack, in order (length groups)

    def digest(self) -> str:
        """A digest of every planned shard: its folder, its utterances in order and their frames."""
        h = hashlib.blake2b(digest_size=16)
        for s in self.shards:
            h.update(s.folder.encode("utf-8") + b"\0")
            h.update("\n".join(self.uttids[i] for i in s.items.tolist()).encode("utf-8") + b"\0")
            h.update(np.ascontiguousarray(self.frames[s.items], np.int64).tobytes())
        return h.hexdigest()


def shuffle_keys(uttids: Sequence[str], seed: int) -> np.ndarray:
    """Each utterance's place in the seeded order: 8 bytes of a keyed hash of its id (uint64).

    A hash rather than a permutation: an utterance's place does not depend on the others, so
    ``pack-audio`` and ``fbank`` + ``pack`` (which drops unreadable audio earlier) agree, as do
    inputs given in another order.  About 1 s per million ids.
    """
    salt = int(seed).to_bytes(16, "little", signed=True)
    return np.fromiter((int.from_bytes(hashlib.blake2b(u.encode("utf-8"), digest_size=8, salt=salt).digest(), "little")
                        for u in uttids), np.uint64, len(uttids))


def plan_shards(uttids: Sequence[str], folders: Sequence[str | None], frames: np.ndarray, folder_order: Sequence[str],
                *, utts_per_shard: int, shuffle: bool, seed: int) -> ShardPlan:
    """The shards of a pack, folder by folder (in ``folder_order``), each folder's in order.

    ``folders[i]`` is item ``i``'s length group folder, None for an item not packed.  Ties of the
    hash (one in ~10^19 pairs) fall back to the id, so the order is total.
    """
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be >= 1")
    frames = np.asarray(frames, np.int64)
    number = {f: k for k, f in enumerate(folder_order)}
    codes = np.fromiter((-1 if f is None else number[f] for f in folders), np.int64, len(folders))
    keys = shuffle_keys(uttids, seed) if shuffle else None
    shards = []
    for k, folder in enumerate(folder_order):
        items = np.flatnonzero(codes == k)
        if keys is not None and len(items):
            items = _by_key(items, keys[items], uttids)
        for a in range(0, len(items), utts_per_shard):
            part = items[a:a + utts_per_shard]
            shards.append(PlannedShard(folder, part, int(frames[part].sum())))
    return ShardPlan(shards, uttids, frames, list(folder_order))


def _by_key(items: np.ndarray, keys: np.ndarray, uttids: Sequence[str]) -> np.ndarray:
    """``items`` sorted by ``keys``, equal keys by id."""
    order = np.argsort(keys, kind="stable")
    items, keys = items[order], keys[order]
    tied = np.flatnonzero(keys[1:] == keys[:-1])
    for a in tied.tolist():  # (practically never) sort each run of equal keys by id
        b = a + 1
        while b + 1 < len(keys) and keys[b + 1] == keys[a]:
            b += 1
        items[a:b + 1] = sorted(items[a:b + 1].tolist(), key=lambda i: uttids[i])
    return items


def write_order(plan: ShardPlan) -> list[int]:
    """Shard ids in the order they are written: the folders interleaved by how far through each is,
    each folder's own shards in plan order (so a loader following the pack sees every length group
    from the start)."""
    seen: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for s in plan.shards:
        total[s.folder] += 1
    rank = {f: n for n, f in enumerate(plan.folders)}
    keyed = []
    for j, s in enumerate(plan.shards):
        keyed.append(((seen[s.folder] + 0.5) / total[s.folder], rank.get(s.folder, 0), j))
        seen[s.folder] += 1
    return [j for *_, j in sorted(keyed)]
