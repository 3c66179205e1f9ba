"""Who reads which shard: per-epoch assignment of shards to ranks and workers.

Every rank computes the same assignment from (seed, epoch, world size): a permutation drawn
afresh each epoch, then a greedy walk that gives each shard to the rank with the fewest frames so
far (frames from the index; the file size stands in without one).  Totals per rank differ by at
most one shard, and because the permutation changes every epoch so does the assignment, so the
early stop below does not discard the same utterances every epoch.  Within a rank the same greedy
walk splits the rank's shards across its DataLoader workers.

Under DDP every rank must run the same number of steps: the loader all-reduces a flag once per
step (``collectives.any_rank_done``), as CAT did: all ranks stop as soon as one runs dry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.format.index import read_index
from wdsprep.format.shardlist import is_url


@dataclass(frozen=True)
class ShardSizes:
    """Per shard: the weight used to balance ranks, and the utterance count when an index knows it."""

    weights: list[int]
    utts: list[int | None]

    @property
    def total_utts(self) -> int | None:
        """Utterances in all shards, or None when some shard has no index entry."""
        return None if any(u is None for u in self.utts) else sum(self.utts)  # type: ignore[misc]


def shard_sizes(shards: Sequence[str]) -> ShardSizes:
    """Frames and utterance counts from each folder's ``index.json``; file size (or 1 for URLs) otherwise."""
    indexes: dict[str, dict] = {}
    weights: list[int] = []
    utts: list[int | None] = []
    for shard in shards:
        if is_url(shard):
            weights.append(1)
            utts.append(None)
            continue
        folder = str(Path(shard).parent)
        if folder not in indexes:
            index = read_index(folder)
            indexes[folder] = {} if index is None else {s.name: s for s in index.shards}
        info = indexes[folder].get(Path(shard).name)
        if info is not None:
            weights.append(max(1, info.num_frames))
            utts.append(info.num_utts)
        else:
            weights.append(max(1, os.path.getsize(shard)))
            utts.append(None)
    return ShardSizes(weights, utts)


def greedy_split(order: Sequence[int], weights: Sequence[int], parts: int) -> list[list[int]]:
    """Walk ``order`` and give each item to the part with the least weight so far (ties: lowest part)."""
    loads = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in order:
        p = loads.index(min(loads))
        out[p].append(i)
        loads[p] += weights[i]
    return out


def epoch_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order shards are dealt in this epoch: a fresh permutation per (seed, epoch), or as listed."""
    if not shuffle:
        return list(range(num_shards))
    # The same on every rank and worker: it only depends on (seed, epoch).
    return np.random.default_rng([seed, epoch]).permutation(num_shards).tolist()


def assign_shards(
    weights: Sequence[int], *, world_size: int, rank: int, num_workers: int, seed: int, epoch: int,
    shuffle: bool, names: Sequence[str] | None = None, allow_idle_ranks: bool = False,
) -> list[list[int]]:
    """Shard indices for each worker of ``rank`` this epoch, in reading order.

    Fewer shards than ranks is an error in training (a rank without data would end every epoch
    at step 0); ``allow_idle_ranks`` (dev mode) lets such a rank simply yield nothing.  Fewer
    shards than ``world_size * num_workers`` is fine: workers without a shard yield nothing.
    """
    n = len(weights)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if n < world_size and not allow_idle_ranks:
        where = f" ({names[0]} ...)" if names else ""
        raise ValueError(f"{n} shards{where} for {world_size} ranks: every rank needs at least one shard "
                         f"(better several per worker). Repack with a smaller --utts-per-shard so there "
                         f"are at least {world_size * max(1, num_workers)} shards")
    order = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle)
    mine = greedy_split(order, weights, world_size)[rank]
    return greedy_split(mine, weights, max(1, num_workers))
