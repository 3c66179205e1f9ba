"""The epoch plan and its assignment, as pure functions: no shard is read here."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from baselines import order_randomness

from wdsprep.plan.assign import assign, consumed, epoch_assignment, next_turn, rank_order
from wdsprep.plan.stats import BatchTally
from wdsprep.plan.streams import PlanOptions, deal_shards, plan_epoch, reservoir_order


def corpus(n_shards=37, per_shard=300, seed=0):
    """Uneven shards of lognormal lengths (the frames of 10 ms fbank, median 600)."""
    rng = np.random.default_rng(seed)
    utts = rng.integers(per_shard // 2, per_shard * 3 // 2, n_shards)
    frames = np.clip(rng.lognormal(np.log(600), 0.5, int(utts.sum())), 50, 3000).astype(np.int32)
    return utts, frames


def batches(plan):
    return [tuple(s.batch(j).tolist()) for s in plan.streams for j in range(s.num_batches)]


def test_the_plan_is_a_function_of_seed_epoch_and_options():
    utts, frames = corpus()
    opts = PlanOptions(max_frames=20_000, streams=8)
    a = plan_epoch(utts, frames, opts, seed=3, epoch=1)
    assert batches(a) == batches(plan_epoch(utts, frames, opts, seed=3, epoch=1))
    assert batches(a) != batches(plan_epoch(utts, frames, opts, seed=3, epoch=2))
    assert batches(a) != batches(plan_epoch(utts, frames, opts, seed=4, epoch=1))
    # Every utterance once per epoch, in a batch under the bound (or alone, when longer).
    rows = [r for b in batches(a) for r in b]
    assert sorted(rows) == list(range(int(utts.sum())))
    for b in batches(a):
        assert len(b) == 1 or len(b) * frames[list(b)].max() <= 20_000
    # A worker planning only its streams gets the same batches for them.
    part = plan_epoch(utts, frames, opts, seed=3, epoch=1, streams=[2, 5])
    for s in (2, 5):
        assert batches_of(part, s) == batches_of(a, s)


def batches_of(plan, s):
    p = plan.streams[s]
    return [tuple(p.batch(j).tolist()) for j in range(p.num_batches)]


def test_batching_quality_holds():
    """Padding efficiency >= 0.97 at max_frames 20,000 on lognormal lengths, random batch order."""
    utts, frames = corpus(n_shards=40, per_shard=2000)
    plan = plan_epoch(utts, frames, PlanOptions(max_frames=20_000), seed=0, epoch=0)
    tally = BatchTally()
    for b in batches(plan):
        tally.add(frames[list(b)])
    assert tally.padding_efficiency >= 0.97, tally.padding_efficiency
    means = [float(frames[list(b)].mean()) for b in batches_of(plan, 0)]
    assert abs(order_randomness(means)["lag1"]) < 0.1


def test_shuffle_buffer_mixes_at_least_as_far_as_a_reservoir_over_the_shards():
    utts, frames = corpus(n_shards=20, per_shard=2000)
    rng = np.random.default_rng(0)
    order = reservoir_order(int(utts.sum()), 2000, rng)
    displacement = np.abs(order - np.arange(len(order))).mean()
    assert displacement > 1000  # a buffer of 2,000 moves a sample ~size/2 and more on average
    assert sorted(order.tolist()) == list(range(len(order)))


@pytest.mark.parametrize("size,n", [(3, 50), (50, 5000), (2000, 7000), (10, 10), (1, 20)])
def test_reservoir_order_equals_one_arrival_at_a_time(size, n):
    """Blocks of arrivals exchanged at once give what a reservoir one arrival at a time gives."""
    got = reservoir_order(n, size, np.random.default_rng(7))
    if size <= 1:
        assert got.tolist() == list(range(n))
        return
    if n <= size:
        assert sorted(got.tolist()) == list(range(n))
        return
    rng = np.random.default_rng(7)
    slots = []
    for first in range(size, n, 4096):  # the same draws: one integers() call per block
        slots += rng.integers(size, size=min(n, first + 4096) - first).tolist()
    buf, out = list(range(size)), []
    for arrival, j in zip(range(size, n), slots):
        out.append(buf[j])
        buf[j] = arrival
    assert got.tolist() == out + [buf[j] for j in rng.permutation(size)]


def test_shards_are_dealt_to_streams_by_frames_in_a_new_order_each_epoch():
    weights = np.random.default_rng(0).integers(1000, 50000, 64)
    for epoch in range(3):
        streams = deal_shards(weights, 6, seed=0, epoch=epoch, shuffle=True)
        loads = [int(weights[s].sum()) for s in streams]
        assert max(loads) - min(loads) <= weights.max()
        assert sorted(np.concatenate(streams).tolist()) == list(range(64))
    orders = {tuple(np.concatenate(deal_shards(weights, 6, seed=0, epoch=e, shuffle=True)).tolist()) for e in range(5)}
    assert len(orders) == 5  # webdataset repeats its shard order every epoch; this does not


TOPOLOGIES = [(1, 0), (1, 2), (2, 0), (2, 3), (3, 0), (3, 2), (4, 1), (5, 4), (8, 2)]


@pytest.mark.parametrize("world_size,workers", TOPOLOGIES)
def test_every_topology_yields_the_plans_batches_with_equal_steps(world_size, workers):
    counts = np.array([13, 15, 13, 11, 2, 30, 9])  # uneven streams
    a = assign(counts, world_size, workers)
    orders = [rank_order(a, r) for r in range(world_size)]
    assert {len(o) for o in orders} == {sum(counts) // world_size} and a.steps == [len(o) for o in orders]
    got = Counter(b for o in orders for b in o)
    assert max(got.values()) == 1
    planned = {(s, j) for s, n in enumerate(counts) for j in range(n)}
    assert set(got) <= planned and len(planned - set(got)) == a.num_discarded < world_size
    # Each stream is read by one reader, but for the runs given away to even the ranks out.
    readers = Counter(s for r in range(world_size) for tasks in a.workers[r] for s in {t.stream for t in tasks})
    assert sum(v - 1 for v in readers.values()) <= world_size


def test_dev_mode_keeps_every_batch():
    counts = [13, 15, 13, 11, 2]
    a = assign(counts, 3, 2, equal=False)
    got = [b for r in range(3) for b in rank_order(a, r)]
    assert sorted(got) == sorted((s, j) for s, n in enumerate(counts) for j in range(n))


@pytest.mark.parametrize("before,after", list(itertools.product([(3, 0), (2, 2), (1, 3)], [(2, 0), (3, 2), (1, 1)])))
def test_a_resumed_epoch_yields_what_is_left_on_any_topology(before, after):
    counts = np.array([13, 15, 13, 11, 2, 30, 9])
    steps = 7
    first = assign(counts, *before)
    done = {b for r in range(before[0]) for b in rank_order(first, r)[:steps]}
    runs = [(*before, steps)]
    assert {(s, j) for s, m in enumerate(consumed(counts, runs)) for j in np.flatnonzero(m)} == done
    second = epoch_assignment(counts, runs, *after)
    later = [b for r in range(after[0]) for b in rank_order(second, r, next_turn(counts, runs, *after, r))]
    assert not done & set(later) and len(later) == len(set(later))
    assert len({len(rank_order(second, r)) for r in range(after[0])}) == 1
    left = sum(counts) - len(done) - len(later)
    assert left < after[0]  # nothing skipped beyond one batch per rank


@pytest.mark.parametrize("world_size,workers", [(1, 2), (2, 3), (3, 2), (4, 2)])
@pytest.mark.parametrize("seed", range(4))
def test_resumed_on_the_same_topology_the_order_continues_exactly(world_size, workers, seed):
    counts = np.random.default_rng(seed).integers(0, 30, 9) if seed else np.array([13, 15, 13, 11, 2, 30, 9])
    a = assign(counts, world_size, workers)
    for steps in range(1, a.steps[0]):
        runs = [(world_size, workers, steps)]
        b = epoch_assignment(counts, runs, world_size, workers)
        for r in range(world_size):
            first = next_turn(counts, runs, world_size, workers, r)
            assert rank_order(b, r, first) == rank_order(a, r)[steps:], (steps, r)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_what_the_plan_leaves_out_is_counted_once_even_from_a_stream_left_without_batches(world_size):
    """Two streams, one of them all too short: its utterances leave the plan, and some rank must
    still count them (it has no batches, so no rank was dealt it)."""
    from wdsprep.plan.corpus import Corpus
    from wdsprep.plan.epochs import CorpusEpochs
    from wdsprep.plan.shardset import ShardSet

    frames = np.concatenate([np.full(40, 30), np.full(60, 500)]).astype(np.int32)
    shards = ShardSet(["a/0.tar", "a/1.tar"], np.array([40, 60]), frames, ["", ""], np.array([-1, -1]))
    options = PlanOptions(max_frames=1000, min_frames=100, streams=2)
    source = CorpusEpochs(Corpus(shards, options, seed=0), corpora=("",), world_size=world_size, num_workers=0)
    run = source.run(source.start(0))
    assert 0 in source.corpus.counts(0).tolist()  # the short stream has no batches
    dropped = Counter()
    for r in range(world_size):
        for window in run.windows(r):
            dropped.update(window.dropped)
    assert dropped == {"too_short": 40}


def test_dev_plans_are_the_same_batches_whatever_the_seed_and_training_plans_are_not():
    """A dev loader's batches (validation losses averaged per batch) do not move with the training
    run's seed: dev pools are cut plainly, training pools shaken (issue 35.8)."""
    utts = np.array([40, 35, 50, 20])
    frames = np.random.default_rng(0).integers(50, 900, int(utts.sum()))

    def batches(train: bool, seed: int) -> set[frozenset[int]]:
        plan = plan_epoch(utts, frames, PlanOptions(max_frames=3000, train=train, shuffle_buffer=30), seed=seed,
                          epoch=0)
        return {frozenset(s.rows[s.starts[j]:s.starts[j + 1]].tolist())
                for s in plan.streams for j in range(len(s.starts) - 1)}

    dev = [batches(False, seed) for seed in range(4)]
    assert all(d == dev[0] for d in dev) and sum(map(len, dev[0])) == utts.sum()
    assert len({frozenset(batches(True, seed)) for seed in range(4)}) == 4


def test_shard_sums_are_each_shards_frames_however_the_rows_are_chunked(monkeypatch):
    """The frames per shard the streams are dealt by, summed a bounded chunk of rows at a time (no int64
    copy of the whole column): the same as summing each shard, empty shards included, at any chunk size."""
    import wdsprep.plan.streams as streams

    rng = np.random.default_rng(1)
    for _ in range(200):
        utts = rng.integers(0, 5, int(rng.integers(1, 40)))
        utts[rng.random(len(utts)) < 0.3] = 0  # empty shards, also at a chunk's edges
        frames = rng.integers(0, 3000, int(utts.sum())).astype(np.int32)
        monkeypatch.setattr(streams, "_SUM_ROWS", int(rng.integers(1, 10)))
        ends = np.cumsum(utts)
        expected = [int(frames[e - n:e].sum()) for n, e in zip(utts, ends)]
        assert streams.shard_sums(utts, frames).tolist() == expected
