"""The training loader: shards -> padded, length-bucketed batches, deterministic and DDP-safe.

This is the front: :func:`make_loader`, the :class:`Loader` a trainer iterates and the
:class:`Batch` it gets.  The data flow itself is composed in ``loading/stream.py``
(``ShardStream.stages``) from the stages in ``loading/stages.py``; ``loading/collate.py`` pads a
batch into one buffer, ``loading/transport.py`` moves it out of a worker process.

The collate reads a batch's features from the shards in a thread of its own (in C, without the
GIL), while the stages make the next batches: the two halves of the work overlap on two cores.
With ``num_workers > 0`` each DataLoader worker runs the stages on its share of the shards and
collates into shared-memory buffers it recycles; workers persist across epochs by default and
learn the epoch through shared memory.

Under DDP (training mode) the main process all-reduces a "no more batches" flag before every
step, so all ranks end the epoch at the same step as soon as one runs dry; what that early stop
discards is reported in :attr:`Loader.stats`.  Dev mode (``train=False``) reads each utterance
exactly once across ranks, without shuffling and without the all-reduce: ranks just end, and may
run a different number of steps.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from wdsprep import _moved
from wdsprep.format.shardlist import expand_shards
from wdsprep.loading.batching import DEFAULT_POOL_SIZE
from wdsprep.loading.collate import LABEL_PAD, Batch, Packed, unpack
from wdsprep.loading.collectives import all_sum, any_rank_done, dist_info
from wdsprep.loading.stats import BatchTally, LoaderStats
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
    """Iterate for one epoch of :class:`Batch`; call :meth:`set_epoch` before each epoch.

    With ``persistent_workers`` (the default) the worker processes, their buffer pools and one
    DataLoader live as long as the Loader; the epoch reaches them through shared memory.
    """

    def __init__(self, dataset: ShardStream, *, num_workers: int, sync: bool, prefetch_factor: int | None = None,
                 pin_memory: bool = False, persistent_workers: bool = True) -> None:
        self.dataset = dataset
        self.control = dataset.control  # the workers' side of it is the dataset's; this Loader writes it
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

    def _batches(self, iteration: int) -> Iterator[Batch]:
        """This rank's batches with the workers' counts folded into :attr:`stats`."""
        st = self.stats
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
            st.add_worker(delta)
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
        self.control.epoch = self.epoch  # shared memory: persistent workers read it when they resume
        self.stats = st = LoaderStats(epoch=self.epoch, steps=first, assigned=ds.assigned_utts(self.epoch))
        self._cursors = {}
        if complete:
            return  # resumed at the end of this epoch
        start = time.perf_counter()
        self.control.set_resume(*self._skip_plan(first))  # read by the workers in iter()
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
                counted = BatchTally()
                counted.add(batch.feat_lens.numpy(), ds.cfg.max_frames)
                st.add_batches(counted)
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
        pool_size: samples sorted together by the bucketing stage (see ``wdsprep.loading.batching``).
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
                          num_workers=num_workers, control=WorkerControl(num_workers))
    # The per-step all-reduce needs a process group; explicit rank/world without one just split shards.
    import torch.distributed as dist

    sync = train and world_size > 1 and dist.is_available() and dist.is_initialized()
    _settle_heap()
    return Loader(dataset, num_workers=num_workers, sync=sync, prefetch_factor=prefetch_factor,
                  pin_memory=pin_memory, persistent_workers=persistent_workers)


def __getattr__(name: str) -> Any:
    # wdsprep 0.1 kept the stages, the collate and the transport here: one release of grace.
    return _moved.moved_attribute(__name__, name, _moved.LOADER_MOVED)
