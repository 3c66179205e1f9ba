"""The pure side of ``wdsprep calibrate``: the timing grid, the fit of the cost model and the
memory search, on plain numbers (numpy and scipy; no torch, so they are tested without it).

``check/calibrate.py`` times the user's model on the shapes :func:`length_grid` and
:func:`label_tokens` give, and hands the timings to :func:`fit_cost`; on CUDA it hands
:func:`search_memory` a probe that runs a training step and says whether it fitted.  The model
they fit is :class:`wdsprep.plan.cost.CostModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import nnls

from wdsprep.plan.corpus import Corpus
from wdsprep.plan.cost import COEFFICIENTS, CostModel
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.streams import PlanOptions

LENGTHS = 9  # lengths of the timing grid; the odd ones are held out of the fit
FRAME_QUANTILES = (0.05, 0.999)  # the corpus's length range the grid covers
MIN_SPAN = 4  # the grid spans at least this ratio of lengths, or t and t^2 cannot be told apart
# At each length the grid times labels of the most tokens a label is taken to hold, divided by
# these: with the label length proportional to the frames, two ratios of u to t leave t^2, t*u and
# u^2 indistinguishable (a quadratic in u/t through two points); three tell them apart, the wider
# apart the better under noise (on a transducer timed on a loaded 2-core machine, 1:2:4 put 0-44%
# of the cost in t*u from run to run, 1:3:9 28-44%; with a cheaper loss, 55-66%).
LABEL_DIVISORS = (1, 3, 9)
# The terms of c(t, u), in COEFFICIENTS' order, and how the report names them.
TERMS = ("", "*t", "*t^2", "*u", "*u^2", "*t*u")
OOM_REL_GAP = 0.05  # the search stops when the largest fitting and smallest failing batch are this close
OOM_START, OOM_CAP = 16, 1 << 16


@dataclass(frozen=True)
class Shape:
    """A synthetic batch: ``size`` utterances of ``frames`` frames, labels of ``tokens`` tokens."""

    size: int
    frames: int
    tokens: int


@dataclass
class Timing:
    shape: Shape
    seconds: float  # the fastest of the rounds
    rounds: list[float] = field(default_factory=list)
    held_out: bool = False


@dataclass
class MemorySearch:
    """The memory search: per length bucket, the largest batch that trained."""

    margin: float
    buckets: list[tuple[Shape, float]]  # (largest batch that fit, its cost); size 0: one utterance is too much
    max_cost: float | None
    cap: int = OOM_CAP  # no batch larger than this was tried


# --- the grid and the fit ---------------------------------------------------------------------

def length_grid(frames: np.ndarray, count: int = LENGTHS) -> np.ndarray:
    """``count`` lengths spaced geometrically over the corpus's 5th..99.9th percentile of frames
    (widened downwards to span ``MIN_SPAN``: a narrow range cannot tell t from t^2)."""
    lo, hi = np.quantile(np.asarray(frames, np.float64), FRAME_QUANTILES)
    hi = max(2.0, math.ceil(hi))
    lo = max(1.0, min(math.floor(lo), hi / MIN_SPAN))
    return np.round(np.geomspace(lo, hi, count)).astype(np.int64)


def label_tokens(frames: int, *, tokens_per_frame: float, max_tokens: int | None, subsampling: int) -> int:
    """The most tokens a label of an utterance of ``frames`` frames is taken to hold: the rate,
    at most ``max_tokens``, and at most the subsampled frames (what CTC can align)."""
    u = math.ceil(tokens_per_frame * frames)
    if max_tokens is not None:
        u = min(u, max_tokens)
    return max(1, min(u, frames // subsampling))


def grid_labels(tokens: int) -> list[int]:
    """The label lengths the grid times at a length whose longest label is ``tokens``: that, and
    it divided by :data:`LABEL_DIVISORS` (at least 1 token, each once)."""
    return sorted({max(1, tokens // d) for d in LABEL_DIVISORS})


def cost_terms(t: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The terms of ``c(t, u)`` at each (t, u), one column per coefficient, in
    :data:`~wdsprep.plan.cost.COEFFICIENTS`' order."""
    t, u = np.asarray(t, np.float64), np.asarray(u, np.float64)
    return np.stack([np.ones_like(t), t, t * t, u, u * u, t * u], axis=-1)


def timing_noise(timings: Sequence[Timing]) -> float:
    """The timing noise of a grid: the median over shapes of how much slower a shape's second
    fastest round was than its fastest (0 where no shape has two rounds).  Other work on the machine
    only adds time, so the fastest rounds are the truest, and their spread is what is left of it."""
    spreads = [(r[1] - r[0]) / r[0] for x in timings if len(r := sorted(x.rounds)) >= 2 and r[0] > 0]
    return float(np.median(spreads)) if spreads else 0.0


# The terms a fit keeps only when the timings need them beyond their noise (a busy machine slows
# long sequences more than short ones: memory traffic, not the model, then looks quadratic).
QUADRATIC = ("per_frame2", "per_token2", "per_frame_token")


def fit_cost(timings: Sequence[Timing], subsampling: int) -> CostModel:
    """The coefficients >= 0 that minimise the squared relative error of ``B * c(t, u)`` against the
    measured seconds: non-negative least squares on rows ``B * [1, t, t^2, u, u^2, t*u] / seconds``
    with target 1.  Columns are scaled to unit size for the solver and the solution scaled back.

    A quadratic term is dropped, smallest first, while the fit without it misses the timings by no
    more than their noise (:func:`timing_noise`) beyond the fit with it: a term that explains less
    than the noise is the noise's."""
    b = np.array([x.shape.size for x in timings], np.float64)
    t = np.array([x.shape.frames for x in timings], np.float64) / subsampling
    u = np.array([x.shape.tokens for x in timings], np.float64)
    secs = np.array([x.seconds for x in timings], np.float64)
    rows = (b / secs)[:, None] * cost_terms(t, u)
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0

    def fit(keep: list[int]) -> tuple[np.ndarray, float]:
        coef = np.zeros(len(COEFFICIENTS))
        scaled = rows[:, keep] / scale[keep]
        coef[keep], _ = nnls(scaled, np.ones(len(timings)))
        return coef, float(np.sqrt(np.mean((scaled @ coef[keep] - 1.0) ** 2)))

    keep = list(range(len(COEFFICIENTS)))
    coef, err = fit(keep)
    noise = timing_noise(timings)
    while True:
        # The quadratic terms still in, the one contributing least to the longest shapes first.
        candidates = sorted((i for i in keep if COEFFICIENTS[i] in QUADRATIC and coef[i] > 0),
                            key=lambda i: float(np.max(rows[:, i] * coef[i] / scale[i])))
        for i in candidates:
            fewer = [k for k in keep if k != i]
            c2, e2 = fit(fewer)
            if e2 <= err + noise:
                keep, coef, err = fewer, c2, e2
                break
        else:
            break
    coef = coef / scale
    return CostModel(subsampling=subsampling, **{n: float(c) for n, c in zip(COEFFICIENTS, coef, strict=True)})


# --- the budget of a frames plan ---------------------------------------------------------------

@dataclass(frozen=True)
class FramesBudget:
    """The costliest batch of the plan ``max_frames`` cuts, under a cost model: a ``max_cost`` that
    keeps the peak of the frames plan a user would otherwise train with."""

    max_frames: int
    seed: int
    epoch: int
    batches: int  # in that epoch's plan
    costliest: Shape  # its utterances, longest frames and longest label
    cost: float  # B * c(t, u) of it: the suggested max_cost


def frames_budget(cost: CostModel, shards: ShardSet, max_frames: int, *, seed: int, epoch: int = 0) -> FramesBudget:
    """The costliest batch under ``cost`` of the loader's plan of ``epoch`` with ``max_frames`` (its
    other options at their defaults, ``seed``); ``shards.tokens`` is needed by a cost that counts
    label tokens."""
    if cost.uses_tokens and shards.tokens is None:
        raise ValueError("the cost model counts label tokens: the shards' label lengths are needed (give the "
                         "tokenizer)")
    plan = Corpus(shards, PlanOptions(max_frames=max_frames), seed=seed).plan(epoch)
    best, count = (0.0, Shape(0, 0, 0)), 0
    for stream in plan.streams:
        if not stream.num_batches:
            continue
        count += stream.num_batches
        heads = stream.starts[:-1]
        sizes = np.diff(stream.starts)
        longest = np.maximum.reduceat(shards.frames[stream.rows], heads)
        labels = (np.maximum.reduceat(shards.tokens[stream.rows], heads) if shards.tokens is not None
                  else np.zeros_like(longest))
        costs = cost.batch(sizes, longest, labels)
        j = int(np.argmax(costs))
        if costs[j] > best[0]:
            best = (float(costs[j]), Shape(int(sizes[j]), int(longest[j]), int(labels[j])))
    return FramesBudget(max_frames, seed, epoch, count, best[1], best[0])


# --- the memory search ---------------------------------------------------------------------------

def largest_batch(fits: Callable[[int], bool], *, start: int = OOM_START, rel_gap: float = OOM_REL_GAP,
                  cap: int = OOM_CAP) -> int:
    """The largest batch size ``fits`` accepts (0 if not even 1), assuming it accepts every smaller
    one: doubling from ``start`` (halving while nothing fits) until one fits and one fails, then
    bisection until they are within ``rel_gap`` of the failing one, or adjacent.  ``cap`` is
    returned when it fits."""
    ok, bad = 0, None  # largest size known to fit, smallest known to fail
    b = max(1, min(start, cap))
    while True:
        if fits(b):
            ok = b
        else:
            bad = b
        if bad is None:
            if b >= cap:
                return ok
            b = min(2 * b, cap)
        elif bad - ok <= 1 or bad - ok <= rel_gap * bad:
            return ok
        else:
            b = (ok + bad) // 2  # strictly between: they differ by 2 or more


def search_memory(fits: Callable[[Shape], bool], buckets: Sequence[tuple[int, int]], cost: CostModel, *,
                  margin: float, rel_gap: float = OOM_REL_GAP, cap: int = OOM_CAP,
                  progress: bool | None = None) -> MemorySearch:
    """Per (frames, tokens) bucket, the largest batch ``fits`` accepts, longest bucket first (a
    shorter one starts its search at twice the batch the longer one took); ``max_cost`` is the
    smallest ``B * c(t, u)`` of those, times ``1 - margin``.  A bucket where one utterance is too
    much bounds nothing (such utterances cannot train at all: the caller warns)."""
    from tqdm import tqdm

    found: list[tuple[Shape, float]] = []
    start = OOM_START
    order = sorted(buckets, reverse=True)
    for frames, tokens in tqdm(order, desc="memory search", unit="length", disable=bar_disabled(progress)):
        size = largest_batch(lambda b: fits(Shape(b, frames, tokens)), start=start, rel_gap=rel_gap, cap=cap)
        found.append((Shape(size, frames, tokens), float(cost.batch(size, frames, tokens))))
        start = max(OOM_START, 2 * size)
    found.reverse()
    bounds = [c for s, c in found if s.size > 0]
    max_cost = (1 - margin) * min(bounds) if bounds else None
    return MemorySearch(margin=margin, buckets=found, max_cost=max_cost, cap=cap)


def bar_disabled(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: None shows the bar on a terminal only."""
    return None if progress is None else not progress
