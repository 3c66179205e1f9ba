"""The pure side of ``wdsprep calibrate`` (``check/costfit.py``): the timing grid, the fit of the
cost model and the memory search, on plain numbers, with a memory limit standing in for the GPU's.
None of it needs torch, and these tests import none."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from wdsprep.check.costfit import (
    Shape,
    Timing,
    fit_cost,
    frames_budget,
    grid_labels,
    label_tokens,
    largest_batch,
    length_grid,
    search_memory,
    timing_noise,
)
from wdsprep.plan.corpus import Corpus
from wdsprep.plan.cost import COEFFICIENTS, CostModel
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.streams import PlanOptions


def test_the_fit_imports_without_torch():
    code = ("import sys\nimport wdsprep.check.costfit\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'torch'], 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("true", [
    CostModel(subsampling=4, per_utt=2e-4, per_frame=3e-5, per_frame2=4e-7, per_token=0, per_token2=5e-7),
    CostModel(subsampling=4, per_utt=1e-4, per_frame=2e-5, per_frame2=1e-7, per_token=3e-6, per_frame_token=8e-7),
], ids=["attention", "transducer"])
def test_fit_recovers_known_coefficients_on_the_grid_s_shapes(true):
    """Times made by a known cost, on the shapes the grid times (labels proportional to the frames,
    at three label lengths each), are fitted back exactly: t^2, t*u and u^2 told apart (two ratios
    of u to t would leave t*u equal to a mix of t^2 and u^2 on every shape)."""
    timings = [Timing(Shape(max(1, 8000 // f), f, u), float(true.batch(max(1, 8000 // f), f, u)))
               for f in (40, 80, 160, 320, 640) for u in grid_labels(label_tokens(f, tokens_per_frame=0.15,
                                                                                   max_tokens=None, subsampling=4))]
    assert len(timings) == 15 and grid_labels(40) == [4, 13, 40] and grid_labels(2) == [1, 2]
    fitted = fit_cost(timings, 4)
    for name in COEFFICIENTS:
        assert getattr(fitted, name) == pytest.approx(getattr(true, name), rel=1e-6, abs=1e-12), name


def _noisy_timings(true: CostModel, rng: np.random.Generator, *, noise: float, bend: float) -> list[Timing]:
    """The grid's shapes timed in 4 rounds each: the true cost, slowed by random noise and, as a busy
    machine does, more at the longest shapes (``bend``: a share at 640 frames, growing with t^2)."""
    out = []
    for f in (40, 80, 160, 320, 640):
        for u in grid_labels(label_tokens(f, tokens_per_frame=0.05, max_tokens=None, subsampling=4)):
            b = max(1, 8000 // f)
            base = float(true.batch(b, f, u)) * (1 + bend * (f / 640) ** 2)
            rounds = [base * (1 + noise * float(rng.exponential())) for _ in range(4)]
            out.append(Timing(Shape(b, f, u), min(rounds), rounds))
    return out


def test_a_quadratic_term_within_the_timing_noise_is_not_fitted_a_real_one_is(monkeypatch):
    """A convolution's cost (no t^2), timed on a busy machine that slows the longest shapes by 12%
    more than the shortest, looks quadratic: the plain least squares fit gives t^2 over 10% of the
    linear term at 750 frames; the fit here leaves it out (it explains less than the timing noise).
    Attention's t^2 stays."""
    import wdsprep.check.costfit as costfit

    conv = CostModel(subsampling=4, per_frame=4e-5, per_token=1e-6)
    attention = CostModel(subsampling=4, per_frame=2e-5, per_frame2=3e-7, per_token=1e-6)
    t = 750 / 4
    for seed in range(4):
        timings = _noisy_timings(conv, np.random.default_rng(seed), noise=0.2, bend=0.12)
        assert 0.01 < timing_noise(timings) < 0.1
        fitted = fit_cost(timings, 4)
        assert fitted.per_frame2 * t < 0.1 * fitted.per_frame, fitted
        with monkeypatch.context() as m:
            m.setattr(costfit, "QUADRATIC", ())  # every term kept: the noise is fitted as cost
            plain = fit_cost(timings, 4)
        assert plain.per_frame2 * t > 0.1 * plain.per_frame, plain
        kept = fit_cost(_noisy_timings(attention, np.random.default_rng(seed + 10), noise=0.2, bend=0.12), 4)
        assert kept.per_frame2 * t > 2 * kept.per_frame, kept
    assert timing_noise([Timing(Shape(1, 10, 1), 1.0, [1.0])]) == 0.0  # one round: no spread to measure


def test_frames_budget_is_the_costliest_batch_of_the_frames_plan():
    """The max_cost calibrate suggests from max_frames: the frames plan's costliest batch under the
    fitted cost, found against every batch of that plan."""
    rng = np.random.default_rng(0)
    utts = np.full(40, 50)
    frames = rng.lognormal(np.log(300), 0.5, 2000).astype(np.int32)
    tokens = np.maximum(1, frames * rng.lognormal(np.log(0.1), 0.5, 2000)).astype(np.int32)
    shards = ShardSet([f"s{i}.tar" for i in range(40)], utts, frames, [""] * 40, np.full(40, -1), tokens=tokens)
    cost = CostModel(subsampling=4, per_frame=512.0, per_frame2=1.0, per_frame_token=2.0)
    b = frames_budget(cost, shards, 20_000, seed=3)
    plan = Corpus(shards, PlanOptions(max_frames=20_000), seed=3).plan(0)
    each = [float(cost.batch(len(r), frames[r].max(), tokens[r].max()))
            for s in plan.streams for r in (s.batch(j) for j in range(s.num_batches))]
    assert b.batches == len(each) and b.cost == pytest.approx(max(each), rel=1e-12)
    assert b.costliest.size * b.costliest.frames <= 20_000
    assert float(cost.batch(b.costliest.size, b.costliest.frames, b.costliest.tokens)) == pytest.approx(b.cost)
    with pytest.raises(ValueError, match="give the tokenizer"):
        frames_budget(cost, ShardSet(shards.urls, utts, frames, shards.digests, shards.sizes), 20_000, seed=3)


def test_length_grid_spans_the_corpus_and_widens_a_narrow_one():
    frames = np.random.default_rng(0).lognormal(np.log(600), 0.5, 10_000).astype(np.int32)
    grid = length_grid(frames)
    lo, hi = np.quantile(frames, [0.05, 0.999])
    assert grid[0] == math.floor(lo) and grid[-1] == math.ceil(hi) and np.all(np.diff(grid) > 0)
    narrow = length_grid(np.full(100, 500))
    assert narrow[-1] == 500 and narrow[0] == 125  # 4x span: t and t^2 can be told apart


# --- the memory search, with a memory limit standing in for the GPU's ---------------------------

LIMIT = 2_000_000.0


def _memory(s: Shape) -> float:
    """A training step's memory: the model and optimizer, plus activations linear and quadratic in length."""
    return 50_000 + s.size * (40 * s.frames + 0.6 * s.frames ** 2 + 16 * s.tokens)


def _true_largest(frames: int, tokens: int) -> int:
    per = _memory(Shape(1, frames, tokens)) - 50_000
    return int((LIMIT - 50_000) // per)


class FakeGPU:
    """A probe standing in for a training step on a GPU: it fits while the step's memory is within
    LIMIT; counts the probes."""

    def __init__(self) -> None:
        self.probes: list[Shape] = []

    def __call__(self, s: Shape) -> bool:
        self.probes.append(s)
        return _memory(s) <= LIMIT


def test_memory_search_finds_each_boundary_and_keeps_the_margin():
    cost = CostModel(subsampling=4, per_frame=1e-4, per_frame2=2e-6, per_token2=1e-7)
    buckets = [(50, 10), (200, 40), (700, 140), (1500, 300)]
    gpu = FakeGPU()
    m = search_memory(gpu, buckets, cost, margin=0.1, rel_gap=0.0)
    assert [(s.frames, s.tokens) for s, _ in m.buckets] == buckets
    for s, c in m.buckets:  # the exact boundary: B fits, B + 1 does not
        assert s.size == _true_largest(s.frames, s.tokens) > 0
        assert c == pytest.approx(float(cost.batch(s.size, s.frames, s.tokens)))
    assert m.max_cost == pytest.approx(0.9 * min(c for _, c in m.buckets))
    # Every batch the budget admits at a bucket's length trains, with 10% of the largest kept free.
    for frames, tokens in buckets:
        b = int(m.max_cost // float(cost.per_utterance(frames, tokens)))
        assert _memory(Shape(b, frames, tokens)) <= LIMIT
        assert b <= 0.9 * _true_largest(frames, tokens)
    # Longest first, and a shorter bucket starts from twice what the longer took: few probes.
    assert gpu.probes[0].frames == 1500
    assert len(gpu.probes) < 4 * 2 * math.log2(max(_true_largest(f, u) for f, u in buckets))


def test_memory_search_stops_within_the_gap_and_skips_lengths_that_never_fit():
    gpu = FakeGPU()
    cost = CostModel(subsampling=4, per_frame=1.0)
    m = search_memory(gpu, [(400, 80), (2000, 400)], cost, margin=0.2,
                      rel_gap=0.05)
    (short, c_short), (long, _) = m.buckets
    assert long.size == 0  # one utterance of 2000 frames needs 2.5 MB: it bounds nothing
    true = _true_largest(400, 80)
    assert 0.95 * true <= short.size <= true
    assert m.max_cost == pytest.approx(0.8 * c_short)


def test_largest_batch_edges():
    assert largest_batch(lambda b: b <= 37, start=16, rel_gap=0) == 37
    assert largest_batch(lambda b: b <= 5, start=16, rel_gap=0) == 5  # halves down from the start
    assert largest_batch(lambda b: False, start=16) == 0
    assert largest_batch(lambda b: True, start=16, cap=100) == 100  # bounded: stops at the cap
    calls = []
    largest_batch(lambda b: calls.append(b) or b <= 1000, start=16, rel_gap=0.05)
    assert len(calls) < 16
