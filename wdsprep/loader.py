"""The training loader: shards -> padded, length-bucketed batches, planned, deterministic and DDP-safe.

This is the front: :func:`make_loader`, the :class:`Loader` (and :class:`MixedLoader` for named
corpora) a trainer iterates, and the :class:`Batch` it gets.  Every epoch is planned from the
index before it starts (``loading/plan.py``) and dealt to ranks and readers (``loading/assign.py``;
mixed corpora: ``loading/mixplan.py``), so ``len(loader)`` is exact and equal on every rank, with
no collective per step.  The run-time data flow is composed in ``loading/stream.py``
(``ShardStream.stages``) from the stages in ``loading/stages.py``; ``loading/collate.py`` pads a
batch into one buffer, ``loading/transport.py`` moves it out of a worker process.

The collate reads a batch's features from the shards in a thread of its own (in C, without the
GIL), while the stages make the next batches: the two halves of the work overlap on two cores.
With ``num_workers > 0`` each DataLoader worker reads its share of the plan and collates into
shared-memory buffers it recycles; workers persist across epochs by default and learn the epoch
through shared memory.

Under DDP the ranks meet only when the loader is built (same shards and options?) and at each
training epoch's end (same steps?), under ``collective_timeout``.  Dev mode (``train=False``)
reads each utterance exactly once across ranks, without shuffling; ranks may run a different
number of steps.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from collections import Counter
from dataclasses import asdict
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from wdsprep import _moved
from wdsprep.loading.assign import Assignment, epoch_assignment, next_turn, rank_order
from wdsprep.loading.batching import DEFAULT_POOL_SIZE
from wdsprep.loading.collate import LABEL_PAD, Batch, Packed, unpack
from wdsprep.loading.collectives import dist_info, gather, loader_group
from wdsprep.loading.fetch import MIN_RATE, FetchOptions
from wdsprep.loading.mixing import MixedStream, mixture_for
from wdsprep.loading.mixplan import MixPosition
from wdsprep.loading.mixture import Mixture
from wdsprep.loading.plan import MIN_STREAM_UTTS, EpochPlan, PlanOptions
from wdsprep.loading.quality import plan_quality, shard_speakers
from wdsprep.loading.shardset import indexed_shards, union
from wdsprep.loading.stages import BatchId
from wdsprep.loading.stats import BatchTally, CorpusStats, LoaderStats
from wdsprep.loading.stream import LoaderConfig, ShardStream, _identity
from wdsprep.loading.transport import _FREE, SlotCache, WorkerControl
from wdsprep.tokenizer import SubwordSampling, Tokenizer, load_tokenizer

__all__ = ["Batch", "LABEL_PAD", "Loader", "LoaderStats", "make_loader"]


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

    ``len(loader)`` is exactly the number of batches this rank yields in the epoch set, the same
    on every rank in training.  With ``persistent_workers`` (the default) the worker processes,
    their buffer pools and one DataLoader live as long as the Loader; the epoch reaches them
    through shared memory.
    """

    def __init__(self, dataset: ShardStream, *, num_workers: int, group: Any = None, collective_timeout: float = 300.0,
                 prefetch_factor: int | None = None, pin_memory: bool = False,
                 persistent_workers: bool = True) -> None:
        self.dataset = dataset
        self.control = dataset.control  # the readers' side of it is the dataset's; this Loader writes it
        self.num_workers = num_workers
        self.group = group  # the loader's gloo group under DDP (checks only), else None
        self.collective_timeout = collective_timeout
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
        self._loader: DataLoader | None = None  # kept with persistent workers
        self._slots: SlotCache | None = None  # the main process's side of the workers' pools
        self._iteration = 0  # which iteration of the loader may take batches (see _batches)
        # Where the current (or next) iteration of the epoch starts: the epoch's earlier runs as
        # (world size, workers, steps), set by load_state_dict; then its progress.
        self._runs: list[tuple[int, int, int]] = []
        self._steps = 0  # batches this iteration yielded
        self._complete = False  # the epoch ended (or the loaded state said so)
        self._resume: tuple[int, list[tuple[int, int, int]], bool] | None = None  # a loaded position, not yet used
        self._planned: tuple[int, tuple, Assignment] | None = None  # (epoch, runs, assignment) last computed
        self._warned_idle = False
        self._iterating = False

    @property
    def rank(self) -> int:
        return self.dataset.rank

    @property
    def world_size(self) -> int:
        return self.dataset.world_size

    @property
    def corpora(self) -> tuple[str, ...]:
        """The corpora's names, in order: ``batch.corpus`` indexes them (``("",)`` for one unnamed)."""
        return self.dataset.shards.corpora

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: the shard order, the streams' shuffles and the batches derive from it."""
        epoch = int(epoch)
        if epoch != self.epoch:
            self._runs, self._steps, self._complete = [], 0, False
            if self._resume is not None and self._resume[0] != epoch:
                self._resume = None  # the trainer moved on from the epoch it resumed in
        self.epoch = epoch

    def _start(self) -> tuple[list[tuple[int, int, int]], bool]:
        """(earlier runs, complete) the next iteration of the epoch starts from: a loaded position, or the start."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1], self._resume[2]
        return [], False

    def assignment(self, runs: list[tuple[int, int, int]] | None = None) -> Assignment:
        """Who yields which planned batches of the epoch set, after ``runs`` (default: where the next
        iteration starts)."""
        runs = self._start()[0] if runs is None else runs
        key = tuple(runs)
        if self._planned is None or self._planned[:2] != (self.epoch, key):
            counts = self.dataset.plan(self.epoch).counts
            self._planned = (self.epoch, key, self.dataset.assignment(counts, runs))
        return self._planned[2]

    def __len__(self) -> int:
        """Batches this rank yields in the next (or current) iteration of the epoch set: the whole
        epoch, or what is left of it after :meth:`load_state_dict`.  The same on every rank."""
        if self._iterating:
            return 0 if self._complete else self.assignment(self._runs).steps[self.rank]
        runs, complete = self._start()
        return 0 if complete else self.assignment(runs).steps[self.rank]

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as a few numbers, for a checkpoint; see :meth:`load_state_dict`.

        Every batch is a function of (seed, epoch, the plan's inputs), and which batches each
        rank has yielded a function of the runs' topologies and steps: ``runs`` lists the epoch's
        runs so far as ``[world_size, num_workers, steps]``.  Under DDP (training) every rank is
        at the same step, so rank 0's state restores every rank, on any world size and workers.
        """
        if self._resume is not None and self._resume[0] == self.epoch:  # loaded, not iterated yet
            runs, complete = self._resume[1], self._resume[2]
        else:
            runs = self._runs + ([(self.world_size, self.num_workers, self._steps)] if self._steps else [])
            complete = self._complete
        return {"version": STATE_VERSION, "seed": self.dataset.cfg.seed, "epoch": self.epoch,
                "step": sum(s for _, _, s in runs), "complete": complete,
                "runs": [list(r) for r in runs], "options": asdict(self.dataset.cfg.plan),
                "fingerprint": self.dataset.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, on this loader's world size and workers, whatever they were:
        the next iteration of ``state["epoch"]`` yields the planned batches not yet yielded, dealt
        anew over the ranks (equal steps again; at most one batch per rank left over).

        Raises ValueError when the state was saved for other shards, options or seed, or names a
        position past the end of its epoch.
        """
        ds = self.dataset
        self._check_state(state, {"runs"})
        epoch = int(state["epoch"])
        runs: list[tuple[int, int, int]] = []
        counts = ds.plan(epoch).counts
        for world, workers, steps in state["runs"]:
            run = (int(world), int(workers), int(steps))
            if run[0] < 1 or run[1] < 0:
                raise ValueError(f"the loader state has a run on world size {run[0]} with {run[1]} workers")
            total = epoch_assignment(counts, runs, run[0], run[1], equal=ds.cfg.train).steps[0]
            if not 0 <= run[2] <= total:
                raise ValueError(f"the loader state says step {run[2]} of epoch {epoch} on world size {run[0]} with "
                                 f"{run[1]} workers, but that run of the epoch has {total} steps: the state is not "
                                 f"from these shards and options, or was edited")
            runs.append(run)
        self.set_epoch(epoch)
        self._resume = (epoch, runs, bool(state["complete"]))

    def _check_state(self, state: dict[str, Any], keys: set[str]) -> None:
        """Refuse a state saved for another seed, options, shards or kind of loader, saying which."""
        ds = self.dataset
        missing = ({"version", "seed", "epoch", "complete", "fingerprint"} | keys) - set(state)
        if missing:
            kind = (" (it is a mixed loader's state)" if "position" in state else
                    " (it is a single-corpus loader's state)" if "runs" in state else "")
            raise ValueError(f"not a wdsprep loader state for this loader (version {STATE_VERSION}){kind}: "
                             f"missing {sorted(missing)}")
        if state["seed"] != ds.cfg.seed:
            raise ValueError(f"the loader state was saved with seed={state['seed']} (this loader: {ds.cfg.seed}): "
                             f"the batches depend on it; build the loader with the saved seed to resume")
        mine = asdict(ds.cfg.plan)
        differ = [f"{k}={v} (this loader: {mine.get(k)})" for k, v in state.get("options", {}).items()
                  if mine.get(k) != v]
        if differ:
            raise ValueError(f"the loader state was saved with {', '.join(differ)}: the planned batches depend on "
                             f"these, so build the loader with the saved values to resume (a CAT bucket_size is split "
                             f"over the world size: pass max_frames as saved)")
        if state["fingerprint"] != ds.fingerprint():
            raise ValueError("the loader state was saved for other shards, index, tokenizer or batching options "
                             "(fingerprint differs): resuming would not continue the same epoch")

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
            self.control.pool = (self._slots.flags, self._slots.serial)
        if self.num_workers == 0:
            return self.dataset
        kw: dict[str, Any] = {}
        if self.prefetch_factor is not None:
            kw["prefetch_factor"] = self.prefetch_factor
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers, collate_fn=_identity,
                            worker_init_fn=_worker_init,
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

    def _batches(self, iteration: int, expected: list[BatchId]) -> Iterator[Batch]:
        """This rank's batches, in the order the assignment says, with the readers' counts folded in."""
        st = self.stats
        loader = self._dataloader()
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
            if k >= len(expected) or bid != expected[k]:
                # The resume of another run relies on this order (DataLoader workers in turn).
                raise RuntimeError(f"loader bug: batch {bid} came as this rank's batch {k}, the assignment says "
                                   f"{expected[k] if k < len(expected) else 'no more'}")
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

    def _begin(self) -> list[BatchId] | None:
        """Set up an iteration of the epoch: its stats, what the readers are told; the batches this
        rank yields, in order (None: the epoch is complete)."""
        ds = self.dataset
        self._runs, self._complete = self._start()
        self._resume = None
        plan = ds.plan(self.epoch)
        a = self.assignment(self._runs)
        self.stats = st = self._planned_stats(plan, a)
        speakers = ds.speakers
        if speakers is not None:  # from the plan and the index: no feature read
            st.shuffle = plan_quality(plan, a, speakers.ids, ds.shards.frames, ranks=[self.rank],
                                      source=speakers.source).to_dict()
        if self._complete:
            return None
        self._warn_idle(a)
        self.control.write(self.epoch, plan.counts, self._runs)  # read by the readers in iter()
        return rank_order(a, self.rank, next_turn(plan.counts, self._runs, self.world_size, self.num_workers,
                                                  self.rank, equal=ds.cfg.train))

    def __iter__(self) -> Iterator[Batch]:
        ds = self.dataset
        self._steps = 0
        expected = self._begin()
        if expected is None:
            return
        st = self.stats
        names = ds.shards.corpora
        start = time.perf_counter()
        self._iteration += 1
        batches = self._batches(self._iteration, expected)
        self._iterating = True
        try:
            for batch in batches:
                counted = BatchTally()
                counted.add(batch.feat_lens.numpy(), ds.cfg.plan.max_frames)
                st.add_batches(counted)
                if len(names) > 1:
                    st.add_corpora(names, batch.corpus.numpy(), batch.feat_lens.numpy())
                self._steps += 1
                st.seconds = time.perf_counter() - start
                yield batch
                batch = None  # so the buffer is handed back as soon as the trainer drops it
        finally:
            # Stopped early: non-persistent workers shut down; persistent ones are drained by the
            # next epoch's iter() (torch discards their in-flight batches).
            batches.close()
            self._iterating = False
        st.seconds = time.perf_counter() - start
        if self._steps != len(expected):
            raise RuntimeError(f"loader bug: this rank yielded {self._steps} batches, the plan gave it {len(expected)}")
        self._complete = True
        self._ended()
        if self.group is not None and ds.cfg.train:  # dev mode: ranks end apart, and need not meet
            ranks = gather(self.group, [self.epoch, self._steps, ds.fingerprint()], timeout=self.collective_timeout,
                           where=f"end of epoch {self.epoch}")
            if len({tuple(r) for r in ranks}) > 1:
                raise RuntimeError(f"wdsprep loader: ranks ended epoch {self.epoch} differently "
                                   f"([epoch, steps, fingerprint] per rank: {ranks})")

    def _ended(self) -> None:
        """The epoch was iterated to its end (a hook for the mixed loader's stats)."""

    def _planned_stats(self, plan: EpochPlan, a: Assignment) -> LoaderStats:
        """The stats an iteration starts from: what the plan gives this rank, and what it leaves out."""
        st = LoaderStats(epoch=self.epoch, steps=sum(s for _, _, s in self._runs),
                         planned_steps=0 if self._complete else a.steps[self.rank])
        utts = lambda tasks: sum(int(plan.streams[t.stream].starts[t.stop] - plan.streams[t.stream].starts[t.start])  # noqa: E731
                                 for t in tasks)
        st.assigned = sum(utts(tasks) for tasks in a.workers[self.rank])
        total = sum(int(s.starts[-1]) for s in plan.streams)
        st.discarded = utts(a.discarded)
        st.discarded_fraction = st.discarded / total if total else 0.0
        if not self._runs:  # what the plan left out, counted once, by the rank the stream was dealt to
            lost = self.dataset.shards.lost
            for s in plan.streams:
                if a.owners[s.stream] != self.rank:
                    continue
                unreadable = int(lost[s.shards].sum()) if len(s.shards) else 0
                extra = Counter(s.dropped) + Counter({"unreadable": unreadable})
                if extra:
                    st.dropped = dict(Counter(st.dropped) + extra)
        return st

    def _warn_idle(self, a: Assignment) -> None:
        readers = a.workers[self.rank]
        idle = sum(not tasks for tasks in readers)
        # A corpus too small for a stream per reader pads less in fewer streams: no warning then.
        big = self.dataset.shards.num_utts >= MIN_STREAM_UTTS * self.world_size * self.num_workers
        if idle and self.num_workers > 1 and big and not self._warned_idle:
            self._warned_idle = True
            warnings.warn(f"rank {self.rank}: {idle} of {self.num_workers} DataLoader workers get no batches this "
                          f"epoch: the plan has {len(self.dataset.plan(self.epoch).streams)} streams for "
                          f"{self.world_size} ranks x {self.num_workers} workers; pass streams= at least "
                          f"{self.world_size * self.num_workers} (or fewer workers)", UserWarning, stacklevel=3)


class MixedLoader(Loader):
    """A :class:`Loader` over named corpora mixed by weight, temperature or schedule (see
    ``loading/mixplan.py``): every loader epoch has the same number of steps on every rank,
    ``len(loader)`` of them, and nothing is left over; each corpus runs through epochs of its own.

    Its state (:meth:`state_dict`) is where every corpus stands, a few numbers per stream: it
    resumes on any world size and workers, and on the same ones exactly as if never stopped.
    """

    dataset: MixedStream

    def __init__(self, dataset: MixedStream, **kw: Any) -> None:
        super().__init__(dataset, **kw)
        self._from: MixPosition | None = None  # where the current iteration started

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self._from, self._steps = None, 0
        super().set_epoch(epoch)

    def __len__(self) -> int:
        """Steps this rank yields in the next (or current) iteration of the epoch set; the same on every rank."""
        if self._iterating and self._from is not None:
            return self.dataset.mix.run(self.epoch, self._from).steps
        return self.dataset.mix.run(self.epoch).steps

    def position(self) -> MixPosition:
        """Where every corpus stands now: after the batches yielded in this epoch's iteration."""
        if self._from is None:
            return self.dataset.mix.epoch_start(self.epoch)
        return self.dataset.mix.run_from(self._from, steps=self._steps).end

    def state_dict(self) -> dict[str, Any]:
        """Where the mixed run stands, for a checkpoint: the loader epoch and step, the schedule's
        global step, every corpus's epoch and what of it is handed out; rank 0's serves every rank."""
        ds = self.dataset
        pos = self.position()
        return {"version": STATE_VERSION, "seed": ds.cfg.seed, "epoch": pos.epoch, "step": pos.step,
                "global_step": pos.global_step, "complete": pos.batches_left == 0, "position": pos.to_json(),
                "mixture": ds.mix.mixture.to_json(), "options": asdict(ds.cfg.plan), "fingerprint": ds.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` on this loader's world size and workers: the schedule goes
        on at the saved global step and every corpus where it stood.  A mixture other than the
        saved one is allowed: it warns, saying what changed, and applies from the saved step on.

        Raises ValueError when the state was saved for other shards, options or seed.
        """
        ds = self.dataset
        self._check_state(state, {"position", "mixture"})
        try:
            pos = MixPosition.from_json(state["position"])
            saved = Mixture.from_json(state["mixture"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"the loader state's position or mixture is not readable ({e!r}): "
                             f"was it edited?") from None
        if pos.epoch != int(state["epoch"]) or len(pos.corpora) != len(self.corpora):
            raise ValueError(f"the loader state's position is for epoch {pos.epoch} and {len(pos.corpora)} corpora, "
                             f"its epoch {state['epoch']} and this loader {len(self.corpora)}: was it edited?")
        changed = ds.mix.mixture.changes_from(saved)
        if changed:
            warnings.warn(f"the mixture differs from the one the loader state was saved with: {changed}; the new one "
                          f"applies from global step {pos.global_step} on", UserWarning, stacklevel=2)
        ds.mix.set_anchor(pos)
        if self._loader is not None:  # persistent workers hold the old anchor: start fresh ones
            self._loader, self._slots = None, None
        self.set_epoch(pos.epoch)
        self._from, self._steps = None, 0

    def _begin(self) -> list[BatchId] | None:
        mix = self.dataset.mix
        start = self._from = mix.epoch_start(self.epoch)
        run = mix.run(self.epoch, start)
        refs = run.rank_order(self.rank)
        self.stats = st = LoaderStats(epoch=self.epoch, steps=start.step, planned_steps=run.steps)
        st.corpora = {name: CorpusStats() for name in self.corpora}
        if self.dataset.speakers is not None:  # from the plan and the index: no feature read
            for name, q in mix.shuffle_quality(run, self.dataset.speakers, ranks=[self.rank]).items():
                st.corpora[name].shuffle = q
        st.assigned = sum(mix.batch_size(r) for r in refs)
        dropped = sum((mix.plan_dropped(r) for r in refs), Counter())
        st.dropped = dict(+dropped)
        if not run.steps:
            return None
        self.control.write(self.epoch, np.zeros(0, np.int64), [])  # the readers need only the epoch
        return list(refs)

    def _ended(self) -> None:
        pos = self.position()
        for name, done in zip(self.corpora, self.dataset.mix.progress(pos)):
            self.stats.corpora[name].epochs = done


STATE_VERSION = 2


def make_loader(
    trset: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike | Sequence[str]],
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
    max_utts_per_speaker: int | None = None,
    tokenize_group: int = 256,
    streams: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    persistent_workers: bool = True,
    collective_timeout: float = 300.0,
    weights: Mapping[str, float] | None = None,
    temperature: float | None = None,
    schedule: Sequence[tuple[int, Mapping[str, float]]] | None = None,
    steps_per_epoch: int | None = None,
    read_ahead: int = 2,
    read_ahead_bytes: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
    retries: int = 5,
    retry_backoff: float = 1.0,
    min_rate: float = MIN_RATE,
) -> Loader:
    """The training (or, with ``train=False``, dev) loader over tar shards.

    Args:
        trset: shard pattern(s): braces and globs (``data/{10_1000,1000_2000}/data-*.tar``), or
            URLs: ``s3://bucket/prefix/{10_1000,1000_2000}/data-*.tar`` (globs list the bucket;
            endpoint and credentials as the AWS CLI finds them), ``https://host/shards/data-{00000..00099}.tar``
            (braces only), ``pipe:CMD``.  A pattern matching nothing is an error.  Remote shards
            need their folder's index files uploaded beside them.  Named corpora as a mapping,
            ``{"en": "en/*/data-*.tar", "zh": [...]}``: in training they are mixed (see ``weights``),
            each with epochs of its own; with ``train=False`` every corpus is read once.
            ``batch.corpus`` says which corpus each utterance came from.
        tokenizer: a :class:`~wdsprep.tokenizer.Tokenizer` or the path of one.
        max_frames: per-rank bound on padded frames per batch (B x longest).  A longer
            utterance becomes a batch of its own.
        seed: with the epoch, decides every shuffle and so every batch, on any world size and workers.
        shuffle_buffer: samples held by each stream's shuffle buffer.
        num_workers: DataLoader worker processes per rank; the rank's streams are split among them.
        max_batch_size: optional cap on utterances per batch.
        min_frames, max_utt_frames: drop utterances outside these lengths (counted in stats).
        ctc_subsampling: drop utterances with ``frames // ctc_subsampling <= label length``.
        train: False for dev/validation: no shuffle, every batch yielded once, ranks may differ in steps.
        on_error: ``"warn"`` (skip the rest of a corrupt shard, counted) or ``"raise"``.
        subword_sampling: SentencePiece sampling in training, reseeded per (seed, epoch, rank, worker).
        pool_size: samples sorted together by the bucketing (see ``wdsprep.loading.batching``).
        max_utts_per_speaker: at most this many utterances of one speaker per batch (speakers from
            the index: ``pack --utt2spk``, else the speaker each id names; docs/shuffle.md).
        tokenize_group: utterances per block when a shard's samples are read.
        streams: canonical streams the epoch is planned in (default: min(shards, 64)); each is read
            by one reader, so at least world_size x num_workers keeps every worker busy.
        rank, world_size: default to torch.distributed's when it is initialized, else 0 and 1.
        prefetch_factor: batches each worker prepares ahead (torch's default: 2).
        pin_memory: page-locked batches for asynchronous host-to-GPU copies; the main process
            copies each batch into pinned memory (CUDA only; without CUDA it warns and does nothing).
        persistent_workers: keep the worker processes (and their buffers) from one epoch to the
            next instead of starting them every epoch; the batches are the same either way.
        collective_timeout: seconds a rank waits for the others at the loader's start and at the
            end of each epoch (under DDP) before naming the ranks that did not come.
        read_ahead: shards each reader fetches ahead of the one in use, in the order it reads them
            (remote: downloaded in the background; local: into the page cache); 0 fetches each when needed.
        read_ahead_bytes: at most this many bytes of remote shards fetched ahead and waiting, per reader
            (at least one shard is always fetched).
        cache_dir: keep fetched remote shards in this local directory and read them from there
            (safe to share between the ranks of a node); without it they are held in memory while used.
        cache_bytes: bound on ``cache_dir``; least recently used shards are removed first.
        retries: attempts after the first for a remote shard or index whose connection drops, whose
            server answers 5xx or whose body is cut short; each is counted in ``stats.retries``.  A
            shard still not fetched is an error (``on_error="raise"``) or skipped and counted.
        retry_backoff: seconds before the first retry, doubling each time (at most 30 s).
        min_rate: bytes/s a remote download must average, after a grace of the time 1 MiB takes at that
            rate (at least 1 s); a slower one (a server that trickles) is cut off and retried, and the error
            names this option.  0: no minimum (the 60 s read timeout alone).
        weights: named corpora's shares of the utterances drawn, ``{"en": 1, "zh": 3}``.  Without
            weights, temperature or schedule: their own proportions, as if they were one corpus.
        temperature: weights ∝ each corpus's hours^(1/temperature) (1: as large as they are).
        schedule: ``[(step, {name: weight}), ...]``: weights over the global training step,
            linear between points, constant after the last.
        steps_per_epoch: steps of a mixed loader epoch (default: one pass's worth of every
            corpus's batches, divided over the ranks).
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
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    options = PlanOptions(max_frames=max_frames, max_batch_size=max_batch_size, shuffle_buffer=shuffle_buffer,
                          pool_size=pool_size, min_frames=min_frames, max_utt_frames=max_utt_frames, streams=streams,
                          train=train, max_utts_per_speaker=max_utts_per_speaker)
    fetch = FetchOptions(read_ahead=read_ahead, read_ahead_bytes=read_ahead_bytes,
                         cache_dir=None if cache_dir is None else os.fspath(cache_dir), cache_bytes=cache_bytes,
                         retries=retries, retry_backoff=retry_backoff, min_rate=min_rate)
    cfg = LoaderConfig(options, seed=seed, ctc_subsampling=ctc_subsampling, on_error=on_error,
                       subword_sampling=subword_sampling, tokenize_group=tokenize_group, fetch=fetch)
    mixing = {"weights": weights, "temperature": temperature, "schedule": schedule, "steps_per_epoch": steps_per_epoch}
    given = [k for k, v in mixing.items() if v is not None]
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    named = isinstance(trset, Mapping)
    if given and not (named and train):
        why = "a dev loader (train=False) reads every corpus once, unmixed" if named else \
            "give trset as {name: pattern, ...}"
        raise ValueError(f"{', '.join(given)}: only named corpora are mixed, in training; {why}")
    if named:
        shards = union({str(name): indexed_shards(patterns, policy=fetch.policy())
                        for name, patterns in trset.items()})
    else:
        shards = indexed_shards(trset, policy=fetch.policy())
    # Stored speakers are cheap (an int column); deriving them from keys is done only when the plan needs them.
    speakers = shard_speakers(shards, derive=max_utts_per_speaker is not None, policy=fetch.policy())
    if max_utts_per_speaker is not None and speakers is None:
        raise ValueError("max_utts_per_speaker needs every utterance's speaker, from the shards' index; these shards "
                         "are in no index: run wdsprep index on a local copy, or leave the option out")
    topology = {"rank": rank, "world_size": world_size, "num_workers": num_workers, "speakers": speakers}
    dataset: ShardStream
    if named and train and (len(shards.corpora) > 1 or given):
        mixture = mixture_for(shards, weights=weights, temperature=temperature, schedule=schedule)
        dataset = MixedStream(shards, tokenizer, cfg, mixture=mixture, steps_per_epoch=steps_per_epoch,
                              control=WorkerControl(0), **topology)
        loader_cls: type[Loader] = MixedLoader
        if not dataset.mix.run(0).steps:
            raise ValueError(f"a mixed epoch of 0 steps on {world_size} ranks: give steps_per_epoch")
    else:
        control = WorkerControl(options.num_streams(len(shards), shards.num_utts))
        dataset = ShardStream(shards, tokenizer, cfg, control=control, **topology)
        loader_cls = Loader
        batches = dataset.plan(0).num_batches
        if train and batches < world_size:
            raise ValueError(f"{batches} batches in an epoch for {world_size} ranks: every rank needs at "
                             f"least one (fewer ranks, a smaller max_frames, or more data)")
    # The checks under DDP run on a gloo group of the loader's own; explicit rank/world without a
    # process group just take their share.
    group = loader_group(collective_timeout) if world_size > 1 else None
    if group is not None:
        fingerprints = gather(group, dataset.fingerprint(), timeout=collective_timeout, where="make_loader")
        odd = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
        if odd:
            raise ValueError(f"ranks {odd} plan from other shards or options than rank 0 (fingerprints "
                             f"{fingerprints}): give every rank the same trset, index and loader options")
    _settle_heap()
    return loader_cls(dataset, num_workers=num_workers, group=group, collective_timeout=collective_timeout,
                      prefetch_factor=prefetch_factor, pin_memory=pin_memory, persistent_workers=persistent_workers)


def __getattr__(name: str) -> Any:
    # wdsprep 0.1 kept the stages, the collate and the transport here: one release of grace.
    return _moved.moved_attribute(__name__, name, _moved.LOADER_MOVED)
