"""Dynamic batching by frame count: batches whose padded size ``B * max(length)`` fits ``max_frames``.

:func:`bucket_pools` is what the epoch plan batches each stream with.  It takes a pool of
``pool_size`` lengths at a time from an already shuffled sequence, sorts the pool, cuts batches
greedily from the sorted pool and puts them in a random order.  Sorting keeps lengths within a
batch close (little padding); shuffling the batches of a pool keeps the order the trainer sees
random (no rising-length runs as with a plain sort window).  The last, partly filled batch of a
pool is carried into the next pool instead of being cut small, at most ``max_carry`` times.  A
length above ``max_frames`` is a batch of its own; nothing is dropped.  When the fit counts label
tokens, a pool is ordered by frames and tokens both (:func:`band_order`), so a batch's longest
label is close to its others too.

:func:`bucket_batches` is the same on a list of samples (``inspect``'s padding curves, tests).
The batchers it is measured against (CAT's stream, WeNet's sort window) are in
``tools/bench/baselines.py``.  numpy only: no torch here.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, TypeVar

import numpy as np

from wdsprep.plan.cost import CostModel

S = TypeVar("S")

# 4,000 samples give >= 0.97 real/padded frames on realistic ASR lengths (lognormal, median 600)
# at max_frames 10k-50k; see docs/batching.md for the measured trade-off (memory vs padding).
DEFAULT_POOL_SIZE = 4000
# How wide (per mille of frames) the bands of a pool ordered by frames and tokens are (band_order):
# wider pads labels less and frames more.  On lognormal frames and text rates, in pools of 128
# batches, 2.5% kept >= 0.974 frames padding with +0.14 to +0.17 label padding efficiency over
# frames-sorted pools; 2% gave +0.12, 3% frames down to 0.971 (tools/bench/bench_cost.py, docs/batching.md).
BAND_WIDTH = 25
# Before a pool is cut, each row may move up to this many places from its sorted one, and the first
# batch closes at a random point (shaken, varied_cuts): a pool that holds the same rows every epoch
# (a corpus of one stream, a stream of one shard) is then cut into other batches each epoch.  On
# the demo corpus (173 utterances, max_frames 1000) two epochs' plans shared 15 of 22 batches before;
# see docs/batching.md for what it costs in padding.
NEIGHBOURS = 2


def len_of_first_dim(sample: Any) -> int:
    """Frames of a ``(key, features, ...)`` sample: the first dimension of ``sample[1]``."""
    return int(sample[1].shape[0])


def check_batching(pool_size: int = 1, max_carry: int = 0, max_utts_per_speaker: int | None = None) -> None:
    """ValueError for pooling options no batching can honour (the fit checks its own)."""
    if max_utts_per_speaker is not None and not (
            isinstance(max_utts_per_speaker, (int, np.integer)) and max_utts_per_speaker > 0):
        raise ValueError(f"max_utts_per_speaker must be None or a positive int, got {max_utts_per_speaker!r}")
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size!r}")
    if max_carry < 0:
        raise ValueError(f"max_carry must be >= 0, got {max_carry!r}")


@dataclass(frozen=True)
class BatchFit:
    """Whether a batch fits: the one rule every batch of the plan is cut by.

    A batch of ``B`` utterances whose longest has ``longest`` frames (and whose longest label has
    ``tokens`` tokens) fits when each bound given holds: ``B * longest <= max_frames``,
    ``B <= max_batch_size``, and its cost ``B * c(t, u) <= max_cost`` under the cost model
    (``plan/cost.py``).  One utterance always makes a batch, fitting or not: nothing is dropped
    for its length.
    """

    max_frames: int | None = None
    max_batch_size: int | None = None
    cost: CostModel | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        if self.max_frames is not None and not (isinstance(self.max_frames, (int, np.integer)) and self.max_frames > 0):
            raise ValueError(f"max_frames must be a positive int, got {self.max_frames!r}")
        if self.max_batch_size is not None and not (isinstance(self.max_batch_size, (int, np.integer))
                                                    and self.max_batch_size > 0):
            raise ValueError(f"max_batch_size must be None or a positive int, got {self.max_batch_size!r}")
        if self.max_cost is not None and (isinstance(self.max_cost, bool) or not isinstance(self.max_cost, (int, float))
                                          or not math.isfinite(self.max_cost) or self.max_cost <= 0):
            raise ValueError(f"max_cost must be a finite number > 0, got {self.max_cost!r}")
        if (self.cost is None) != (self.max_cost is None):
            raise ValueError("a cost budget needs both cost (the model: a dict or its JSON file) and max_cost")
        if self.max_frames is None and self.max_cost is None:
            raise ValueError("batches need a bound: max_frames (padded frames), or cost and max_cost")

    @property
    def uses_tokens(self) -> bool:
        """Whether a batch's fit depends on its labels' length in tokens."""
        return self.cost is not None and self.cost.uses_tokens

    def room(self, longest: np.ndarray | int, tokens: np.ndarray | int = 0) -> np.ndarray:
        """The most utterances a batch may hold when its longest has ``longest`` frames and its
        longest label ``tokens`` tokens (>= 1); elementwise (int64) for arrays."""
        longest = np.asarray(longest, np.int64)
        room = np.full(longest.shape, np.iinfo(np.int64).max, np.int64)
        if self.max_frames is not None:
            # Utterances of no frames pad nothing: the frame bound leaves them be.
            room = np.where(longest > 0, self.max_frames // np.maximum(longest, 1), room)
        if self.max_batch_size is not None:
            room = np.minimum(room, self.max_batch_size)
        if self.cost is not None and self.max_cost is not None:
            each = self.cost.per_utterance(longest, tokens)
            # The last ulp must not turn B * c == max_cost into one utterance fewer.
            most = np.floor(self.max_cost / np.maximum(each, 1e-300) * (1 + 1e-12))
            room = np.minimum(room, np.where(each > 0, np.minimum(most, 2.0 ** 62), room).astype(np.int64))
        return np.maximum(room, 1)

    def fits(self, size: int, longest: int, tokens: int = 0) -> bool:
        return bool(size <= self.room(longest, tokens))

    def cut(self, lengths: np.ndarray, tokens: np.ndarray | None = None) -> list[tuple[int, int]]:
        """Greedy ``[start, end)`` cuts of ascending lengths (and their labels' tokens, when the fit
        depends on them): a batch closes before the sample that would not fit.  The last cut is the
        open batch.

        A batch from ``start`` must close before sample ``i`` when ``i - start + 1 > room[i]``,
        that is when ``i + 1 - room[i] > start``.  Lengths ascend, so ``room`` falls and
        ``i + 1 - room[i]`` rises strictly: each batch's end is one binary search (planning 15M
        utterances cuts ~750,000 batches).  With tokens, a batch's room falls with its longest
        frames and label so far (lengths need not ascend then: :func:`band_order`'s pools do not):
        it closes within its first sample's room, and its end is searched in windows that start at
        twice the batch before (neighbours are alike) and double until the batch closes.
        """
        n = len(lengths)
        if not n:
            return []
        cuts: list[tuple[int, int]] = []
        start = 0
        if tokens is None or not self.uses_tokens:
            # A list and bisect: one call per batch, where numpy's dispatch would cost more than the search.
            closes = (np.arange(1, n + 1, dtype=np.int64) - self.room(lengths)).tolist()
            while start < n:
                end = max(start + 1, bisect_right(closes, start))
                cuts.append((start, end))
                start = end
            return cuts
        lengths, tokens = np.asarray(lengths, np.int64), np.asarray(tokens, np.int64)
        counts = np.arange(1, n + 1, dtype=np.int64)
        last = 8
        while start < n:
            # The room a batch has only falls as it grows, so it closes within its first sample's
            # room: a window that reaches the end or finds the close is enough.
            stop = min(n, start + 2 * last)
            while True:
                room = self.room(np.maximum.accumulate(lengths[start:stop]),
                                 np.maximum.accumulate(tokens[start:stop]))
                over = np.flatnonzero(counts[:stop - start] > room)
                if len(over) or stop == n:
                    break
                stop = min(n, start + 2 * (stop - start))
            end = max(start + 1, start + (int(over[0]) if len(over) else stop - start))
            cuts.append((start, end))
            last, start = end - start, end
        return cuts


def _cut_capped(lengths: list[int], tokens: list[int], speakers: list[int], fit: BatchFit,
                cap: int) -> list[list[int]]:
    """Greedy batches of a pool's order as :meth:`BatchFit.cut` cuts them, but with at most ``cap``
    utterances of one speaker each: the positions of each batch, the last one open.

    An utterance whose speaker already has ``cap`` in the batch waits (per speaker, in order) and
    is first in line for the next batch: with ascending lengths it is no longer than anything
    after it, so it never raises that batch's padding (in a pool ordered by frames and tokens,
    by no more than a band's width).  Leftovers of a speaker who dominates the pool end up in small
    batches of their own at the end of the pool; the last of them is the one carried over.
    O(pool): each position is looked at once on the way in and once per batch it waits for.
    """
    n = len(lengths)
    waiting: dict[int, deque[int]] = {}  # speaker -> positions passed over, ascending
    batches: list[list[int]] = []
    i = 0
    while i < n or waiting:
        batch: list[int] = []
        count: dict[int, int] = {}
        longest = most_tokens = 0

        def fits(j: int) -> bool:
            return fit.fits(len(batch) + 1, max(longest, lengths[j]), max(most_tokens, tokens[j]))

        # Those waiting first, shortest first; at most cap of each speaker can be taken.
        for j in sorted(j for q in waiting.values() for j in islice(q, cap)):
            if not fits(j):
                break
            batch.append(j)
            longest, most_tokens = max(longest, lengths[j]), max(most_tokens, tokens[j])
            spk = speakers[j]
            count[spk] = count.get(spk, 0) + 1
            waiting[spk].popleft()
        waiting = {spk: q for spk, q in waiting.items() if q}
        while i < n:
            spk = speakers[i]
            if count.get(spk, 0) >= cap:
                waiting.setdefault(spk, deque()).append(i)
                i += 1
                continue
            if not fits(i):
                break
            batch.append(i)
            longest, most_tokens = max(longest, lengths[i]), max(most_tokens, tokens[i])
            count[spk] = count.get(spk, 0) + 1
            i += 1
        batches.append(batch)
    return batches


def stable_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")`` of non-negative ints, as 16-bit keys where they fit:
    numpy sorts those by radix, about 4x faster (planning sorts every pool and buffer block)."""
    if len(values) and int(values.max()) < 1 << 16:
        values = values.astype(np.uint16)
    return np.argsort(values, kind="stable")


@lru_cache(maxsize=1)
def band_edges() -> np.ndarray:
    """int64: the frames at which each band of :func:`band_order` starts, each :data:`BAND_WIDTH`
    per mille above the one before (at least one frame), up to 2**31.  Integers only: a float
    logarithm may round differently on another CPU, and the plan must not."""
    edges = [1]
    while edges[-1] < 1 << 31:
        edges.append(edges[-1] + max(1, edges[-1] * BAND_WIDTH // 1000))
    return np.array(edges, np.int64)


def band_order(order: np.ndarray, lens: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """A pool's rows ordered by frames and label tokens both, from ``order`` (its rows by ascending frames).

    The frames-sorted pool is split into bands of frames :data:`BAND_WIDTH` per mille wide, and
    each band is sorted by tokens, rising in one band and falling in the next: a batch cut from a
    band pads its frames by at most that width and spans a narrow range of its labels, and one
    that straddles two bands joins the same end of both.  The bands depend on the lengths only,
    never on the topology.
    """
    ordered_lens, ordered_tokens = lens[order], tokens[order]
    band = np.searchsorted(band_edges(), ordered_lens, side="right")
    band[1:] = np.cumsum(band[1:] != band[:-1])  # bands present, numbered from 0: alternate directions
    band[0] = 0
    key = np.where(band % 2 == 1, -ordered_tokens, ordered_tokens) + (1 << 31)  # in [0, 2**32)
    # By band, then by key; stable: ties keep ascending frames.
    return order[np.argsort((band << 32) | key, kind="stable")]


def shaken(order: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``order`` with each row moved by up to :data:`NEIGHBOURS` places (integer keys: the same on every CPU)."""
    keys = (np.arange(len(order), dtype=np.int64) << 2) + rng.integers(0, 8 * NEIGHBOURS + 1, len(order))
    return order[stable_order(keys)]


def varied_cuts(fit: BatchFit, lens: np.ndarray, tokens: np.ndarray | None,
                rng: np.random.Generator) -> list[tuple[int, int]]:
    """:meth:`BatchFit.cut` of a pool in a nearly sorted order (:func:`shaken`), its first batch
    closing at a random point of the room it has (a pool that is one batch stays whole)."""
    if not len(lens):
        return []
    if tokens is None:
        # A batch is bounded by the longest so far: never below its own longest, in a nearly sorted order.
        lens = np.maximum.accumulate(lens)
    head = int(min(len(lens), fit.room(int(lens[0]), 0 if tokens is None else int(tokens[0])) + 1))
    first = fit.cut(lens[:head], None if tokens is None else tokens[:head])[0][1]
    if first >= len(lens):
        return [(0, first)]  # the whole pool is one batch: nothing to vary
    k = int(rng.integers(1, first + 1))
    rest = fit.cut(lens[k:], None if tokens is None else tokens[k:])
    return [(0, k), *((a + k, b + k) for a, b in rest)]


def _over_cap(cuts: list[tuple[int, int]], speakers: np.ndarray, cap: int) -> bool:
    """Whether a cut holds more than ``cap`` utterances of one speaker (``speakers`` in cut order)."""
    sizes = np.array([b - a for a, b in cuts], np.int64)
    _, spk = np.unique(speakers, return_inverse=True)
    codes = np.repeat(np.arange(len(cuts), dtype=np.int64), sizes) * (int(spk.max(initial=0)) + 1) + spk
    return bool(len(codes)) and int(np.unique(codes, return_counts=True)[1].max()) > cap


def _plan_pool(lens: np.ndarray, tokens: np.ndarray | None, fit: BatchFit, rng: np.random.Generator,
               ages: np.ndarray, max_carry: int, speakers: np.ndarray | None = None,
               max_utts_per_speaker: int | None = None, vary: bool = True
               ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The rows of each batch of one pool in random order, the rows to carry over and their new ages.

    The first ``len(ages)`` rows of the pool are the ones carried into it.  ``tokens`` (labels'
    lengths) only where the fit depends on them.  ``vary``: the pool shaken and its first batch cut
    at a random point (:func:`varied_cuts`); without, the plain cut of the sorted pool.
    """
    # Stable sort: ties keep arrival order, so the result never depends on the sort algorithm.
    order = stable_order(lens)
    if tokens is not None:
        order = band_order(order, lens, tokens)
    if vary:
        order = shaken(order, rng)
    sorted_lens = lens[order]
    sorted_tokens = None if tokens is None else tokens[order]
    cuts = varied_cuts(fit, sorted_lens, sorted_tokens, rng) if vary else fit.cut(sorted_lens, sorted_tokens)
    batches = [order[a:b] for a, b in cuts]
    if max_utts_per_speaker is not None and speakers is not None and _over_cap(cuts, speakers[order],
                                                                               max_utts_per_speaker):
        token_list = [0] * len(order) if sorted_tokens is None else sorted_tokens.tolist()
        capped = _cut_capped(sorted_lens.tolist(), token_list, speakers[order].tolist(), fit, max_utts_per_speaker)
        batches = [order[np.array(b, np.int64)] for b in capped]
    carry = new_ages = np.zeros(0, np.int64)
    if max_carry and batches:
        rows = batches[-1]
        size, longest = len(rows), int(lens[rows].max())
        full = not fit.fits(size + 1, longest, 0 if tokens is None else int(tokens[rows].max()))
        aged = np.ones(len(rows), np.int64)
        was_carried = rows < len(ages)
        aged[was_carried] += ages[rows[was_carried]]
        # Without an age limit a lone long utterance would be carried to the end of the epoch.
        if not full and aged.max() <= max_carry:
            carry, new_ages = rows, aged
            batches.pop()
    # Shuffle the batch order so lengths do not rise within a pool (WeNet's weak spot).
    return [batches[j] for j in rng.permutation(len(batches))], carry, new_ages


def bucket_pools(lengths: np.ndarray, *, fit: BatchFit, rng: np.random.Generator, pool_size: int = DEFAULT_POOL_SIZE,
                 max_carry: int = 1, tokens: np.ndarray | None = None, speakers: np.ndarray | None = None,
                 max_utts_per_speaker: int | None = None, vary: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Batches of a shuffled length sequence as ``(positions, starts)``: batch ``j`` holds the
    positions ``positions[starts[j]:starts[j + 1]]`` of ``lengths``, batches in the order a trainer
    gets them.  Same ``rng`` state and lengths -> same batches in the same order.

    ``tokens`` (each label's length) is needed when the fit's cost depends on it;
    ``max_utts_per_speaker`` caps each speaker's utterances per batch; it needs ``speakers``
    (an int id per length).  ``vary`` (training): each pool cut into other batches from one
    ``rng`` to the next (:data:`NEIGHBOURS`); off (dev): the same batches whatever the ``rng``, which
    then orders them only."""
    check_batching(pool_size, max_carry, max_utts_per_speaker)
    if max_utts_per_speaker is not None and (speakers is None or len(speakers) != len(lengths)):
        raise ValueError("max_utts_per_speaker needs the speaker of every length (speakers=)")
    if fit.uses_tokens and (tokens is None or len(tokens) != len(lengths)):
        raise ValueError("the cost model counts label tokens: it needs every label's length (tokens=)")
    tokens = np.asarray(tokens, np.int64) if fit.uses_tokens else None
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and lengths.min() < 0:
        # A negative length would let a batch pass the B * max <= max_frames check wrongly.
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())} at position {int(lengths.argmin())}")
    out: list[np.ndarray] = []
    sizes: list[int] = []
    carried = np.zeros(0, np.int64)  # positions carried into the next pool
    ages = np.zeros(0, np.int64)
    pos = 0
    while True:
        take = min(pool_size, len(lengths) - pos)
        last = pos + take >= len(lengths)
        pool = np.concatenate([carried, np.arange(pos, pos + take, dtype=np.int64)])
        pos += take
        if not len(pool):
            break
        rows, carry, ages = _plan_pool(lengths[pool], None if tokens is None else tokens[pool], fit, rng, ages,
                                       0 if last else max_carry, None if speakers is None else speakers[pool],
                                       max_utts_per_speaker, vary)
        for r in rows:
            out.append(pool[r])
            sizes.append(len(r))
        carried = pool[carry]
        if last:
            break
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), starts


def bucket_batches(
    samples: Iterable[S],
    *,
    max_frames: int,
    rng: np.random.Generator,
    length: Callable[[S], int] = len_of_first_dim,
    max_batch_size: int | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_carry: int = 1,
) -> Iterator[list[S]]:
    """:func:`bucket_pools` on (already shuffled) samples: lists of samples with ``B * max(length) <= max_frames``.

    ``length`` must be cheap: it is called once per sample.
    """
    items = list(samples)
    lens = np.fromiter((length(s) for s in items), np.int64, len(items))
    if len(lens) and lens.min() < 0:
        bad = items[int(lens.argmin())]
        # Samples are usually (key, features, ...): name the key so the user can find the utterance.
        what = repr(bad[0]) if isinstance(bad, (tuple, list)) and bad and isinstance(bad[0], str) else repr(bad)
        raise ValueError(f"sample length must be >= 0, got {int(lens.min())} for sample {what}")
    positions, starts = bucket_pools(lens, fit=BatchFit(max_frames, max_batch_size), rng=rng, pool_size=pool_size,
                                     max_carry=max_carry)
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        yield [items[i] for i in positions[a:b].tolist()]
