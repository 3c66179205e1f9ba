"""One reader's epoch: the planned batches it was dealt, read, labelled, filtered and collated.

:meth:`ReaderStream.stages` is the one place the loader's run-time data flow is written down::

    the epoch source (from the index) -> this reader's planned batches, in order
      -> read each shard once, in that order (with the fields asked for)
      -> tokenize (each corpus's transforms: its text treatment, its tokenizer, by language where
         it has one per language; the text fields too) -> gather each planned batch's rows
      -> features (audio shards: decode, augment, fbank; SpecAugment)
      -> field filter -> CTC filter -> collate (in a C thread, overlapped) -> Batch

The source is pure: the plan and this reader's share are computed alike in the main process and
in every worker from what the Loader writes where an iteration starts (``source.reader_start``),
so the batches are the same in any process layout; only which reader yields which batch depends
on the topology.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from wdsprep.format.keys import LANG
from wdsprep.format.records import Records
from wdsprep.format.shardfile import row_reader
from wdsprep.loading.collate import Packed, start_collate
from wdsprep.loading.features import FeatureMaker, FeatureOptions
from wdsprep.loading.stages import filter_ctc, filter_fields, read_batches, tokenize
from wdsprep.loading.transport import READ_AHEAD, ShmPool, WorkerControl
from wdsprep.plan.corpus import Corpus
from wdsprep.plan.options import FetchOptions, ReadOptions
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.source import EpochSource
from wdsprep.plan.stats import WorkerTally
from wdsprep.plan.streams import BatchId, Planned, PlanOptions, fingerprint
from wdsprep.plan.transforms import Transforms
from wdsprep.tokenizer import Tokenizer, derive_seed

# What a reader hands the main process: a batch (None: its last counts, or a resumed run's
# placeholder), the counts since its previous item, the reader, and which planned batch it is
# ((-1, -1, -1, -1) with no batch).
Item = tuple["Packed | None", WorkerTally, int, BatchId]
NO_BATCH: BatchId = (-1, -1, -1, -1)


@dataclass(frozen=True)
class LoaderConfig:
    """What the readers need besides the epoch source and the tokenizer: the options they read with,
    and the features they make (audio shards' fbank and the augmentation; the plan's own part, speed,
    is in ``plan``)."""

    plan: PlanOptions
    seed: int
    read: ReadOptions = field(default_factory=ReadOptions)
    fetch: FetchOptions = field(default_factory=FetchOptions)
    features: FeatureOptions = field(default_factory=FeatureOptions)

    @property
    def train(self) -> bool:
        return self.plan.train


class ReaderStream(IterableDataset):
    """The planned epoch of one rank, read by its readers (the main process, or DataLoader workers).

    Yields :data:`Item`; a reader's last item has no batch and carries its last counts.
    """

    def __init__(self, source: EpochSource, tokenizer: Tokenizer, cfg: LoaderConfig, *, rank: int,
                 control: WorkerControl, transforms: Sequence[Transforms] | None = None) -> None:
        self.source = source
        self.tokenizer = tokenizer  # the loader's
        # Each named corpus's transforms (``transforms.py``); one for all where none differs.
        self.transforms = tuple(transforms) if transforms else (
            Transforms(tokenizer, cfg.read.normalize, cfg.read.augment),)
        self.cfg = cfg
        self.rank = rank
        self.control = control  # the Loader's: where each iteration starts reaches the readers through it
        self._pool: ShmPool | None = None  # a worker's own pool, kept across epochs (persistent workers)
        self.features = FeatureMaker(cfg.features, self._corpus_of, on_error=cfg.read.on_error).load() \
            if cfg.features.needed else None

    @property
    def shards(self) -> ShardSet:
        return self.source.shards

    def _corpus_of(self, c: int) -> Corpus:
        return self.source.corpus_of(c)  # the source held now (a growing one plans anew)

    def fingerprint(self, shards: ShardSet | None = None) -> str:
        """A digest of what decides the batches besides (seed, epoch): the plan's options, the shard
        set (last two path parts, utterance counts, frame columns; ``shards``, else this stream's),
        the tokenizer, the run-time options."""
        shards = self.shards if shards is None else shards
        speakers = shards.speakers
        planned = None if self.cfg.plan.max_utts_per_speaker is None or speakers is None else \
            hashlib.blake2b(np.ascontiguousarray(speakers.ids).tobytes(), digest_size=8).hexdigest()
        read = self.cfg.read
        # "ctc" is here as well as in the plan's options (where it is held only once set): a state
        # records it as None when unset.
        run = {"tokenizer": [self.tokenizer.kind, self.tokenizer.to_dict()], "ctc": self.cfg.plan.ctc_subsampling,
               "sampling": repr(read.subword_sampling), "speakers": planned}
        if self.cfg.features.needed:  # a loader that makes no features records none
            run["features"] = self.cfg.features.to_json()
        if self.source.mix_unit is not None:  # a mixture: what it mixes decides its batches
            run["mix_unit"] = self.source.mix_unit
        # Each corpus's text treatment is recorded only where one differs from the loader's tokenizer alone.
        texts = [t.text_json() for t in self.transforms]
        if any(t != {"tokenizer": run["tokenizer"], "normalize": None} for t in texts):
            run["corpora"] = texts
        text = json.dumps(run, sort_keys=True, default=repr, ensure_ascii=False)
        return fingerprint(self.cfg.plan, shards.fingerprint(), hashlib.blake2b(text.encode()).hexdigest())

    def stages(self, windows: Iterable[list[Planned]], epoch: int,
               counts: WorkerTally) -> Iterator[tuple[BatchId, Records]]:
        """The data flow of one reader for one epoch, in order, a window of planned batches at a time."""
        cfg, read = self.cfg, self.cfg.read
        sampling = read.subword_sampling if cfg.train else None
        shards, transforms = self.shards, self.transforms
        names = read.read_fields
        text = [names.index(n) for n in read.text_fields or ()]

        def label(s: int, rows: Records) -> Records:
            # Subword sampling seeded per (seed, epoch, shard): whichever rank or reader reads a shard.
            t = transforms[int(shards.corpus[s]) if len(transforms) > 1 else 0]
            return tokenize(rows, t, sampling=sampling, seed=derive_seed(cfg.seed, epoch, s),
                            langs=shards.values(LANG, rows.rows), text_fields=text,
                            field_names=[names[k] for k in text])

        rows = read_batches(windows, shards, label=label, on_error=read.on_error, counts=counts,
                            block=read.tokenize_group, fetch=cfg.fetch, fields=names, origins=self.source.origins)
        if self.features is not None:
            rows = self.features(rows, counts)
        if names:
            rows = filter_fields(rows, counts=counts)
        # The plan drops what the rule drops; this catches what subword sampling lengthens past it.
        return filter_ctc(rows, ctc_subsampling=cfg.plan.ctc_subsampling, counts=counts)

    def read(self, refs: Sequence[BatchId], epoch: int) -> Iterator[tuple[BatchId, Packed]]:
        """Planned batches of the loader's ``epoch`` chosen by id, read through :meth:`stages` (each
        shard once) and collated in this process, in the order given: the batches training yields
        under those ids, with their counts left out of every tally (``Loader.rehearse``)."""
        windows = [[(bid, self.source.rows(bid)) for bid in refs]]
        for bid, rows in self.stages(windows, epoch, WorkerTally()):
            yield bid, start_collate(rows, dims=self.shards.dims, on_error=self.cfg.read.on_error,
                                     waveform=self.cfg.features.waveform)()

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        at = self.source.from_reader_start(self.control.read())
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
                                                   on_error=self.cfg.read.on_error, fields=self.cfg.read.read_fields,
                                                   text_fields=self.cfg.read.text_fields or (),
                                                   waveform=self.cfg.features.waveform)))
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
            if info is not None:
                _return_free_heap()
        yield item(None)


def identity(x: Any) -> Any:
    """The DataLoader's collate: a reader's items are whole batches already."""
    return x


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    with suppress(OSError, AttributeError):
        return ctypes.CDLL(None).malloc_trim
    return None


def _return_free_heap() -> None:
    """Give the free pages inside a worker's heap back to the system, once an epoch has ended.

    An audio epoch's batches are waveforms of every size (speed perturbation; up to ~13 MB a
    batch); glibc keeps such blocks on its heap once its mmap threshold has risen to them, and the
    holes they leave stay resident.  Over 30 epochs (``tools/bench/bench_longrun.py``) a worker
    ends at 262 MB with this against 270 without; it costs a few milliseconds an epoch.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _cores() -> int:
    """CPUs this process may run on.

    A worker's read thread pays only with a core to run on: on 2 cores it made 1 worker ~20%
    faster and 2 workers (4 busy threads) ~10% slower (8 interleaved runs), so workers read in a
    thread of their own when there are at least 2 cores per worker.
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

