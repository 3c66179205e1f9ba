"""The rehearsal: the epoch's costliest planned batches, with their real data, through the trainer's step.

Every batch of an epoch is known before it starts, so the ones that decide whether a run fits in
memory can be run first: ``Loader.rehearse(step, k)`` ranks every rank's batches of the epoch set
by their planned cost (under the plan's cost model, else padded frames: B x longest), reads the
``k`` costliest through the readers' own stages (``ReaderStream.read``: the same shards, labels,
features, augmentation and collate as training), and calls ``step(batch)`` on each, costliest
first.  A step that runs out of memory is reported, naming the batch and the budget that would
have fitted, and the rehearsal goes on.

Nothing of the loader moves: its position, state and stats are not touched, its draws are
functions of (seed, epoch, row) and read from nowhere else, and torch's global generators are
forked around the steps; training afterwards yields the batches it would have yielded without
the rehearsal.  The steps themselves do train the user's model.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from wdsprep.loading.collate import Batch, Packed
from wdsprep.loading.stream import ReaderStream
from wdsprep.plan.cost import batch_cost
from wdsprep.plan.source import EpochRun
from wdsprep.plan.streams import BatchId

# What a CPU allocator or the OS says when memory runs out (torch's CPU allocator raises a
# RuntimeError; Python a MemoryError; CUDA torch.cuda.OutOfMemoryError).
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device or the host ran out of memory."""
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e).lower() for s in OUT_OF_MEMORY)


@dataclass(frozen=True)
class Ranked:
    """A planned batch of the epoch: which rank yields it, at which of its steps, and its planned cost."""

    batch: BatchId
    rank: int
    step: int
    cost: float


def costliest(stream: ReaderStream, run: EpochRun, k: int) -> tuple[list[Ranked], int]:
    """The ``k`` costliest batches every rank yields in ``run`` (the plan's cost model, else padded
    frames), costliest first (ties: by rank, then step), and how many batches were ranked."""
    source = stream.source
    model, tokens = stream.cfg.plan.cost, source.shards.tokens
    every: list[Ranked] = []
    for rank in range(source.world_size):
        step = 0
        for window in run.windows(rank):
            for bid in window.refs:
                labels = None if tokens is None or model is None else tokens[source.rows(bid)]
                every.append(Ranked(bid, rank, step, batch_cost(model, source.planned_frames(bid), labels)))
                step += 1
    every.sort(key=lambda p: (-p.cost, p.rank, p.step))
    return every[:k], len(every)


@dataclass
class Rehearsed:
    """One batch of the rehearsal: what it held, what it was planned to cost, what its step took."""

    planned: Ranked
    keys: list[str]
    shape: tuple[int, int, int]  # utterances, longest frames, longest label (tokens), as read
    seconds: float
    peak_memory: int | None = None  # CUDA: bytes allocated at most during the step
    headroom: int | None = None  # CUDA: bytes the device still had at that peak (free, and this process's cache)
    error: str | None = None  # the out-of-memory error the step raised

    @property
    def cost(self) -> float:
        return self.planned.cost


@dataclass
class Rehearsal:
    """What ``Loader.rehearse`` ran: the costliest batches of the epoch set, costliest first."""

    epoch: int
    measure: str  # what a batch's cost is
    budget: str  # the option that bounds it: "max_cost", or "max_frames" for padded frames
    ranked: int  # batches of the epoch set, over every rank
    batches: list[Rehearsed]

    @property
    def failed(self) -> list[Rehearsed]:
        """The batches whose step ran out of memory."""
        return [b for b in self.batches if b.error is not None]

    def fitted(self, cost: float) -> float | None:
        """The largest planned cost below ``cost`` whose step trained (None: none did)."""
        return max((b.cost for b in self.batches if b.error is None and b.cost < cost), default=None)

    @property
    def fits(self) -> float | None:
        """Where some step ran out of memory: the largest planned cost below every such one that trained."""
        failed = self.failed
        return None if not failed else self.fitted(min(b.cost for b in failed))

    def problem(self, b: Rehearsed) -> str:
        """What to say about a batch whose step ran out of memory: the batch, and the budget that fits."""
        size, frames, tokens = b.shape
        keys = ", ".join(b.keys[:3]) + (f" and {len(b.keys) - 3} more" if len(b.keys) > 3 else "")
        fit = self.fitted(b.cost)
        what = (f"{self.budget} {_number(fit)} would have fitted (the costliest batch that trained)" if fit is not None
                else f"no batch of lower cost trained: rehearse with {self.budget} below {_number(b.cost)}")
        return (f"rank {b.planned.rank}, step {b.planned.step}: {b.error} on a batch of {size} "
                f"utterance{'s' if size != 1 else ''} of up to "
                f"{frames:,} frames and {tokens:,} tokens, planned cost {_number(b.cost)} ({keys}); {what}")

    def format(self) -> str:
        """The table ``wdsprep rehearse`` prints."""
        lines = [f"rehearsal of epoch {self.epoch}: the {len(self.batches)} costliest of {self.ranked:,} planned "
                 f"batches, every rank's (cost: {self.measure})",
                 f"  {'rank':>4} {'step':>5} {'utts':>5} {'frames':>7} {'tokens':>6} {'cost':>10} {'seconds':>13} "
                 f"{'peak mem':>9} {'headroom':>9}  keys"]
        for b in self.batches:
            size, frames, tokens = b.shape
            ran = "out of memory" if b.error is not None else f"{b.seconds:.3f}"
            keys = ", ".join(b.keys[:2]) + (f" +{len(b.keys) - 2}" if len(b.keys) > 2 else "")
            lines.append(f"  {b.planned.rank:>4} {b.planned.step:>5} {size:>5} {frames:>7} {tokens:>6} "
                         f"{_number(b.cost):>10} {ran:>13} {_bytes(b.peak_memory):>9} {_bytes(b.headroom):>9}  {keys}")
        failed = self.failed
        if failed:
            lines.append(f"out of memory on {len(failed)} of {len(self.batches)}:")
            lines += [f"  {self.problem(b)}" for b in failed]
        else:
            lines.append(f"every step ran: the costliest batch of the epoch, {_number(self.batches[0].cost)}, trains"
                         if self.batches else "the epoch has no batch to rehearse")
        return "\n".join(lines)


def _number(x: float | None) -> str:
    """A cost: padded frames and large costs whole, with thousands marked; small ones (seconds) to 4 digits."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if 1000 <= abs(x) < 1e12 or float(x).is_integer() else f"{x:.4g}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2 ** 30:.2f} GiB"


def rehearse(stream: ReaderStream, run: EpochRun, epoch: int, step: Callable[[Batch], Any], *, k: int,
             receive: Callable[[Packed], Batch]) -> Rehearsal:
    """``step`` on the ``k`` costliest batches of ``run`` (every rank's), read by ``stream`` as the
    loader's ``epoch`` reads them and made Batches by ``receive``; see the module's docstring."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    chosen, ranked = costliest(stream, run, k)
    model = stream.cfg.plan.cost
    measure = model.describe() if model is not None else "padded frames (B x longest)"
    result = Rehearsal(epoch, measure, "max_cost" if model is not None else "max_frames", ranked, [])
    by_id = {p.batch: p for p in chosen}
    devices = [torch.cuda.current_device()] if _cuda() else []
    with torch.random.fork_rng(devices=devices):
        for bid, packed in stream.read([p.batch for p in chosen], epoch):
            result.batches.append(_run(step, receive(packed), by_id[bid]))
    return result


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _run(step: Callable[[Batch], Any], batch: Batch, planned: Ranked) -> Rehearsed:
    """One step, timed (on CUDA: synchronized, its peak memory measured from a reset)."""
    shape = ((len(batch.keys), int(batch.feat_lens.max()), int(batch.label_lens.max())) if len(batch.keys)
             else (0, 0, 0))
    out = Rehearsed(planned, list(batch.keys), shape, 0.0)
    if _cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        step(batch)
        if _cuda():
            torch.cuda.synchronize()
    except Exception as e:
        if not out_of_memory(e):
            raise
        out.error = f"{type(e).__name__}: {_first_line(e)}"
    out.seconds = time.perf_counter() - t0
    del batch
    if out.error is not None:
        # Outside the except: the traceback's frames, which hold the step's tensors, are gone.
        gc.collect()
    if _cuda():
        if out.error is not None:
            torch.cuda.empty_cache()
        out.peak_memory = int(torch.cuda.max_memory_allocated())
        free, _ = torch.cuda.mem_get_info()
        out.headroom = int(free + torch.cuda.memory_reserved() - out.peak_memory)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"
