"""The mixture (weights, temperature, schedule) and the mixed plan: pure functions, no I/O."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from wdsprep.plan.mix.epochs import apportion
from wdsprep.plan.mix.portions import Cursor, cut, merge_order, progress_prefix, take
from wdsprep.plan.mix.weights import Mixture, draw_probabilities
from wdsprep.plan.mix.weights import make_mixture as mixture_of
from wdsprep.plan.options import MixOptions
from wdsprep.plan.shardset import ShardSet, union
from wdsprep.plan.source import epoch_source
from wdsprep.plan.state import SavedState
from wdsprep.plan.streams import PlanOptions


def make_mixture(names, *, hours=None, utts=None, **given):
    return mixture_of(names, MixOptions(**given), hours=hours, utts=utts)

NAMES = ("en", "zh")


def test_fixed_weights_are_shares_of_utterances():
    m = make_mixture(NAMES, weights={"en": 1, "zh": 3})
    np.testing.assert_allclose(m.at([0, 10**6]), [[0.25, 0.75]] * 2)
    assert m.given == "weights"


def test_weights_at_the_edge_of_floats_are_still_shares():
    """{1e308, 1e308} summed to inf and gave NaN chances, and 100% of one corpus in silence."""
    m = make_mixture(["en", "zh"], weights={"en": 1e308, "zh": 1e308})
    assert m.points == ((0.5, 0.5),)
    assert np.allclose(draw_probabilities(m.at([0, 5]), [10.0, 10.0]), 0.5)
    tiny = make_mixture(["en", "zh"], weights={"en": 5e-324, "zh": 1e-323})
    assert tiny.points[0][1] == pytest.approx(2 / 3)


def test_temperature_flattens_by_hours():
    hours = [900.0, 100.0]
    np.testing.assert_allclose(make_mixture(NAMES, temperature=1, hours=hours).at([0])[0], [0.9, 0.1])
    t5 = make_mixture(NAMES, temperature=5, hours=hours).at([0])[0]
    np.testing.assert_allclose(t5, np.array([900, 100]) ** 0.2 / (900 ** 0.2 + 100 ** 0.2))
    assert 0.5 < t5[0] < 0.9


def test_no_weights_mean_the_corpora_as_they_are():
    np.testing.assert_allclose(make_mixture(NAMES, utts=[300, 100]).at([5])[0], [0.75, 0.25])


def test_schedule_is_linear_between_points_and_constant_outside():
    m = make_mixture(NAMES, schedule=[(100, {"en": 9, "zh": 1}), (300, {"en": 1, "zh": 1}), (400, {"en": 0, "zh": 1})])
    got = m.at([0, 100, 200, 300, 350, 400, 10**6])
    np.testing.assert_allclose(got[:, 0], [0.9, 0.9, 0.7, 0.5, 0.25, 0.0, 0.0])
    np.testing.assert_allclose(got.sum(axis=1), 1)
    assert Mixture.from_json(m.to_json()) == m


@pytest.mark.parametrize("kw,match", [
    ({"weights": {"en": 1}}, r"no weight for \['zh'\]"),
    ({"weights": {"en": 1, "zh": 1, "fr": 1}}, r"no corpus named \['fr'\]"),
    ({"weights": {"en": -1, "zh": 1}}, "finite and >= 0"),
    ({"weights": {"en": 0, "zh": 0}}, "every weight is 0"),
    ({"weights": {"en": 1, "zh": 1}, "temperature": 2}, "one way"),
    ({"schedule": [(10, {"en": 1, "zh": 1}), (10, {"en": 1, "zh": 2})]}, "steps must increase"),
    ({"schedule": [(-1, {"en": 1, "zh": 1})]}, "integer >= 0"),
    ({"schedule": []}, "no points"),
    ({"temperature": 0, "hours": [1, 1]}, "temperature must be"),
])
def test_a_bad_mixture_is_refused_saying_what_is_wrong(kw, match):
    with pytest.raises(ValueError, match=match):
        make_mixture(NAMES, **kw)


def test_a_changed_mixture_says_what_changed():
    old = make_mixture(NAMES, weights={"en": 1, "zh": 1})
    new = make_mixture(NAMES, schedule=[(0, {"en": 1, "zh": 1}), (500, {"en": 1, "zh": 3})])
    assert new.changes_from(old) == "en 0.5, zh 0.5 (weights) -> en 0.5@0 -> 0.25@500, zh 0.5@0 -> 0.75@500 (schedule)"
    assert old.changes_from(make_mixture(NAMES, weights={"en": 2, "zh": 2})) is None


def test_draw_chances_give_the_utterance_shares():
    shares = np.array([[0.25, 0.75]])
    per_batch = [40.0, 10.0]  # en batches hold 4x the utterances
    p = draw_probabilities(shares, per_batch)[0]
    assert p[0] * per_batch[0] / (p @ per_batch) == pytest.approx(0.25)


# -- the mixed plan ---------------------------------------------------------------------------

def test_a_prefix_of_the_progress_order_is_a_prefix_of_every_stream_and_grows_with_it():
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(0, 9, rng.integers(1, 7)).tolist()
        # The order itself, by brute force: item j of a stream of n at (j + 0.5) / n, ties by stream.
        order = sorted(((2 * j + 1) / (2 * n), s) for s, n in enumerate(sizes) for j in range(n))
        before = np.zeros(len(sizes), np.int64)
        for m in range(sum(sizes) + 1):
            got = progress_prefix(sizes, m)
            assert got.tolist() == np.bincount([s for _, s in order[:m]], minlength=len(sizes)).tolist()
            assert (got >= before).all()
            before = got
    assert progress_prefix([10**9, 3 * 10**9 + 1], 2 * 10**9).sum() == 2 * 10**9  # large counts, exactly


def test_taken_items_cross_corpus_epochs_and_cut_into_equal_contiguous_pieces():
    sizes = {0: np.array([3, 2]), 1: np.array([1, 1, 1])}
    segments, end = take(lambda e: sizes[e % 2], Cursor(0, 1), 7)
    assert end == Cursor(1, 3) or end == Cursor(2, 0)
    assert sum(len(s) for s in segments) == 7
    # every stream of a corpus epoch is taken as one range, and epoch 0's first item is not retaken
    assert [(s.epoch, s.stream) for s in segments] == sorted({(s.epoch, s.stream) for s in segments})
    pieces = cut(segments, 3)
    assert [sum(len(s) for s in p) for p in pieces] == [3, 2, 2]
    flat = [(s.epoch, s.stream, j) for p in pieces for s in p for j in range(s.start, s.stop)]
    assert flat == [(s.epoch, s.stream, j) for s in segments for j in range(s.start, s.stop)]


def test_sequences_merged_by_progress_keep_their_order_and_spread_evenly():
    which, index = merge_order([9, 3, 1])
    for c, n in enumerate([9, 3, 1]):
        assert index[which == c].tolist() == list(range(n))
    # 9: 1/18, 3/18 ... 17/18; 3: 3/18, 9/18, 15/18; 1: 9/18 (ties: the lower sequence first)
    assert which.tolist() == [0, 0, 1, 0, 0, 0, 1, 2, 0, 0, 0, 1, 0]


def test_apportioned_items_add_up_exactly_in_proportion():
    assert apportion(np.array([1.0, 1.0, 1.0]), 10).tolist() == [4, 3, 3]
    assert apportion(np.array([0.9, 0.1]), 7).tolist() == [6, 1]
    assert apportion(np.array([1.0, 0.0]), 5).tolist() == [5, 0]


def _shards(n_shards: int, per_shard: int, seed: int) -> ShardSet:
    rng = np.random.default_rng(seed)
    utts = np.full(n_shards, per_shard, np.int64)
    frames = np.clip(rng.lognormal(6.2, 0.6, n_shards * per_shard), 50, 3000).astype(np.int32)
    return ShardSet([f"c{seed}/s{i}.tar" for i in range(n_shards)], utts, frames, [""] * n_shards,
                    np.full(n_shards, -1))


# "en" big (8 shards of 400: 3 streams), "zh" small (2 shards of 150: 1 stream) so it loops.
UNION = union({"en": _shards(8, 400, 0), "zh": _shards(2, 150, 1)})


def _source(world: int, workers: int, *, seed: int = 1, unit: str = "batch", max_frames: int = 6000, **mix):
    options = PlanOptions(max_frames=max_frames)
    return epoch_source(UNION, options, seed=seed, world_size=world, num_workers=workers, named=True,
                        mix=MixOptions(mix_unit=unit, **mix))


def _epoch(source, epoch: int) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Every batch of ``epoch`` any rank yields, as (rows, corpora, corpus epochs)."""
    run = source.run(source.start(epoch))
    out = []
    for r in range(source.world_size):
        for window in run.windows(r):
            for bid in window.refs:
                units, epochs = source.origins(bid)
                out.append((tuple(source.rows(bid).tolist()), tuple(units.tolist()), tuple(epochs.tolist())))
    return out


@pytest.mark.parametrize("unit", ["batch", "utterance"])
def test_every_topology_yields_the_same_batches_at_most_one_per_rank_apart(unit):
    one = [b for e in range(3) for b in _epoch(_source(1, 0, unit=unit, weights={"en": 1, "zh": 1}), e)]
    for world, workers in [(2, 2), (3, 1), (5, 0)]:
        many = [b for e in range(3) for b in _epoch(_source(world, workers, unit=unit, weights={"en": 1, "zh": 1}),
                                                    e)]
        left = Counter(one)
        left.subtract(Counter(many))
        assert not +(Counter(many) - Counter(one)), "a batch the one-rank plan has not"
        assert sum(left.values()) <= 3 * (world - 1), (world, workers, sum(left.values()))


@pytest.mark.parametrize("unit", ["batch", "utterance"])
def test_within_a_corpus_epoch_no_utterance_repeats_and_none_is_lost(unit):
    source = _source(1, 0, unit=unit, weights={"en": 1, "zh": 1})
    seen: Counter = Counter()
    for e in range(4):
        for rows, units, epochs in _epoch(source, e):
            seen.update(zip(rows, units, epochs))
    assert max(seen.values()) == 1
    zh_epochs = {(e, r) for r, u, e in seen if u == 1}
    last = max(e for e, _ in zh_epochs)
    assert last >= 3  # the small corpus looped
    zh_rows = set(range(3200, 3500))
    for e in range(last):  # every corpus epoch but the last one was taken whole
        assert {r for ee, r in zh_epochs if ee == e} == zh_rows


def test_shares_are_exact_over_each_epoch_and_follow_the_schedule_epoch_by_epoch():
    source = _source(2, 0, unit="utterance", schedule=[(0, {"en": 9, "zh": 1}), (600, {"en": 1, "zh": 1})])
    shares = []
    for e in range(4):
        units = np.concatenate([np.array(u) for _, u, _ in _epoch(source, e)])
        at = source.planner.start(e)
        steps = source.run(source.start(e)).steps(0)
        scheduled = source.mixture.at(at.global_step + np.arange(steps)).mean(axis=0)
        shares.append((units == 1).mean())
        # every utterance the epoch takes is in some rank's batch, but for the discarded tail
        assert abs(shares[-1] - scheduled[1]) <= 0.02, (e, shares[-1], scheduled)
    assert shares[0] < 0.2 and shares[-1] > 0.4


def test_same_seed_same_plan_another_seed_another():
    assert _epoch(_source(2, 1), 1) == _epoch(_source(2, 1), 1)
    assert _epoch(_source(2, 1), 1) != _epoch(_source(2, 1, seed=2), 1)


def test_a_weight_of_zero_is_never_taken():
    source = _source(2, 0, weights={"en": 1, "zh": 0})
    assert {u for e in range(2) for _, units, _ in _epoch(source, e) for u in units} == {0}


@pytest.mark.parametrize("unit", ["batch", "utterance"])
@pytest.mark.parametrize("to", [(3, 0), (1, 2)])
@pytest.mark.parametrize("mix", [{"weights": {"en": 1, "zh": 3}},
                                 {"schedule": [(0, {"en": 1, "zh": 1}), (40, {"en": 1, "zh": 3})]}],
                         ids=["weights", "schedule"])
def test_resumed_on_another_topology_an_epoch_yields_what_it_had_left(unit, to, mix):
    """Two ranks of two workers stop after 4 steps of epoch 1; the position through JSON, as a
    checkpoint holds it, resumes on another topology: together, the batches of the epoch as planned,
    but for the tail the resumed ranks discard.  With weights that is the epoch one rank plans; a
    schedule's clock follows the steps, so there it is the epoch the two ranks planned."""
    first = _source(2, 2, unit=unit, **mix)
    run = first.run(first.start(1))  # planned forward from epoch 0, as a loader does
    done = [bid for r in range(2) for bid in [b for w in run.windows(r) for b in w.refs][:4]]
    at = run.after(0, 4)
    doc = json.loads(json.dumps(first.position_json(at)))
    state = SavedState(epoch=1, step=4, complete=False, global_step=first.global_step(at), position=doc,
                       mixture=None)
    other = _source(*to, unit=unit, **mix)
    other.resume(other.position(state))
    rest = [bid for r in range(to[0]) for w in other.run(other.start(1)).windows(r) for bid in w.refs]

    def batch(src, bid):
        return tuple(src.rows(bid).tolist()), tuple(src.origins(bid)[0].tolist())

    planned = _source(1, 0, unit=unit, **mix) if "weights" in mix else first
    whole = Counter(batch(planned, (0, 1, m, j)) for m, n in enumerate(planned.planner.counts(1)) for j in range(n))
    got = Counter([batch(first, b) for b in done] + [batch(other, b) for b in rest])
    assert not +(got - whole)  # nothing the epoch did not plan, nothing twice
    assert sum((whole - got).values()) <= to[0] - 1  # only the tail the resumed ranks discard


def test_a_mixture_of_utterances_mixes_batches_at_the_weights_with_little_padding():
    """Two corpora of lognormal lengths (different medians), 1 : 2 by weight: most batches hold both,
    each corpus's share of the utterances is within 2 points of its weight, and the batches pad as
    little as one corpus's do (frames padding efficiency >= 0.95 at 20,000 frames a batch)."""
    def corpus(n_shards: int, median: float, seed: int) -> ShardSet:
        rng = np.random.default_rng(seed)
        frames = np.clip(rng.lognormal(np.log(median), 0.5, n_shards * 500), 30, 6000).astype(np.int32)
        return ShardSet([f"c{seed}/s{i}.tar" for i in range(n_shards)], np.full(n_shards, 500, np.int64), frames,
                        [""] * n_shards, np.full(n_shards, -1))

    shards = union({"en": corpus(24, 600, 0), "zh": corpus(12, 400, 1)})
    source = epoch_source(shards, PlanOptions(max_frames=20_000), seed=3, world_size=2, num_workers=1, named=True,
                          mix=MixOptions(mix_unit="utterance", weights={"en": 1, "zh": 2}))
    batches = _epoch(source, 0)
    units = np.concatenate([np.array(u) for _, u, _ in batches])
    assert abs((units == 1).mean() - 2 / 3) <= 0.02
    assert np.mean([len(set(u)) == 2 for _, u, _ in batches]) >= 0.5
    frames = [shards.frames[list(r)] for r, _, _ in batches]
    assert sum(f.sum() for f in frames) / sum(len(f) * f.max() for f in frames) >= 0.95
