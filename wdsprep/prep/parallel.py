"""Running a job's chunks in worker processes behind one tqdm progress bar, or its tasks on an
existing engine's workers (any ``concurrent.futures.Executor``: a Dask cluster's, :func:`dask_executor`)."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from tqdm import tqdm

T = TypeVar("T")
R = TypeVar("R")

_counter = None  # a shared integer in worker processes, bumped once per item done


def _init_worker(counter) -> None:
    global _counter
    _counter = counter


def _tick(n: int = 1) -> None:
    with _counter.get_lock():
        _counter.value += n


def max_jobs() -> int:
    """The most worker processes a job takes: far more than the cores only costs memory and forks."""
    return max(64, 8 * (os.cpu_count() or 1))


def check_nj(nj: object) -> int:
    """``nj`` when it is a number of worker processes from 1 to :func:`max_jobs`; else a ValueError
    (checked when given, before a job reads anything)."""
    if isinstance(nj, bool) or not isinstance(nj, int) or not 1 <= nj <= max_jobs():
        raise ValueError(f"nj must be a whole number of worker processes from 1 to {max_jobs()} (8 per core here), "
                         f"got {nj!r}")
    return nj


def split(items: Sequence[T], n: int) -> list[Sequence[T]]:
    """``n`` contiguous, nearly equal slices (order kept, so arks are read sequentially)."""
    return [items[i * len(items) // n:(i + 1) * len(items) // n] for i in range(n)]


def run_chunks(fn: Callable[[Sequence[T], int, Callable[[int], None]], R], items: Sequence[T], nj: int,
               desc: str, progress: bool | None = None, *, total: int | None = None) -> list[R]:
    """``fn(chunk, worker_index, tick)`` over ``nj`` contiguous chunks of ``items``; results in chunk order.

    ``nj == 1`` runs in this process.  ``progress=None`` shows the bar only on a terminal; its
    total is ``total`` (what ``fn`` ticks: utterances), else the number of items.
    """
    if nj < 1:
        raise ValueError("nj must be >= 1")
    nj = min(nj, max(1, len(items)))
    chunks = split(items, nj)
    total = len(items) if total is None else total
    with tqdm(total=total, desc=desc, unit="utt", disable=None if progress is None else not progress) as bar:
        if nj == 1:
            return [fn(chunks[0], 0, bar.update)]
        counter = mp.Value("q", 0)
        # Pool (not ProcessPoolExecutor): leaving the block terminates the other workers when one fails.
        with mp.Pool(nj, initializer=_init_worker, initargs=(counter,)) as pool:
            results = [pool.apply_async(fn, (chunk, i, _tick)) for i, chunk in enumerate(chunks)]
            while not all(r.ready() for r in results):
                time.sleep(0.2)
                bar.update(counter.value - bar.n)
                for r in results:
                    if r.ready() and not r.successful():
                        r.get()  # re-raises the worker's exception
            bar.update(counter.value - bar.n)
            return [r.get() for r in results]


def _die_with_parent() -> None:
    """Linux: this worker gets SIGKILL when the process that started it dies, however it dies (a
    worker left writing after its pack was killed could collide with the pack resumed)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _init_ordered(counter, init: Callable[..., None], args: tuple) -> None:
    _die_with_parent()
    _init_worker(counter)
    init(*args)


def imap_ordered(fn: Callable[[T, Callable[[int], None]], R], tasks: Sequence[T], nj: int, desc: str,
                 progress: bool | None = None, *, init: Callable[..., None], init_args: tuple = (),
                 done: Callable[[], None] | None = None, total: int | None = None) -> Iterator[R]:
    """``fn(task, tick)`` for each task in ``nj`` worker processes, the results yielded in task order
    as soon as each and all before it are done (a worker takes the next task when it is free; at
    most a few tasks per worker run ahead of the oldest unfinished one).

    ``init(*init_args)`` prepares each worker (``nj == 1``: this process, and ``done()`` ends it);
    module-level functions, so they reach workers however they start.  Leaving the iterator early
    (an error, Ctrl-C) stops the workers; a worker that dies (killed, out of memory) is an error
    naming it, never a hang.
    """
    if nj < 1:
        raise ValueError("nj must be >= 1")
    nj = min(nj, max(1, len(tasks)))
    total = len(tasks) if total is None else total
    with tqdm(total=total, desc=desc, unit="utt", disable=None if progress is None else not progress) as bar:
        if nj == 1:
            init(*init_args)
            try:
                for task in tasks:
                    yield fn(task, bar.update)
            finally:
                if done is not None:
                    done()
            return
        counter = mp.Value("q", 0)
        pool = ProcessPoolExecutor(nj, mp_context=mp.get_context(), initializer=_init_ordered,
                                   initargs=(counter, init, init_args))
        try:
            ahead = 4 * nj
            pending: deque = deque()
            todo = iter(tasks)
            try:
                for task in itertools.islice(todo, ahead):
                    pending.append(pool.submit(fn, task, _tick))
                while pending:
                    try:
                        r = pending[0].result(timeout=0.2)
                    except FuturesTimeout:
                        bar.update(counter.value - bar.n)
                        continue
                    pending.popleft()
                    for task in itertools.islice(todo, 1):
                        pending.append(pool.submit(fn, task, _tick))
                    bar.update(counter.value - bar.n)
                    yield r
            except BrokenProcessPool:
                raise ChildProcessError(f"{desc}: a worker process died (killed by a signal, e.g. out of memory); "
                                        f"what it was writing is not kept") from None
        finally:
            # Stop at once: on an error or Ctrl-C nothing a worker still does is wanted.
            for p in list(getattr(pool, "_processes", {}).values()):
                if p.is_alive():
                    p.terminate()
            pool.shutdown(wait=True, cancel_futures=True)


def executor_slots(executor: Executor) -> int:
    """How many tasks ``executor`` runs at once, where it says (a process pool's workers, a Dask
    cluster's threads); 8 where it does not."""
    n = getattr(executor, "_max_workers", None)
    client = getattr(executor, "_client", None)  # Dask's ClientExecutor
    if n is None and client is not None:
        try:
            n = sum(client.nthreads().values())
        except Exception:  # a cluster that does not answer now: the default
            n = None
    return max(1, int(n or 8))


def imap_executor(fn: Callable[[T], R], tasks: Iterable[T], executor: Executor, desc: str,
                  progress: bool | None = None, *, sizes: Sequence[int], ahead: int | None = None) -> Iterator[R]:
    """``fn(task)`` for each task on ``executor``'s workers, the results yielded in task order as
    soon as each and all before it are done; at most ``ahead`` tasks (default: twice the workers)
    are out at once, so what waits to be published stays bounded.  ``sizes``: each task's weight
    on the progress bar (its utterances).

    The engine runs a task again when its worker is lost (Dask and Ray do), so a task must be
    safe to run twice.  Leaving the iterator early (an error, Ctrl-C) cancels what has not started.
    """
    ahead = ahead or 2 * executor_slots(executor)
    pending: deque = deque()
    todo = iter(enumerate(tasks))
    with tqdm(total=sum(sizes), desc=desc, unit="utt", disable=None if progress is None else not progress) as bar:
        try:
            for k, task in itertools.islice(todo, ahead):
                pending.append((k, executor.submit(fn, task)))
            while pending:
                k, future = pending.popleft()
                r = future.result()  # an engine that gave up on a task (Dask's KilledWorker) says why
                for k2, task in itertools.islice(todo, 1):
                    pending.append((k2, executor.submit(fn, task)))
                bar.update(sizes[k])
                yield r
        finally:
            for _, future in pending:
                future.cancel()


@contextmanager
def dask_executor(address: str, *, timeout: float = 60.0) -> Iterator[Any]:
    """An executor over the Dask cluster whose scheduler is at ``address`` (``tcp://HOST:8786``), for
    the ``with`` block; an error naming the address when it cannot be reached or Dask is missing."""
    try:
        from distributed import Client
    except ImportError:
        raise ImportError("--dask needs Dask's distributed scheduler: pip install 'wdsprep[cluster]' (or pip install "
                          "'dask[distributed]')") from None
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise OSError(f"no Dask scheduler answered at {address} within {timeout:g} s ({type(e).__name__}: {e}); "
                      f"start one (dask scheduler; dask worker {address}) or check the address") from None
    try:
        yield client.get_executor()
    finally:
        client.close()
