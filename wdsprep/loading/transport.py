"""Moving batches from worker processes to the trainer: recycled shared-memory buffers, and the
shared state through which the Loader steers its (persistent) workers.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import StorageWeakRef

from wdsprep.loading.collate import Packed, alloc_buffer

# Batches whose feature reads are in flight behind the one a worker hands out: the stages of the
# next READ_AHEAD batches overlap each read, so one slow read (long utterances) rarely stalls.
READ_AHEAD = 2
# Shared-memory batch buffers each worker recycles (see ShmPool): in flight at once are the
# batches being read ahead, the DataLoader's prefetch (2 per worker by default), the batch the
# trainer holds and the one the main process releases a step late; a spare keeps the worker from
# falling back to fresh memory.
POOL_SLOTS = READ_AHEAD + 5
FREE, _BUSY = 0, 1


class WorkerControl:
    """What the Loader tells its readers each iteration, in shared memory: persistent workers were
    forked with a copy of the dataset, so only shared memory reaches them after the fork.

    It holds one JSON note, the epoch source's (``source.note``): where the iteration starts, from
    which a reader works out the plan and its own share itself.  The Loader owns it and writes it
    before each iteration's ``iter()``; a note longer than ``capacity`` needs a larger control
    (and workers forked with it).
    """

    def __init__(self, capacity: int = 1 << 20) -> None:
        self.capacity = capacity
        self._note = mp.RawArray("c", capacity)
        self._length = mp.RawValue("q", 0)
        # (flags, serial) of the Loader's SlotCache, set before the workers start: see ShmPool.
        self.pool: tuple[Any, Any] | None = None

    @staticmethod
    def encode(note: dict[str, Any]) -> bytes:
        return json.dumps(note, separators=(",", ":")).encode()

    def write(self, data: bytes) -> None:
        if len(data) > self.capacity:
            raise ValueError(f"a reader note of {len(data):,} bytes; this control holds {self.capacity:,}")
        self._note[:len(data)] = data
        self._length.value = len(data)

    def read(self) -> dict[str, Any]:
        return json.loads(self._note[:self._length.value])


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
                    self.flags[self.base + j] = FREE
                    self.stamps[j] = -1

    def alloc(self, nbytes: int) -> tuple[torch.Tensor, int]:
        """A shared uint8 buffer of ``nbytes`` and its slot (-1 when unpooled)."""
        for j, buf in enumerate(self.bufs):
            if self.flags[self.base + j] == FREE:
                if buf is None or buf.numel() < nbytes:
                    # Batches are bounded by max_frames, so capacities settle after a few batches;
                    # the headroom saves regrowing for a slightly larger one.
                    buf = self.bufs[j] = alloc_buffer(nbytes + nbytes // 8, self.shared)
                    self.gens[j] += 1
                    self.sent[j] = False
                self.flags[self.base + j] = _BUSY
                # Read after marking busy (the main process bumps, then frees): see begin().
                self.stamps[j] = self.serial.value if self.serial is not None else -1
                return buf[:nbytes], j
        return alloc_buffer(nbytes, self.shared), -1

    def outgoing(self, p: Packed) -> Packed:
        """``p`` as it is sent: the buffer only on the slot's first use since :meth:`begin` or regrowth."""
        if p.slot < 0:
            return p
        j = p.slot
        if self.sent[j]:
            return p._replace(buf=None, gen=self.gens[j])
        self.sent[j] = True
        return p._replace(gen=self.gens[j])


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
                self.flags[i] = FREE

    def release(self) -> None:
        """Hand back the slots of batches nothing references any more (the trainer moved on)."""
        if self.held:
            still = []
            for i, ref in self.held:
                if ref.expired():
                    self.flags[i] = FREE
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
        return torch.from_numpy(mem[:p.layout.nbytes]), i  # type: ignore[index]

    def hold(self, i: int, buf: torch.Tensor) -> None:
        """Keep slot ``i`` busy while anything references ``buf``'s storage."""
        self.held.append((i, StorageWeakRef(buf.untyped_storage())))
