"""The batchers wdsprep's bucketing is measured against, and how random a batch order is.

- :func:`stream_batches`: CAT's streaming batcher: fill in arrival order, no sorting.
- :func:`sort_window_batches`: WeNet's: sort each window of N samples by length, then fill.
- :func:`order_randomness`: correlations of consecutive batches' mean lengths (sorted runs show up).

Benchmarks and tests only; the library never imports this.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

S = TypeVar("S")


def _check_args(max_frames: int, max_batch_size: int | None) -> None:
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames!r}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be None or >= 1, got {max_batch_size!r}")


def stream_batches(
    samples: Iterable[S],
    *,
    max_frames: int,
    length: Callable[[S], int],
    max_batch_size: int | None = None,
) -> Iterator[list[S]]:
    """Baseline (CAT's streaming batcher): fill in arrival order until the next sample would exceed
    ``max_frames`` padded frames; no sorting.  Unlike CAT we flush the last batch instead of dropping
    it, and an oversize sample comes out alone instead of failing an assertion."""
    _check_args(max_frames, max_batch_size)
    cap = max_batch_size or math.inf
    buf: list[S] = []
    longest = 0
    for s in samples:
        n = int(length(s))
        longest_if_added = max(longest, n)
        if buf and (len(buf) >= cap or (len(buf) + 1) * longest_if_added > max_frames):
            yield buf
            buf, longest = [s], n
        else:
            buf.append(s)
            longest = longest_if_added
    if buf:
        yield buf


def sort_window(samples: Iterable[S], *, window: int, length: Callable[[S], int]) -> Iterator[S]:
    """Stage: sort each consecutive window of ``window`` samples by length (ascending), as WeNet does."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    buf: list[tuple[int, int, S]] = []
    for s in samples:
        # The arrival index breaks ties so samples themselves are never compared.
        buf.append((int(length(s)), len(buf), s))
        if len(buf) >= window:
            buf.sort(key=lambda t: (t[0], t[1]))
            yield from (t[2] for t in buf)
            buf = []
    buf.sort(key=lambda t: (t[0], t[1]))
    yield from (t[2] for t in buf)


def sort_window_batches(
    samples: Iterable[S],
    *,
    max_frames: int,
    window: int = 500,
    length: Callable[[S], int],
    max_batch_size: int | None = None,
) -> Iterator[list[S]]:
    """Baseline (WeNet): sort within windows of ``window`` samples, then fill batches in that order.

    As in WeNet, batches may straddle window boundaries and come out in rising length within a window.
    """
    _check_args(max_frames, max_batch_size)
    yield from stream_batches(sort_window(samples, window=window, length=length),
                              max_frames=max_frames, length=length, max_batch_size=max_batch_size)


def order_randomness(batch_means: Sequence[float]) -> dict[str, float]:
    """How random the order of batches is, from their mean lengths in output order.

    - ``spearman``: rank correlation of position and mean length over the whole stream (~0 if random;
      blind to a sawtooth of many sorted windows, hence the next two).
    - ``lag1``: rank correlation of consecutive batches' mean lengths (~0 if random, ~1 if sorted runs).
    - ``longest_rise``: longest run of strictly rising mean lengths (random order: ~log n / log log n).
    """
    x = np.asarray(batch_means, dtype=np.float64)
    n = len(x)
    out = {"spearman": math.nan, "lag1": math.nan, "longest_rise": float(min(n, 1))}
    if n < 3:
        return out
    out["spearman"] = _rank_corr(np.arange(n), x)
    out["lag1"] = _rank_corr(x[:-1], x[1:])
    rises = np.diff(x) > 0
    longest = run = 0
    for r in rises.tolist():
        run = run + 1 if r else 0
        longest = max(longest, run)
    out["longest_rise"] = float(longest + 1)
    return out


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return 0.0
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb))


def _ranks(x: np.ndarray) -> np.ndarray:
    # Average ranks for ties, so equal mean lengths do not fake a correlation.
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]
