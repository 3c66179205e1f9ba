"""Frame-count dynamic batching: bounds, nothing lost, determinism, padding, order randomness."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from baselines import order_randomness, sort_window, sort_window_batches, stream_batches

from wdsprep.plan.batching import BatchFit, bucket_batches, len_of_first_dim
from wdsprep.plan.stats import padding_efficiency


def utts(lengths):
    """Samples as (id, length) pairs: ids make duplicates and losses visible."""
    return [(f"u{i}", int(n)) for i, n in enumerate(lengths)]


def length(s):
    return s[1]


def lognormal(n, seed=0, median=600, sigma=0.5):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, n), 50, 3000).astype(int)


def lens_of(batches):
    return [[s[1] for s in b] for b in batches]


def run(samples, seed=0, **kw):
    kw.setdefault("max_frames", 5000)
    return list(bucket_batches(iter(samples), rng=np.random.default_rng(seed), length=length, **kw))


def check_bound_and_complete(samples, batches, max_frames, max_batch_size=None):
    for b in batches:
        assert b, "empty batch"
        lens = [s[1] for s in b]
        if max(lens) > max_frames:
            assert len(b) == 1, f"oversize sample shares a batch: {lens}"
        else:
            assert len(b) * max(lens) <= max_frames, lens
        if max_batch_size is not None:
            assert len(b) <= max_batch_size
    out = Counter(s[0] for b in batches for s in b)
    assert out == Counter(s[0] for s in samples), "samples lost or duplicated"


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 999, 1000, 1001, 5003])
@pytest.mark.parametrize("pool_size", [1, 2, 100, 1000])
def test_bound_and_every_sample_exactly_once(n, pool_size):
    samples = utts(lognormal(n, seed=n))
    batches = run(samples, pool_size=pool_size, max_frames=5000)
    check_bound_and_complete(samples, batches, 5000)


def test_tiny_inputs():
    assert run([]) == []
    assert run(utts([10])) == [[("u0", 10)]]
    two = run(utts([10, 20]), max_frames=100)
    assert two == [[("u0", 10), ("u1", 20)]]  # fit together, flushed at the end


def test_oversize_alone_never_dropped():
    lengths = lognormal(3000, seed=3)
    lengths[[5, 700, 701, 2999]] = [6000, 9000, 5001, 12000]
    samples = utts(lengths)
    for pool_size in (1, 50, 1000, 4000):
        batches = run(samples, pool_size=pool_size, max_frames=5000)
        check_bound_and_complete(samples, batches, 5000)
        alone = {b[0][0] for b in batches if len(b) == 1 and b[0][1] > 5000}
        assert alone == {"u5", "u700", "u701", "u2999"}


def test_exactly_max_frames_fits():
    fit = BatchFit(5000)
    assert fit.fits(2, 2500) and not fit.fits(3, 2500) and fit.fits(1, 5000)
    assert fit.cut(np.array([2500, 2500])) == [(0, 2)]
    assert lens_of(run(utts([5000]), max_frames=5000)) == [[5000]]


def test_max_batch_size_respected():
    samples = utts([10] * 1000)
    batches = run(samples, max_frames=100_000, max_batch_size=7, pool_size=300)
    check_bound_and_complete(samples, batches, 100_000, max_batch_size=7)
    # Only each pool's first batch (cut at a random point) and the end-of-stream flush may hold
    # fewer than 7: 4 pools here.
    assert sum(len(b) < 7 for b in batches) <= 4 + 1


def test_same_seed_same_batches_different_seed_different_order():
    samples = utts(lognormal(5000, seed=1))
    a = run(samples, seed=7, pool_size=1000)
    b = run(samples, seed=7, pool_size=1000)
    c = run(samples, seed=8, pool_size=1000)
    assert a == b
    assert a != c
    # The seed changes the grouping too (neighbours trade places, each pool's first batch closes at
    # a random point): a pool of the same utterances is cut into other batches.
    assert sorted(map(tuple, a)) != sorted(map(tuple, c))
    for batches in (a, c):
        check_bound_and_complete(samples, batches, 5000)


def test_partial_tail_carried_not_emitted_small():
    # Pools of 100 samples of length 100 under max_frames 1500 end with an open batch (100 is no
    # multiple of 15): it is carried into the next pool, not emitted, so the only batches below
    # full are each pool's first (cut at a random point) and the final flush.
    samples = utts([100] * 1000)
    batches = run(samples, max_frames=1500, pool_size=100)
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 1000
    assert sum(n < 15 for n in sizes) <= 10 + 1


@pytest.mark.parametrize("max_frames", [20_000, 50_000])
def test_padding_efficiency_on_lognormal_lengths(max_frames):
    samples = utts(lognormal(40_000, seed=2))
    batches = run(samples, max_frames=max_frames)
    check_bound_and_complete(samples, batches, max_frames)
    assert padding_efficiency(lens_of(batches)) >= 0.97
    # The unsorted baseline is far worse: the test would notice if sorting stopped working.
    assert padding_efficiency(lens_of(stream_batches(samples, max_frames=max_frames, length=length))) < 0.6


def test_batch_order_random_unlike_sort_window():
    samples = utts(lognormal(40_000, seed=4))
    ours = order_randomness([np.mean(b) for b in lens_of(run(samples, max_frames=20_000, pool_size=500))])
    wenet = order_randomness([np.mean(b) for b in lens_of(
        sort_window_batches(samples, max_frames=20_000, window=500, length=length))])
    assert abs(ours["spearman"]) < 0.05
    assert abs(ours["lag1"]) < 0.15
    assert wenet["lag1"] > 0.5  # rising runs within each window
    assert ours["longest_rise"] < wenet["longest_rise"]
    assert ours["longest_rise"] <= 10  # ~2,000 batches: chance gives ~6-7


def test_order_randomness_detects_sorted_and_random():
    rng = np.random.default_rng(0)
    sawtooth = np.tile(np.arange(50), 20).astype(float)
    r = order_randomness(sawtooth)
    assert abs(r["spearman"]) < 0.1 and r["lag1"] > 0.8 and r["longest_rise"] == 50
    shuffled = order_randomness(rng.permutation(sawtooth))
    assert abs(shuffled["lag1"]) < 0.1 and shuffled["longest_rise"] < 10
    assert order_randomness(np.arange(100))["spearman"] == pytest.approx(1.0)


def test_stream_batches_is_arrival_order_greedy():
    samples = utts([100, 300, 200, 900, 50, 50, 2000, 10])
    batches = list(stream_batches(samples, max_frames=1000, length=length))
    # Arrival order kept: concatenating batches gives the input back.
    assert [s for b in batches for s in b] == samples
    assert lens_of(batches) == [[100, 300, 200], [900], [50, 50], [2000], [10]]
    check_bound_and_complete(samples, batches, 1000)
    assert lens_of(stream_batches(utts([5] * 5), max_frames=1000, length=length, max_batch_size=2)) == [
        [5, 5], [5, 5], [5]]


def test_sort_window_batches_sorts_within_windows_only():
    lengths = lognormal(1234, seed=5)
    samples = utts(lengths)
    flat = list(sort_window(samples, window=500, length=length))
    for w in range(0, 1234, 500):
        chunk = flat[w:w + 500]
        assert [s[1] for s in chunk] == sorted(lengths[w:w + 500].tolist())
        assert {s[0] for s in chunk} == {s[0] for s in samples[w:w + 500]}
    batches = list(sort_window_batches(samples, max_frames=5000, window=500, length=length))
    assert [s for b in batches for s in b] == flat
    check_bound_and_complete(samples, batches, 5000)


def test_padding_efficiency():
    assert padding_efficiency([[1, 3], [2, 2]]) == pytest.approx(8 / 10)
    assert math.isnan(padding_efficiency([]))


def test_default_length_is_frames_of_features():
    feats = np.zeros((123, 80), dtype=np.float32)
    assert len_of_first_dim(("utt1", feats, "text")) == 123
    samples = [("a", np.zeros((300, 4))), ("b", np.zeros((200, 4))), ("c", np.zeros((600, 4)))]
    for seed in range(4):
        batches = list(bucket_batches(samples, max_frames=600, rng=np.random.default_rng(seed)))
        # measured by frames (300, 200, 600), not by dims (4): c fills a batch alone, a and b may share one
        names = [[x[0] for x in b] for b in batches]
        assert ["c"] in names and all(len(b) * max(len(x[1]) for x in b) <= 600 for b in batches)


def test_bad_arguments_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="max_frames"):
        list(bucket_batches([], max_frames=0, rng=rng, length=length))
    with pytest.raises(ValueError, match="max_batch_size"):
        list(bucket_batches([], max_frames=10, rng=rng, length=length, max_batch_size=0))
    with pytest.raises(ValueError, match="pool_size"):
        list(bucket_batches([], max_frames=10, rng=rng, length=length, pool_size=0))
    with pytest.raises(ValueError, match="'bad'"):
        list(bucket_batches([("bad", -1)], max_frames=10, rng=rng, length=length))


def test_bench_runs_and_checks_completeness(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "bench" / "bench_batching.py"
    spec = importlib.util.spec_from_file_location("bench_batching", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--n", "3000", "--max-frames", "20000", "--pool", "1000", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "CAT stream" in out and "WeNet sort window 500" in out and "ours, pool 1000" in out


def test_lone_long_utterance_not_held_to_the_end():
    # One long utterance among short ones is always the open batch of its pool; without an age
    # limit on carrying it would come out only at the end of the epoch.
    samples = utts([10] * 3999 + [2400] + [10] * 40_000)
    batches = run(samples, max_frames=5000, pool_size=4000)
    check_bound_and_complete(samples, batches, 5000)
    samples_before = sum(len(b) for b in batches[:next(i for i, b in enumerate(batches) if b[0][0] == "u3999")])
    assert samples_before < 2 * 4000 + 100  # out with the next pool, not after 44,000 samples


@pytest.mark.parametrize("max_carry", [0, 1, 3])
def test_max_carry_bounds_delay(max_carry):
    samples = utts(lognormal(20_000, seed=6))
    batches = run(samples, max_frames=20_000, pool_size=1000, max_carry=max_carry)
    check_bound_and_complete(samples, batches, 20_000)
    out_pos = {s[0]: i for i, s in enumerate(s for b in batches for s in b)}
    # A sample leaves at the latest with the pool that is max_carry pools after its own.
    pool_len = 1000 + 30  # pool plus the carried batch (< 30 samples at these lengths)
    assert all(out_pos[k] < (int(k[1:]) // 1000 + 1 + max_carry) * pool_len for k in out_pos)


def _greedy_cuts(lengths, max_frames, cap):
    """The cut rule one sample at a time (the reference the bisection must equal)."""
    cuts, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        size = i - start
        if size and (size >= cap or (size + 1) * max(longest, n) > max_frames):
            cuts.append((start, i))
            start, longest = i, n
        else:
            longest = max(longest, n)
    if start < len(lengths):
        cuts.append((start, len(lengths)))
    return cuts


@pytest.mark.parametrize("max_frames,cap", [(5000, None), (20_000, 7), (400, None), (3000, 1)])
def test_cut_by_binary_search_equals_cutting_one_sample_at_a_time(max_frames, cap):
    from wdsprep.plan.batching import BatchFit

    for seed in range(5):
        lengths = np.sort(lognormal(3000, seed=seed))
        want = _greedy_cuts(lengths.tolist(), max_frames, cap or len(lengths))
        assert BatchFit(max_frames, cap).cut(lengths) == want


def test_batches_of_samples_are_the_batches_of_their_lengths():
    from wdsprep.plan.batching import BatchFit, bucket_pools

    samples = utts(lognormal(5000, seed=4))
    positions, starts = bucket_pools(np.array([s[1] for s in samples]), fit=BatchFit(5000), pool_size=700,
                                     rng=np.random.default_rng(0))
    want = [[samples[i] for i in positions[a:b]] for a, b in zip(starts[:-1], starts[1:])]
    assert run(samples, max_frames=5000, pool_size=700) == want and len(want) > 50
