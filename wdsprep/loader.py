"""The training loader: shards -> padded, length-bucketed batches, planned, deterministic and DDP-safe.

This is the front: :func:`make_loader`, the :class:`Loader` a trainer iterates, and the
:class:`Batch` it gets.  Every epoch is planned from the index before it starts, by the epoch
source :func:`~wdsprep.plan.source.epoch_source` builds (one corpus: ``plan/epochs.py``;
named corpora mixed: ``plan/mix/``), so ``len(loader)`` is exact and equal on every rank, with
no collective per step.  The run-time data flow is composed in ``loading/stream.py``
(``ReaderStream.stages``) from the stages in ``loading/stages.py``; ``loading/collate.py`` pads a
batch into one buffer, ``loading/transport.py`` moves it out of a worker process.

The collate reads a batch's features from the shards in a thread of its own (in C, without the
GIL), while the stages make the next batches: the two halves of the work overlap on two cores.
With ``num_workers > 0`` each DataLoader worker reads its share of the plan and collates into
shared-memory buffers it recycles; workers persist across epochs by default and learn where each
iteration starts through shared memory.

Under DDP the ranks meet only when the loader is built (same shards and options?) and at each
training epoch's end (same steps?), under ``collective_timeout``; a loader following growing
folders (``growing=True``) also shares rank 0's view of them when an epoch is set.  Dev mode (``train=False``)
reads each utterance exactly once across ranks, without shuffling; ranks may run a different
number of steps.
"""

from __future__ import annotations

import copy
import gc
import json
import time
import warnings
from collections import Counter
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from wdsprep.loading.collate import LABEL_PAD, Batch, Packed, unpack
from wdsprep.loading.collectives import dist_info, gather, loader_group
from wdsprep.loading.features import FeatureOptions
from wdsprep.loading.rehearsal import Rehearsal, rehearse
from wdsprep.loading.stream import LoaderConfig, ReaderStream, identity
from wdsprep.loading.transport import FREE, SlotCache, WorkerControl
from wdsprep.options import documented
from wdsprep.plan.compose import build_source, corpora_of
from wdsprep.plan.follow import Ranks
from wdsprep.plan.growing import VISIBLE_WITHIN
from wdsprep.plan.options import GROUPS, LoaderOptions, WorkerOptions, check_waveform_augment
from wdsprep.plan.source import EpochSource, Trset
from wdsprep.plan.state import STATE_VERSION, read_state
from wdsprep.plan.stats import BatchTally, CorpusStats, LoaderStats
from wdsprep.plan.streams import PLAN_REVISION, BatchId, options_json
from wdsprep.tokenizer import Tokenizer, TokenizerSpec, as_tokenizer

__all__ = ["Batch", "LABEL_PAD", "Loader", "LoaderStats", "Rehearsal", "make_loader"]


_heap_settled = False


def _settle_heap() -> None:
    """Take everything alive now off the cyclic GC's books, once per process.

    A process that imported torch holds ~170,000 objects the GC tracks (modules, functions,
    classes) that never die.  The loader's steady allocation triggers CPython's full collection
    sooner or later (measured: once, in the 4th or 7th epoch of 800 utterances), and that pass
    walks all of them: ~80-150 ms, as much as such an epoch's loading.  Collecting once here and
    freezing what survives moves those objects into the permanent generation, so later full
    collections walk only what was made since, and a DataLoader worker forked afterwards inherits
    them frozen.
    """
    global _heap_settled
    if not _heap_settled:
        gc.collect()
        gc.freeze()
        _heap_settled = True


def _worker_init(worker: int) -> None:
    # What a worker inherited from the main process stays alive as long as the worker does.
    gc.freeze()


def _pin(buf: torch.Tensor) -> torch.Tensor:
    """A page-locked copy (a seam for tests on machines without CUDA)."""
    return buf.pin_memory()


class Loader:
    """One epoch of :class:`Batch` per iteration; call :meth:`set_epoch` before each epoch.

    ``len(loader)`` is exactly the number of batches this rank takes in the epoch set, counted from
    its start (a resumed epoch's steps before the checkpoint too, as trainers count them), the same
    on every rank in training.  The batches come from the epoch source (``loader.source``: one
    corpus, or named corpora mixed), read by ``loader.dataset``.  With ``persistent_workers`` (the
    default) the worker processes, their buffer pools and one DataLoader live as long as the
    Loader; where each iteration starts reaches them through shared memory.
    """

    def __init__(self, dataset: ReaderStream, workers: WorkerOptions, *, group: Any = None) -> None:
        self.dataset = dataset
        self.rank = workers.rank or 0
        self.num_workers = workers.num_workers
        self.group = group  # the loader's gloo group under DDP (checks only), else None
        self.collective_timeout = workers.collective_timeout
        self.prefetch_factor = workers.prefetch_factor
        self.pin_memory = workers.pin_memory
        self.persistent_workers = workers.persistent_workers
        # The DataLoader's own pinning would copy only a slot's first batch, and the main process
        # would keep that copy as the slot's buffer; so the main process pins every batch itself.
        self._pin = self.pin_memory and torch.cuda.is_available()
        if self.pin_memory and not self._pin:
            warnings.warn("pin_memory=True but CUDA is not available: batches are not pinned", stacklevel=2)
        self.epoch = 0
        self.stats = LoaderStats()
        self._loader: DataLoader | None = None  # kept with persistent workers
        self._forked_for: tuple[Any, int] | None = None  # the source (and its revision) they were forked with
        self._slots: SlotCache | None = None  # the main process's side of the workers' pools
        self._iteration = 0  # which iteration of the loader may take batches (see _batches)
        self._run: Any = None  # the latest iteration of this epoch (an EpochRun), or None
        self._steps = 0  # batches that iteration yielded
        self._first = 0  # the epoch's step that iteration began at
        self._iterating = False
        self._warned_unfinished = False
        self._warned_idle = False
        self._epoch_set = False  # set_epoch was called since the last iteration began
        self._iterated = False
        self._warned_same_epoch = False
        self._planned: tuple[Any, LoaderStats] | None = None  # a run and its planned stats (_planned_stats)

    @property
    def source(self) -> EpochSource:
        """Where every batch comes from: the epoch source the readers plan with."""
        return self.dataset.source

    @property
    def world_size(self) -> int:
        return self.source.world_size

    @property
    def tokenizer(self) -> Tokenizer:
        return self.dataset.tokenizer

    @property
    def corpora(self) -> tuple[str, ...]:
        """The corpora's names, in order: ``batch.corpus`` indexes them (``("",)`` for one unnamed)."""
        return self.source.corpora

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: the shard order, the streams' shuffles and the batches derive from it.

        A source whose shard set changes (folders a pack is still writing) plans the epoch over the
        shards there are now (rank 0's view, shared with every rank: call it on every rank, as DDP
        trainers do), unless it was already (a resumed epoch: over the shards its state records).
        """
        epoch = int(epoch)
        if epoch != self.epoch:
            self._left_unfinished()
            # An iteration the trainer stopped taking batches from is over once another epoch is set.
            self._run, self._steps, self._iterating = None, 0, False
        if not self._iterating and self.source.follow(epoch):
            self._run, self._steps = None, 0
        self.epoch = epoch
        self._epoch_set = True
        if not self._iterating:  # from now on the stats describe the epoch set: its planned figures
            self.stats = self._planned_stats(self._next_run())

    def _planned_stats(self, run: Any) -> LoaderStats:
        """A fresh copy of ``run``'s figures known before a batch is read (computed once per run: the
        shuffle report reads the whole plan)."""
        if self._planned is None or self._planned[0] is not run:
            st = run.planned_stats(self.rank)
            self.source.annotate(st)
            self._planned = (run, st)
        return copy.deepcopy(self._planned[1])

    def _next_run(self) -> Any:
        """The run the next iteration of the epoch set yields: from a loaded position in it, else its start."""
        return self.source.run(self.source.start(self.epoch))

    def _left_unfinished(self) -> None:
        """Warn, once, when the trainer stopped taking batches before the end of a training epoch.

        Lightning sizes every epoch by ``len(loader)`` of the epoch it set up the loader in, unless
        told to ask again each epoch; an epoch of more batches than that one is cut short there.
        """
        run = self._run
        if run is None or not self.dataset.cfg.train or self._warned_unfinished:
            return
        planned = run.steps(self.rank)
        if self._steps < planned:
            self._warned_unfinished = True
            warnings.warn(f"epoch {self.epoch} ended after {self._steps} of the {planned} batches this rank had left: "
                          f"the trainer stopped asking for them. Epochs differ in length, so under Lightning give "
                          f"Trainer(reload_dataloaders_every_n_epochs=1) and call set_epoch in train_dataloader() "
                          f"(docs/trainers.md); ignore this if the epoch was cut short on purpose", UserWarning,
                          stacklevel=3)

    def __len__(self) -> int:
        """Batches of the epoch set on this rank, counted from the epoch's start, as torch's DataLoader
        counts them: after :meth:`load_state_dict`, the steps the epoch had taken before the loaded
        position plus those this rank yields from there (the next iteration yields only these).  The
        same on every rank; for the rest alone, ``len(loader) - loader.position().step``.

        A trainer that resumes counts the batches it took before the checkpoint against this (Lightning
        does), so a resumed epoch ends where an uninterrupted one does.
        """
        if self._iterating and self._run is not None:
            return self._first + self._run.steps(self.rank)
        at = self.source.start(self.epoch)
        return at.step + self.source.run(at).steps(self.rank)

    def position(self) -> Any:
        """Where the epoch set stands: after the batches its latest iteration yielded (a loaded
        position before any)."""
        if self._run is None:
            return self.source.start(self.epoch)
        return self._run.after(self.rank, self._steps)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as a few numbers, for a checkpoint; see :meth:`load_state_dict`.

        Every batch is a function of (seed, epoch, the plan's inputs), and where an epoch stands a
        few numbers (``plan/state.py`` has the format).  Under DDP (training) every rank is at
        the same step, so rank 0's state restores every rank, on any world size and workers.
        """
        src = self.source
        at = self.position()
        state = {"version": STATE_VERSION, "kind": src.kind, "seed": self.dataset.cfg.seed, "epoch": at.epoch,
                 "step": at.step, "complete": src.complete(at), "global_step": src.global_step(at),
                 "position": src.position_json(at),
                 "mixture": None if src.mixture is None else src.mixture.to_json(),
                 "options": self._options(), "fingerprint": self.dataset.fingerprint(),
                 "plan_revision": PLAN_REVISION, **src.saved(), **self._text()}
        return state

    def _text(self) -> dict[str, Any]:
        """What a state records of the text treatment: each corpus's ``normalize`` steps, only where
        one is set (states of loaders without one have no such field)."""
        steps = [None if t.normalize is None else t.normalize.to_json() for t in self.dataset.transforms]
        return {"normalize": steps} if any(steps) else {}

    def _options(self) -> dict[str, Any]:
        """The plan's options as JSON gives them back (a speed's factors are lists then, not tuples),
        so a state saved through JSON or pickle compares alike."""
        return json.loads(json.dumps(options_json(self.dataset.cfg.plan), default=repr))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, on this loader's world size and workers, whatever they were:
        the next iteration of ``state["epoch"]`` yields the planned batches not yet yielded, dealt
        anew over the ranks (one corpus: equal steps again, at most one batch per rank left over; a
        mixture: its schedule goes on at the saved global step, every corpus where it stood).  A
        mixture other than the saved one is allowed: it warns, saying what changed.

        A source whose shard set changes plans the epoch over the shards its state says there were
        when it was planned (however many there are now).

        Raises :class:`~wdsprep.plan.state.StateError` (a ValueError) when the state was saved
        for other shards, options or seed, or any of its fields is not what such a loader saves; the
        loader is then as it was.
        """
        source = self.source.restored(state)
        saved = read_state(state, kind=source.kind, seed=self.dataset.cfg.seed, options=self._options(),
                           fingerprint=self.dataset.fingerprint(source.shards), revision=PLAN_REVISION,
                           text=self._text())
        at = source.position(saved)
        self.dataset.source = source  # every check passed: from here the state is this loader's
        source.resume(at)
        self.set_epoch(at.epoch)
        self._run, self._steps = None, 0

    def rehearse(self, step: Callable[[Batch], Any], k: int = 8) -> Rehearsal:
        """Run ``step`` on the ``k`` costliest batches of the epoch set, every rank's, before training it.

        ``step(batch)`` is the trainer's forward, backward and optimizer step.  The batches are the
        ones the next iteration of the epoch set yields on any rank (after :meth:`load_state_dict`:
        what is left of it), ranked by their planned cost (under ``cost``, else padded frames),
        read with their real data as training reads them, costliest first.  Returns each batch's
        keys, shape (utterances, longest frames, longest label), planned cost and seconds, and on
        CUDA the step's peak memory and the device's headroom.  A step that runs out of memory
        (``torch.cuda.OutOfMemoryError``, or on the host a ``MemoryError`` or torch's "can't
        allocate memory") is reported naming the batch and the budget that would have fitted
        (``Rehearsal.failed``, ``Rehearsal.fits``), and the rehearsal goes on; any other error
        goes through.

        The loader's position, state, stats and draws are left as they were, and torch's global
        generators are forked around the steps: the epoch then yields exactly the batches it would
        have.  The steps train the model: save its (and the optimizer's) state first to start
        training from the same weights.
        """
        if self._iterating:
            raise RuntimeError("rehearse before iterating the epoch (or after it), not while an iteration runs")
        return rehearse(self.dataset, self._next_run(), self.epoch, step, k=k,
                        receive=lambda packed: self._receive(packed, 0))

    def _dataloader(self, start: bytes) -> DataLoader | ReaderStream:
        """This epoch's DataLoader: with persistent workers, the same one every epoch.  Without
        workers, the dataset itself: a DataLoader would only add ~4% (a profiler hook per batch).

        The pool flags and the control are created with the workers (before they fork) and live as
        long as they do; a start too long for the control starts workers with a larger one, and a
        source replaced or replanned (``revision``) starts workers that hold the new one.
        """
        control = self.dataset.control
        if len(start) > control.capacity:
            self.dataset.control = WorkerControl(max(len(start) * 2, control.capacity * 2))
            self.dataset.control.pool = control.pool
            self._loader = None  # persistent workers hold the old control: fork new ones
        self.dataset.control.write(start)
        if self._forked_for is not None and (self._forked_for[0] is not self.source
                                             or self._forked_for[1] != self.source.revision):
            self._loader = None  # persistent workers plan with the source they were forked with
        if self._loader is not None:
            return self._loader
        persistent = self.persistent_workers and self.num_workers > 0
        if self._slots is None or (self.num_workers > 0 and not persistent):
            # num_workers=0 recycles batch buffers the same way, in this process, for the Loader's
            # life: filling fresh memory cost a page fault per 4 KiB, ~20% of an epoch.
            self._slots = SlotCache(max(1, self.num_workers))
            self.dataset.control.pool = (self._slots.flags, self._slots.serial)
        if self.num_workers == 0:
            return self.dataset
        kw: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kw["prefetch_factor"] = self.prefetch_factor
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers, collate_fn=identity,
                            worker_init_fn=_worker_init,
                            persistent_workers=persistent, pin_memory=False, **kw)
        if persistent:
            self._loader = loader
            self._forked_for = (self.source, self.source.revision)
        return loader

    def _receive(self, p: Packed, worker: int) -> Batch:
        """The Batch for a worker's packed batch; a pooled slot stays busy while the Batch lives."""
        slots = self._slots
        if p.slot >= 0 and slots is not None:
            buf, i = slots.buffer(p, worker)
            if self._pin:
                buf = _pin(buf)
                slots.flags[i] = FREE  # the batch is the pinned copy: the slot is free already
            else:
                slots.hold(i, buf)
        else:
            buf = _pin(p.buf) if self._pin else p.buf
        if self._pin and p.audio is not None:
            p = p._replace(audio=_pin(p.audio))
        return unpack(p._replace(buf=buf))

    def _batches(self, iteration: int, start: bytes, expected: Iterator[BatchId]) -> Iterator[Batch]:
        """This rank's batches, in the order the run says, with the readers' counts folded in."""
        st = self.stats
        loader = self._dataloader(start)
        slots = self._slots
        assert slots is not None
        slots.new_epoch()  # before iter(): the workers resume the moment it returns
        items = iter(loader)
        k = 0
        while True:
            # Hand back what the trainer dropped before asking for the next batch: with
            # num_workers=0 it is collated right now, into a buffer still in the CPU cache.
            slots.release()
            item = next(items, None)
            if item is None:
                break
            packed, delta, worker, bid = item
            st.add_worker(delta)
            if packed is None:
                continue
            want = next(expected, None)
            if bid != want:
                # The resume of another run relies on this order (DataLoader workers in turn).
                raise RuntimeError(f"loader bug: batch {bid} came as this rank's batch {k}, the plan says "
                                   f"{want if want is not None else 'no more'}")
            k += 1
            batch = self._receive(packed, worker)
            del packed  # only the yielded Batch may keep the buffer alive
            yield batch
            del batch
            if iteration != self._iteration:
                # Persistent workers serve one iteration at a time: an older one resumed would
                # take the newer one's batches.
                raise RuntimeError("this Loader was iterated again before an earlier iteration finished; "
                                   "finish or drop the old iterator first")

    def _expected(self, run: Any) -> Iterator[BatchId]:
        """The batches this rank is to yield, in order; each window's planned figures go into the
        stats as it begins."""
        st = self.stats
        for window in run.windows(self.rank):
            st.assigned += window.assigned
            if window.dropped:
                st.dropped = dict(Counter(st.dropped) + window.dropped)
            yield from window.refs

    def __iter__(self) -> Iterator[Batch]:
        if self._iterated and not self._epoch_set and self.dataset.cfg.train and not self._warned_same_epoch:
            # As with a DistributedSampler: the epoch decides the shuffle, so it must change.
            self._warned_same_epoch = True
            warnings.warn(f"iterating epoch {self.epoch} again without set_epoch: the same batches in the same order "
                          f"as the last pass; call loader.set_epoch(epoch) before each epoch", UserWarning,
                          stacklevel=2)
        self._iterated, self._epoch_set = True, False
        src = self.source
        src.begin(self.epoch)
        at = src.start(self.epoch)
        run = self._run = src.run(at)
        self._steps, self._first = 0, at.step
        self.stats = st = self._planned_stats(run)
        if run.complete:
            return
        warning = run.idle_warning(self.rank)
        if warning and not self._warned_idle:
            self._warned_idle = True
            warnings.warn(warning, UserWarning, stacklevel=2)
        expected = self._expected(run)
        names = src.corpora
        start = time.perf_counter()
        self._iteration += 1
        iteration = self._iteration
        planned = run.steps(self.rank)
        batches = self._batches(iteration, WorkerControl.encode(src.reader_start(at)), expected)
        self._iterating = True
        try:
            for batch in batches:
                counted = BatchTally()
                counted.add(batch.feat_lens.numpy(), self.dataset.cfg.plan.max_frames, batch.label_lens.numpy())
                st.add_batches(counted)
                if len(names) > 1:
                    st.add_corpora(names, batch.corpus.numpy(), batch.feat_lens.numpy())
                self._steps += 1
                st.seconds = time.perf_counter() - start
                if self._steps == planned:
                    # The epoch ends with its last batch: a trainer that knows len(loader) (Lightning)
                    # never asks for the batch after it.
                    self._end_epoch(planned, expected)
                yield batch
                batch = None  # so the buffer is handed back as soon as the trainer drops it
        finally:
            # Stopped early: non-persistent workers shut down; persistent ones are drained by the
            # next epoch's iter() (torch discards their in-flight batches).
            batches.close()
            if iteration == self._iteration:  # not a newer iteration's flag
                self._iterating = False
        if self._steps != planned:
            raise RuntimeError(f"loader bug: this rank yielded {self._steps} batches, the plan gave it {planned}")
        if not planned:
            self._end_epoch(planned, expected)

    def _end_epoch(self, planned: int, expected: Iterator[BatchId]) -> None:
        """What ends an iteration that yielded its planned batches: the checks, the corpora's progress
        and, in training under DDP, the ranks' agreement that they ended the epoch alike."""
        self._iterating = False
        if next(expected, None) is not None:
            raise RuntimeError(f"loader bug: this rank yielded {self._steps} batches, the plan gave it more than "
                               f"{planned}")
        st, names = self.stats, self.source.corpora
        progress = self.source.progress(self.position())
        for name, done in zip(names, progress or []):
            st.corpora.setdefault(name, CorpusStats()).epochs = done
        if self.group is not None and self.dataset.cfg.train:  # dev mode: ranks end apart, and need not meet
            ranks = gather(self.group, [self.epoch, self._steps, self.dataset.fingerprint()],
                           timeout=self.collective_timeout, where=f"end of epoch {self.epoch}")
            if len({tuple(r) for r in ranks}) > 1:
                raise RuntimeError(f"wdsprep loader: ranks ended epoch {self.epoch} differently "
                                   f"([epoch, steps, fingerprint] per rank: {ranks})")


@documented(LoaderOptions, *(cls for cls, _ in GROUPS.values()))
def make_loader(trset: Trset, tokenizer: TokenizerSpec, options: LoaderOptions | None = None,
                **overrides: Any) -> Loader:
    """The training (or, with ``train=False``, dev) loader over tar shards.

    >>> loader = make_loader("shards/train", "exp/spm.json", max_frames=20000, num_workers=2)
    >>> for epoch in range(10):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader: ...

    Args:
        trset: a pack's folder (or several: its length groups' shards, as ``wdsprep pattern`` finds
            them), or shard pattern(s): braces and globs (``data/{10_1000,1000_2000}/data-*.tar``), or
            URLs: ``s3://bucket/prefix/{10_1000,1000_2000}/data-*.tar`` (globs list the bucket;
            endpoint and credentials as the AWS CLI finds them), ``https://host/shards/data-{00000..00099}.tar``
            (braces only), ``pipe:CMD``.  A pattern matching nothing is an error.  Remote shards
            need their folder's index files uploaded beside them.  Named corpora as a mapping,
            ``{"en": "en/*/data-*.tar", "zh": [...]}``: in training they are mixed (see ``weights``),
            each with epochs of its own; with ``train=False`` every corpus is read once.
            ``batch.corpus`` says which corpus each utterance came from.  A named corpus may give
            its own transforms: ``{"en": {"shards": PATTERN, "tokenizer": ..., "normalize": [...],
            "augment": {...}}, ...}``; one that does not inherits the loader's (docs/multilingual.md).
        tokenizer: a :class:`~wdsprep.tokenizer.Tokenizer` or the path of one; or one per language,
            ``{"en": "exp/en.json", "zh": "exp/zh.json"}``: each utterance is tokenized by its
            language's (from the index: ``pack --utt2lang``), the ids laid out as an aggregate
            tokenizer does (each language's in a range of its own, ``<s>`` and ``<unk>`` shared as
            ids 0 and 1; ``loader.tokenizer`` is it, ``.save()`` writes it).
        options: every option below at once (a :class:`~wdsprep.plan.options.LoaderOptions`);
            keywords given too replace its values.
        **overrides: any option below by name, e.g. ``max_frames=20000`` (TypeError for a name that
            is none; ValueError naming a value its group refuses).  ``rank`` and ``world_size``
            default to torch.distributed's when it is initialized, else 0 and 1.
    """
    options = LoaderOptions.of(**overrides) if options is None else options.replaced(**overrides)
    d_rank, d_world = dist_info()
    workers = options.workers
    options = options.with_topology(d_rank if workers.rank is None else workers.rank,
                                    d_world if workers.world_size is None else workers.world_size)
    rank, world_size, workers = options.rank, options.world_size, options.workers
    tokenizer = as_tokenizer(tokenizer)
    corpora = corpora_of(trset, options, tokenizer)
    assert corpora.transforms is not None
    # The checks under DDP run on a gloo group of the loader's own; explicit rank/world without a
    # process group just take their share.
    group = loader_group(workers.collective_timeout) if world_size > 1 else None
    if options.grow.growing and world_size > 1 and group is None:
        warnings.warn("growing=True with world_size > 1 but no torch.distributed process group: the ranks cannot "
                      "share rank 0's view of the growing shards, so each plans over the shards it sees; give "
                      "every rank the same state (load_state_dict) to plan alike", UserWarning, stacklevel=2)
    ranks = Ranks() if group is None else Ranks(
        share=lambda value, where: gather(group, value, timeout=workers.collective_timeout, where=where)[0],
        leader=rank == 0, visible_within=VISIBLE_WITHIN)
    source = build_source(corpora, options, tokenizer=tokenizer, ranks=ranks)
    _check_fields(source.shards, options, corpora.transforms)
    augments = tuple(t.augment for t in corpora.transforms)
    waveform = options.read.features == "waveform"
    if waveform:
        for name, aug in zip(corpora.names, augments):
            check_waveform_augment(aug, f"corpus {name!r}: " if name else "")
    features = FeatureOptions(options.read.fbank_for(source.shards.audio), options.read.augment,
                              augments if any(a != options.read.augment for a in augments) else None,
                              waveform=waveform)
    cfg = LoaderConfig(options.plan, seed=options.seed, read=options.read, fetch=options.fetch, features=features)
    dataset = ReaderStream(source, tokenizer, cfg, rank=rank, control=WorkerControl(), transforms=corpora.transforms)
    if group is not None:
        fingerprints = gather(group, dataset.fingerprint(), timeout=workers.collective_timeout, where="make_loader")
        odd = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
        if odd:
            raise ValueError(f"ranks {odd} plan from other shards or options than rank 0 (fingerprints "
                             f"{fingerprints}): give every rank the same trset, index and loader options")
    _settle_heap()
    return Loader(dataset, workers, group=group)


def _check_fields(shards: Any, options: LoaderOptions, transforms: Sequence[Any]) -> None:
    """Refuse fields the shards' samples do not carry, and a tokenizer per language without languages."""
    missing = [n for n in options.read.read_fields if n not in shards.fields]
    if missing:
        raise ValueError(f"fields {missing}: the shards' index lists {list(shards.fields) or 'no field'} (every "
                         f"folder's must: pack with --field NAME=FILE, or re-index shards that carry them: wdsprep "
                         f"index --force)")
    for c, t in enumerate(transforms):
        if t.by_language and shards.lacks("lang", c):
            where = f"corpus {shards.corpora[c]!r}'s" if shards.corpora != ("",) else "the shards'"
            if shards.has_some("lang", c):  # a manifest's lines without one were packed without one
                raise ValueError(f"a tokenizer per language needs each utterance's language: some of {where} "
                                 f"utterances have none (manifest lines without one); pack them with one "
                                 f"(--lang-column, --utt2lang), or train with one tokenizer")
            raise ValueError(f"a tokenizer per language needs each utterance's language: {where} index has no "
                             f"language column (pack with --utt2lang; shards that carry KEY.lang: wdsprep index "
                             f"--force)")
