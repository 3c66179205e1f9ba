"""The training loader: shards -> padded, length-bucketed batches, planned, deterministic and DDP-safe.

This is the front: :func:`make_loader`, the :class:`Loader` a trainer iterates, and the
:class:`Batch` it gets.  Every epoch is planned from the index before it starts, by the epoch
source :func:`~wdsprep.loading.source.epoch_source` builds (one corpus: ``loading/epochs.py``;
named corpora mixed: ``loading/mix/``), so ``len(loader)`` is exact and equal on every rank, with
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

import gc
import json
import os
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import DataLoader

from wdsprep.loading.augment import Augment, parse_augment
from wdsprep.loading.batching import DEFAULT_POOL_SIZE
from wdsprep.loading.collate import LABEL_PAD, Batch, Packed, unpack
from wdsprep.loading.collectives import dist_info, gather, loader_group
from wdsprep.loading.cost import CostModel, load_cost
from wdsprep.loading.features import FeatureOptions, with_fbank
from wdsprep.loading.growing import VISIBLE_WITHIN, View, coverage, observe, wait_for
from wdsprep.loading.plan import BatchId, PlanOptions
from wdsprep.loading.readahead import MIN_RATE, FetchOptions
from wdsprep.loading.shardset import ShardSet
from wdsprep.loading.source import EpochSource, epoch_source, load_shards
from wdsprep.loading.state import STATE_VERSION, StateError, read_published, read_state
from wdsprep.loading.stats import BatchTally, CorpusStats, LoaderStats
from wdsprep.loading.stream import LoaderConfig, ReaderStream, _identity
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


@dataclass
class Growth:
    """What a loader following growing folders plans each epoch from: the trset, how an epoch source
    is built over a view of it, the view the current source was built over, and the epoch that view
    is fixed for (set, iterated or resumed: the epoch is planned over it)."""

    trset: Any
    build: Callable[[View, float], EpochSource]
    view: View
    coverage: dict[str, Any]
    epoch: int | None = None


def _pin(buf: torch.Tensor) -> torch.Tensor:
    """A page-locked copy (a seam for tests on machines without CUDA)."""
    return buf.pin_memory()


class Loader:
    """One epoch of :class:`Batch` per iteration; call :meth:`set_epoch` before each epoch.

    ``len(loader)`` is exactly the number of batches this rank yields in the epoch set, the same
    on every rank in training.  The batches come from the epoch source (``loader.source``: one
    corpus, or named corpora mixed), read by ``loader.dataset``.  With ``persistent_workers`` (the
    default) the worker processes, their buffer pools and one DataLoader live as long as the
    Loader; where each iteration starts reaches them through shared memory.
    """

    def __init__(self, dataset: ReaderStream, *, rank: int, num_workers: int, group: Any = None,
                 collective_timeout: float = 300.0, prefetch_factor: int | None = None, pin_memory: bool = False,
                 persistent_workers: bool = True, growth: Growth | None = None) -> None:
        self.dataset = dataset
        self.source = dataset.source
        self.rank = rank
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
        self._run: Any = None  # the latest iteration of this epoch (an EpochRun), or None
        self._steps = 0  # batches that iteration yielded
        self._iterating = False
        self._warned_idle = False
        self.growth = growth  # following growing folders: what each epoch is planned from

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

        Following growing folders (``growing=True``), the epoch is planned over the shards published
        now (rank 0's view, shared with every rank: call it on every rank, as DDP trainers do),
        unless it was already (a resumed epoch is planned over the shards its state records).
        """
        epoch = int(epoch)
        if self.growth is not None and self.growth.epoch != epoch and not self._iterating:
            self._follow(epoch)
        if epoch != self.epoch:
            self._run, self._steps = None, 0
        self.epoch = epoch

    def _follow(self, epoch: int) -> None:
        """Plan ``epoch`` over the shards published now, as rank 0 sees them."""
        g = self.growth
        assert g is not None
        view = observe(g.trset) if self.rank == 0 or self.group is None else None
        if self.group is not None:
            shared = gather(self.group, None if view is None else view.to_json(), timeout=self.collective_timeout,
                            where=f"set_epoch({epoch}), sharing rank 0's view of the growing shards")
            view = View.from_json(shared[0])
        assert view is not None
        if view != g.view:
            self._replan(view, carry_to=epoch, wait=VISIBLE_WITHIN if self.group is not None else 0.0)
        g.epoch = epoch

    def _replan(self, view: View, *, carry_to: int | None, wait: float = 0.0) -> None:
        """The epoch source over ``view``; ``carry_to``: it goes on where the current one stands at
        that epoch's start (a mixture's corpora; None: a loaded state says where); ``wait``: seconds
        to wait to see the shards rank 0 saw."""
        g = self.growth
        assert g is not None
        source = g.build(view, wait)
        if carry_to is not None:
            source.continue_from(self.source, carry_to)
        self.source = self.dataset.source = source
        self.dataset.shards = source.shards
        g.view, g.coverage = view, coverage(source.shards, view)
        self._run, self._steps = None, 0
        self._loader = None  # persistent workers hold the old plan: fork new ones

    def _next_run(self) -> Any:
        """The run the next iteration of the epoch set yields: from a loaded position in it, else its start."""
        return self.source.run(self.source.start(self.epoch))

    def __len__(self) -> int:
        """Batches this rank yields in the next (or current) iteration of the epoch set: the whole
        epoch, or what is left of it after :meth:`load_state_dict`.  The same on every rank."""
        run = self._run if self._iterating else self._next_run()
        return run.steps(self.rank)

    def position(self) -> Any:
        """Where the epoch set stands: after the batches its latest iteration yielded (a loaded
        position before any)."""
        if self._run is None:
            return self.source.start(self.epoch)
        return self._run.after(self.rank, self._steps)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as a few numbers, for a checkpoint; see :meth:`load_state_dict`.

        Every batch is a function of (seed, epoch, the plan's inputs), and where an epoch stands a
        few numbers (``loading/state.py`` has the format).  Under DDP (training) every rank is at
        the same step, so rank 0's state restores every rank, on any world size and workers.
        """
        src = self.source
        at = self.position()
        state = {"version": STATE_VERSION, "kind": src.kind, "seed": self.dataset.cfg.seed, "epoch": at.epoch,
                 "step": at.step, "complete": src.complete(at), "global_step": src.global_step(at),
                 "position": src.position_json(at),
                 "mixture": None if src.mixture is None else src.mixture.to_json(),
                 "options": self._options(), "fingerprint": self.dataset.fingerprint()}
        if self.growth is not None:  # the shards the epoch is planned over, in short
            state["published"] = self.growth.view.to_json()
        return state

    def _options(self) -> dict[str, Any]:
        """The plan's options as JSON gives them back (a speed's factors are lists then, not tuples),
        so a state saved through JSON or pickle compares alike."""
        return json.loads(json.dumps(asdict(self.dataset.cfg.plan), default=repr))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, on this loader's world size and workers, whatever they were:
        the next iteration of ``state["epoch"]`` yields the planned batches not yet yielded, dealt
        anew over the ranks (one corpus: equal steps again, at most one batch per rank left over; a
        mixture: its schedule goes on at the saved global step, every corpus where it stood).  A
        mixture other than the saved one is allowed: it warns, saying what changed.

        Following growing folders, the epoch is planned over the shards its state says were
        published when it was planned (however many are now).

        Raises :class:`~wdsprep.loading.state.StateError` (a ValueError) when the state was saved
        for other shards, options or seed, or any of its fields is not what such a loader saves.
        """
        published = read_published(state)
        if self.growth is not None:
            view = View.from_json(published) if published is not None else self.growth.view
            epoch = state.get("epoch") if isinstance(state, Mapping) else None
            if view != self.growth.view:
                try:
                    self._replan(view, carry_to=None)
                except FileNotFoundError as e:
                    raise StateError(f"the loader state's published shards cannot be found ({e})") from None
            self.growth.epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        saved = read_state(state, kind=self.source.kind, seed=self.dataset.cfg.seed,
                           options=self._options(), fingerprint=self.dataset.fingerprint())
        at = self.source.position(saved)
        self.source.resume(at)
        self.set_epoch(at.epoch)
        self._run, self._steps = None, 0

    def _dataloader(self, note: bytes) -> DataLoader | ReaderStream:
        """This epoch's DataLoader: with persistent workers, the same one every epoch.  Without
        workers, the dataset itself: a DataLoader would only add ~4% (a profiler hook per batch).

        The pool flags and the control are created with the workers (before they fork) and live as
        long as they do; a note too long for the control starts workers with a larger one.
        """
        control = self.dataset.control
        if len(note) > control.capacity:
            self.dataset.control = WorkerControl(max(len(note) * 2, control.capacity * 2))
            self.dataset.control.pool = control.pool
            self._loader = None  # persistent workers hold the old control: fork new ones
        self.dataset.control.write(note)
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

    def _batches(self, iteration: int, note: bytes, expected: Iterator[BatchId]) -> Iterator[Batch]:
        """This rank's batches, in the order the run says, with the readers' counts folded in."""
        st = self.stats
        loader = self._dataloader(note)
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
        if self.growth is not None and self.growth.epoch is None:
            self.growth.epoch = self.epoch  # iterated without set_epoch: over the shards the loader has
        src = self.source
        at = src.start(self.epoch)
        run = self._run = src.run(at)
        self._steps = 0
        self.stats = st = run.planned_stats(self.rank)
        if self.growth is not None:
            st.growing = dict(self.growth.coverage)
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
        planned = run.steps(self.rank)
        batches = self._batches(self._iteration, WorkerControl.encode(src.note(at)), expected)
        self._iterating = True
        try:
            for batch in batches:
                counted = BatchTally()
                counted.add(batch.feat_lens.numpy(), self.dataset.cfg.plan.max_frames)
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
        if self._steps != planned or next(expected, None) is not None:
            raise RuntimeError(f"loader bug: this rank yielded {self._steps} batches, the plan gave it {planned}")
        progress = src.progress(self.position())
        for name, done in zip(names, progress or []):
            st.corpora.setdefault(name, CorpusStats()).epochs = done
        if self.group is not None and self.dataset.cfg.train:  # dev mode: ranks end apart, and need not meet
            ranks = gather(self.group, [self.epoch, self._steps, self.dataset.fingerprint()],
                           timeout=self.collective_timeout, where=f"end of epoch {self.epoch}")
            if len({tuple(r) for r in ranks}) > 1:
                raise RuntimeError(f"wdsprep loader: ranks ended epoch {self.epoch} differently "
                                   f"([epoch, steps, fingerprint] per rank: {ranks})")


def make_loader(
    trset: str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike | Sequence[str]],
    tokenizer: Tokenizer | str | os.PathLike,
    *,
    max_frames: int | None = None,
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
    cost: CostModel | Mapping[str, Any] | str | os.PathLike | None = None,
    max_cost: float | None = None,
    growing: bool = False,
    min_shards: int | None = None,
    min_hours: float | None = None,
    wait_timeout: float = 3600.0,
    augment: Augment | Mapping[str, Any] | str | os.PathLike | None = None,
    fbank: Mapping[str, Any] | None = None,
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
            utterance becomes a batch of its own.  Give it, or ``cost`` and ``max_cost``, or both
            (a batch then fits both).
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
        streams: canonical streams the epoch is planned in (default: min(shards, 64, utterances // 2000),
            at least 1); each is read by one reader, so at least world_size x num_workers keeps every
            worker busy.
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
        cost: what a batch costs a training step, ``B x c(t, u)`` (``wdsprep.loading.cost``): a
            CostModel, a dict with its coefficients, or the JSON file ``wdsprep calibrate`` writes.
        max_cost: per-rank bound on a batch's cost under ``cost``; an utterance over it is a batch
            of its own.  A model that counts label tokens needs every label's length: counted once
            per index folder and tokenizer and kept beside the index (docs/batching.md).
        growing: follow shard folders a pack is still writing (``pack``/``pack-audio`` publish
            shards one by one): every epoch is planned over the shards published when
            :meth:`Loader.set_epoch` is called (rank 0's view, shared), ``len(loader)`` is exact for
            it, and the state records it, so a resume plans the same epoch.  Once the pack is complete
            an epoch is the one an ordinary loader plans.  ``loader.stats.growing`` says how much of
            the final corpus the epoch covers.  Without it such a folder is refused.
        min_shards, min_hours: with ``growing``, wait before the first epoch until this many shards
            (at least one) and hours of the trset are published.
        wait_timeout: seconds to wait for them before a TimeoutError saying how far the pack got.
        augment: augmentation in training, every draw a function of (seed, corpus epoch, utterance)
            (docs/audio.md): ``{"speed": {"factors": [0.9, 1.0, 1.1], "probs": [...]}, "noise":
            {"dir": D, "snr": [10, 20], "prob": 1}, "reverb": {"dir": D, "prob": 1},
            "specaugment": {"freq_masks": 2, "freq_width": 27, "time_masks": 2, "time_width": 40,
            "max_time_ratio": 0.2, "time_warp": 0, "fill": "mean"}}`` (any part, or its dataclass
            from ``wdsprep.loading.augment``), its JSON text or a JSON file.  Speed, noise and
            reverb need audio shards; speed is drawn by the plan, which cuts batches with the
            perturbed lengths (``batch.keys`` then name a perturbed utterance ``sp0.9-ID``).
        fbank: for audio shards, fbank options in place of their index's: ``num_mel_bins``,
            ``dither`` (seeded per utterance; backend ``numpy`` only), ``backend``
            (``numpy``, ``kaldi-native-fbank``, ``torchaudio``).
    """
    if on_error not in ("warn", "raise"):
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    if ctc_subsampling is not None and ctc_subsampling < 1:
        raise ValueError(f"ctc_subsampling must be >= 1, got {ctc_subsampling}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if (min_shards is not None or min_hours is not None) and not growing:
        raise ValueError("min_shards/min_hours wait for shards a pack is still publishing: pass growing=True too")
    if min_shards is not None and min_shards < 0 or min_hours is not None and min_hours < 0:
        raise ValueError(f"min_shards and min_hours must be >= 0, got {min_shards} and {min_hours}")
    d_rank, d_world = dist_info()
    rank = d_rank if rank is None else rank
    world_size = d_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    aug = parse_augment(augment)
    if aug is not None and not train:
        raise ValueError("augment is for training: a dev loader (train=False) reads the data as it is")
    options = PlanOptions(max_frames=max_frames, max_batch_size=max_batch_size, shuffle_buffer=shuffle_buffer,
                          pool_size=pool_size, min_frames=min_frames, max_utt_frames=max_utt_frames, streams=streams,
                          train=train, max_utts_per_speaker=max_utts_per_speaker,
                          cost=None if cost is None else load_cost(cost), max_cost=max_cost,
                          speed=None if aug is None else aug.speed)
    fetch = FetchOptions(read_ahead=read_ahead, read_ahead_bytes=read_ahead_bytes,
                         cache_dir=None if cache_dir is None else os.fspath(cache_dir), cache_bytes=cache_bytes,
                         retries=retries, retry_backoff=retry_backoff, min_rate=min_rate)
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    # Stored speakers are cheap (an int column); deriving them from keys is done only when the plan needs them.
    load = {"policy": fetch.policy(), "derive_speakers": max_utts_per_speaker is not None}
    counted = tokenizer if options.fit.uses_tokens else None

    def plan(shards: ShardSet) -> EpochSource:
        return epoch_source(shards, options, seed=seed, world_size=world_size, num_workers=num_workers,
                            named=isinstance(trset, Mapping), weights=weights, temperature=temperature,
                            schedule=schedule, steps_per_epoch=steps_per_epoch)

    def build(view: View | None, wait: float = 0.0) -> EpochSource:
        shards = load_shards(trset, **load, tokenizer=counted, view=view, view_wait=wait)
        made = with_fbank(shards.audio, fbank)
        return plan(shards if made is None else replace(shards, dims=made.num_mel_bins))  # what the batches hold

    # The checks under DDP run on a gloo group of the loader's own; explicit rank/world without a
    # process group just take their share.
    group = loader_group(collective_timeout) if world_size > 1 else None
    growth = None
    if growing and world_size > 1 and group is None:
        warnings.warn("growing=True with world_size > 1 but no torch.distributed process group: the ranks cannot "
                      "share rank 0's view of the growing shards, so each plans over the shards it sees; give "
                      "every rank the same state (load_state_dict) to plan alike", UserWarning, stacklevel=2)
    if growing:
        # Until the first epoch has a batch for every rank (without counting label tokens: a cost
        # model's tokens do not change how many batches there are by much, and cost a read).
        view = wait_for(trset, lambda v: load_shards(trset, **load, view=v), min_shards=min_shards,
                        min_hours=min_hours, timeout=wait_timeout, check=plan if counted is None else None)
        if group is not None:  # every rank plans over rank 0's view
            view = View.from_json(gather(group, view.to_json(), timeout=collective_timeout,
                                         where="make_loader, sharing rank 0's view of the growing shards")[0])
        source = build(view, VISIBLE_WITHIN if group is not None else 0.0)
        growth = Growth(trset, build, view, coverage(source.shards, view))
    else:
        source = build(None)
    fbank_opts = with_fbank(source.shards.audio, fbank)
    if aug is not None:
        on_audio = [name for name in ("speed", "noise", "reverb") if getattr(aug, name) is not None]
        if on_audio and source.shards.audio is None:
            raise ValueError(f"augment {', '.join(on_audio)} act on audio: these shards hold features computed at "
                             f"pack time; pack the audio (layout flac or wav) or augment with specaugment only")
    cfg = LoaderConfig(options, seed=seed, ctc_subsampling=ctc_subsampling, on_error=on_error,
                       subword_sampling=subword_sampling, tokenize_group=tokenize_group, fetch=fetch,
                       features=FeatureOptions(fbank_opts, aug))
    dataset = ReaderStream(source, tokenizer, cfg, rank=rank, control=WorkerControl())
    if group is not None:
        fingerprints = gather(group, dataset.fingerprint(), timeout=collective_timeout, where="make_loader")
        odd = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
        if odd:
            raise ValueError(f"ranks {odd} plan from other shards or options than rank 0 (fingerprints "
                             f"{fingerprints}): give every rank the same trset, index and loader options")
    _settle_heap()
    return Loader(dataset, rank=rank, num_workers=num_workers, group=group, collective_timeout=collective_timeout,
                  prefetch_factor=prefetch_factor, pin_memory=pin_memory, persistent_workers=persistent_workers,
                  growth=growth)
