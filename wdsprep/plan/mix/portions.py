"""Each corpus's portion of a mixed loader epoch, cut without regard to the topology.

A corpus (a named one, or a subset ``mix_by`` made) goes through epochs of its own, each laid out
in streams of items: its planned batches (``mix_unit="batch"``) or its utterances in the order the
shuffle buffer gives them (``mix_unit="utterance"``).  A loader epoch takes the next ``n`` items of
every corpus from where it stands (its :class:`Cursor`), and the taken items are cut into the
mixed epoch's streams.  Three pure rules, each a function of the counts alone:

- **which items**: a corpus epoch is consumed in progress order, item ``j`` of a stream of ``N`` at
  ``(j + 0.5) / N`` (ties: the lower stream first), so the first ``m`` items of an epoch are a
  prefix of every stream (:func:`progress_prefix`) and each stream advances by the same share: a
  portion is a contiguous range of each stream, read in order;
- **where they go**: a corpus's portion, its streams one after another, is cut into ``pieces``
  contiguous pieces of equal size (:func:`cut`), piece ``m`` going into mixed stream ``m``, so a
  mixed stream reads few streams of each corpus, each in order;
- **in what order**: a mixed stream's corpora are merged by progress (:func:`merge_order`), so
  each is spread evenly through it.

No I/O, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, NamedTuple, Sequence

import numpy as np

# Below this many items a sequence's progress keys are exact as floats (see merge_order).
_EXACT_FLOAT_ITEMS = 1 << 24


@dataclass(frozen=True)
class Cursor:
    """Where a corpus stands in its own epochs: ``done`` items of its epoch ``epoch`` taken."""

    epoch: int = 0
    done: int = 0

    def to_json(self) -> list[int]:
        return [self.epoch, self.done]


class Segment(NamedTuple):
    """Items ``start:stop`` of stream ``stream`` of one corpus epoch."""

    epoch: int
    stream: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def _key(stream: int, j: int, size: int) -> tuple[Fraction, int]:
    """Item ``j``'s place in a corpus epoch's progress order (exact: no float decides a tie)."""
    return Fraction(2 * j + 1, 2 * size), stream


def progress_prefix(sizes: Sequence[int], m: int) -> np.ndarray:
    """How many items of each stream (of ``sizes[s]`` items) the first ``m`` items of the progress
    order hold: a prefix of every stream, growing with ``m`` (so two prefixes make ranges)."""
    sizes = [int(n) for n in sizes]
    total = sum(sizes)
    if not 0 <= m <= total:
        raise ValueError(f"a prefix of {m} items of {total}")
    # Near the answer first (each stream's share), then exact steps: the taken set is made a prefix of
    # the order (its last item before every untaken one) of m items.  Each step moves one item.
    got = [min(n, max(0, int(np.ceil(m * n / total - 0.5)))) if total else 0 for n in sizes]
    while True:
        last = max((_key(s, got[s] - 1, n) for s, n in enumerate(sizes) if got[s]), default=None)
        first = min((_key(s, got[s], n) for s, n in enumerate(sizes) if got[s] < n), default=None)
        count = sum(got)
        if count > m or (count == m and last is not None and first is not None and last > first):
            got[last[1]] -= 1
        elif count < m:
            assert first is not None
            got[first[1]] += 1
        else:
            return np.array(got, np.int64)


def take(sizes_of: Callable[[int], np.ndarray], cursor: Cursor, n: int) -> tuple[list[Segment], Cursor]:
    """The next ``n`` items of a corpus from ``cursor`` (``sizes_of(e)``: the items per stream of its
    epoch ``e``): the segments of each corpus epoch they cross, streams in order, and where the corpus
    then stands.  An epoch spent, the next begins."""
    out: list[Segment] = []
    epoch, done = cursor.epoch, cursor.done
    while n > 0:
        sizes = np.asarray(sizes_of(epoch), np.int64)
        total = int(sizes.sum())
        if not total:
            raise ValueError(f"epoch {epoch} of a mixed corpus has nothing to take: every utterance is left out by "
                             f"the length or label filters")
        k = min(n, total - done)
        a, b = progress_prefix(sizes, done), progress_prefix(sizes, done + k)
        out.extend(Segment(epoch, s, int(a[s]), int(b[s])) for s in range(len(sizes)) if b[s] > a[s])
        n, done = n - k, done + k
        if done == total:
            epoch, done = epoch + 1, 0
    return out, Cursor(epoch, done)


def cut(segments: Sequence[Segment], pieces: int) -> list[list[Segment]]:
    """``segments`` one after another, cut into ``pieces`` contiguous pieces of equal size (the
    first ones one item larger where they do not divide): piece ``m``'s segments, in order."""
    sizes = [len(s) for s in segments]
    total = sum(sizes)
    bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.arange(total), pieces)]).tolist()
    out: list[list[Segment]] = [[] for _ in range(pieces)]
    first = 0  # items of the segments before the current one
    m = 0
    for seg, size in zip(segments, sizes):
        a = 0
        while a < size:
            while bounds[m + 1] <= first + a:
                m += 1
            b = min(size, bounds[m + 1] - first)
            out[m].append(Segment(seg.epoch, seg.stream, seg.start + a, seg.start + b))
            a = b
        first += size
    return out


def merge_order(lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of ``lengths[c]`` items merged by progress, item ``i`` of sequence ``c`` at
    ``(i + 0.5) / lengths[c]`` (ties: the lower ``c`` first): ``(which sequence, its item)`` per
    place of the merge."""
    which = np.concatenate([np.full(n, c, np.int64) for c, n in enumerate(lengths)] or [np.zeros(0, np.int64)])
    index = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths] or [np.zeros(0, np.int64)])
    sizes = np.asarray(lengths, np.int64)[which]
    if max(lengths, default=0) < _EXACT_FLOAT_ITEMS:
        # (2i + 1) / (2n) correctly rounded: equal fractions give equal floats, and two that differ
        # differ by at least 1 / (4 n n'), far more than a rounding below this many items.
        order = np.lexsort((which, (2 * index + 1) / (2 * sizes)))
    else:
        order = np.array(sorted(range(len(which)), key=lambda k: (Fraction(int(2 * index[k] + 1), int(2 * sizes[k])),
                                                                   int(which[k]))), np.int64)
    return which[order], index[order]
