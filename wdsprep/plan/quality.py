"""How random an epoch's batches are: speakers per batch, speaker recurrence, length correlation.

Pure numpy (and scipy's log-gamma), from the plan and the index alone: no feature is read.  A
*sequence* is the batches one trainer process gets, in order (one rank); sums of several
sequences add up (:meth:`ShuffleQuality.merge`), so a report over all ranks is exact.  The
reference is a **fully random draw**: every batch's ``b`` utterances drawn uniformly, without
replacement, from the epoch's ``N`` utterances, consecutive batches disjoint.  With ``n_s`` of
the epoch's utterances from speaker ``s`` and ``q_s(m) = C(N - n_s, m) / C(N, m)`` the chance
that ``m`` random utterances miss ``s`` (computed exactly, with log-gamma):

- **speakers per batch**: the mean number of distinct speakers in a batch; random:
  ``sum_s 1 - q_s(b)`` per batch, averaged over the batches' own sizes.
- **recurrence within k steps**: of the pairs (batch ``t``, a speaker of batch ``t``) whose batch
  has ``k`` batches after it, the share whose speaker is in one of batches ``t+1 .. t+k``.
  Random: the ratio of the expected counts, with ``P(s in A and s in C) = 1 - q_s(a) - q_s(c)
  + q_s(a + c)`` for disjoint random draws of sizes ``a = b_t`` and ``c = b_t+1 + ... + b_t+k``.
- **lag-1 length correlation**: the Pearson correlation of consecutive batches' mean lengths
  (about 0 for a random batch order; runs of rising lengths give nearly 1).

Speakers come from the index's speakers column (:meth:`wdsprep.format.index.FolderIndex.speakers`):
``utt2spk`` given to ``pack``, else the key rule :func:`wdsprep.format.keys.speaker_of`.  The
random figure is a bound, not a target: batches are cut from length-sorted pools, so where
speakers differ in utterance length, even a perfect shuffle gives a little less.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from wdsprep.plan.assign import Assignment, rank_order
from wdsprep.plan.streams import EpochPlan

RECURRENCE_STEPS = (1, 4)  # k of "recurs within the next k steps" reported


@dataclass
class ShuffleQuality:
    """Sums over one or more batch sequences; the figures are the properties.  Adds up across ranks."""

    ks: list[int] = field(default_factory=lambda: list(RECURRENCE_STEPS))
    batches: int = 0
    utterances: int = 0
    speakers: int = 0  # distinct speakers among the epoch's utterances (the population)
    source: str = ""  # where the speakers came from: utt2spk, key prefix
    distinct: float = 0.0  # sum over batches of their distinct speakers
    distinct_random: float = 0.0  # ... expected of a random draw of the same size
    recur_pairs: list[float] = field(default_factory=list)  # per k: (batch, speaker) pairs with k batches after
    recur_hits: list[float] = field(default_factory=list)  # per k: ... whose speaker recurs within k steps
    recur_pairs_random: list[float] = field(default_factory=list)
    recur_hits_random: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=lambda: [0.0] * 6)  # n, sum x, y, xx, yy, xy of consecutive means

    def __post_init__(self) -> None:
        for name in ("recur_pairs", "recur_hits", "recur_pairs_random", "recur_hits_random"):
            if not getattr(self, name):
                setattr(self, name, [0.0] * len(self.ks))

    def merge(self, other: ShuffleQuality) -> None:
        """Add another sequence's sums (another rank's batches of the same epoch)."""
        if list(other.ks) != list(self.ks):
            raise ValueError(f"cannot merge recurrence over steps {other.ks} into {self.ks}")
        self.batches += other.batches
        self.utterances += other.utterances
        self.speakers = max(self.speakers, other.speakers)
        self.source = self.source or other.source
        self.distinct += other.distinct
        self.distinct_random += other.distinct_random
        for name in ("recur_pairs", "recur_hits", "recur_pairs_random", "recur_hits_random", "lag"):
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name))])

    @property
    def speakers_per_batch(self) -> float:
        return self.distinct / self.batches if self.batches else math.nan

    @property
    def speakers_per_batch_random(self) -> float:
        return self.distinct_random / self.batches if self.batches else math.nan

    def recurrence(self, k: int) -> float:
        """Share of a batch's speakers found again within the next ``k`` batches."""
        i = self.ks.index(k)
        return self.recur_hits[i] / self.recur_pairs[i] if self.recur_pairs[i] else math.nan

    def recurrence_random(self, k: int) -> float:
        i = self.ks.index(k)
        return self.recur_hits_random[i] / self.recur_pairs_random[i] if self.recur_pairs_random[i] else math.nan

    @property
    def lag1_length_corr(self) -> float:
        n, sx, sy, sxx, syy, sxy = self.lag
        if n < 2:
            return math.nan
        vx, vy = sxx - sx * sx / n, syy - sy * sy / n
        return (sxy - sx * sy / n) / math.sqrt(vx * vy) if vx > 0 and vy > 0 else math.nan

    def figures(self) -> dict[str, Any]:
        """The report's numbers."""
        random = self.speakers_per_batch_random
        return {
            "speakers_per_batch": self.speakers_per_batch,
            "speakers_per_batch_random": random,
            "speakers_ratio": self.speakers_per_batch / random if random else math.nan,
            "recurrence": {str(k): self.recurrence(k) for k in self.ks},
            "recurrence_random": {str(k): self.recurrence_random(k) for k in self.ks},
            "lag1_length_corr": self.lag1_length_corr,
            "speakers": self.speakers,
            "speaker_source": self.source,
            "batches": self.batches,
        }

    def to_dict(self) -> dict[str, Any]:
        """The figures and the sums they come from (:meth:`from_dict` reads it back, to merge ranks)."""
        return {**self.figures(), "sums": asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShuffleQuality:
        return cls(**d["sums"])

    def format(self, indent: str = "  ") -> str:
        """Three lines for a report; "n/a" where there are too few batches for a figure."""
        f = self.figures()
        rec = ", ".join(f"{k} step{'s' if k > 1 else ''} {_num(self.recurrence(k), '.2f')} (random "
                        f"{_num(self.recurrence_random(k), '.2f')})" for k in self.ks)
        return "\n".join([
            f"{indent}speakers per batch  {_num(f['speakers_per_batch'], '.1f')}, random draw "
            f"{_num(f['speakers_per_batch_random'], '.1f')} ({_num(f['speakers_ratio'], '.2f')}x; "
            f"{self.speakers:,} speakers by {self.source})",
            f"{indent}speaker recurs in   {rec}",
            f"{indent}lag-1 length corr.  {_num(f['lag1_length_corr'], '+.2f')} (consecutive batches' mean lengths; "
            f"random ~0)",
        ])


def _num(x: float, spec: str) -> str:
    return "n/a" if math.isnan(x) else format(x, spec)


def _miss_sums(sizes: np.ndarray, total: int, draws: np.ndarray) -> np.ndarray:
    """For each draw size ``m``: ``sum_s q_s(m)``, the expected number of speakers a uniform draw of
    ``m`` of ``total`` utterances misses, speakers having ``sizes`` utterances (exact, log-gamma)."""
    from scipy.special import gammaln

    n_unique, n_count = np.unique(sizes, return_counts=True)
    m_unique, m_inverse = np.unique(draws, return_inverse=True)
    a = (total - n_unique)[:, None].astype(np.float64)  # utterances not of the speaker
    m = m_unique[None, :].astype(np.float64)
    possible = a >= m  # else every draw of m meets the speaker
    a_, m_ = np.where(possible, a, 0.0), np.where(possible, m, 0.0)
    log_q = gammaln(a_ + 1) - gammaln(a_ - m_ + 1) - gammaln(total + 1) + gammaln(total - m_ + 1)
    q = np.where(possible, np.exp(log_q), 0.0)
    return (n_count[:, None] * q).sum(axis=0)[m_inverse]


def sequence_quality(speakers: np.ndarray, lengths: np.ndarray, starts: np.ndarray, population: np.ndarray, *,
                     ks: Sequence[int] = RECURRENCE_STEPS, source: str = "") -> ShuffleQuality:
    """The sums of one batch sequence: batch ``t`` holds utterances ``starts[t]:starts[t + 1]`` of
    ``speakers`` (int ids) and ``lengths``; ``population`` holds the speaker id of every utterance
    of the epoch (all ranks), the pool a random draw takes from."""
    return _sequence_quality(speakers, lengths, starts, np.bincount(np.asarray(population, np.int64)), ks, source)


def _sequence_quality(speakers: np.ndarray, lengths: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                      ks: Sequence[int], source: str, *, loops: bool = False) -> ShuffleQuality:
    """:func:`sequence_quality` with the population as utterances per speaker id (``counts``);
    ``loops``: the sequence may go through the population more than once (a mixed corpus)."""
    speakers = np.asarray(speakers, np.int64)
    lengths = np.asarray(lengths, np.float64)
    starts = np.asarray(starts, np.int64)
    if len(starts) == 0 or starts[0] != 0 or starts[-1] != len(speakers) or (np.diff(starts) < 0).any():
        raise ValueError("starts must rise from 0 to the number of utterances")
    sizes = np.diff(starts)
    sizes = sizes[sizes > 0]  # an empty batch is no step of the sequence
    q = ShuffleQuality(ks=list(ks), source=source)
    pop_sizes = counts[counts > 0]
    total, n_speakers = int(pop_sizes.sum()), len(pop_sizes)
    q.speakers = n_speakers
    t_count = len(sizes)
    if not t_count:
        return q
    q.batches, q.utterances = t_count, int(sizes.sum())
    if q.utterances > total and not loops:
        raise ValueError(f"the batches hold {q.utterances} utterances, more than the {total} of the epoch")
    batch_of = np.repeat(np.arange(t_count, dtype=np.int64), sizes)
    width = int(speakers.max()) + 1
    keys = np.sort(batch_of * width + speakers)
    # Each (batch, speaker) once, by batch then speaker; np.unique (numpy 2) hashes, 20x slower here.
    pairs = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    pair_batch, pair_spk = pairs // width, pairs % width
    distinct = np.bincount(pair_batch, minlength=t_count)
    q.distinct = float(distinct.sum())
    by_spk = np.lexsort((pair_batch, pair_spk))  # by speaker, then batch
    s_sorted, t_sorted = pair_spk[by_spk], pair_batch[by_spk]
    gap = np.full(len(pairs), np.iinfo(np.int64).max)  # batches until the speaker's next batch
    same = s_sorted[1:] == s_sorted[:-1]
    gap[:-1][same] = (t_sorted[1:] - t_sorted[:-1])[same]

    # Expected speakers missed by a random draw, for every draw size used: one vectorized evaluation.
    csum = np.concatenate([[0], np.cumsum(sizes)])
    after = {}  # k -> utterances in the k batches after each batch that has k after it
    for k in ks:
        t = np.arange(max(0, t_count - k))
        after[k] = csum[t + 1 + k] - csum[t + 1]
    used = np.unique(np.concatenate([sizes, *after.values(), *[sizes[:len(c)] + c for c in after.values()]]))
    missed = _miss_sums(pop_sizes, total, used)
    miss = lambda m: missed[np.searchsorted(used, m)]  # noqa: E731
    meet = n_speakers - miss(sizes)  # expected distinct speakers of a random batch of each size
    q.distinct_random = float(meet.sum())
    for i, k in enumerate(ks):
        last = t_count - k  # batches 0 .. last-1 have k batches after them
        if last <= 0:
            continue
        c, b = after[k], sizes[:last]
        q.recur_pairs[i] = float(distinct[:last].sum())
        q.recur_hits[i] = float(((t_sorted < last) & (gap <= k)).sum())
        q.recur_pairs_random[i] = float(meet[:last].sum())
        q.recur_hits_random[i] = float((n_speakers - miss(b) - miss(c) + miss(b + c)).sum())
    means = np.add.reduceat(lengths, csum[:-1]) / sizes
    x, y = means[:-1], means[1:]
    q.lag = [float(len(x)), float(x.sum()), float(y.sum()), float((x * x).sum()), float((y * y).sum()),
             float((x * y).sum())]
    return q


def plan_quality(plan: EpochPlan, assignment: Assignment, speakers: np.ndarray, lengths: np.ndarray, *,
                 ranks: Sequence[int], ks: Sequence[int] = RECURRENCE_STEPS, source: str = "") -> ShuffleQuality:
    """The quality of the batches ``ranks`` get in a planned epoch, each rank's batches a sequence
    in the order it yields them; the population is every utterance of the plan.  ``speakers`` and
    ``lengths`` are per global row (the shard set's)."""
    return ranks_quality(lambda s, j: plan.streams[s].batch(j), assignment, population(plan, speakers), speakers,
                         lengths, ranks=ranks, ks=ks, source=source)


def population(plan: EpochPlan, speakers: np.ndarray) -> np.ndarray:
    """The epoch's utterances per speaker id (``speakers``: per global row), from every stream's rows."""
    counts = np.zeros(int(speakers.max(initial=-1)) + 1, np.int64)
    for s in plan.streams:
        counts += np.bincount(speakers[s.rows], minlength=len(counts))
    return counts


def ranks_quality(batch: Callable[[int, int], np.ndarray], assignment: Assignment, counts: np.ndarray,
                  speakers: np.ndarray, lengths: np.ndarray, *, ranks: Sequence[int],
                  ks: Sequence[int] = RECURRENCE_STEPS, source: str = "") -> ShuffleQuality:
    """:func:`plan_quality` with the population given as utterances per speaker id (``counts``) and
    each batch's rows by ``batch(stream, j)``: a rank that keeps no whole plan plans only its own."""
    out = ShuffleQuality(ks=list(ks), source=source)
    for r in ranks:
        batches = [batch(s, j) for s, j in rank_order(assignment, r)]
        out.merge(_batches_quality(batches, speakers, lengths, counts, ks, source))
    out.speakers = int(np.count_nonzero(counts))
    return out


def _batches_quality(batches: Sequence[np.ndarray], speakers: np.ndarray, lengths: np.ndarray, counts: np.ndarray,
                     ks: Sequence[int], source: str, *, loops: bool = False) -> ShuffleQuality:
    """:func:`_sequence_quality` of a sequence given as each batch's rows (of ``speakers`` and ``lengths``)."""
    rows = np.concatenate(batches) if len(batches) else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
    return _sequence_quality(speakers[rows], lengths[rows], starts, counts, ks, source, loops=loops)


def corpus_quality(sequences: Sequence[Sequence[tuple[int, np.ndarray]]], corpus_rows: Sequence[range | np.ndarray],
                   speakers: np.ndarray, lengths: np.ndarray, *, ks: Sequence[int] = RECURRENCE_STEPS,
                   source: str = "") -> list[ShuffleQuality]:
    """Per corpus of a mixed loader: the quality of its batches.  ``sequences`` holds each rank's
    batches in the order it yields them, as (corpus, rows); a corpus's batches on a rank are one
    sequence, so "within k steps" counts that corpus's batches.  The random draw takes from the
    whole corpus (``corpus_rows[c]``, rows of the union): a batch of several corpora counts for
    each with its rows of that corpus (the caller splits it), and a small corpus may loop within a
    loader epoch."""
    out = []
    width = int(speakers.max(initial=-1)) + 1
    for c, rows_c in enumerate(corpus_rows):
        mine = speakers[rows_c] if isinstance(rows_c, np.ndarray) else speakers[rows_c.start:rows_c.stop]
        counts = np.bincount(mine, minlength=width)
        q = ShuffleQuality(ks=list(ks), source=source)
        for seq in sequences:
            batches = [rows for corpus, rows in seq if corpus == c]
            q.merge(_batches_quality(batches, speakers, lengths, counts, ks, source, loops=True))
        q.speakers = int(np.count_nonzero(counts))
        out.append(q)
    return out
