"""The mixture (weights, temperature, schedule) and the mixed plan: pure functions, no I/O."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from wdsprep.plan.mix.deal import MixPosition, mix_run, next_epoch, start_position
from wdsprep.plan.mix.weights import Mixture, draw_probabilities
from wdsprep.plan.mix.weights import make_mixture as mixture_of
from wdsprep.plan.options import MixOptions


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


# -- the mixed plan -----------------------------------------------------------------------------

# Two corpora: "en" big (4 streams), "zh" small (2 streams) so it loops; batches per stream vary
# with the corpus epoch, as real plans do.
def counts(c: int, e: int) -> np.ndarray:
    base = [np.array([30, 28, 31, 29]), np.array([5, 6])][c]
    return base + (e % 3) * (np.arange(len(base)) % 2)


UTTS_PER_BATCH = [20.0, 8.0]
CHUNKS = [4, 2]
SCHEDULE = make_mixture(NAMES, schedule=[(0, {"en": 9, "zh": 1}), (500, {"en": 1, "zh": 1})])


def probabilities(steps: np.ndarray, mixture: Mixture = SCHEDULE) -> np.ndarray:
    return draw_probabilities(mixture.at(steps), UTTS_PER_BATCH)


def run(start: MixPosition, world: int, workers: int, steps: int | None = None, *, seed: int = 1, prob=probabilities):
    return mix_run(start, world, workers, seed=seed, probabilities=prob, counts=counts, chunks=CHUNKS, steps=steps)


def epochs(world: int, workers: int, n: int, *, batches: int, seed: int = 1) -> list:
    """n loader epochs from the start; each run's refs, [world, steps, 4]."""
    pos, out = start_position(2, batches, world, workers), []
    for _ in range(n):
        r = run(pos, world, workers, seed=seed)
        out.append(r)
        pos = next_epoch(r.end, batches)
    return out


def check_corpus_epochs(refs: np.ndarray) -> None:
    """No batch repeats within a corpus epoch; every corpus epoch that a later one followed was
    handed out whole (nothing lost), except what readers still held when the next began."""
    seen = Counter(map(tuple, refs.reshape(-1, 4).tolist()))
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:5]
    for c in range(2):
        mine = {k for k in seen if k[0] == c}
        last = max(k[1] for k in mine)
        for e in range(last - 1):  # the one before the last may still be finishing
            got = {(s, j) for (_, ee, s, j) in mine if ee == e}
            assert got == {(s, j) for s, n in enumerate(counts(c, e)) for j in range(n)}, (c, e)


def test_every_step_of_every_rank_yields_a_batch_and_steps_are_equal():
    rs = epochs(3, 2, 2, batches=200)
    for r in rs:
        assert r.steps == math.ceil(200 / 3) and r.refs.shape == (3, r.steps, 4) and (r.refs >= 0).all()
        # Each epoch is a new DataLoader iteration: its turns start at worker 0, no placeholder.
        assert r.reader_of(0) == 0 and not r.lead(1)
    assert rs[1].end.global_step == 2 * math.ceil(200 / 3)


def test_within_a_corpus_epoch_no_batch_repeats_and_none_is_lost():
    rs = epochs(2, 3, 6, batches=150)  # zh (11-12 batches an epoch) loops many times
    refs = np.concatenate([r.refs for r in rs], axis=1)
    assert refs[..., 1][refs[..., 0] == 1].max() >= 5
    check_corpus_epochs(refs)


def test_the_share_of_each_50_step_window_follows_the_schedule_within_binomial_noise():
    """Batches drawn per window are a sum of Bernoulli draws with the scheduled chance of each step."""
    world = 2
    rs = epochs(world, 0, 3, batches=400)  # 600 steps, past the schedule's end at 500
    drawn = np.concatenate([r.corpus for r in rs], axis=1)  # [rank, step]
    p = probabilities(np.arange(drawn.shape[1]))[:, 1]
    for w0 in range(0, drawn.shape[1], 50):
        got = (drawn[:, w0:w0 + 50] == 1).sum()
        mean = world * p[w0:w0 + 50].sum()
        sd = math.sqrt(world * (p[w0:w0 + 50] * (1 - p[w0:w0 + 50])).sum())
        assert abs(got - mean) <= 4 * sd, (w0, got, mean, sd)
    # And the schedule is visible: zh (10% of the utterances, batches of 8 against 20) starts at
    # 22% of the draws and ends at 71% (50% of the utterances).
    assert (drawn[:, :100] == 1).mean() < 0.3 and (drawn[:, 500:] == 1).mean() > 0.6


def test_same_seed_same_plan_and_another_seed_another():
    a = epochs(2, 2, 2, batches=120)
    b = epochs(2, 2, 2, batches=120)
    c = epochs(2, 2, 2, batches=120, seed=2)
    assert all(np.array_equal(x.refs, y.refs) for x, y in zip(a, b))
    assert not np.array_equal(a[0].refs, c[0].refs)


@pytest.mark.parametrize("cut", [1, 17, 59])
def test_resumed_on_the_same_topology_the_run_goes_on_as_if_never_stopped(cut):
    start = start_position(2, 240, 2, 3)
    whole = run(start, 2, 3)
    first = run(start, 2, 3, steps=cut)
    saved = MixPosition.from_json(first.end.to_json())  # through JSON, as a checkpoint holds it
    rest = run(saved, 2, 3)
    assert np.array_equal(np.concatenate([first.refs, rest.refs], axis=1), whole.refs)
    assert rest.lead(0) == (cut % 3 != 0) and not rest.lead(cut % 3)  # the readers whose turn had passed


@pytest.mark.parametrize("to", [(3, 0), (1, 4), (4, 2)])
def test_resumed_on_another_topology_nothing_repeats_or_is_lost(to):
    batches = 150
    pos = start_position(2, batches, 2, 2)
    parts = []
    for _ in range(3):  # three loader epochs, each cut after 23 steps and finished on the other topology
        a = run(pos, 2, 2, steps=23)
        b = run(MixPosition.from_json(a.end.to_json()), *to)
        assert b.steps == math.ceil((batches - 23 * 2) / to[0])
        assert b.end.global_step == a.end.global_step + b.steps
        parts += [a.refs.reshape(-1, 4), b.refs.reshape(-1, 4)]
        pos = next_epoch(b.end, batches)
    check_corpus_epochs(np.concatenate(parts))


def test_a_weight_of_zero_is_never_drawn():
    fade = make_mixture(NAMES, schedule=[(0, {"en": 1, "zh": 1}), (100, {"en": 1, "zh": 0})])
    r = run(start_position(2, 600, 2, 0), 2, 0, prob=lambda g: probabilities(g, fade))
    assert (r.corpus[:, 100:] == 0).all() and (r.corpus[:, :50] == 1).any()
