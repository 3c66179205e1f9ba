"""The epoch plan: every batch of an epoch, decided from the index before the epoch starts.

A pure function of (the shard set's utterance counts and frames, the options, seed, epoch): no
I/O, no torch, and nothing about ranks or workers.  It lays the epoch out in ``streams``
canonical streams, each a deterministic pipeline over utterance rows::

    shards in a fresh order per (seed, epoch), dealt to streams by frames
      -> each stream: its shards' rows in order -> shuffle buffer -> length and label filters
      -> length pools -> batches (positions in random order within a pool)

Where the fit counts label tokens, pools are ordered by frames and tokens both (``batching.
band_order``).  Such pools need many batches to be homogeneous in both, so they hold
:data:`TOKEN_POOL_BATCHES` typical batches at least, and a stream a pool (:func:`layout`).

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
from typing import Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from wdsprep.options import FILE_OR_OBJECT, NUMBER, SWITCH, fingerprinted, option
from wdsprep.plan.assign import least_loaded
from wdsprep.plan.augment import Speed
from wdsprep.plan.batching import (
    BAND_WIDTH,
    DEFAULT_POOL_SIZE,
    BatchFit,
    bucket_pools,
    check_batching,
    stable_order,
)
from wdsprep.plan.cost import CostModel, load_cost
from wdsprep.units import FRAMES_PER_SECOND, seconds_to_frames

# Streams by default: at most 64, never more than there are shards, and at least ~2,000 utterances
# each: a stream is batched from its own length pools, and a smaller one pads more (lognormal
# lengths, median 600 frames, max_frames 20,000: 0.967 with 1,000 per stream, 0.982 with 2,000,
# 0.990 with 4,000; at 50,000: 0.922, 0.957, 0.977).
DEFAULT_STREAMS = 64
MIN_STREAM_UTTS = 2000
# Pools ordered by frames and tokens hold this many typical batches at least (and streams a pool):
# on lognormal frames and text rates, >= 0.97 frames padding with +0.1 label padding over pools
# sorted by frames needed about 120 batches a pool (tools/bench/bench_cost.py, docs/batching.md).
TOKEN_POOL_BATCHES = 128
# The typical batch: what a batch holds at the shape of the utterance at this percentile of room
# (a batch pads to its longest, so it holds fewer than the median utterance's room).
TYPICAL_ROOM_PERCENTILE = 20
TYPICAL_SAMPLE = 65_536
# Why the plan leaves an utterance out -> (the option that sets the rule, the utterances it drops:
# a function of each row's measures, "frames", "tokens" and "tokens_per_second", and the option's
# value).  Applied in this order; an utterance is counted by the first that drops it.
Measures = Mapping[str, np.ndarray]
FILTERS: dict[str, tuple[str, Callable[[Measures, float], np.ndarray]]] = {
    "too_short": ("min_frames", lambda m, n: m["frames"] < n),
    "too_long": ("max_utt_frames", lambda m, n: m["frames"] > n),
    "too_many_tokens_per_second": ("max_tokens_per_second", lambda m, x: m["tokens_per_second"] > x),
    "too_few_tokens_per_second": ("min_tokens_per_second", lambda m, x: m["tokens_per_second"] < x),
    "label_too_long": ("max_label_tokens", lambda m, n: m["tokens"] > n),
    # CAT's CTC rule: frames // N encoder outputs cannot align a label of that many tokens.  Decided
    # here, with the frames the reader delivers (after speed perturbation), so a planned batch is
    # never emptied later; the reader applies it again to the labels it makes (subword sampling).
    "ctc_too_short": ("ctc_subsampling", lambda m, n: m["frames"] // int(n) <= m["tokens"]),
}
# The filters that need every label's length in tokens.
TOKEN_FILTERS = ("max_tokens_per_second", "min_tokens_per_second", "max_label_tokens", "ctc_subsampling")
# Percentiles of tokens per second that token_rates reports.
RATE_PERCENTILES = (0.1, 1, 5, 25, 50, 75, 95, 99, 99.9)
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

    max_frames: int | None = option(None, "padded frames per rank batch (B x longest)", plan=True, common=True,
                                    doc="per-rank bound on padded frames per batch (B x longest); a longer "
                                        "utterance becomes a batch of its own. Give it, or cost and max_cost, or "
                                        "both (a batch then fits both)")
    max_duration: float | None = option(
        None, "max_frames in seconds of audio: padded seconds per rank batch (B x longest), 100 frames a second",
        kind=NUMBER, metavar="SECONDS", plan=True, when_set=True, common=True,
        doc="max_frames given in seconds: a per-rank bound on a batch's padded seconds (B x longest, as max_frames "
            "is; not the summed seconds), mapped to max_frames at the shards' 100 frames a second (20 -> 2000); "
            "give one of the two")
    max_batch_size: int | None = option(None, "utterances per batch at most", plan=True, common=True)
    shuffle_buffer: int = option(2000, "utterances each stream's shuffle buffer holds", plan=True, common=True)
    pool_size: int = option(DEFAULT_POOL_SIZE, "utterances sorted together into batches", plan=True,
                            doc="utterances sorted together into batches by the bucketing (wdsprep.plan.batching)")
    min_frames: int | None = option(None, "drop shorter utterances (counted)", plan=True)
    max_utt_frames: int | None = option(None, "drop longer utterances (counted)", plan=True)
    streams: int | None = option(None, "canonical streams the epoch is planned in (default: min(shards, 64, "
                                       "utterances // 2000))", plan=True,
                                 doc="canonical streams the epoch is planned in (default: min(shards, 64, "
                                     "utterances // 2000), at least 1); each is read by one reader, so at least "
                                     "world_size x num_workers keeps every worker busy")
    train: bool = option(True, "dev/validation: no shuffle, every batch once, ranks may differ", kind=SWITCH,
                         flag="--dev", plan=True, common=True,
                         doc="False for dev/validation: no shuffle, every batch yielded once, ranks may differ in"
                             " steps")
    max_utts_per_speaker: int | None = option(None, "at most N utterances of one speaker per batch (speakers from "
                                                    "the index)", plan=True,
                                              doc="at most this many utterances of one speaker per batch "
                                                  "(speakers from the index: pack --utt2spk, else the speaker "
                                                  "each id names; docs/shuffle.md)")
    cost: CostModel | None = option(None, "the cost model of a training step (JSON, e.g. from wdsprep calibrate): "
                                          "batches are cut by what they cost, within --max-cost", kind=FILE_OR_OBJECT,
                                    plan=True, when_set=True, common=True,
                                    doc="what a batch costs a training step, B x c(t, u) (wdsprep.plan.cost): a "
                                        "CostModel, a dict of its coefficients, or the JSON file wdsprep "
                                        "calibrate writes")
    max_cost: float | None = option(None, "per-rank bound on a batch's cost under --cost", kind=NUMBER,
                                    plan=True, when_set=True, common=True,
                                    doc="per-rank bound on a batch's cost under cost; an utterance over it is a "
                                        "batch of its own. A model that counts label tokens needs every label's "
                                        "length: counted once per index folder and tokenizer and kept beside the "
                                        "index (docs/batching.md)")
    # Speed perturbation (plan/augment.py), the part of augment the plan draws: the corpus plans
    # with the perturbed lengths.  Not an option of its own.
    speed: Speed | None = field(default=None, metadata={"when_set": True})
    # Label filters: counted by reason, decided with the plan from the token column.
    max_tokens_per_second: float | None = option(
        None, "drop utterances with more label tokens per second of audio than this (counted; dry-run --plan prints "
              "the distribution)", kind=NUMBER, metavar="X", plan=True, when_set=True,
        doc="drop utterances whose label has more tokens of the tokenizer per second of audio than this: "
            "misaligned transcripts (400 characters on one second of audio) that would blow up a batch's labels. "
            "Decided when the epoch is planned, from the label lengths counted once per index folder and "
            "tokenizer (docs/batching.md), so len stays exact; counted by reason in stats.dropped. dry-run --plan"
            " prints the distribution to choose from")
    min_tokens_per_second: float | None = option(
        None, "drop utterances with fewer label tokens per second of audio than this (counted)", kind=NUMBER,
        metavar="X", plan=True, when_set=True)
    max_label_tokens: int | None = option(None, "drop utterances whose label has more tokens than this (counted)",
                                          plan=True, when_set=True)
    ctc_subsampling: int | None = option(None, "drop utterances with frames // N <= label length (CAT's CTC rule; "
                                               "decided with the plan, counted as ctc_too_short)", plan=True,
                                         when_set=True, common=True,
                                         doc="drop utterances with frames // ctc_subsampling <= label length "
                                             "(CAT's CTC rule), decided when the epoch is planned, with the "
                                             "frames the readers deliver (after speed perturbation) and each "
                                             "label's length counted once per index folder and tokenizer, so no "
                                             "planned batch is emptied by it; the readers apply it again to the "
                                             "labels they make (subword sampling can lengthen one: dry-run --plan"
                                             " counts the batches that could end empty then). Counted as "
                                             "ctc_too_short")

    def __post_init__(self) -> None:
        if self.max_duration is not None:
            frames = seconds_to_frames(self.max_duration, what="max_duration")
            if self.max_frames is not None and self.max_frames != frames:
                raise ValueError(f"max_duration={self.max_duration:g} s is max_frames={frames}, and max_frames="
                                 f"{self.max_frames} is given too: give one of them")
            if frames < 1:
                raise ValueError(f"max_duration={self.max_duration!r} s is less than one 10 ms frame")
            object.__setattr__(self, "max_frames", frames)
        if self.cost is not None:
            object.__setattr__(self, "cost", load_cost(self.cost))
        object.__setattr__(self, "_fit", BatchFit(self.max_frames, self.max_batch_size, self.cost, self.max_cost))
        check_batching(self.pool_size, max_utts_per_speaker=self.max_utts_per_speaker)
        if self.streams is not None and self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        for name in ("max_tokens_per_second", "min_tokens_per_second"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not np.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be None or a finite number >= 0, got {value!r}")
        low, high = self.min_tokens_per_second, self.max_tokens_per_second
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_tokens_per_second ({low}) is above max_tokens_per_second ({high}): every "
                             f"utterance would be dropped")
        for name in ("max_label_tokens", "ctc_subsampling"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
                                          and value >= 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")

    @property
    def fit(self) -> BatchFit:
        """The rule the plan's batches are cut by (checked when the options are made)."""
        return self._fit  # type: ignore[attr-defined]

    @property
    def token_filters(self) -> list[str]:
        """The filters set that drop utterances by their labels' length in tokens."""
        return [name for name in TOKEN_FILTERS if getattr(self, name) is not None]

    @property
    def filters_tokens(self) -> bool:
        """Whether utterances are dropped by their labels' length in tokens."""
        return bool(self.token_filters)

    @property
    def needs_tokens(self) -> bool:
        """Whether the plan needs every label's length in tokens: the fit counts them, or a filter."""
        return self.fit.uses_tokens or self.filters_tokens

    def num_streams(self, num_shards: int, num_utts: int, stream_utts: int = MIN_STREAM_UTTS) -> int:
        """The streams given, or min(shards, 64, utterances // ``stream_utts``); never more than the shards."""
        wanted = self.streams or min(DEFAULT_STREAMS, num_utts // stream_utts)
        return max(1, min(num_shards, wanted))


class Layout(NamedTuple):
    """How a corpus's epochs are laid out: its streams, the utterances sorted together in a pool, and
    the fewest utterances a stream holds unless ``streams`` is given."""

    streams: int
    pool: int
    stream_utts: int


def typical_batch(fit: BatchFit, frames: np.ndarray, tokens: np.ndarray) -> int:
    """Utterances a typical batch holds: the room at the :data:`TYPICAL_ROOM_PERCENTILE` th
    percentile of the utterances' own, over every row or, in a large corpus, rows at an even
    stride (at most 2 x :data:`TYPICAL_SAMPLE`).  An integer of the data: the same on every machine."""
    step = max(1, len(frames) // TYPICAL_SAMPLE)
    room = fit.room(frames[::step], tokens[::step])
    if not len(room):
        return 1
    k = len(room) * TYPICAL_ROOM_PERCENTILE // 100
    return int(np.partition(room, k)[k])


def layout(options: PlanOptions, utts: np.ndarray, frames: np.ndarray, tokens: np.ndarray | None = None) -> Layout:
    """The layout of a corpus of shards of ``utts[i]`` utterances with these ``frames`` (and label
    ``tokens``), from the index: ``pool_size`` and :meth:`PlanOptions.num_streams`; where the fit
    counts tokens, pools and streams of :data:`TOKEN_POOL_BATCHES` typical batches at least."""
    num_shards, num_utts = len(utts), int(np.sum(utts))
    if not options.fit.uses_tokens:
        return Layout(options.num_streams(num_shards, num_utts), options.pool_size, MIN_STREAM_UTTS)
    if tokens is None or len(tokens) != len(frames):
        raise ValueError("the cost model counts label tokens: the plan needs every label's length in tokens "
                         "(give the tokenizer)")
    wanted = TOKEN_POOL_BATCHES * typical_batch(options.fit, frames, tokens)
    stream_utts = max(MIN_STREAM_UTTS, wanted)
    return Layout(options.num_streams(num_shards, num_utts, stream_utts), max(options.pool_size, wanted), stream_utts)


@dataclass
class StreamPlan:
    """One stream's epoch: its shards in reading order and its batches, in order, as global rows."""

    stream: int
    shards: np.ndarray  # shard indices, in the order the stream reads them
    rows: np.ndarray  # the rows (utterances) of every batch, batch after batch (int32 where they fit: compact_rows)
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


def filtered_out(plan: EpochPlan, options: PlanOptions) -> str:
    """What the plan's filters left out of an epoch, naming each filter and its value (for a
    message when the epoch has too few batches); empty when they left nothing out."""
    dropped = plan.dropped
    if not dropped:
        return ""
    kept = sum(len(s.rows) for s in plan.streams)
    parts = [f"{n:,} by {FILTERS[r][0]}={getattr(options, FILTERS[r][0])!r} ({r})" for r, n in dropped.items()]
    every = "every one" if not kept else f"{sum(dropped.values()):,}"
    return (f"; the plan's filters leave out {every} of its {kept + sum(dropped.values()):,} utterances: "
            f"{', '.join(parts)}: relax {' or '.join(FILTERS[r][0] for r in dropped)}")


def options_json(options: PlanOptions) -> dict[str, object]:
    """The plan's options as a fingerprint holds them (and a resume state should): fields marked
    ``when_set`` only when set (``options.fingerprinted``), the cost model as its JSON, where a
    coefficient added later is left out at 0, so the states of older versions still compare equal."""
    kept = fingerprinted(options)
    kept.pop("max_duration", None)  # max_frames holds it: the same plan, however the budget was spelled
    opts: dict[str, object] = {k: v for k, v in asdict(options).items() if k in kept}
    if options.cost is not None:
        opts["cost"] = options.cost.to_json()
    return opts


# The revision of the rules a plan is cut by, recorded in resume states: a state of an older
# revision was planned by other rules, and its epoch cannot be planned again to resume it.
# 2: training pools shaken and their first batch cut at a random point (batching.shaken,
# varied_cuts).  Dev plans are cut plainly; the "cuts" key of their fingerprint tells them from
# the shaken dev plans a wdsprep of this revision made before.
PLAN_REVISION = 2


def fingerprint(options: PlanOptions, shards_fingerprint: str, extra: object = None) -> str:
    """A digest of a plan's inputs besides seed and epoch: options, the shard set, and ``extra``."""
    doc: dict[str, object] = {"options": options_json(options), "shards": shards_fingerprint, "extra": extra,
                              "revision": PLAN_REVISION}
    if not options.train:
        doc["cuts"] = "plain"
    if options.fit.uses_tokens:  # how pools are laid out and ordered decides those plans' batches
        doc["pools"] = {"order": "frames, then tokens in bands", "band_width": BAND_WIDTH,
                        "batches": TOKEN_POOL_BATCHES, "typical": TYPICAL_ROOM_PERCENTILE}
    return hashlib.blake2b(json.dumps(doc, sort_keys=True, default=repr).encode(), digest_size=8).hexdigest()


def tokens_per_second(frames: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """float64: each label's tokens per second of its audio (frames are 10 ms; an utterance of no
    frames counts as one frame long)."""
    return np.asarray(tokens, np.float64) * FRAMES_PER_SECOND / np.maximum(np.asarray(frames, np.float64), 1)


def token_rates(frames: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """The distribution of tokens per second over a shard set (``frames`` and ``tokens`` per row):
    its percentiles (:data:`RATE_PERCENTILES`, keys ``"p50"`` ...), ``"min"``, ``"max"`` and
    ``"utterances"``: what ``min_tokens_per_second`` and ``max_tokens_per_second`` are chosen from."""
    rate = tokens_per_second(frames, tokens)
    if not len(rate):
        return {"utterances": 0}
    points = np.percentile(rate, RATE_PERCENTILES)
    return {"utterances": len(rate), "min": float(rate.min()),
            **{f"p{p:g}": float(v) for p, v in zip(RATE_PERCENTILES, points)}, "max": float(rate.max())}


def describe_rates(rates: dict[str, float]) -> str:
    """:func:`token_rates` in one line."""
    if not rates.get("utterances"):
        return "no utterances"
    return ", ".join(f"{k} {v:.3g}" for k, v in rates.items() if k != "utterances")


def stream_shards(utts: np.ndarray, frames: np.ndarray, num_streams: int, *, seed: int, epoch: int,
                  shuffle: bool) -> list[np.ndarray]:
    """Shard indices of each stream of ``epoch``, in reading order, for shards of ``utts[i]``
    utterances whose frames are ``frames`` (shard after shard): :func:`deal_shards` by their frames."""
    return deal_shards(shard_sums(utts, frames), num_streams, seed=seed, epoch=epoch, shuffle=shuffle)


# Rows summed per numpy step by shard_sums: its int64 copy of them stays 8 MB.
_SUM_ROWS = 1 << 20


def shard_sums(utts: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """int64: each shard's frames, for shards of ``utts[i]`` rows of ``frames`` one after another.

    A shard's rows at a time up to :data:`_SUM_ROWS`: ``np.add.reduceat(frames, ..., dtype=int64)``
    over the whole column makes an int64 copy of it first (288 MB at 36 M utterances, on every
    stream a reader plans)."""
    utts = np.asarray(utts, np.int64)
    starts = np.concatenate([[0], np.cumsum(utts)]).astype(np.int64)
    out = np.zeros(len(utts), np.int64)
    i = 0
    while i < len(utts):
        j = max(i + 1, int(np.searchsorted(starts, starts[i] + _SUM_ROWS, side="right")) - 1)
        j = min(j, len(utts))
        a, b = int(starts[i]), int(starts[j])
        full = np.flatnonzero(utts[i:j] > 0)  # reduceat gives an empty shard its neighbour's value: only the others
        if len(full):
            part = np.add.reduceat(np.asarray(frames[a:b], np.int64), starts[i:j][full] - a)
            out[i + full] = part
        i = j
    return out


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


class StreamRows(NamedTuple):
    """A stream's utterances before they are batched: its rows in the order its shuffle buffer
    gives them, those the filters keep, and what they left out by reason."""

    rows: np.ndarray  # int64, the rows kept
    dropped: dict[str, int]


def stream_rows(starts: np.ndarray, frames: np.ndarray, shards: np.ndarray, stream: int, *, seed: int, epoch: int,
                options: PlanOptions, tokens: np.ndarray | None = None) -> StreamRows:
    """One stream's rows: its shards' rows in reading order (``starts``: row offsets per shard),
    through the shuffle buffer (training), then the length and label filters (:data:`FILTERS`;
    ``tokens``: each label's length, needed by the label filters)."""
    if options.filters_tokens and tokens is None:
        raise ValueError(f"{', '.join(options.token_filters)} need every label's length in tokens")
    if len(shards):
        rows = np.concatenate([np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards])
    else:
        rows = np.zeros(0, np.int64)
    if options.train and options.shuffle_buffer > 1:
        rng = np.random.default_rng([seed, epoch, stream, _SHUFFLE])
        rows = rows[reservoir_order(len(rows), options.shuffle_buffer, rng)]
    lens = np.asarray(frames[rows], np.int64)
    labels = None if tokens is None else np.asarray(tokens[rows], np.int64)
    measures = {"frames": lens}
    if labels is not None:
        measures.update(tokens=labels, tokens_per_second=tokens_per_second(lens, labels))
    dropped: dict[str, int] = {}
    keep = np.ones(len(rows), bool)
    for reason, (name, drops) in FILTERS.items():
        bound = getattr(options, name)
        if bound is not None:
            out = drops(measures, bound) & keep
            if out.any():
                dropped[reason] = int(out.sum())
                keep &= ~out
    return StreamRows(rows if keep.all() else rows[keep], dropped)


Cut = tuple[np.ndarray, np.ndarray]  # (rows in batch order, batch starts)


def cut_batches(rows: np.ndarray, frames: np.ndarray, rng: np.random.Generator, *, options: PlanOptions, pool: int,
                speakers: np.ndarray | None = None, tokens: np.ndarray | None = None) -> Cut:
    """``rows`` cut into batches in pools of ``pool`` utterances, by their ``frames[rows]`` (and,
    where the plan needs them, ``speakers[rows]`` and label lengths ``tokens[rows]``): the rows in
    batch order and where each batch starts, the batches in a random order."""
    labels = None if not options.fit.uses_tokens or tokens is None else np.asarray(tokens[rows])
    positions, batch_starts = bucket_pools(np.asarray(frames[rows], np.int64), fit=options.fit, pool_size=pool,
                                           rng=rng, tokens=labels,
                                           speakers=None if speakers is None else np.asarray(speakers[rows]),
                                           max_utts_per_speaker=options.max_utts_per_speaker, vary=options.train)
    return rows[positions], batch_starts


def plan_stream(starts: np.ndarray, frames: np.ndarray, shards: np.ndarray, stream: int, *, seed: int, epoch: int,
                options: PlanOptions, speakers: np.ndarray | None = None, tokens: np.ndarray | None = None,
                pool: int | None = None) -> StreamPlan:
    """One stream's batches from its shards' rows (:func:`stream_rows`, then :func:`cut_batches`;
    ``speakers``, needed by ``max_utts_per_speaker`` only, and ``tokens``, each label's length,
    needed by a cost model that counts them and by the label filters, per row), in pools of
    ``pool`` utterances (the layout's; default ``pool_size``)."""
    kept = stream_rows(starts, frames, shards, stream, seed=seed, epoch=epoch, options=options, tokens=tokens)
    rows, batch_starts = cut_batches(kept.rows, frames, np.random.default_rng([seed, epoch, stream, _BATCHES]),
                                     options=options, pool=pool or options.pool_size, speakers=speakers,
                                     tokens=tokens)
    return StreamPlan(stream, shards, compact_rows(rows, len(frames)), batch_starts, kept.dropped)


def compact_rows(rows: np.ndarray, num_rows: int) -> np.ndarray:
    """``rows`` (of a corpus of ``num_rows``) as int32 where every row number fits: a whole epoch's
    plan is one row number per utterance, which every rank's main process holds (144 MB at 36 M
    utterances instead of 288)."""
    return rows.astype(np.int32) if num_rows <= np.iinfo(np.int32).max else rows


def plan_epoch(utts: np.ndarray, frames: np.ndarray, options: PlanOptions, *, seed: int, epoch: int,
               streams: Sequence[int] | None = None, speakers: np.ndarray | None = None,
               tokens: np.ndarray | None = None, laid_out: Layout | None = None) -> EpochPlan:
    """The plan of ``epoch`` over shards of ``utts[i]`` utterances whose frames are ``frames`` (shard after
    shard); ``streams`` plans only those (a worker needs only its own), the rest left empty.
    ``speakers`` (an int id per utterance) is needed with ``options.max_utts_per_speaker`` only,
    ``tokens`` (each label's length in tokens) with a cost model that counts them or a label filter
    (``options.needs_tokens``).  ``laid_out``: the corpus's :func:`layout` (default: from these
    frames; a corpus with speed perturbation lays its epochs out from the index's)."""
    plans = list(plan_streams(utts, frames, options, seed=seed, epoch=epoch, streams=streams, speakers=speakers,
                              tokens=tokens, laid_out=laid_out))
    return EpochPlan(epoch if options.train else 0, plans)


def plan_streams(utts: np.ndarray, frames: np.ndarray, options: PlanOptions, *, seed: int, epoch: int,
                 streams: Sequence[int] | None = None, speakers: np.ndarray | None = None,
                 tokens: np.ndarray | None = None, laid_out: Layout | None = None) -> Iterator[StreamPlan]:
    """:func:`plan_epoch`'s streams one after another, each planned when asked for: a caller that
    keeps only what it needs of each (its batch counts) holds one stream's rows at a time."""
    if options.needs_tokens and (tokens is None or len(tokens) != len(frames)):
        why = "the cost model counts label tokens" if options.fit.uses_tokens else \
            f"{', '.join(options.token_filters)} count label tokens"
        raise ValueError(f"{why}: the plan needs every label's length in tokens (give the tokenizer)")
    if options.max_utts_per_speaker is not None and (speakers is None or len(speakers) != len(frames)):
        raise ValueError("max_utts_per_speaker needs every utterance's speaker (from the index)")
    utts = np.asarray(utts, np.int64)
    starts = np.concatenate([[0], np.cumsum(utts)]).astype(np.int64)
    epoch = epoch if options.train else 0  # dev mode: the same batches every epoch
    laid_out = laid_out or layout(options, utts, frames, tokens)
    dealt = stream_shards(utts, frames, laid_out.streams, seed=seed, epoch=epoch, shuffle=options.train)
    wanted = set(range(len(dealt))) if streams is None else set(streams)
    for s, shards in enumerate(dealt):
        if s in wanted:
            yield plan_stream(starts, frames, shards, s, seed=seed, epoch=epoch, options=options,
                              speakers=speakers if options.max_utts_per_speaker is not None else None,
                              tokens=tokens if options.needs_tokens else None, pool=laid_out.pool)
        else:
            yield StreamPlan(s, shards, np.zeros(0, np.int64), np.zeros(1, np.int64))
