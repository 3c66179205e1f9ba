"""The training loader: shards -> padded, length-bucketed batches, deterministic and DDP-safe.

The data flow, composed in :meth:`ShardStream.stages` (read it first)::

    shard list -> split by rank/worker -> per-epoch shard shuffle -> read + decode
      -> sample shuffle buffer -> tokenize -> filter -> bucket + batch -> collate -> Batch

Every stage is a plain generator function over blocks of utterances held as columns
(:class:`~wdsprep.loading.records.Records`), so each moves a few hundred utterances per numpy call
instead of one Python object at a time.  Randomness comes only from generators seeded with
(seed, epoch, rank, worker), so the same seed, epoch and world size give the same batches, bit
for bit, with any ``num_workers`` layout kept equal.

The collate reads a batch's features from the shards in a thread of its own (in C, without the
GIL), while the stages make the next :data:`READ_AHEAD` batches: the two halves of the work
overlap on two cores.

With ``num_workers > 0`` each DataLoader worker runs the stages on its share of the shards and
collates into shared-memory buffers it recycles (:class:`ShmPool`); a buffer crosses to the main
process once per epoch, later batches in it only name their slot (:class:`SlotCache`).  Workers
persist across epochs by default and learn the epoch through shared memory.

Under DDP (training mode) the main process all-reduces a "no more batches" flag before every
step, so all ranks end the epoch at the same step as soon as one runs dry; what that early stop
discards is reported in :attr:`Loader.stats`.  Dev mode (``train=False``) reads each utterance
exactly once across ranks, without shuffling and without the all-reduce: ranks just end, and may
run a different number of steps.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import time
import warnings
from collections import Counter, deque
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from wdsprep.batching import DEFAULT_POOL_SIZE, bucket_blocks
from wdsprep.distributed import (
    all_sum,
    any_rank_done,
    assign_shards,
    dist_info,
    shard_sizes,
)
from wdsprep.format.shardfile import bulk_reads, prefetch_shard, row_reader
from wdsprep.format.shardlist import expand_shards
from wdsprep.loading.read import iter_records
from wdsprep.loading.records import IN_MEMORY, Records
from wdsprep.tokenizer import SubwordSampling, Tokenizer, derive_seed, load_tokenizer

LABEL_PAD = 0  # labels are padded with 0 (<s>/blank), like CAT's collate; use label_lens to mask
_STREAM_SHUFFLE, _STREAM_BATCH = 1, 2  # keep the per-stage generators of one worker independent
_NEVER = np.iinfo(np.int64).max
# Batches whose feature reads are in flight behind the one a worker hands out: the stages of the
# next READ_AHEAD batches overlap each read, so one slow read (long utterances) rarely stalls.
READ_AHEAD = 2
# Shared-memory batch buffers each worker recycles (see ShmPool): in flight at once are the
# batches being read ahead, the DataLoader's prefetch (2 per worker by default), the batch the
# trainer holds and the one the main process releases a step late; a spare keeps the worker from
# falling back to fresh memory.
POOL_SLOTS = READ_AHEAD + 5
_FREE, _BUSY = 0, 1


class Batch(NamedTuple):
    """One rank's batch.  The first four unpack like CAT's collate: ``xs, x_lens, ys, y_lens = batch[:4]``.

    ``feats`` float32 [B, T, D], zero-padded; ``feat_lens`` int64 [B]; ``labels`` int64 [B, U]
    padded with :data:`LABEL_PAD` (0); ``label_lens`` int64 [B]; ``keys`` the utterance ids.
    Utterances are sorted by length, longest first (what ``pack_padded_sequence`` wants).
    """

    feats: torch.Tensor
    feat_lens: torch.Tensor
    labels: torch.Tensor
    label_lens: torch.Tensor
    keys: list[str]


# ---------------------------------------------------------------------------------------------
# Stages: plain generators of Records blocks.  ``counts`` is the worker's Counter of dropped/read samples.


def read_shards(shards: Sequence[str], utts: Sequence[int | None], *, on_error: str, counts: Counter,
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
            counts["read"] += len(rows)
            yield rows
        if corrupt:
            counts["corrupt_shards"] += 1
            # Without an index the number of samples lost is unknown; the shard is still counted.
            if expected is not None:
                counts["dropped:corrupt_shard"] += max(0, expected - cursor[1])
            else:
                counts["corrupt_shards_without_index"] += 1
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
                   ctc_subsampling: int | None, counts: Counter) -> Iterator[Records]:
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
                counts[f"dropped:{reason}"] += dropped
                keep &= ~bad
        if keep.all():
            yield rows
        elif keep.any():
            yield rows[keep]


def bucket(blocks: Iterator[Records], *, max_frames: int, rng: np.random.Generator, max_batch_size: int | None = None,
           pool_size: int = DEFAULT_POOL_SIZE) -> Iterator[Records]:
    """Batches of similar length in random order: :func:`~wdsprep.batching.bucket_batches` on blocks."""
    return bucket_blocks(((rows, rows.frames) for rows in blocks), concat=Records.concat, take=Records.__getitem__,
                         max_frames=max_frames, rng=rng, max_batch_size=max_batch_size, pool_size=pool_size)


class Packed(NamedTuple):
    """A collated batch as one flat byte buffer plus its shape: what a worker sends.

    A :class:`Batch` has four tensors; sent from a worker, each would cost its own file
    descriptor hand-over.  All four are views on ``buf``, so one hand-over carries the batch.
    A pooled slot's buffer is sent only on the slot's first use per epoch; after that ``buf`` is
    None and the main process reads the slot's memory through the handle it kept (see ShmPool).
    """

    buf: torch.Tensor | None  # uint8: lens, label_lens (int64 [B]), labels (int64 [B, U]), feats (float32 [B, T, D])
    shape: tuple[int, int, int, int]  # B, T, D, U
    keys: list[str]
    slot: int = -1  # the worker's pool slot holding ``buf`` (-1: not pooled); see ShmPool
    gen: int = 0  # the slot buffer's generation: bumped whenever the worker replaces the buffer


class ShmPool:
    """A worker's reusable shared-memory batch buffers (with ``num_workers=0``, the main process's
    own, in private memory); the main process hands them back.

    A fresh shared segment per batch cost a worker ~13% of its time to create and ~40% to fill
    (a page fault and a zeroed page per 4 KiB).  A pooled buffer is mapped and faulted in once.
    Sending a shared tensor costs the main process ~0.45 ms (a file descriptor passed and looked
    up) against ~0.1 ms for a small object, so a slot's buffer travels once per epoch
    (:meth:`outgoing`) and later batches in it send only the slot number: see :class:`SlotCache`.

    ``flags`` (shared with the main process, one byte per slot of every worker) says who owns a
    slot: the worker marks it busy when it fills it; the main process marks it free only once
    nothing references the batch any more (see :class:`SlotCache`).  A batch the trainer still
    holds is therefore never overwritten.  With no free slot (the trainer keeps many batches) the
    worker allocates a fresh, unpooled buffer: it never waits.

    ``serial`` (shared) counts the main process's epoch starts.  An epoch cut short leaves batches
    in flight that torch drains and discards, and the worker may fill more of them after the main
    process freed its unreferenced slots for the next epoch; :meth:`begin` frees those.
    """

    def __init__(self, flags: Any, worker: int, slots: int = POOL_SLOTS, serial: Any = None,
                 shared: bool = True) -> None:
        self.flags = flags
        self.shared = shared  # False with num_workers=0: the pool serves the main process itself
        self.serial = serial
        self.base = worker * slots
        self.bufs: list[torch.Tensor | None] = [None] * slots
        self.gens = [0] * slots
        self.sent = [False] * slots  # buffer sent since begin()
        self.stamps = [-1] * slots  # serial when the slot was last taken

    def begin(self) -> None:
        """Start an epoch: every buffer is sent again, and slots filled for discarded batches are freed.

        Batches sent in the previous epoch may have been drained unseen, so the main process may
        lack a buffer; a slot taken after the main process's epoch start (same serial) holds such
        a batch.
        """
        self.sent = [False] * len(self.bufs)
        if self.serial is not None:
            now = self.serial.value
            for j, stamp in enumerate(self.stamps):
                if stamp == now:
                    self.flags[self.base + j] = _FREE
                    self.stamps[j] = -1

    def alloc(self, nbytes: int) -> tuple[torch.Tensor, int]:
        """A shared uint8 buffer of ``nbytes`` and its slot (-1 when unpooled)."""
        for j, buf in enumerate(self.bufs):
            if self.flags[self.base + j] == _FREE:
                if buf is None or buf.numel() < nbytes:
                    # Batches are bounded by max_frames, so capacities settle after a few batches;
                    # the headroom saves regrowing for a slightly larger one.
                    buf = self.bufs[j] = _alloc(nbytes + nbytes // 8, self.shared)
                    self.gens[j] += 1
                    self.sent[j] = False
                self.flags[self.base + j] = _BUSY
                # Read after marking busy (the main process bumps, then frees): see begin().
                self.stamps[j] = self.serial.value if self.serial is not None else -1
                return buf[:nbytes], j
        return _alloc(nbytes, self.shared), -1

    def outgoing(self, p: Packed) -> Packed:
        """``p`` as it is sent: the buffer only on the slot's first use since :meth:`begin` or regrowth."""
        if p.slot < 0:
            return p
        j = p.slot
        if self.sent[j]:
            return p._replace(buf=None, gen=self.gens[j])
        self.sent[j] = True
        return p._replace(gen=self.gens[j])


def _alloc(nbytes: int, shared: bool) -> torch.Tensor:
    """An uninitialized uint8 buffer; ``shared``: in shared memory from the start.

    DataLoader workers send tensors through shared memory and copy every tensor that is not
    already there; allocating the batch there directly makes sending it a handle, not a copy.
    ``_new_shared`` is what torch's own ``default_collate`` uses in workers for the same reason.
    """
    if shared:
        storage = torch.UntypedStorage._new_shared(max(1, nbytes))
        return torch.empty(0, dtype=torch.uint8).set_(storage)[:nbytes]
    return torch.empty(nbytes, dtype=torch.uint8)


def collate(batch: Records, *, shared: bool = False,
            alloc: Callable[[int], tuple[torch.Tensor, int]] | None = None) -> Packed:
    """Pad into one uninitialized buffer (one copy per utterance; float16 becomes float32 here).

    Features still in their shard are read straight into their row, in one C call for the batch
    (:class:`~wdsprep.format.shardfile.RowReads`): for float32 the only copy of those bytes; float16 rows
    are converted on the way.  Only the padding is zeroed: ``np.zeros``
    wrote every byte twice.  Every byte of the returned view is written, so a recycled ``alloc``
    buffer never leaks old data.
    """
    return start_collate(batch, shared=shared, alloc=alloc)()


def start_collate(batch: Records, *, shared: bool = False,
                  alloc: Callable[[int], tuple[torch.Tensor, int]] | None = None,
                  reader: Any = None) -> Callable[[], Packed]:
    """:func:`collate` in two halves: all but the bulk feature read now, that read on ``reader``'s
    thread (a :func:`~wdsprep.format.shardfile.row_reader`) while the caller goes on; calling the result
    waits for it and returns the :class:`Packed`.  The read is ~half a worker's time, so the
    stages of the next batches overlap it.
    """
    batch = batch[np.argsort(-batch.frames, kind="stable")]  # longest first; ties keep their order
    n = len(batch)
    lens, label_lens, dims = batch.frames, batch.label_lens, batch.dims
    uttids = batch.uttids.tolist()
    d = int(dims[0])
    if (dims != d).any():
        i = int(np.flatnonzero(dims != d)[0])
        raise ValueError(f"utterance {uttids[i]!r} has {dims[i]} feature dims, {uttids[0]!r} in the same "
                         f"batch has {d}: mixed feature sets in trset?")
    t, u = int(lens[0]), int(label_lens.max(initial=0))
    nbytes = 8 * (2 * n + n * u) + 4 * n * t * d
    buf, slot = alloc(nbytes) if alloc is not None else (_alloc(nbytes, shared), -1)
    v_lens, v_label_lens, v_labels, v_feats = _views(buf, n, t, d, u)
    v_lens[:] = lens
    v_label_lens[:] = label_lens
    # Labels in one go: the row-major True cells of the mask are exactly the concatenated labels.
    v_labels[...] = LABEL_PAD
    v_labels[np.arange(u) < label_lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(batch.labels), np.int64, int(label_lens.sum()))
    offsets, itemsizes, sources = batch.offsets, batch.itemsizes, batch.sources.tolist()
    # The common case, features of one dtype still in the shards, in one C call (float16 is
    # converted there, in the same thread: torch's conversion, parallel on every core, left its
    # threads spinning on the core the read needed).
    reads = None
    if (offsets != IN_MEMORY).all() and (itemsizes == itemsizes[0]).all():
        reads = bulk_reads(sources, offsets, lens * d * itemsizes, int(itemsizes[0]))
    if reads is not None:
        reads.start(v_feats, reader)

    def finish() -> Packed:
        done = reads.wait() if reads is not None else 0
        # Whatever the bulk read left, row by row (which raises the error naming a row that
        # cannot be read).
        with warnings.catch_warnings():
            # from_numpy warns that a read-only array (a view on an in-memory pipe/URL shard) is not
            # writable; the tensor is only ever read here.
            warnings.simplefilter("ignore", UserWarning)
            t_feats = torch.from_numpy(v_feats)
            for i in range(done, n):
                k = int(lens[i])
                row = v_feats[i, :k]
                if offsets[i] == IN_MEMORY:
                    feats = sources[i]
                else:  # float32 straight into the batch
                    feats = row if itemsizes[i] == 4 else np.empty((k, d), np.float16)
                    sources[i].readinto(feats, int(offsets[i]), f"utterance {uttids[i]!r}")
                if feats is not row:
                    if feats.dtype == np.float32:
                        row[...] = feats  # numpy's call overhead is lower than torch's for a plain copy
                    else:
                        # numpy converts float16 element by element (~10x slower than the copy); torch's
                        # conversion is vectorized, and writes straight into the batch.
                        t_feats[i, :k].copy_(torch.from_numpy(feats))
                v_feats[i, k:] = 0
        return Packed(buf, (n, t, d, u), uttids, slot)

    return finish


def _views(buf: torch.Tensor, n: int, t: int, dims: int, u: int) -> tuple[np.ndarray, ...]:
    """numpy views (lens, label_lens, labels, feats) on a packed buffer; int64 parts first (aligned)."""
    a = buf.numpy()
    o1, o2, o3 = 8 * n, 16 * n, 16 * n + 8 * n * u
    return (a[:o1].view(np.int64), a[o1:o2].view(np.int64), a[o2:o3].view(np.int64).reshape(n, u),
            a[o3:o3 + 4 * n * t * dims].view(np.float32).reshape(n, t, dims))


def unpack(p: Packed) -> Batch:
    """The :class:`Batch` whose four tensors are views on the packed buffer (no copy)."""
    n, t, dims, u = p.shape
    o1, o2, o3 = 8 * n, 16 * n, 16 * n + 8 * n * u
    b = p.buf
    return Batch(b[o3:o3 + 4 * n * t * dims].view(torch.float32).view(n, t, dims), b[:o1].view(torch.int64),
                 b[o2:o3].view(torch.int64).view(n, u), b[o1:o2].view(torch.int64), p.keys)


def _nbytes(shape: tuple[int, int, int, int]) -> int:
    """Bytes of a packed batch of ``shape`` (B, T, D, U), as :func:`collate` lays it out."""
    n, t, dims, u = shape
    return 8 * (2 * n + n * u) + 4 * n * t * dims


def _pin(buf: torch.Tensor) -> torch.Tensor:
    """A page-locked copy (a seam for tests on machines without CUDA)."""
    return buf.pin_memory()


class SlotCache:
    """The main process's side of the workers' :class:`ShmPool` slots: their flags and buffers.

    A slot's buffer arrives with its first batch of the epoch and is kept, per (worker, slot) and
    with its generation; later batches in the slot come without it.  Each batch gets its own
    storage over that memory (``torch.from_numpy`` of a slice, ~1.5 us), so a weak reference to
    that storage expires exactly when neither the trainer nor the loader holds any tensor of the
    batch; only then is the slot handed back.  Lives as long as the workers.
    """

    def __init__(self, num_workers: int) -> None:
        self.flags = mp.RawArray("b", num_workers * POOL_SLOTS)
        self.serial = mp.RawValue("q", 0)  # epoch starts: see ShmPool.begin
        self.bufs: dict[int, tuple[int, np.ndarray]] = {}  # flag index -> (generation, the slot's whole buffer)
        self.held: list[tuple[int, StorageWeakRef]] = []  # batches handed out: flag index, their storage

    def new_epoch(self) -> None:
        """Before the workers resume: free every slot that no batch handed out still uses.

        Batches in flight when the last epoch stopped early were drained unseen, their slots still busy.
        """
        self.serial.value += 1  # before freeing: see ShmPool.begin
        self.release()
        held = {i for i, _ in self.held}
        for i in range(len(self.flags)):
            if i not in held:
                self.flags[i] = _FREE

    def release(self) -> None:
        """Hand back the slots of batches nothing references any more (the trainer moved on)."""
        if self.held:
            still = []
            for i, ref in self.held:
                if ref.expired():
                    self.flags[i] = _FREE
                else:
                    still.append((i, ref))
            self.held = still

    def buffer(self, p: Packed, worker: int) -> tuple[torch.Tensor, int]:
        """A tensor with its own storage over pooled batch ``p``'s memory, and the slot's flag index."""
        i = worker * POOL_SLOTS + p.slot
        if p.buf is not None:
            whole = torch.empty(0, dtype=torch.uint8).set_(p.buf.untyped_storage())
            self.bufs[i] = (p.gen, whole.numpy())
        gen, mem = self.bufs.get(i, (None, None))
        if gen != p.gen:
            raise RuntimeError(f"worker {worker} sent a batch in slot {p.slot}, buffer generation {p.gen}, but "
                               f"the main process holds generation {gen}: that buffer never arrived (loader bug)")
        return torch.from_numpy(mem[:_nbytes(p.shape)]), i  # type: ignore[index]

    def hold(self, i: int, buf: torch.Tensor) -> None:
        """Keep slot ``i`` busy while anything references ``buf``'s storage."""
        self.held.append((i, StorageWeakRef(buf.untyped_storage())))


# ---------------------------------------------------------------------------------------------


@dataclass
class LoaderConfig:
    """Everything that decides the batches besides the shards, the tokenizer and the epoch."""

    max_frames: int
    seed: int = 0
    shuffle_buffer: int = 2000
    max_batch_size: int | None = None
    min_frames: int | None = None
    max_utt_frames: int | None = None
    ctc_subsampling: int | None = None
    train: bool = True
    on_error: str = "warn"
    subword_sampling: SubwordSampling | None = None
    pool_size: int = DEFAULT_POOL_SIZE
    tokenize_group: int = 256


class ShardStream(IterableDataset):
    """The stages for one (rank, worker) and epoch; yields ``(Packed | None, counts, cursor)``.

    The counts are deltas since the previous item, so the main process can add them up even when
    the worker lives in another process; a final ``None`` batch carries the worker's last counts.
    """

    def __init__(self, shards: list[str], tokenizer: Tokenizer, cfg: LoaderConfig, *, rank: int,
                 world_size: int, num_workers: int) -> None:
        self.shards = shards
        self.sizes = shard_sizes(shards)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        # Shared memory, so persistent workers (forked with a copy of this object) see set_epoch.
        self._epoch = mp.RawValue("q", 0)
        # A resumed epoch's plan per worker, in shared memory too (see Loader._skip_plan): batches
        # to make without reading them, and whether to hand out a placeholder item first.
        self._skip = mp.RawArray("q", max(1, num_workers))
        self._lead = mp.RawArray("b", max(1, num_workers))
        self._fingerprint: str | None = None
        # (flags, serial) of the Loader's SlotCache, set before workers start: see ShmPool.
        self.pool_shared: tuple[Any, Any] | None = None
        self._pool: ShmPool | None = None  # a worker's own pool, kept across epochs (persistent workers)
        # Fail in the main process, before workers start, when there are too few shards.
        self.plan(0)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.value = epoch

    def plan(self, epoch: int) -> list[list[int]]:
        """Shard indices per worker of this rank for ``epoch``."""
        cfg = self.cfg
        return assign_shards(self.sizes.weights, world_size=self.world_size, rank=self.rank,
                             num_workers=self.num_workers, seed=cfg.seed, epoch=epoch, shuffle=cfg.train,
                             names=self.shards, allow_idle_ranks=not cfg.train)

    def assigned_utts(self, epoch: int) -> int | None:
        """Utterances in this rank's shards this epoch, when the index knows them."""
        counts = [self.sizes.utts[i] for w in self.plan(epoch) for i in w]
        return None if any(c is None for c in counts) else sum(counts)  # type: ignore[arg-type]

    def fingerprint(self) -> str:
        """A digest of what decides the batches besides (seed, epoch, world size, num_workers):
        the options, the tokenizer, and each shard's last two path parts and size (so a moved
        corpus keeps its fingerprint)."""
        if self._fingerprint is None:
            doc = {"cfg": asdict(self.cfg), "tokenizer": [self.tokenizer.kind, self.tokenizer.to_dict()],
                   "shards": [["/".join(name.rstrip("/").split("/")[-2:]), w, u]
                              for name, w, u in zip(self.shards, self.sizes.weights, self.sizes.utts)]}
            text = json.dumps(doc, sort_keys=True, default=repr, ensure_ascii=False)
            self._fingerprint = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        return self._fingerprint

    def stages(self, worker: int, counts: Counter, cursor: list[int]) -> Iterator[Records]:
        """The data flow of one worker for one epoch, in order."""
        cfg = self.cfg
        epoch = self.epoch if cfg.train else 0  # dev mode: the same batches every epoch
        mine = self.plan(epoch)[worker]  # split by rank/worker + per-epoch shard shuffle
        shards = [self.shards[i] for i in mine]
        utts = [self.sizes.utts[i] for i in mine]
        rng = np.random.default_rng([cfg.seed, epoch, self.rank, worker, _STREAM_SHUFFLE])
        batch_rng = np.random.default_rng([cfg.seed, epoch, self.rank, worker, _STREAM_BATCH])
        self.tokenizer.seed(derive_seed(cfg.seed, epoch, self.rank, worker))  # subword sampling

        blocks = read_shards(shards, utts, on_error=cfg.on_error, counts=counts, cursor=cursor,
                             block=cfg.tokenize_group)
        if cfg.train:
            blocks = shuffle_buffer(blocks, size=cfg.shuffle_buffer, rng=rng)
        blocks = tokenize(blocks, self.tokenizer, sampling=cfg.subword_sampling if cfg.train else None)
        blocks = filter_samples(blocks, min_frames=cfg.min_frames, max_utt_frames=cfg.max_utt_frames,
                                ctc_subsampling=cfg.ctc_subsampling, counts=counts)
        return bucket(blocks, max_frames=cfg.max_frames, rng=batch_rng, max_batch_size=cfg.max_batch_size,
                      pool_size=cfg.pool_size)

    def replay(self, worker: int) -> Iterator[Records]:
        """The worker's batches of this epoch as :meth:`stages` makes them, in this process.

        With a tokenizer of its own, so that replaying several workers side by side keeps each
        one's subword-sampling sequence.
        """
        twin = copy.copy(self)
        twin.tokenizer = copy.copy(self.tokenizer)
        return twin.stages(worker, Counter(), [0, 0])

    def __iter__(self) -> Iterator[tuple[Packed | None, dict[str, int], tuple[int, int, int]]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        skip, lead = self._skip[worker], self._lead[worker]
        counts: Counter = Counter()
        cursor = [0, 0]
        pool = None
        if self.pool_shared is not None:
            if self._pool is None:
                flags, serial = self.pool_shared
                self._pool = ShmPool(flags, worker, serial=serial, shared=info is not None)
            pool = self._pool
            pool.begin()

        def item(out: Packed | None) -> tuple[Packed | None, dict[str, int], tuple[int, int, int]]:
            if out is not None and pool is not None:
                out = pool.outgoing(out)
            delta = dict(counts)
            counts.clear()
            return out, delta, (worker, cursor[0], cursor[1])

        # A thread in C reads batch k's features while the stages make the next READ_AHEAD
        # batches (with num_workers=0 it also overlaps the trainer's step).  It lives for the epoch.
        # Without it nothing overlaps the read, so reading ahead would only keep more batch
        # buffers in rotation, each one more to miss the CPU cache (2 workers: +8-15% without).
        reader = row_reader() if info is None or _cores() >= 2 * info.num_workers else None
        ahead = READ_AHEAD if reader is not None else 0
        pending: deque[Callable[[], Packed]] = deque()
        try:
            if lead:
                yield item(None)  # a resumed epoch: the turn this worker had already taken
            batches = self.stages(worker, counts, cursor)
            for batch in itertools.islice(batches, skip):
                # Batches the resumed epoch had already yielded: made (the pipeline's state
                # depends on them) but not read; counted so the epoch's stats stay whole.
                for name, v in zip(_TALLY, tally(batch.frames, self.cfg.max_frames)):
                    counts[f"skipped:{name}"] += v
            for batch in batches:
                pending.append(start_collate(batch, shared=info is not None, reader=reader,
                                             alloc=pool.alloc if pool is not None else None))
                if len(pending) > ahead:
                    yield item(pending.popleft()())
            while pending:
                yield item(pending.popleft()())
        finally:
            # Stopped early (or by an error): finish the batches whose reads were started, so
            # their descriptors close and no read is left writing into a pool slot.  Nobody will
            # see these batches, nor their errors.
            for finish in pending:
                with suppress(Exception):
                    finish()
            if reader is not None:
                reader.close()
        yield item(None)


def _identity(x: Any) -> Any:
    return x


def _cores() -> int:
    """CPUs this process may run on.

    A worker's read thread pays only with a core to run on: on 2 cores it made 1 worker ~20%
    faster and 2 workers (4 busy threads) ~10% slower (8 interleaved runs), so workers read in a
    thread of their own when there are at least 2 cores per worker.
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_TALLY = ("utterances", "real_frames", "padded_frames", "oversize_batches")  # LoaderStats fields


def tally(frames: np.ndarray, max_frames: int) -> tuple[int, int, int, int]:
    """A batch's share of :data:`_TALLY` from its utterances' frame counts."""
    longest = int(frames.max())
    return len(frames), int(frames.sum()), len(frames) * longest, int(longest > max_frames)


@dataclass
class LoaderStats:
    """What one epoch of this rank did so far; ``dropped`` holds every sample not in a batch, by reason."""

    epoch: int = 0
    steps: int = 0
    utterances: int = 0  # in yielded batches
    read: int = 0  # decoded from shards (includes samples later dropped or still buffered)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> samples
    corrupt_shards: int = 0
    real_frames: int = 0
    padded_frames: int = 0
    oversize_batches: int = 0
    assigned: int | None = None  # utterances in this rank's shards (known with an index)
    # After a DDP training epoch: utterances of the whole epoch that no rank put into a batch or
    # dropped by a filter, because the epoch stopped when the first rank ran dry.
    discarded: int | None = None
    discarded_fraction: float | None = None
    seconds: float = 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real / padded frames over the batches yielded (NaN before the first)."""
        return self.real_frames / self.padded_frames if self.padded_frames else math.nan

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "padding_efficiency": self.padding_efficiency}


class Loader:
    """Iterate for one epoch of :class:`Batch`; call :meth:`set_epoch` before each epoch.

    With ``persistent_workers`` (the default) the worker processes, their buffer pools and one
    DataLoader live as long as the Loader; the epoch reaches them through shared memory.
    """

    def __init__(self, dataset: ShardStream, *, num_workers: int, sync: bool, prefetch_factor: int | None = None,
                 pin_memory: bool = False, persistent_workers: bool = True) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.sync = sync  # all-reduce the quit flag each step (DDP training)
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        # The DataLoader's own pinning would copy only a slot's first batch, and the main process
        # would keep that copy as the slot's buffer; so the main process pins every batch itself.
        self._pin = pin_memory and torch.cuda.is_available()
        if pin_memory and not self._pin:
            warnings.warn("pin_memory=True but CUDA is not available: batches are not pinned", stacklevel=2)
        self.epoch = 0
        self.stats = LoaderStats()
        self._cursors: dict[int, tuple[int, int]] = {}
        self._loader: DataLoader | None = None  # kept with persistent workers
        self._slots: SlotCache | None = None  # the main process's side of the workers' pools
        self._iteration = 0  # which iteration of the loader may take batches (see _batches)
        self._position = (0, 0, False)  # (epoch, step, complete): see state_dict
        self._resume: tuple[int, int, bool] | None = None  # a loaded position, for that epoch's next iteration

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: the shard order, the assignment and every shuffle derive from it."""
        self.epoch = int(epoch)
        if self._position[0] != self.epoch:
            self._position = (self.epoch, 0, False)
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None  # the trainer moved on from the epoch it resumed in

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as a few numbers, for a checkpoint; see :meth:`load_state_dict`.

        (seed, epoch, world size, num_workers) determine every batch, so the position is ``step``,
        the batches of ``epoch`` yielded so far (``complete`` once the epoch ended).  Under DDP
        (training) every rank is at the same step, so rank 0's state restores every rank.
        ``fingerprint`` identifies the shards, the tokenizer and the batching options;
        ``cursors[w] = (shards finished, samples read in the current shard)`` of each worker is for
        people (the reader runs ahead of ``step`` by the shuffle buffer and prefetch).
        """
        ds = self.dataset
        epoch, step, complete = self._position
        return {"seed": ds.cfg.seed, "epoch": epoch, "step": step, "complete": complete, "rank": ds.rank,
                "world_size": ds.world_size, "num_workers": self.num_workers, "fingerprint": ds.fingerprint(),
                "cursors": {w: list(c) for w, c in sorted(self._cursors.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration of ``state["epoch"]`` yields exactly
        the batches that epoch had left, then its stats cover the whole epoch.

        The skipped part is replayed without reading features: the stages run over it (~10 us per
        utterance, in each worker and once more in the main process to plan the workers' turns).
        Raises ValueError when the loader would make different batches from the saved one's.
        With ``subword_sampling`` the segmentations are sampled afresh: SentencePiece's sampling
        does not repeat across processes (see docs/loader.md).
        """
        ds = self.dataset
        missing = {"seed", "epoch", "step", "complete", "world_size", "num_workers", "fingerprint"} - set(state)
        if missing:
            raise ValueError(f"not a wdsprep loader state: missing {sorted(missing)}")
        mine = {"seed": ds.cfg.seed, "world_size": ds.world_size, "num_workers": self.num_workers}
        wrong = [f"{k}={state[k]} (this loader: {v})" for k, v in mine.items() if state[k] != v]
        if wrong:
            raise ValueError(f"the loader state was saved with {', '.join(wrong)}: the batches depend on "
                             f"these, so build the loader with the saved values to resume")
        if state["fingerprint"] != ds.fingerprint():
            raise ValueError("the loader state was saved for other shards, tokenizer or batching options "
                             "(fingerprint differs): resuming would not continue the same epoch")
        if state["step"] < 0:
            raise ValueError(f"step must be >= 0, got {state['step']}")
        self.epoch = int(state["epoch"])
        self._position = self._resume = (self.epoch, int(state["step"]), bool(state["complete"]))

    def _skip_plan(self, step: int) -> tuple[list[int], list[bool]]:
        """For a resumed epoch: per worker, how many of its batches come before ``step``, and
        whether it hands out a placeholder first.

        The DataLoader takes items from the workers in turn (worker 0, 1, ... again), a worker's
        last item being its final counts; a worker whose items are spent drops out of the turns.
        Replaying every worker's batches in that order finds the worker ``last`` that made batch
        ``step``.  A new iteration starts its turns at worker 0, so every worker up to ``last``
        hands out a placeholder first: then the remaining batches come in the same order as they
        would have (an item without a batch, placeholder or final counts, never moves a batch).
        """
        n = self.num_workers
        if n == 0 or step == 0:
            return [step] * max(1, n), [False] * max(1, n)
        replays = [self.dataset.replay(w) for w in range(n)]
        skip, done, made, last = [0] * n, [False] * n, 0, -1
        while made < step and not all(done):
            for w in range(n):
                if done[w]:
                    continue
                if next(replays[w], None) is None:
                    done[w] = True
                else:
                    skip[w] += 1
                    made += 1
                last = w
                if made == step:
                    break
        return skip, [w <= last for w in range(n)]

    def _dataloader(self) -> DataLoader | ShardStream:
        """This epoch's DataLoader: with persistent workers, the same one every epoch.  Without
        workers, the dataset itself: a DataLoader would only add ~4% (a profiler hook per batch).

        The pool flags are created with the workers (before they fork) and live as long as they do.
        """
        if self._loader is not None:
            return self._loader
        persistent = self.persistent_workers and self.num_workers > 0
        if self._slots is None or (self.num_workers > 0 and not persistent):
            # num_workers=0 recycles batch buffers the same way, in this process, for the Loader's
            # life: filling fresh memory cost a page fault per 4 KiB, ~20% of an epoch.
            self._slots = SlotCache(max(1, self.num_workers))
            self.dataset.pool_shared = (self._slots.flags, self._slots.serial)
        if self.num_workers == 0:
            return self.dataset
        kw: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kw["prefetch_factor"] = self.prefetch_factor
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers, collate_fn=_identity,
                            persistent_workers=persistent, pin_memory=False, **kw)
        if persistent:
            self._loader = loader
        return loader

    def _receive(self, p: Packed, worker: int) -> Batch:
        """The Batch for a worker's packed batch; a pooled slot stays busy while the Batch lives."""
        slots = self._slots
        if p.slot >= 0 and slots is not None:
            buf, i = slots.buffer(p, worker)
            if self._pin:
                buf = _pin(buf)
                slots.flags[i] = _FREE  # the batch is the pinned copy: the slot is free already
            else:
                slots.hold(i, buf)
        else:
            buf = _pin(p.buf) if self._pin else p.buf
        return unpack(p._replace(buf=buf))

    def _batches(self, iteration: int) -> Iterator[Batch]:
        """This rank's batches with the workers' counts folded into :attr:`stats`."""
        st = self.stats
        dropped: Counter = Counter()
        loader = self._dataloader()
        slots = self._slots
        assert slots is not None
        slots.new_epoch()  # before iter(): the workers resume the moment it returns
        items = iter(loader)
        while True:
            # Hand back what the trainer dropped before asking for the next batch: with
            # num_workers=0 it is collated right now, into a buffer still in the CPU cache.
            slots.release()
            item = next(items, None)
            if item is None:
                break
            packed, delta, (worker, shard_i, sample_i) = item
            self._cursors[worker] = (shard_i, sample_i)
            for k, v in delta.items():
                if k == "read":
                    st.read += v
                elif k == "corrupt_shards":
                    st.corrupt_shards += v
                elif k.startswith("skipped:"):  # a resumed epoch's batches before its first step
                    name = k[len("skipped:"):]
                    setattr(st, name, getattr(st, name) + v)
                elif k.startswith("dropped:"):
                    dropped[k[len("dropped:"):]] += v
                else:
                    dropped[k] += v
            st.dropped = dict(dropped)
            if packed is not None:
                batch = self._receive(packed, worker)
                del packed  # only the yielded Batch may keep the buffer alive
                yield batch
                del batch
                if iteration != self._iteration:
                    # Persistent workers serve one iteration at a time: an older one resumed would
                    # take the newer one's batches.
                    raise RuntimeError("this Loader was iterated again before an earlier iteration finished; "
                                       "finish or drop the old iterator first")

    def __iter__(self) -> Iterator[Batch]:
        ds = self.dataset
        first, complete = 0, False
        if self._resume is not None and self._resume[0] == self.epoch:
            _, first, complete = self._resume
        self._resume = None
        self._position = (self.epoch, first, complete)
        ds.epoch = self.epoch  # shared memory: persistent workers read it when they resume
        self.stats = st = LoaderStats(epoch=self.epoch, steps=first, assigned=ds.assigned_utts(self.epoch))
        self._cursors = {}
        if complete:
            return  # resumed at the end of this epoch
        start = time.perf_counter()
        ds._skip[:], ds._lead[:] = self._skip_plan(first)  # shared memory again, read by the workers in iter()
        self._iteration += 1
        batches = self._batches(self._iteration)
        try:
            while True:
                batch = next(batches, None)  # prefetch one: the flag says whether this rank has a batch
                if self.sync:
                    if any_rank_done(batch is None):
                        break
                elif batch is None:
                    break
                st.steps += 1
                for name, v in zip(_TALLY, tally(batch.feat_lens.numpy(), ds.cfg.max_frames)):
                    setattr(st, name, getattr(st, name) + v)
                st.seconds = time.perf_counter() - start
                self._position = (self.epoch, st.steps, False)
                yield batch
                batch = None  # so the buffer is handed back as soon as the trainer drops it
            self._position = (self.epoch, st.steps, True)
        finally:
            # Stopped early: non-persistent workers shut down; persistent ones are drained by the
            # next epoch's iter() (torch discards their in-flight batches).
            batches.close()
        st.seconds = time.perf_counter() - start
        self._account_discarded()

    def _account_discarded(self) -> None:
        """How much of the epoch no rank used: all-reduced so every rank reports the same."""
        st, ds = self.stats, self.dataset
        total = ds.sizes.total_utts
        used = [st.utterances, st.num_dropped]
        if self.sync:
            used = all_sum(used)  # every rank reaches this after the same (last) step
        if total is None:
            return
        st.discarded = max(0, total - sum(used)) if (self.sync or ds.world_size == 1) else None
        if st.discarded is not None:
            st.discarded_fraction = st.discarded / total if total else 0.0


def make_loader(
    trset: str | os.PathLike | Sequence[str | os.PathLike],
    tokenizer: Tokenizer | str | os.PathLike,
    *,
    max_frames: int,
    seed: int = 0,
    shuffle_buffer: int = 2000,
    num_workers: int = 0,
    max_batch_size: int | None = None,
    min_frames: int | None = None,
    max_utt_frames: int | None = None,
    ctc_subsampling: int | None = None,
    train: bool = True,
    on_error: str = "warn",
    subword_sampling: SubwordSampling | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    tokenize_group: int = 256,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = True,
) -> Loader:
    """The training (or, with ``train=False``, dev) loader over tar shards.

    Args:
        trset: shard pattern(s): braces and globs (``data/{10_1000,1000_2000}/data-*.tar``), or
            URLs (``pipe:...``).  A pattern matching nothing is an error.
        tokenizer: a :class:`~wdsprep.tokenizer.Tokenizer` or the path of one.
        max_frames: per-rank bound on padded frames per batch (B x longest).  A longer
            utterance becomes a batch of its own.
        seed: with the epoch (and world size), decides every shuffle and so every batch.
        shuffle_buffer: samples held by the shuffle buffer (per worker).
        num_workers: DataLoader worker processes per rank; shards are split among them.
        max_batch_size: optional cap on utterances per batch.
        min_frames, max_utt_frames: drop utterances outside these lengths (counted in stats).
        ctc_subsampling: drop utterances with ``frames // ctc_subsampling <= label length``.
        train: False for dev/validation: no shuffle, no early stop, each utterance once.
        on_error: ``"warn"`` (skip the rest of a corrupt shard, counted) or ``"raise"``.
        subword_sampling: SentencePiece sampling in training, reseeded per (seed, epoch, rank, worker).
        pool_size: samples sorted together by the bucketing stage (see ``wdsprep.batching``).
        tokenize_group: utterances per block through the stages: read, shuffled and tokenized
            (one ``encode_batch`` call) together.
        rank, world_size: default to torch.distributed's when it is initialized, else 0 and 1.
        prefetch_factor: batches each worker prepares ahead (torch's default: 2).
        pin_memory: page-locked batches for asynchronous host-to-GPU copies; the main process
            copies each batch into pinned memory (CUDA only; without CUDA it warns and does nothing).
        persistent_workers: keep the worker processes (and their buffers) from one epoch to the
            next instead of starting them every epoch; the batches are the same either way.
    """
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    if on_error not in ("warn", "raise"):
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    if ctc_subsampling is not None and ctc_subsampling < 1:
        raise ValueError(f"ctc_subsampling must be >= 1, got {ctc_subsampling}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    d_rank, d_world = dist_info()
    rank = d_rank if rank is None else rank
    world_size = d_world if world_size is None else world_size
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    cfg = LoaderConfig(max_frames=max_frames, seed=seed, shuffle_buffer=shuffle_buffer, max_batch_size=max_batch_size,
                       min_frames=min_frames, max_utt_frames=max_utt_frames, ctc_subsampling=ctc_subsampling,
                       train=train, on_error=on_error, subword_sampling=subword_sampling, pool_size=pool_size,
                       tokenize_group=tokenize_group)
    dataset = ShardStream(expand_shards(trset), tokenizer, cfg, rank=rank, world_size=world_size,
                          num_workers=num_workers)
    # The per-step all-reduce needs a process group; explicit rank/world without one just split shards.
    import torch.distributed as dist

    sync = train and world_size > 1 and dist.is_available() and dist.is_initialized()
    return Loader(dataset, num_workers=num_workers, sync=sync, prefetch_factor=prefetch_factor,
                  pin_memory=pin_memory, persistent_workers=persistent_workers)
