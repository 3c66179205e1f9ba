"""Who yields which planned batches: streams dealt to ranks and workers, steps equal by construction.

Pure functions of the plan's batch counts per stream and the topology (world size, workers per
rank); no I/O, no torch.  Every rank computes the same assignment.

Training: streams are dealt whole to ranks, largest first, each to the rank with the fewest
batches so far.  Every rank then yields exactly ``T = total // world_size`` batches: a rank
dealt more gives the surplus off the end of its streams to ranks dealt fewer (they read those
few shards too: the only shards read twice), and the fewer than ``world_size`` batches left over
are the epoch's discarded tail, at most one batch per rank.  Dev mode (``equal=False``) keeps
every batch: ranks may yield different numbers of batches.

Within a rank, a stream's batches go to one worker, so its shards are read in order by one
reader.  A rank's batches reach the trainer in the DataLoader's order: one from each worker in
turn, a worker whose batches are spent dropping out of the turns (:func:`rank_order`); with that,
the batches consumed after ``k`` steps on any topology are known, which is what resuming on
another topology needs (:func:`consumed`).

The dealing itself is :func:`least_loaded`, which the plan also uses to deal shards to streams.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

# A reader yields the batches of this many of its streams interleaved (see Assignment.reader_order).
INTERLEAVE = 4


def least_loaded(order: Iterable[int], weights: Sequence[int], parts: int) -> list[list[int]]:
    """Walk ``order`` and give each item to the part with the least weight so far (ties: the
    lowest part); each part's items in the order given.  Given largest first, loads differ by at
    most the largest weight."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    heap = [(0, p) for p in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in order:
        load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + int(weights[i]), p))
    return out


@dataclass(frozen=True)
class Task:
    """Batches ``start:stop`` of one stream, read in order by one worker; ``group``: the streams of
    one group are interleaved, groups follow one another (see :meth:`Assignment.reader_order`)."""

    stream: int
    start: int
    stop: int
    group: int = 0

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class Assignment:
    """Per rank, per worker, the tasks it reads, in order; and what no rank yields."""

    world_size: int
    num_workers: int  # DataLoader workers per rank; 0 reads in the main process (one reader)
    workers: list[list[list[Task]]]  # [rank][reader] -> tasks
    steps: list[int]  # batches each rank yields
    owners: list[int]  # per stream: the rank it was dealt to (-1: nothing of it left)
    discarded: list[Task] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # per stream: its batches in the whole epoch

    def tasks(self, rank: int, reader: int) -> list[Task]:
        return self.workers[rank][reader]

    def reader_order(self, rank: int, reader: int) -> list[tuple[int, int]]:
        """(stream, batch) in the order the reader yields them.

        A reader's streams are read :data:`INTERLEAVE` at a time, their batches merged by progress
        (batch ``j`` of a stream of ``n`` at ``(j + 0.5) / n``), so consecutive batches come from
        different streams: one stream's batches share its few shards, and with length-grouped
        shards their lengths. The key of a batch depends only on its stream's place among the
        reader's streams and its own place in the stream, both fixed by the streams' whole sizes,
        so what a resumed reader has left comes in the order the uninterrupted one would yield it.
        """
        tasks = self.workers[rank][reader]
        if not tasks:
            return []
        streams = np.concatenate([np.full(len(t), t.stream, np.int64) for t in tasks])
        batches = np.concatenate([np.arange(t.start, t.stop, dtype=np.int64) for t in tasks])
        groups = np.concatenate([np.full(len(t), t.group, np.int64) for t in tasks])
        first = {}
        for t in tasks:  # the order the streams first appear: the tie-break within a group
            first.setdefault(t.stream, len(first))
        place = np.array([first[s] for s in streams.tolist()], np.int64)
        sizes = np.array(self.sizes, np.float64)[streams]
        order = np.lexsort((place, (batches + 0.5) / sizes, groups))
        return list(zip(streams[order].tolist(), batches[order].tolist()))

    @property
    def num_discarded(self) -> int:
        return sum(len(t) for t in self.discarded)


def _ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs of True in a boolean mask."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def assign(counts: Sequence[int], world_size: int, num_workers: int, *, equal: bool = True,
           consumed: Sequence[np.ndarray] | None = None, interleave: int = INTERLEAVE) -> Assignment:
    """Deal the batches of an epoch whose streams hold ``counts[s]`` batches.

    ``consumed[s]`` (a boolean mask per stream) marks batches a resumed epoch already yielded;
    only the rest are dealt.  Streams go to ranks and readers by their whole size, so on the
    topology that consumed them each reader is left exactly the rest of its own batches.
    ``interleave``: the streams a reader yields interleaved (see :meth:`Assignment.reader_order`).
    """
    if world_size < 1 or num_workers < 0:
        raise ValueError(f"world size must be >= 1 and num_workers >= 0, got {world_size} and {num_workers}")
    left: list[list[tuple[int, int]]] = []  # per stream: runs of batches still to yield
    for s, n in enumerate(counts):
        mask = np.ones(int(n), bool) if consumed is None else ~np.asarray(consumed[s], bool)
        left.append(_ranges(mask))
    sizes = [int(n) for n in counts]
    # Streams to ranks: largest first, each to the least loaded rank (ties: the lower rank).
    rank_streams = least_loaded(sorted((s for s in range(len(sizes)) if sizes[s]), key=lambda s: (-sizes[s], s)),
                                sizes, world_size)
    owners = [-1] * len(sizes)
    for r, streams in enumerate(rank_streams):
        for s in streams:
            owners[s] = r
    own: list[list[list[Task]]] = [[[Task(s, a, b) for a, b in left[s]] for s in streams] for streams in rank_streams]
    loads = [sum(len(t) for unit in units for t in unit) for units in own]
    received: list[list[Task]] = [[] for _ in range(world_size)]
    discarded: list[Task] = []
    if equal:
        target = sum(loads) // world_size
        pool: list[Task] = []  # surplus, peeled off the end of the donors' streams
        for r in range(world_size):
            surplus = loads[r] - target
            for unit in reversed(own[r]):
                while surplus > 0 and unit:
                    last = unit[-1]
                    give = min(surplus, len(last))
                    pool.append(Task(last.stream, last.stop - give, last.stop))
                    surplus -= give
                    if give == len(last):
                        unit.pop()
                    else:
                        unit[-1] = Task(last.stream, last.start, last.stop - give)
            loads[r] = min(loads[r], target)
        # In stream order, not peeling order: what is left of these runs when an epoch is resumed
        # on the same topology then goes to the same ranks as before.
        pool.sort(key=lambda t: (t.stream, t.start))
        for r in range(world_size):
            need = target - loads[r]
            while need > 0:
                task = pool.pop(0)
                take = min(need, len(task))
                received[r].append(Task(task.stream, task.start, task.start + take))
                if take < len(task):
                    pool.insert(0, Task(task.stream, task.start + take, task.stop))
                need -= take
            loads[r] = target
        discarded = pool
    readers = max(1, num_workers)
    workers: list[list[list[Task]]] = []
    for r in range(world_size):
        # A stream's tasks stay together (one reader reads its shards in order), dealt by the
        # stream's whole size; then each received run of another rank's stream, in stream order
        # (weighed as nothing: they are short, and what is left of them changes as they are read).
        # Both stay put as the epoch is consumed, so a resumed reader has the rest of its own list,
        # and its streams keep their interleave groups (an emptied stream still counts).
        units = [(sizes[s], u) for s, u in sorted(zip(rank_streams[r], own[r]), key=lambda x: (-sizes[x[0]], x[0]))]
        per_reader: list[list[Task]] = [[] for _ in range(readers)]
        load = [0] * readers
        dealt = [0] * readers
        for weight, u in units:
            w = load.index(min(load))
            per_reader[w].extend(Task(t.stream, t.start, t.stop, dealt[w] // interleave) for t in u)
            load[w] += weight
            dealt[w] += 1
        for t in received[r]:  # after the reader's own streams, one after another
            w = load.index(min(load))
            per_reader[w].append(Task(t.stream, t.start, t.stop, len(sizes) + dealt[w]))
            dealt[w] += 1
        workers.append(per_reader)
    return Assignment(world_size, num_workers, workers, loads, owners, discarded, sizes)


def _turns(a: Assignment, rank: int, first: int = 0) -> list[tuple[int, tuple[int, int]]]:
    """(reader, (stream, batch)) in the order rank ``rank`` yields them: its readers in turn, one
    batch each, a reader whose batches are spent dropping out (what torch's DataLoader does with
    workers).  Readers before ``first`` that have batches hand out a placeholder first (a resumed
    run: they had taken their turn of that round already)."""
    lists = [[None] * (w < first and bool(tasks)) + a.reader_order(rank, w)  # type: ignore[operator]
             for w, tasks in enumerate(a.workers[rank])]
    out: list[tuple[int, tuple[int, int]]] = []
    for k in range(max(map(len, lists), default=0)):
        out.extend((w, lst[k]) for w, lst in enumerate(lists) if k < len(lst) and lst[k] is not None)
    return out


def rank_order(a: Assignment, rank: int, first: int = 0) -> list[tuple[int, int]]:
    """(stream, batch) in the order rank ``rank`` yields them (see :func:`_turns`)."""
    return [b for _, b in _turns(a, rank, first)]


def next_turn(counts: Sequence[int], runs: Sequence[tuple[int, int, int]], world_size: int, num_workers: int,
              rank: int, *, equal: bool = True, interleave: int = INTERLEAVE) -> int:
    """The reader whose turn is next after the last of ``runs``, when it ran on this topology (0 else):
    resumed, readers before it hand out a placeholder first, so the batches come in the order the
    interrupted run would have yielded them."""
    if not runs or tuple(runs[-1][:2]) != (world_size, num_workers) or num_workers < 2:
        return 0
    # The last run started where the ones before it left off, with its own first turn.
    *before, (_, _, steps) = runs
    first = next_turn(counts, before, world_size, num_workers, rank, equal=equal, interleave=interleave)
    turns = _turns(epoch_assignment(counts, before, world_size, num_workers, equal=equal, interleave=interleave),
                   rank, first)
    return turns[steps][0] if steps < len(turns) else 0


def consumed(counts: Sequence[int], runs: Sequence[tuple[int, int, int]], *, equal: bool = True,
             interleave: int = INTERLEAVE) -> list[np.ndarray]:
    """Per stream, the batches an epoch had yielded after ``runs``: runs of it, in turn, on
    ``(world_size, num_workers, steps)``, each resumed where the one before stopped."""
    done = [np.zeros(int(n), bool) for n in counts]
    for i, (world_size, num_workers, steps) in enumerate(runs):
        a = assign(counts, world_size, num_workers, equal=equal, consumed=done, interleave=interleave)
        for rank in range(world_size):
            first = next_turn(counts, runs[:i], world_size, num_workers, rank, equal=equal, interleave=interleave)
            for stream, j in rank_order(a, rank, first)[:steps]:
                done[stream][j] = True
    return done


def epoch_assignment(counts: Sequence[int], runs: Sequence[tuple[int, int, int]], world_size: int, num_workers: int,
                     *, equal: bool = True, interleave: int = INTERLEAVE) -> Assignment:
    """The assignment of what an epoch has left after ``runs`` (see :func:`consumed`), on this topology."""
    done = consumed(counts, runs, equal=equal, interleave=interleave) if runs else None
    return assign(counts, world_size, num_workers, equal=equal, consumed=done, interleave=interleave)
