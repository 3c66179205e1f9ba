"""The shuffle report's figures (plan/quality.py) on constructed cases, and the speaker cap."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest

from wdsprep.format.keys import speaker_of
from wdsprep.plan.batching import BatchFit, bucket_pools
from wdsprep.plan.quality import ShuffleQuality, corpus_quality, sequence_quality

A, B, C, D = 0, 1, 2, 3
POPULATION = np.array([A] * 4 + [B] * 4 + [C] * 2 + [D] * 2)  # the epoch: 12 utterances of 4 speakers
BATCHES = [[A, A, B], [A, C], [B, D, D], [A, B, C]]  # 11 of them, in the order a trainer gets them


def flat(batches):
    return np.concatenate([np.asarray(b) for b in batches]), np.cumsum([0] + [len(b) for b in batches])


def miss(n_s: int, total: int, m: int) -> float:
    """C(N - n_s, m) / C(N, m), straight from the definition."""
    return math.comb(total - n_s, m) / math.comb(total, m)


def test_figures_of_a_constructed_sequence_are_those_counted_by_hand():
    speakers, starts = flat(BATCHES)
    lengths = np.array([10, 11, 12, 30, 31, 50, 52, 54, 20, 21, 22], np.float64)
    q = sequence_quality(speakers, lengths, starts, POPULATION, ks=(1, 2))

    # Distinct speakers: {A,B}, {A,C}, {B,D}, {A,B,C}.
    assert q.speakers_per_batch == (2 + 2 + 2 + 3) / 4
    # Within 1 step: A of batch 0 is in batch 1, B of batch 2 in batch 3; 6 pairs in batches 0-2.
    assert q.recurrence(1) == 2 / 6
    # Within 2 steps (batches 0-1 count): A, B of batch 0 (B in batch 2), A of batch 1 (batch 3); C too.
    assert q.recurrence(2) == 4 / 4
    # Random: sum over speakers of 1 - C(N - n_s, b) / C(N, b), averaged over the batch sizes.
    sizes = {A: 4, B: 4, C: 2, D: 2}
    meet = lambda b: sum(1 - miss(n, 12, b) for n in sizes.values())  # noqa: E731
    assert q.speakers_per_batch_random == pytest.approx(np.mean([meet(3), meet(2), meet(3), meet(3)]))
    both = lambda a, c: sum(1 - miss(n, 12, a) - miss(n, 12, c) + miss(n, 12, a + c) for n in sizes.values())  # noqa
    expected = (both(3, 2) + both(2, 3) + both(3, 3)) / (meet(3) + meet(2) + meet(3))
    assert q.recurrence_random(1) == pytest.approx(expected)
    means = [np.mean(lengths[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    assert q.lag1_length_corr == pytest.approx(np.corrcoef(means[:-1], means[1:])[0, 1])
    assert q.speakers == 4 and q.batches == 4 and q.utterances == 11


def test_the_random_figures_are_what_random_batches_give():
    """Shuffle the epoch, cut it into the same batch sizes, count: the average is the exact expectation."""
    speakers, starts = flat(BATCHES)
    sizes = np.diff(starts)
    exact = sequence_quality(speakers, np.zeros(len(speakers)), starts, POPULATION, ks=(1, 2))
    rng = np.random.default_rng(0)
    sim = ShuffleQuality(ks=[1, 2])
    for _ in range(20_000):
        drawn = rng.permutation(POPULATION)[:sizes.sum()]
        sim.merge(sequence_quality(drawn, np.zeros(len(drawn)), starts, POPULATION, ks=(1, 2)))
    assert sim.speakers_per_batch == pytest.approx(exact.speakers_per_batch_random, rel=0.01)
    for k in (1, 2):
        assert sim.recurrence(k) == pytest.approx(exact.recurrence_random(k), rel=0.02)
    # and a sequence of random batches is "as good as random"
    assert sim.speakers_per_batch / sim.speakers_per_batch_random == pytest.approx(1.0, rel=0.01)


def test_sequences_add_up_as_one_report_over_ranks():
    speakers, starts = flat(BATCHES)
    lengths = np.arange(len(speakers), dtype=np.float64)
    one = sequence_quality(speakers[:5], lengths[:5], starts[:3], POPULATION)
    two = sequence_quality(speakers[5:], lengths[5:], starts[2:] - 5, POPULATION)
    merged = ShuffleQuality.from_dict(one.to_dict())
    merged.merge(ShuffleQuality.from_dict(two.to_dict()))
    assert merged.batches == 4 and merged.speakers_per_batch == 9 / 4
    # Recurrence looks within a rank's own sequence: batch 1 is the last of rank one.
    assert merged.recurrence(1) == (1 + 1) / (2 + 2)
    assert merged.figures()["speakers_ratio"] == pytest.approx(merged.speakers_per_batch
                                                                / merged.speakers_per_batch_random)


def test_a_mixed_corpus_is_reported_on_its_own_batches_against_its_own_speakers():
    """Two corpora in one union (rows 0-3: speakers A A B B; rows 4-7: C C D D).  Corpus 0's steps are
    its own batches: the corpus 1 batch between them is not a step of it.  A small corpus loops,
    so its batches may hold more utterances than it has."""
    speakers = np.array([A, A, B, B, C, C, D, D])
    lengths = np.arange(8, dtype=np.float64)
    rows = [range(0, 4), range(4, 8)]
    rank0 = [(0, np.array([0, 1])), (1, np.array([4, 6])), (0, np.array([2, 3])), (0, np.array([0, 2]))]
    rank1 = [(1, np.array([5, 7])), (1, np.array([4, 5]))]
    zero, one = corpus_quality([rank0, rank1], rows, speakers, lengths, ks=(1,))

    assert zero.batches == 3 and zero.utterances == 6 > 4 and zero.speakers == 2
    assert zero.speakers_per_batch == (1 + 1 + 2) / 3  # {A}, {B}, {A, B}
    assert zero.recurrence(1) == 1 / 2  # A of batch 0 is not in batch 1; B of batch 1 is in batch 2
    # The random draw takes from corpus 0 alone: 4 utterances, 2 per speaker.
    meet2 = 2 * (1 - miss(2, 4, 2))
    assert zero.speakers_per_batch_random == pytest.approx(meet2)
    # A speaker in both of two disjoint random pairs: 1 - q(2) - q(2) + q(4), and q(4) = 0 (4 of 4 meet everyone).
    both = 2 * (1 - miss(2, 4, 2) - miss(2, 4, 2) + 0.0)
    assert zero.recurrence_random(1) == pytest.approx(2 * both / (2 * meet2))
    # Corpus 1: rank 1's batches {C, D}, {C}; rank 0's single batch {C, D} has no next step.
    assert one.batches == 3 and one.speakers_per_batch == (2 + 2 + 1) / 3
    assert one.recurrence(1) == 1 / 2
    assert one.speakers_per_batch_random == pytest.approx(meet2)


@pytest.mark.parametrize("uttid,speaker", [
    ("spk01-utt3", "spk01"), ("sp0.9-spk01-utt3", "spk01"), ("sp1.1-spk01-utt3", "spk01"), ("sp1-spk01-x", "spk01"),
    ("103-1240-0000", "103"), ("en_f1_r1.10_p70-0001", "en_f1_r1.10_p70"), ("BAC009S0002W0122", "BAC009S0002W0122"),
    ("spk.with.dots-1", "spk.with.dots"), ("sp0.9-", "sp0.9"),
])
def test_the_key_rule_takes_the_id_up_to_its_first_dash_after_a_speed_prefix(uttid, speaker):
    assert speaker_of(uttid) == speaker


def _capped_case(seed=0):
    rng = np.random.default_rng(seed)
    n = 3000
    lengths = np.clip(rng.lognormal(np.log(600), 0.5, n), 50, 3000).astype(np.int64)
    speakers = np.sort(rng.integers(0, 30, n))  # a pool in speaker order: batches would be one-speaker
    return lengths, speakers


@pytest.mark.parametrize("cap", [1, 2, 5])
def test_the_speaker_cap_holds_in_every_batch_and_keeps_every_utterance(cap):
    lengths, speakers = _capped_case()
    pos, starts = bucket_pools(lengths, fit=BatchFit(20_000), rng=np.random.default_rng(1), pool_size=1000,
                               speakers=speakers, max_utts_per_speaker=cap)
    assert sorted(pos.tolist()) == list(range(len(lengths)))
    for a, b in zip(starts[:-1], starts[1:]):
        batch = pos[a:b]
        assert np.bincount(speakers[batch]).max() <= cap
        assert len(batch) == 1 or len(batch) * lengths[batch].max() <= 20_000


def test_the_cap_changes_nothing_where_it_already_holds():
    lengths, speakers = _capped_case()
    speakers = np.random.default_rng(2).permutation(speakers)
    pos, starts = bucket_pools(lengths, fit=BatchFit(20_000), rng=np.random.default_rng(1))
    top = max(int(np.bincount(speakers[pos[a:b]]).max()) for a, b in zip(starts[:-1], starts[1:]))
    capped = bucket_pools(lengths, fit=BatchFit(20_000), rng=np.random.default_rng(1), speakers=speakers,
                          max_utts_per_speaker=top)
    assert np.array_equal(capped[0], pos) and np.array_equal(capped[1], starts)
    tighter = bucket_pools(lengths, fit=BatchFit(20_000), rng=np.random.default_rng(1), speakers=speakers,
                           max_utts_per_speaker=top - 1)
    assert not np.array_equal(tighter[0], pos)


def test_the_cap_needs_speakers_and_a_positive_count():
    with pytest.raises(ValueError, match="speakers"):
        bucket_pools(np.ones(5, np.int64), fit=BatchFit(10), rng=np.random.default_rng(0), max_utts_per_speaker=1)
    with pytest.raises(ValueError, match="max_utts_per_speaker"):
        bucket_pools(np.ones(5, np.int64), fit=BatchFit(10), rng=np.random.default_rng(0), speakers=np.zeros(5),
                     max_utts_per_speaker=0)


def test_exact_expectation_matches_enumeration_on_a_tiny_corpus():
    """Every subset of 3 of 7 utterances: the mean distinct speakers is the formula's value."""
    population = np.array([0, 0, 0, 1, 1, 2, 3])
    subsets = list(combinations(range(7), 3))
    mean = np.mean([len(set(population[list(s)].tolist())) for s in subsets])
    q = sequence_quality(population[:3], np.zeros(3), np.array([0, 3]), population)
    assert q.speakers_per_batch_random == pytest.approx(mean)
