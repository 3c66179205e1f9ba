"""The epoch plan: every batch of an epoch, decided from the index before the epoch starts.

A pure function of (the shard set's utterance counts and frames, the options, seed, epoch): no
I/O, no torch, and nothing about ranks or workers.  It lays the epoch out in ``streams``
canonical streams, each a deterministic pipeline over utterance rows::

    shards in a fresh order per (seed, epoch), dealt to streams by frames
      -> each stream: its shards' rows in order -> shuffle buffer -> length filter
      -> length pools -> batches (positions in random order within a pool)

A stream is what one reader reads: its shards one after another, each shard by one reader.
Ranks and workers are dealt whole streams (``assign.py``), so every batch any rank yields under
any world size or worker count is a batch of this plan, and the number of streams is set by the
data and the options, never by the topology.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from wdsprep.balance import least_loaded
from wdsprep.loading.augment import Speed
from wdsprep.loading.batching import DEFAULT_POOL_SIZE, BatchFit, bucket_pools, check_batching, stable_order
from wdsprep.loading.cost import CostModel

# Streams by default: at most 64, never more than there are shards, and at least ~2,000 utterances
# each: a stream is batched from its own length pools, and a smaller one pads more (lognormal
# lengths, median 600 frames, max_frames 20,000: 0.967 with 1,000 per stream, 0.982 with 2,000,
# 0.990 with 4,000; at 50,000: 0.922, 0.957, 0.977).
DEFAULT_STREAMS = 64
MIN_STREAM_UTTS = 2000
# Generators of one stream are independent: (seed, epoch, stream, purpose).
_SHUFFLE, _BATCHES = 1, 2
# Arrivals exchanged with the shuffle buffer per numpy step (fixed: the draws depend on it).
_BUFFER_BLOCK = 4096

BatchId = tuple[int, int, int, int]  # a planned batch: (corpus, corpus epoch, stream, batch of that stream)
Planned = tuple[BatchId, np.ndarray]  # a planned batch and its utterances' rows in the loader's shard set


class TooFewBatches(ValueError):
    """An epoch's plan has too few batches for its ranks (or a mixed corpus none): a loader following
    growing folders waits for more shards instead."""


class Window(NamedTuple):
    """A stretch of one rank's planned batches, in order: what an epoch source deals at once."""

    refs: list[BatchId]
    assigned: int  # utterances the plan put in them
    dropped: Counter[str]  # utterances the plan left out, counted with these batches


@dataclass(frozen=True)
class PlanOptions:
    """Everything besides the shards, the seed and the epoch that decides the batches."""

    max_frames: int | None = None
    max_batch_size: int | None = None
    shuffle_buffer: int = 2000
    pool_size: int = DEFAULT_POOL_SIZE
    min_frames: int | None = None
    max_utt_frames: int | None = None
    streams: int | None = None  # None: see num_streams
    train: bool = True  # False (dev): shards in order, no shuffle, the same plan every epoch
    max_utts_per_speaker: int | None = None  # per batch; the plan then needs every utterance's speaker
    cost: CostModel | None = None  # what a batch costs (loading/cost.py), bounded by max_cost
    max_cost: float | None = None
    speed: Speed | None = None  # speed perturbation (loading/augment.py): the corpus plans with the perturbed lengths

    def __post_init__(self) -> None:
        self.fit  # building it checks the bounds
        check_batching(self.pool_size, max_utts_per_speaker=self.max_utts_per_speaker)
        if self.streams is not None and self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")

    @property
    def fit(self) -> BatchFit:
        """The rule the plan's batches are cut by."""
        return BatchFit(self.max_frames, self.max_batch_size, self.cost, self.max_cost)

    def num_streams(self, num_shards: int, num_utts: int) -> int:
        """The streams given, or min(shards, 64, utterances // 2,000); never more than the shards."""
        wanted = self.streams or min(DEFAULT_STREAMS, num_utts // MIN_STREAM_UTTS)
        return max(1, min(num_shards, wanted))


@dataclass
class StreamPlan:
    """One stream's epoch: its shards in reading order and its batches, in order, as global rows."""

    stream: int
    shards: np.ndarray  # shard indices, in the order the stream reads them
    rows: np.ndarray  # int64: the rows (utterances) of every batch, batch after batch
    starts: np.ndarray  # int64 [batches + 1]: batch j is rows[starts[j]:starts[j + 1]]
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> utterances the plan left out

    @property
    def num_batches(self) -> int:
        return len(self.starts) - 1

    def batch(self, j: int) -> np.ndarray:
        return self.rows[self.starts[j]:self.starts[j + 1]]


@dataclass
class EpochPlan:
    """Every stream's plan for one epoch."""

    epoch: int
    streams: list[StreamPlan]

    @property
    def counts(self) -> np.ndarray:
        """Batches per stream."""
        return np.array([s.num_batches for s in self.streams], np.int64)

    @property
    def num_batches(self) -> int:
        return int(self.counts.sum())

    @property
    def dropped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.streams:
            for k, v in s.dropped.items():
                out[k] = out.get(k, 0) + v
        return out


def fingerprint(options: PlanOptions, shards_fingerprint: str, extra: object = None) -> str:
    """A digest of a plan's inputs besides seed and epoch: options, the shard set, and ``extra``."""
    opts = asdict(options)
    for added in ("cost", "max_cost", "speed"):  # options added later: left out while unused, so older states resume
        if opts[added] is None:
            del opts[added]
    doc = {"options": opts, "shards": shards_fingerprint, "extra": extra}
    return hashlib.blake2b(json.dumps(doc, sort_keys=True, default=repr).encode(), digest_size=8).hexdigest()


def deal_shards(shard_frames: np.ndarray, num_streams: int, *, seed: int, epoch: int,
                shuffle: bool) -> list[np.ndarray]:
    """Shard indices of each stream, in reading order: a fresh permutation per (seed, epoch), dealt
    greedily by frames, so streams differ by at most one shard's frames and change every epoch."""
    n = len(shard_frames)
    order = np.random.default_rng([seed, epoch]).permutation(n).tolist() if shuffle else list(range(n))
    weights = np.maximum(np.asarray(shard_frames, np.int64), 1)
    return [np.array(s, np.int64) for s in least_loaded(order, weights, num_streams)]


def reservoir_order(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """The order in which a shuffle buffer of ``size`` emits arrivals ``0..n-1``.

    The buffer fills with the first ``size`` arrivals; then each arrival takes a random slot and
    the arrival that held it goes out; at the end the buffer goes out in random order (webdataset's
    and CAT's shuffle buffer).  A block of arrivals is exchanged at once: an arrival's output is the
    last earlier arrival of its block that took its slot, else the slot's holder before the block.
    """
    if size <= 1 or n <= size:
        return rng.permutation(n) if size > 1 else np.arange(n)
    buf = np.arange(size, dtype=np.int64)
    out = np.empty(n, np.int64)
    done = 0
    for first in range(size, n, _BUFFER_BLOCK):
        arrivals = np.arange(first, min(n, first + _BUFFER_BLOCK), dtype=np.int64)
        m = len(arrivals)
        slots = rng.integers(size, size=m)
        order = stable_order(slots)  # arrivals grouped by slot, in arrival order within one
        grouped = slots[order]
        edge = np.ones(m + 1, bool)
        edge[1:-1] = grouped[1:] != grouped[:-1]
        head, tail = edge[:-1], edge[1:]  # first and last of their slot's group
        emitted = np.empty(m, np.int64)
        emitted[order[head]] = buf[grouped[head]]
        emitted[order[~head]] = arrivals[order[np.flatnonzero(~head) - 1]]
        buf[grouped[tail]] = arrivals[order[tail]]
        out[done:done + m] = emitted
        done += m
    out[done:] = buf[rng.permutation(size)]
    return out


def plan_stream(starts: np.ndarray, frames: np.ndarray, shards: np.ndarray, stream: int, *, seed: int, epoch: int,
                options: PlanOptions, speakers: np.ndarray | None = None,
                tokens: np.ndarray | None = None) -> StreamPlan:
    """One stream's batches from its shards' rows (``starts``: row offsets per shard; ``frames``,
    ``speakers`` (needed by ``max_utts_per_speaker`` only) and ``tokens`` (each label's length,
    needed by a cost model that counts them) per row)."""
    if len(shards):
        rows = np.concatenate([np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards])
    else:
        rows = np.zeros(0, np.int64)
    if options.train and options.shuffle_buffer > 1:
        rng = np.random.default_rng([seed, epoch, stream, _SHUFFLE])
        rows = rows[reservoir_order(len(rows), options.shuffle_buffer, rng)]
    lens = np.asarray(frames[rows], np.int64)
    dropped: dict[str, int] = {}
    keep = np.ones(len(rows), bool)
    for reason, bound, bad in (("too_short", options.min_frames, lambda x, b: x < b),
                               ("too_long", options.max_utt_frames, lambda x, b: x > b)):
        if bound is not None:
            out = bad(lens, bound) & keep
            if out.any():
                dropped[reason] = int(out.sum())
                keep &= ~out
    if not keep.all():
        rows, lens = rows[keep], lens[keep]
    positions, batch_starts = bucket_pools(lens, fit=options.fit, pool_size=options.pool_size,
                                           rng=np.random.default_rng([seed, epoch, stream, _BATCHES]),
                                           tokens=None if tokens is None else np.asarray(tokens[rows]),
                                           speakers=None if speakers is None else np.asarray(speakers[rows]),
                                           max_utts_per_speaker=options.max_utts_per_speaker)
    return StreamPlan(stream, shards, rows[positions], batch_starts, dropped)


def plan_epoch(utts: np.ndarray, frames: np.ndarray, options: PlanOptions, *, seed: int, epoch: int,
               streams: Sequence[int] | None = None, speakers: np.ndarray | None = None,
               tokens: np.ndarray | None = None) -> EpochPlan:
    """The plan of ``epoch`` over shards of ``utts[i]`` utterances whose frames are ``frames`` (shard after
    shard); ``streams`` plans only those (a worker needs only its own), the rest left empty.
    ``speakers`` (an int id per utterance) is needed with ``options.max_utts_per_speaker`` only,
    ``tokens`` (each label's length in tokens) with a cost model that counts them."""
    if options.fit.uses_tokens and (tokens is None or len(tokens) != len(frames)):
        raise ValueError("the cost model counts label tokens: the plan needs every label's length in tokens")
    if options.max_utts_per_speaker is not None and (speakers is None or len(speakers) != len(frames)):
        raise ValueError("max_utts_per_speaker needs every utterance's speaker (from the index)")
    utts = np.asarray(utts, np.int64)
    starts = np.concatenate([[0], np.cumsum(utts)]).astype(np.int64)
    shard_frames = (np.add.reduceat(frames, starts[:-1], dtype=np.int64) if len(frames)  # no int64 copy of frames
                    else np.zeros(len(utts)))
    shard_frames = np.where(utts > 0, shard_frames, 0)  # reduceat repeats a value for empty shards
    epoch = epoch if options.train else 0  # dev mode: the same batches every epoch
    dealt = deal_shards(shard_frames, options.num_streams(len(utts), int(starts[-1])), seed=seed, epoch=epoch,
                        shuffle=options.train)
    wanted = set(range(len(dealt))) if streams is None else set(streams)
    plans = []
    for s, shards in enumerate(dealt):
        if s in wanted:
            plans.append(plan_stream(starts, frames, shards, s, seed=seed, epoch=epoch, options=options,
                                     speakers=speakers if options.max_utts_per_speaker is not None else None,
                                     tokens=tokens if options.fit.uses_tokens else None))
        else:
            plans.append(StreamPlan(s, shards, np.zeros(0, np.int64), np.zeros(1, np.int64)))
    return EpochPlan(epoch, plans)
