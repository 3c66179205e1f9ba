"""Dealing weighted items to parts so their loads stay even: streams to ranks, shards to streams and
to pack workers all use it.  Pure Python: no I/O, no numpy."""

from __future__ import annotations

import heapq
from typing import Iterable, Sequence


def least_loaded(order: Iterable[int], weights: Sequence[int], parts: int) -> list[list[int]]:
    """Walk ``order`` and give each item to the part with the least weight so far (ties: the
    lowest part); each part's items in the order given.  Given largest first, loads differ by at
    most the largest weight."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    heap = [(0, p) for p in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in order:
        load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + int(weights[i]), p))
    return out
