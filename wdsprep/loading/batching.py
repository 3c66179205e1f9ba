"""Dynamic batching by frame count: batches whose padded size ``B * max(length)`` fits ``max_frames``.

``bucket_batches`` is the stage the loader uses.  It collects a pool of samples from an already
shuffled stream, sorts the pool by length, cuts batches greedily from the sorted pool and yields
them in a random order.  Sorting keeps lengths within a batch close (little padding); shuffling the
batches of a pool keeps the order the trainer sees random (no rising-length runs as with a plain
sort window).  A sample longer than ``max_frames`` is a batch of its own; nothing is dropped.

The batchers it is measured against (CAT's stream, WeNet's sort window) are in
``tools/bench/baselines.py``.

Pure numpy/Python: this module never imports torch, so it runs in any worker.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

S = TypeVar("S")
B = TypeVar("B")  # a block of samples (see bucket_blocks)

# 4,000 samples give >= 0.97 real/padded frames on realistic ASR lengths (lognormal, median 600)
# at max_frames 10k-50k; see docs/batching.md for the measured trade-off (memory vs padding).
DEFAULT_POOL_SIZE = 4000


def len_of_first_dim(sample: Any) -> int:
    """Frames of a ``(key, features, ...)`` sample: the first dimension of ``sample[1]``."""
    return int(sample[1].shape[0])


def _check_args(max_frames: int, max_batch_size: int | None) -> None:
    if not (isinstance(max_frames, (int, np.integer)) and max_frames > 0):
        raise ValueError(f"max_frames must be a positive int, got {max_frames!r}")
    if max_batch_size is not None and not (isinstance(max_batch_size, (int, np.integer)) and max_batch_size > 0):
        raise ValueError(f"max_batch_size must be None or a positive int, got {max_batch_size!r}")


def _length(length: Callable[[S], int], sample: S) -> int:
    n = int(length(sample))
    if n < 0:
        # A negative length would let a batch pass the B * max <= max_frames check wrongly.
        raise ValueError(f"sample length must be >= 0, got {n} for sample {_describe(sample)}")
    return n


def _describe(sample: Any) -> str:
    # Samples are usually (key, features, ...): name the key so the user can find the utterance.
    if isinstance(sample, (tuple, list)) and sample and isinstance(sample[0], str):
        return repr(sample[0])
    return f"of type {type(sample).__name__}"


def _cut(lengths: Sequence[int], max_frames: int, max_batch_size: int | None) -> list[tuple[int, int]]:
    """Greedy ``[start, end)`` cuts of a length sequence in the given order.

    A batch is closed when the next sample would break ``(B + 1) * max <= max_frames`` or
    ``max_batch_size``; an oversize sample therefore ends up alone.  The last cut is the open batch.
    """
    cap = max_batch_size or len(lengths) + 1
    cuts: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        longest_if_added = n if n > longest else longest
        size = i - start
        if size and (size >= cap or (size + 1) * longest_if_added > max_frames):
            cuts.append((start, i))
            start, longest = i, n
        else:
            longest = longest_if_added
    if start < len(lengths):
        cuts.append((start, len(lengths)))
    return cuts


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
    """Stage: group a (already shuffled) sample stream into batches with ``B * max(length) <= max_frames``.

    Every ``pool_size`` samples: sort the pool by length, cut batches greedily, shuffle the batch
    order with ``rng`` and yield them, spread evenly over the reading of the next pool.  The last
    (open, partly filled) batch of a pool is carried into the next pool instead of being emitted
    small, but a sample is carried at most ``max_carry`` times, so no utterance is held back for
    long; at the end of the stream everything left is flushed.  A sample longer than
    ``max_frames`` comes out alone.  ``length`` must be cheap: it is called once per sample.
    Same ``rng`` state and input -> same batches in the same order.
    """
    blocks = (([s], (_length(length, s),)) for s in samples)
    return bucket_blocks(blocks, concat=_concat_lists, take=_take_from_list, max_frames=max_frames, rng=rng,
                         max_batch_size=max_batch_size, pool_size=pool_size, max_carry=max_carry)


def _concat_lists(parts: list[list[S]]) -> list[S]:
    return [s for part in parts for s in part]


def _take_from_list(pool: list[S], rows: np.ndarray) -> list[S]:
    return [pool[i] for i in rows.tolist()]


def bucket_blocks(
    blocks: Iterable[tuple[B, Sequence[int]]],
    *,
    concat: Callable[[list[B]], B],
    take: Callable[[B, np.ndarray], B],
    max_frames: int,
    rng: np.random.Generator,
    max_batch_size: int | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_carry: int = 1,
) -> Iterator[B]:
    """:func:`bucket_batches` on a stream of blocks of samples: the same batches, made by ``take``.

    ``blocks`` yields ``(block, lengths)`` pairs, a block being anything with ``len()`` and
    slicing: a list of samples, or the loader's :class:`~wdsprep.loading.records.Records`, where a pool
    is sorted and cut with a few numpy calls.  ``concat`` joins blocks into a pool and
    ``take(pool, rows)`` selects the rows of a batch (an int64 index array).
    """
    _check_args(max_frames, max_batch_size)
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size!r}")
    if max_carry < 0:
        raise ValueError(f"max_carry must be >= 0, got {max_carry!r}")
    parts: list[B] = []  # the pool so far: the carried rows first, then what arrived
    part_lens: list[np.ndarray] = []
    filled = carried = 0  # rows in the pool, and how many of them were carried over
    ages = np.zeros(0, np.int64)  # times each carried row was carried so far
    ready: list[B | None] = []  # the previous pool's batches, yielded while this pool fills
    k = 0  # next batch of ``ready`` to yield
    for block, lens in blocks:
        lens = np.asarray(lens, np.int64)
        start = 0
        while start < len(lens):
            # A block may close the pool part way: the rest of it begins the next pool.
            stop = start + pool_size + carried - filled
            parts.append(block[start:stop])
            part_lens.append(lens[start:stop])
            filled += len(part_lens[-1])
            start = stop
            if filled >= pool_size + carried:
                yield from _drain(ready, k)
                pool, pool_lens = concat(parts), np.concatenate(part_lens)
                rows, carry, ages = _plan_pool(pool_lens, max_frames, max_batch_size, rng, ages, max_carry)
                ready, k = [take(pool, r) for r in rows], 0
                # The carried open batch joins the next pool, where it can be filled with its peers.
                parts, part_lens = [take(pool, carry)], [pool_lens[carry]]
                filled = carried = len(carry)
            else:
                # Yield the previous pool's batches at an even pace while this one fills, not all
                # at once: DataLoader workers deliver in turn, so one worker's whole pool of
                # reading between bursts made the main process, and then the other workers,
                # wait.  Same batches, same order; only when they leave changes.
                due = len(ready) * (filled - carried) // pool_size
                if k < due:
                    yield from _drain(ready, k, due)
                    k = due
    yield from _drain(ready, k)
    if filled:
        pool, pool_lens = concat(parts), np.concatenate(part_lens)
        rows, _, _ = _plan_pool(pool_lens, max_frames, max_batch_size, rng, ages, max_carry=0)
        for r in rows:
            yield take(pool, r)


def _drain(ready: list[B | None], start: int, stop: int | None = None) -> Iterator[B]:
    """Yield ``ready[start:stop]``, dropping each reference as it goes (the trainer may be the only holder)."""
    for i in range(start, len(ready) if stop is None else stop):
        batch, ready[i] = ready[i], None
        yield batch  # type: ignore[misc]


def _plan_pool(
    lens: np.ndarray, max_frames: int, max_batch_size: int | None, rng: np.random.Generator,
    ages: np.ndarray, max_carry: int,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The rows of each batch of one pool in random order, the rows to carry over and their new ages.

    The first ``len(ages)`` rows of the pool are the ones carried into it.
    """
    # Stable sort: ties keep arrival order, so the result never depends on the sort algorithm.
    order = np.argsort(lens, kind="stable")
    sorted_lens = lens[order].tolist()
    cuts = _cut(sorted_lens, max_frames, max_batch_size)
    carry = new_ages = np.zeros(0, np.int64)
    if max_carry and cuts:
        start, end = cuts[-1]
        size, longest = end - start, sorted_lens[end - 1]
        full = (max_batch_size is not None and size >= max_batch_size) or (size + 1) * longest > max_frames
        rows = order[start:end]
        aged = np.ones(len(rows), np.int64)
        was_carried = rows < len(ages)
        aged[was_carried] += ages[rows[was_carried]]
        # Without an age limit a lone long utterance would be carried to the end of the epoch.
        if not full and aged.max() <= max_carry:
            carry, new_ages = rows, aged
            cuts.pop()
    # Shuffle the batch order so lengths do not rise within a pool (WeNet's weak spot).
    return [order[cuts[j][0]:cuts[j][1]] for j in rng.permutation(len(cuts))], carry, new_ages
