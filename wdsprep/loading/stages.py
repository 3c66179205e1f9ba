"""The loader's stages: plain generator functions over blocks of utterances held as columns.

Each takes an iterator of :class:`~wdsprep.loading.records.Records` and yields them on, so a few
hundred utterances move per numpy call.  They are composed in one place,
``ShardStream.stages`` (``stream.py``).  numpy only: no torch here, so they run and test anywhere.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from wdsprep.format.shardfile import prefetch_shard
from wdsprep.loading.batching import DEFAULT_POOL_SIZE, bucket_blocks
from wdsprep.loading.read import iter_records
from wdsprep.loading.records import IN_MEMORY, Records
from wdsprep.loading.stats import WorkerTally
from wdsprep.tokenizer import SubwordSampling, Tokenizer

_NEVER = np.iinfo(np.int64).max


def read_shards(shards: Sequence[str], utts: Sequence[int | None], *, on_error: str, counts: WorkerTally,
                cursor: list[int], block: int) -> Iterator[Records]:
    """Every sample of every shard in order, in blocks of up to ``block``; a corrupt shard's unread
    rest is counted.

    ``cursor`` is updated in place to [shards finished, samples read from the current shard]:
    with (seed, epoch, rank, worker) it is the worker's position in the epoch.
    """
    for i, (shard, expected) in enumerate(zip(shards, utts)):
        cursor[0], cursor[1] = i, 0
        if i == 0:
            prefetch_shard(shard)
        if i + 1 < len(shards):
            prefetch_shard(shards[i + 1])  # a cold next shard streams in while this one is decoded
        corrupt: list[str] = []
        for rows in iter_records(shard, on_error=on_error, block=block,
                                 on_corrupt=lambda url, key, why: corrupt.append(url)):
            cursor[1] += len(rows)
            counts.read += len(rows)
            yield rows
        if corrupt:
            counts.corrupt_shards += 1
            # Without an index the number of samples lost is unknown: only the shard is counted.
            if expected is not None and expected > cursor[1]:
                counts.dropped["corrupt_shard"] += expected - cursor[1]
    cursor[0], cursor[1] = len(shards), 0


def shuffle_buffer(blocks: Iterator[Records], *, size: int, rng: np.random.Generator) -> Iterator[Records]:
    """Reservoir-style shuffle: keep ``size`` samples; each arrival takes a random slot, and the
    sample it replaces goes out.

    A block of arrivals is exchanged at once (:func:`_exchange`); the samples go out in the same
    order as one arrival at a time.  At the end the buffer goes out in random order.

    Features of a pipe or URL shard are views on the shard's bytes in memory, so one sample left
    in the buffer would keep the whole shard alive; a few stay for many shards (the wait is
    geometric), which made peak RSS grow with the data set.  Every ``size`` arrivals, such samples
    that waited more than ``2 * size`` arrivals (~14% of them) get their features copied out, so
    only the last few shards stay in memory.  (Local shards' features are still on disk.)
    """
    if size <= 1:
        yield from blocks
        return
    filling: list[Records] = []
    buf: Records | None = None  # once full: the buffer's own copy, overwritten in place
    born = np.zeros(size, np.int64)  # arrival number of each slot's sample
    arrivals = 0
    for rows in blocks:
        if buf is None:
            room = size - arrivals
            filling.append(rows[:room])
            arrivals += len(filling[-1])
            if arrivals < size:
                continue
            full = Records.concat(filling)
            buf = Records(full.num.copy(), full.obj.copy())
            born[:] = np.arange(1, size + 1)
            rows = rows[room:]
        if not len(rows):
            continue
        slots = rng.integers(size, size=len(rows))
        yield _exchange(buf, rows, slots, born, arrivals)
        before, arrivals = arrivals, arrivals + len(rows)
        if arrivals // size > before // size:
            _detach_waiting(buf, born, arrivals - 2 * size)
    rest = buf if buf is not None else Records.concat(filling) if filling else Records.empty()
    if len(rest):
        yield rest[rng.permutation(len(rest))]


def _exchange(buf: Records, arrivals: Records, slots: np.ndarray, born: np.ndarray, before: int) -> Records:
    """What a reservoir emits when ``arrivals[t]`` replaces slot ``slots[t]`` for t = 0, 1, ...: the
    slot's sample just before, which is the last earlier arrival that took that slot, or the
    buffer's.  ``buf`` (and ``born``, after ``before`` arrivals) then hold each slot's last taker."""
    m = len(arrivals)
    order = np.argsort(slots, kind="stable")  # arrivals grouped by slot, in arrival order within a slot
    grouped = slots[order]
    edge = np.ones(m + 1, bool)
    edge[1:-1] = grouped[1:] != grouped[:-1]
    first, last = edge[:-1], edge[1:]  # of its slot's group
    # Row of [buf[slots]; arrivals] each arrival's output comes from.
    source = np.empty(m, np.int64)
    source[order[first]] = order[first]  # the buffer's sample: buf[slots[t]] is row t
    source[order[~first]] = m + order[np.flatnonzero(~first) - 1]  # the group's previous arrival
    out = Records.concat([buf[slots], arrivals])[source]
    buf.put(grouped[last], arrivals[order[last]])
    born[grouped[last]] = before + 1 + order[last]
    return out


def _detach_waiting(buf: Records, born: np.ndarray, older_than: int) -> None:
    """Copy out in-memory features of samples in the buffer since before arrival ``older_than``."""
    for j in np.flatnonzero(born < older_than).tolist():
        feats = buf.sources[j]
        if buf.offsets[j] == IN_MEMORY and feats.base is not None:  # a view on a shard's bytes
            buf.sources[j] = np.array(feats)  # same values, own memory
        born[j] = _NEVER


def tokenize(blocks: Iterator[Records], tokenizer: Tokenizer, *, sampling: SubwordSampling | None) -> Iterator[Records]:
    """Labels from raw text, one ``encode_batch`` call per block (one C++ call for spm)."""
    for rows in blocks:
        yield rows.with_labels(tokenizer.encode_batch(rows.texts.tolist(), sampling=sampling))


def filter_samples(blocks: Iterator[Records], *, min_frames: int | None, max_utt_frames: int | None,
                   ctc_subsampling: int | None, counts: WorkerTally) -> Iterator[Records]:
    """Drop what the model cannot use; every drop is counted by its first reason."""
    for rows in blocks:
        t = rows.frames
        keep = np.ones(len(rows), bool)
        checks = []
        if min_frames is not None:
            checks.append(("too_short", t < min_frames))
        if max_utt_frames is not None:
            checks.append(("too_long", t > max_utt_frames))
        if ctc_subsampling is not None:
            # CTC needs at least one output frame per label (CAT's filter: T // sub > U).
            checks.append(("ctc_too_short", t // ctc_subsampling <= rows.label_lens))
        for reason, bad in checks:
            dropped = int(np.count_nonzero(bad & keep))
            if dropped:
                counts.dropped[reason] += dropped
                keep &= ~bad
        if keep.all():
            yield rows
        elif keep.any():
            yield rows[keep]


def bucket(blocks: Iterator[Records], *, max_frames: int, rng: np.random.Generator, max_batch_size: int | None = None,
           pool_size: int = DEFAULT_POOL_SIZE) -> Iterator[Records]:
    """Batches of similar length in random order: :func:`~wdsprep.loading.batching.bucket_batches` on blocks."""
    return bucket_blocks(((rows, rows.frames) for rows in blocks), concat=Records.concat, take=Records.__getitem__,
                         max_frames=max_frames, rng=rng, max_batch_size=max_batch_size, pool_size=pool_size)
