"""One reader's epoch: the planned batches it was dealt, read, labelled, filtered and collated.

:meth:`ReaderStream.stages` is the one place the loader's run-time data flow is written down::

    the epoch source (from the index) -> this reader's planned batches, in order
      -> read each shard once, in that order -> gather each planned batch's rows
      -> tokenize -> features (audio shards: decode, augment, fbank; SpecAugment)
      -> CTC filter -> collate (in a C thread, overlapped) -> Batch

The source is pure: the plan and this reader's share are computed alike in the main process and
in every worker from the note the Loader writes (``source.note``: where the iteration starts),
so the batches are the same in any process layout; only which reader yields which batch depends
on the topology.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsprep.format.shardfile import row_reader
from wdsprep.loading.collate import Packed, start_collate
from wdsprep.loading.features import FeatureMaker, FeatureOptions
from wdsprep.loading.plan import BatchId, Planned, PlanOptions, fingerprint
from wdsprep.loading.readahead import FetchOptions
from wdsprep.loading.records import Records
from wdsprep.loading.source import EpochSource
from wdsprep.loading.stages import filter_ctc, read_batches, tokenize
from wdsprep.loading.stats import WorkerTally
from wdsprep.loading.transport import READ_AHEAD, ShmPool, WorkerControl
from wdsprep.tokenizer import SubwordSampling, Tokenizer, derive_seed

# What a reader hands the main process: a batch (None: its last counts, or a resumed run's
# placeholder), the counts since its previous item, the reader, and which planned batch it is
# ((-1, -1, -1, -1) with no batch).
Item = tuple["Packed | None", WorkerTally, int, BatchId]
NO_BATCH: BatchId = (-1, -1, -1, -1)


@dataclass
class LoaderConfig:
    """Everything besides the shards, the tokenizer and the epoch that decides the batches."""

    plan: PlanOptions
    seed: int = 0
    ctc_subsampling: int | None = None
    on_error: str = "warn"
    subword_sampling: SubwordSampling | None = None
    tokenize_group: int = 256  # utterances per block when a shard's rows are read
    fetch: FetchOptions = field(default_factory=FetchOptions)  # read-ahead, cache, retries (run time only)
    # audio shards' fbank and the augmentation of features (the plan's own part, speed, is in ``plan``)
    features: FeatureOptions = field(default_factory=FeatureOptions)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def train(self) -> bool:
        return self.plan.train


class ReaderStream(IterableDataset):
    """The planned epoch of one rank, read by its readers (the main process, or DataLoader workers).

    Yields :data:`Item`; a reader's last item has no batch and carries its last counts.
    """

    def __init__(self, source: EpochSource, tokenizer: Tokenizer, cfg: LoaderConfig, *, rank: int,
                 control: WorkerControl) -> None:
        self.source = source
        self.shards = source.shards
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.rank = rank
        self.control = control  # the Loader's: where each iteration starts reaches the readers through it
        self._pool: ShmPool | None = None  # a worker's own pool, kept across epochs (persistent workers)
        self.features = FeatureMaker(cfg.features, source.unit, on_error=cfg.on_error).load() \
            if cfg.features.needed else None

    def fingerprint(self) -> str:
        """A digest of what decides the batches besides (seed, epoch): the plan's options, the shard
        set (last two path parts, utterance counts, frame columns), the tokenizer, the run-time options."""
        speakers = self.shards.speakers
        planned = None if self.cfg.plan.max_utts_per_speaker is None or speakers is None else \
            hashlib.blake2b(np.ascontiguousarray(speakers.ids).tobytes(), digest_size=8).hexdigest()
        run = {"tokenizer": [self.tokenizer.kind, self.tokenizer.to_dict()], "ctc": self.cfg.ctc_subsampling,
               "sampling": repr(self.cfg.subword_sampling), "speakers": planned}
        if self.cfg.features.needed:  # only then: feature shards keep the fingerprints they had
            run["features"] = self.cfg.features.to_json()
        text = json.dumps(run, sort_keys=True, default=repr, ensure_ascii=False)
        return fingerprint(self.cfg.plan, self.shards.fingerprint(), hashlib.blake2b(text.encode()).hexdigest())

    def stages(self, windows: Iterable[list[Planned]], epoch: int,
               counts: WorkerTally) -> Iterator[tuple[BatchId, Records]]:
        """The data flow of one reader for one epoch, in order, a window of planned batches at a time."""
        cfg = self.cfg
        sampling = cfg.subword_sampling if cfg.train else None
        # Subword sampling seeded per (seed, epoch, shard): whichever rank or reader reads a shard.
        label: Callable[[int, Records], Records] = lambda s, rows: tokenize(  # noqa: E731
            rows, self.tokenizer, sampling=sampling, seed=derive_seed(cfg.seed, epoch, s))
        rows = read_batches(windows, self.shards, label=label, on_error=cfg.on_error, counts=counts,
                            block=cfg.tokenize_group, fetch=cfg.fetch)
        if self.features is not None:
            rows = self.features(rows, counts)
        return filter_ctc(rows, ctc_subsampling=cfg.ctc_subsampling, counts=counts)

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        at = self.source.from_note(self.control.read())
        lead, windows = self.source.run(at).reader_batches(self.rank, worker)
        epoch = at.epoch
        counts = WorkerTally()
        pool = None
        if self.control.pool is not None:
            if self._pool is None:
                flags, serial = self.control.pool
                self._pool = ShmPool(flags, worker, serial=serial, shared=info is not None)
            pool = self._pool
            pool.begin()
        dims = self.shards.dims

        # A thread in C reads batch k's features while the stages make the next READ_AHEAD
        # batches (with num_workers=0 it also overlaps the trainer's step).  It lives for the epoch.
        # Without it nothing overlaps the read, so reading ahead would only keep more batch
        # buffers in rotation, each one more to miss the CPU cache (2 workers: +8-15% without).
        reader = row_reader() if info is None or _cores() >= 2 * info.num_workers else None
        ahead = READ_AHEAD if reader is not None else 0
        pending: deque[tuple[BatchId, Callable[[], Packed]]] = deque()

        def item(done: tuple[BatchId, Callable[[], Packed]] | None) -> Item:
            if done is None:
                return None, counts.take(), worker, NO_BATCH
            bid, finish = done
            out = finish()
            if out.nonfinite:
                counts.dropped["nonfinite_features"] += out.nonfinite
            if pool is not None:
                out = pool.outgoing(out)
            return out, counts.take(), worker, bid

        try:
            if lead:
                yield item(None)
            for bid, rows in self.stages(windows, epoch, counts):
                pending.append((bid, start_collate(rows, shared=info is not None, reader=reader, dims=dims,
                                                   alloc=pool.alloc if pool is not None else None,
                                                   on_error=self.cfg.on_error)))
                if len(pending) > ahead:
                    yield item(pending.popleft())
            while pending:
                yield item(pending.popleft())
        finally:
            # Stopped early (or by an error): finish the batches whose reads were started, so
            # their descriptors close and no read is left writing into a pool slot.  Nobody will
            # see these batches, nor their errors.
            for _, finish in pending:
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

