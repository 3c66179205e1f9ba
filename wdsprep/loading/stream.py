"""One worker's epoch: the stages composed in data-flow order, the collate overlapped with them.

:meth:`ShardStream.stages` is the one place the loader's data flow is written down::

    shard list -> split by rank/worker -> per-epoch shard shuffle -> read + decode
      -> sample shuffle buffer -> tokenize -> filter -> bucket + batch -> collate -> Batch

Randomness comes only from generators seeded with (seed, epoch, rank, worker), so the same seed,
epoch and world size give the same batches, bit for bit, with any ``num_workers`` layout kept equal.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
from collections import deque
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsprep.format.shardfile import row_reader
from wdsprep.loading.assign import assign_shards, shard_sizes
from wdsprep.loading.batching import DEFAULT_POOL_SIZE
from wdsprep.loading.collate import Packed, start_collate
from wdsprep.loading.records import Records
from wdsprep.loading.stages import bucket, filter_samples, read_shards, shuffle_buffer, tokenize
from wdsprep.loading.stats import WorkerTally
from wdsprep.loading.transport import READ_AHEAD, ShmPool, WorkerControl
from wdsprep.tokenizer import SubwordSampling, Tokenizer, derive_seed

_STREAM_SHUFFLE, _STREAM_BATCH = 1, 2  # keep the per-stage generators of one worker independent

# What a worker hands the main process: a batch (None: its last counts, or a resumed epoch's
# placeholder), the counts since its previous item, and (worker, shards done, samples read).
Item = tuple["Packed | None", WorkerTally, tuple[int, int, int]]


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
    """The stages for one (rank, worker) and epoch; yields :data:`Item`: ``(Packed | None, counts, cursor)``.

    The counts (a :class:`~wdsprep.loading.stats.WorkerTally`) are deltas since the previous item,
    so the main process can add them up even when the worker lives in another process; a final
    ``None`` batch carries the worker's last counts.
    """

    def __init__(self, shards: list[str], tokenizer: Tokenizer, cfg: LoaderConfig, *, rank: int,
                 world_size: int, num_workers: int, control: WorkerControl) -> None:
        self.shards = shards
        self.sizes = shard_sizes(shards)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.control = control  # the Loader's: the epoch and a resumed epoch's plan reach workers through it
        self._fingerprint: str | None = None
        self._pool: ShmPool | None = None  # a worker's own pool, kept across epochs (persistent workers)
        # Fail in the main process, before workers start, when there are too few shards.
        self.plan(0)

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

    def stages(self, worker: int, counts: WorkerTally, cursor: list[int]) -> Iterator[Records]:
        """The data flow of one worker for one epoch, in order."""
        cfg = self.cfg
        epoch = self.control.epoch if cfg.train else 0  # dev mode: the same batches every epoch
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
        return twin.stages(worker, WorkerTally(), [0, 0])

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        skip, lead = self.control.resume(worker)
        counts = WorkerTally()
        cursor = [0, 0]
        pool = None
        if self.control.pool is not None:
            if self._pool is None:
                flags, serial = self.control.pool
                self._pool = ShmPool(flags, worker, serial=serial, shared=info is not None)
            pool = self._pool
            pool.begin()

        def item(out: Packed | None) -> Item:
            if out is not None and pool is not None:
                out = pool.outgoing(out)
            return out, counts.take(), (worker, cursor[0], cursor[1])

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
                counts.skipped.add(batch.frames, self.cfg.max_frames)
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
