"""The mixed epoch: which corpus each rank's step draws, and which planned batch of it each reader yields.

Pure functions of (seed, the loader epoch, where every corpus stands, the mixture, the topology);
no I/O, no torch.  Every rank computes the whole of it, so all agree without talking.

Every corpus is planned on its own (``../streams.py``), epoch after epoch of its own: a small corpus
loops, a large one's epoch spans many loader epochs.  A loader epoch is a number of steps (by
default one pass's worth of batches of every corpus); at every step each rank draws a corpus by
the mixture's weights at that step, from a generator seeded by (seed, epoch, rank), and yields
that corpus's next batch.  Steps are equal on every rank by construction and nothing is left over.

A corpus's batches reach readers (rank x worker) in chunks of about a shard's worth, as they are
needed: a reader goes on with the stream it owns; one that owns none takes the first stream
nobody owns; once every stream is owned it takes the last chunk of the stream with the most
left, so an owner's reading at the front is untouched and a shard is read by more than one
reader only in a small corpus.  When nothing of a corpus epoch is left to hand out, the corpus's
next epoch begins; until then no utterance of the corpus repeats.

Where every corpus stands (:class:`MixPosition`) is a few numbers per stream, JSON-able: the
loader's resume state.  Resumed on the same topology, readers keep what they held and the run
goes on as if never stopped; on another, what they held goes back to be dealt anew.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

_MIX = 3  # generator purpose, beside streams.py's
BatchRef = tuple[int, int, int, int]  # (corpus, corpus epoch, stream, batch)
Counts = Callable[[int, int], np.ndarray]  # (corpus, corpus epoch) -> batches per stream


@dataclass
class MixCorpusPosition:
    """Where one corpus stands: its epoch, what of it no reader has taken yet, and what readers hold."""

    epoch: int = 0
    free: list[list[list[int]]] | None = None  # per stream, untaken [start, stop) runs; None: all of it
    own: dict[int, int] = field(default_factory=dict)  # reader -> the stream it reads on with
    held: dict[int, list[int]] = field(default_factory=dict)  # reader -> [epoch, stream, next, stop] taken
    leftover: list[list[int]] = field(default_factory=list)  # [epoch, stream, start, stop] of an earlier epoch

    def to_json(self) -> dict[str, Any]:
        """Plain lists and ints, sharing nothing with this position."""
        free = None if self.free is None else [[list(run) for run in runs] for runs in self.free]
        return {"epoch": self.epoch, "free": free, "own": [[r, s] for r, s in sorted(self.own.items())],
                "held": [[r, *h] for r, h in sorted(self.held.items())], "leftover": [list(r) for r in self.leftover]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MixCorpusPosition:
        free = None if doc["free"] is None else [[[int(a), int(b)] for a, b in runs] for runs in doc["free"]]
        return cls(int(doc["epoch"]), free, {int(r): int(s) for r, s in doc["own"]},
                   {int(h[0]): [int(x) for x in h[1:]] for h in doc["held"]},
                   [[int(x) for x in run] for run in doc["leftover"]])


@dataclass
class MixPosition:
    """Where a mixed run stands: in its loader epoch, on the schedule's clock, and in every corpus."""

    epoch: int  # the loader epoch
    step: int  # steps of it done
    global_step: int  # steps since training began: the schedule's clock
    batches_left: int  # batches (over all ranks) the loader epoch has left
    world_size: int  # the topology the readers in ``corpora`` belong to
    num_workers: int
    phase: int  # worker 0 of that topology serves the steps t = phase (mod readers per rank)
    corpora: list[MixCorpusPosition]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["corpora"] = [c.to_json() for c in self.corpora]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MixPosition:
        fields_ = {k: int(doc[k]) for k in ("epoch", "step", "global_step", "batches_left", "world_size",
                                            "num_workers", "phase")}
        return cls(**fields_, corpora=[MixCorpusPosition.from_json(c) for c in doc["corpora"]])

    def steps_left(self, world_size: int) -> int:
        return math.ceil(self.batches_left / world_size) if self.batches_left > 0 else 0


def corpus_progress(pos: MixCorpusPosition, counts: np.ndarray) -> float:
    """Corpus epochs handed out: whole ones plus the handed-out part of the current one."""
    total = int(np.sum(counts))
    if pos.free is None or not total:
        return float(pos.epoch)
    left = sum(b - a for runs in pos.free for a, b in runs)
    return pos.epoch + (total - left) / total


def start_position(num_corpora: int, epoch_batches: int, world_size: int, num_workers: int) -> MixPosition:
    """Training's very start: every corpus at the start of its epoch 0."""
    return MixPosition(0, 0, 0, epoch_batches, world_size, num_workers, 0,
                       [MixCorpusPosition() for _ in range(num_corpora)])


def next_epoch(end: MixPosition, epoch_batches: int) -> MixPosition:
    """The position a loader epoch starts from, given where the one before ended: its first step
    goes to worker 0 (a new iteration of the DataLoader starts its turns there)."""
    return MixPosition(end.epoch + 1, 0, end.global_step, epoch_batches, end.world_size, end.num_workers, 0,
                       end.corpora)


@dataclass
class MixRun:
    """Steps ``first .. first + steps - 1`` of a loader epoch on one topology."""

    first: int
    steps: int
    readers: int  # per rank: max(1, num_workers)
    phase: int
    corpus: np.ndarray  # int64 [world size, steps]: the corpus each rank drew at each step
    refs: np.ndarray  # int64 [world size, steps, 4]: the BatchRef each rank yields at each step
    end: MixPosition

    def reader_of(self, k: np.ndarray | int) -> np.ndarray | int:
        """The worker serving the run's ``k``-th step (DataLoader workers in turn)."""
        return (self.first + k - self.phase) % self.readers

    def rank_order(self, rank: int) -> list[BatchRef]:
        return [tuple(r) for r in self.refs[rank].tolist()]  # type: ignore[misc]

    def reader_refs(self, rank: int, worker: int) -> list[BatchRef]:
        k = np.flatnonzero(self.reader_of(np.arange(self.steps)) == worker)
        return [tuple(r) for r in self.refs[rank, k].tolist()]  # type: ignore[misc]

    def lead(self, worker: int) -> bool:
        """Whether ``worker`` hands out a placeholder first: workers before the one whose turn it is
        (the run resumes mid-round, so the DataLoader's first turns go to them)."""
        return self.steps > 0 and worker < self.reader_of(0)


def _take(pos: MixCorpusPosition, reader: int, chunk: int) -> list[int]:
    """Hand ``reader`` its next chunk of the corpus, [epoch, stream, start, stop]: a run left from
    an earlier epoch first, else from the current epoch (which has something left)."""
    if pos.leftover:
        e, s, a, b = pos.leftover[0]
        stop = min(a + chunk, b)
        if stop == b:
            pos.leftover.pop(0)
        else:
            pos.leftover[0][2] = stop
        return [e, s, a, stop]
    assert pos.free is not None
    free = pos.free
    s = pos.own.get(reader)
    if s is None or not free[s]:
        owned = set(pos.own.values())
        s = next((k for k, runs in enumerate(free) if runs and k not in owned), None)
        if s is None:  # every stream is being read: the tail of the one with the most left
            victim = max((k for k, runs in enumerate(free) if runs),
                         key=lambda k: (sum(b - a for a, b in free[k]), -k))
            run = free[victim][-1]
            start = max(run[0], run[1] - chunk)
            taken = [pos.epoch, victim, start, run[1]]
            if start == run[0]:
                free[victim].pop()
            else:
                run[1] = start
            return taken
        pos.own[reader] = s
    run = free[s][0]
    stop = min(run[0] + chunk, run[1])
    taken = [pos.epoch, s, run[0], stop]
    if stop == run[1]:
        free[s].pop(0)
    else:
        run[0] = stop
    return taken


def _release(pos: MixCorpusPosition) -> None:
    """Readers of another topology: what they held goes back to be dealt anew; nobody owns a stream."""
    for e, s, a, b in pos.held.values():
        if a >= b:
            continue
        if e == pos.epoch and pos.free is not None:
            runs = pos.free[s]
            runs.append([a, b])
            runs.sort()
            merged: list[list[int]] = []
            for run in runs:
                if merged and merged[-1][1] == run[0]:
                    merged[-1][1] = run[1]
                else:
                    merged.append(run)
            pos.free[s] = merged
        else:
            pos.leftover.append([e, s, a, b])
    pos.leftover.sort()
    pos.held.clear()
    pos.own.clear()


def draw_corpora(probabilities: np.ndarray, *, seed: int, epoch: int, rank: int, first: int) -> np.ndarray:
    """The corpus rank ``rank`` draws at steps ``first ..`` of the loader epoch (``probabilities``
    [steps, corpora], per step); one uniform number per (epoch, rank, step), so a resumed run
    draws what the uninterrupted one would have."""
    n = len(probabilities)
    bits = np.random.PCG64(np.random.SeedSequence([seed, epoch, rank, _MIX]))
    bits.advance(first)  # a float is one 64-bit draw: skip the steps before ``first`` without making them
    u = np.random.Generator(bits).random(n)
    cum = np.cumsum(probabilities, axis=1)
    return (u[:, None] * cum[:, -1:] >= cum).sum(axis=1).astype(np.int64)


def mix_run(start: MixPosition, world_size: int, num_workers: int, *, seed: int,
            probabilities: Callable[[np.ndarray], np.ndarray], counts: Counts, chunks: Sequence[int],
            steps: int | None = None) -> MixRun:
    """The next ``steps`` steps (default: the rest of the loader epoch) on this topology, from ``start``.

    ``probabilities(global_steps)`` gives each corpus's chance per step ([steps, corpora]);
    ``counts(corpus, corpus_epoch)`` the batches per stream of a corpus epoch's plan;
    ``chunks[c]`` how many batches of corpus ``c`` a reader takes at once.
    """
    readers = max(1, num_workers)
    left = start.steps_left(world_size)
    steps = left if steps is None else min(int(steps), left)
    corpora = [MixCorpusPosition.from_json(c.to_json()) for c in start.corpora]  # never change the caller's
    same = (start.world_size, start.num_workers) == (world_size, num_workers)
    phase = start.phase if same else start.step
    if not same:
        for pos in corpora:
            _release(pos)
    t0 = start.step
    probs = probabilities(start.global_step + np.arange(steps))
    corpus = np.stack([draw_corpora(probs, seed=seed, epoch=start.epoch, rank=r, first=t0)
                       for r in range(world_size)]) if steps else np.zeros((world_size, 0), np.int64)
    refs = np.full((world_size, steps, 4), -1, np.int64)
    worker = (t0 + np.arange(steps) - phase) % readers
    for c, pos in enumerate(corpora):
        _deal(c, pos, corpus, worker, refs, readers, chunks[c], counts)
    end = MixPosition(start.epoch, t0 + steps, start.global_step + steps,
                      max(0, start.batches_left - steps * world_size), world_size, num_workers, phase, corpora)
    return MixRun(t0, steps, readers, phase, corpus, refs, end)


def _deal(c: int, pos: MixCorpusPosition, corpus: np.ndarray, worker: np.ndarray, refs: np.ndarray, readers: int,
          chunk: int, counts: Counts) -> None:
    """Serve every step that drew corpus ``c``: each reader from what it holds, then chunk by
    chunk in the order the needs arise (step, then rank)."""
    needs: dict[int, np.ndarray] = {}  # reader -> its steps that drew c, ascending
    heap: list[tuple[int, int, int]] = []  # (step, rank, reader) of each reader's next unserved need
    served: dict[int, int] = {}
    for r in range(corpus.shape[0]):
        mine = np.flatnonzero(corpus[r] == c)
        for w in range(readers):
            ks = mine[worker[mine] == w]
            if not len(ks):
                continue
            i = r * readers + w
            needs[i] = ks
            served[i] = _serve(c, pos, i, ks, 0, refs[r])
            if served[i] < len(ks):
                heap.append((int(ks[served[i]]), r, i))
    heapq.heapify(heap)

    def counts_for(epoch: int) -> np.ndarray:
        n = np.asarray(counts(c, epoch), np.int64)
        if not n.sum():
            raise ValueError(f"corpus {c} has no batches in its epoch {epoch}: nothing left after the length filters?")
        return n

    while heap:
        _, r, i = heapq.heappop(heap)
        pos.held[i] = _take_chunk(pos, i, chunk, counts_for)
        served[i] = _serve(c, pos, i, needs[i], served[i], refs[r])
        if served[i] < len(needs[i]):
            heapq.heappush(heap, (int(needs[i][served[i]]), r, i))


def _take_chunk(pos: MixCorpusPosition, reader: int, chunk: int, counts_for: Callable[[int], np.ndarray]) -> list[int]:
    if not pos.leftover:
        if pos.free is None:  # the epoch is not begun: all of it is free
            pos.free = [[[0, int(n)]] if n else [] for n in counts_for(pos.epoch)]
        elif not any(pos.free):  # all of this epoch is handed out: the next one begins
            pos.epoch += 1
            pos.own.clear()
            pos.free = [[[0, int(n)]] if n else [] for n in counts_for(pos.epoch)]
    return _take(pos, reader, chunk)


def _serve(c: int, pos: MixCorpusPosition, reader: int, ks: np.ndarray, done: int, out: np.ndarray) -> int:
    """Fill ``reader``'s needs ``ks[done:]`` from what it holds; how many of ``ks`` are served now."""
    held = pos.held.get(reader)
    if held is None:
        return done
    e, s, a, b = held
    k = min(len(ks) - done, b - a)
    if k > 0:
        out[ks[done:done + k]] = np.stack([np.full(k, c), np.full(k, e), np.full(k, s), np.arange(a, a + k)], axis=1)
    if a + k >= b:
        del pos.held[reader]
    else:
        held[2] = a + k
    return done + k
