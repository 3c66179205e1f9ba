"""Shards brought to a reader ahead of use, in the order its planned streams read them.

The assignment tells each reader (a rank's main process or DataLoader worker) which shards it
reads and in what order, so it reads ahead along exactly that order and nothing else: under DDP
each node fetches only its own ranks' shards.  While a shard is in use the next ones are fetched
in the background (remote: downloaded, into memory or the cache directory; local: asked into the
page cache, :data:`LEAST_AHEAD` ahead).  When, for remote shards: each is started once it would
arrive late otherwise, by the batch that first needs it, the store's first-byte latency and
bandwidth and the seconds this reader takes per batch (``wdsprep.remote.pace``, measured as it
goes), at most ``max_requests`` downloads at once and ``read_ahead_bytes`` of shards started and
not yet opened; ``read_ahead=N`` fixes the count instead.  A fetch that fails is retried
(``wdsprep.remote.fetch``); the retries are handed back with the shard, for the reader's counts.
Pure threads and numpy: no torch.

The options it reads with (``FetchOptions``) are the plan's (``wdsprep/plan/options.py``): the
plan reads remote indexes with the same retries.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, Sequence

import numpy as np

from wdsprep.format.shardfile import ShardFile, prefetch_shard
from wdsprep.plan.options import FetchOptions
from wdsprep.remote.cache import ShardCache
from wdsprep.remote.fetch import Cancelled, FetchError, LocalCopy, Timing, fetch_shard
from wdsprep.remote.pace import Estimate, Gauge, gauge_for, window
from wdsprep.remote.urls import is_url, redact

# Local shards asked into the page cache ahead of the one in use.
LEAST_AHEAD = 2
# Shards not yet started that the pace looks at, at most (and no more bytes than the budget).
PACE_HORIZON = 256
# Seconds between two looks at the pace as batches are reached (a shard opened always looks).
PACE_EVERY = 0.01


class Opened(NamedTuple):
    """A shard ready to read: its fetched copy (None: a local file, read by its path), the retries
    the fetch took and the bytes it downloaded."""

    source: ShardFile | None
    retries: int
    fetched_bytes: int


class ShardFetcher:
    """One reader's shards, fetched ahead along ``order`` (shard indices in the order its batches
    first need them); :meth:`reached` each batch as it is read, :meth:`open` each shard when it is
    needed, :meth:`close` at the end.

    ``sizes[s]``: the bytes shard ``s`` has according to the index (-1: unknown), which a fetch
    checks and which the byte bound counts; ``checksums[s]``: its SHA-256, which a fetch checks
    (None: not recorded).  ``peak_in_flight``: the most downloads it had running at once.
    """

    def __init__(self, urls: Sequence[str], sizes: np.ndarray, order: Sequence[int], options: FetchOptions,
                 checksums: Sequence[str | None] | None = None) -> None:
        self.urls, self.sizes, self.order = urls, sizes, list(order)
        self.checksums = checksums
        self.options = options
        self.position = {s: i for i, s in enumerate(self.order)}
        self.need = dict.fromkeys(self.order, 0)  # shard -> the batch (of this reader's epoch) that first needs it
        self.batches = 0  # batches of the windows extended so far
        self.batch = -1  # the batch being read
        self.next = 0  # self.order[:next] were started (remote) or asked into the page cache (local)
        self.pending: dict[int, Future] = {}  # started, not yet opened
        self.opened: set[int] = set()
        self.cancel = threading.Event()
        self.pool: ThreadPoolExecutor | None = None
        self.cache = ShardCache(options.cache_dir, options.cache_bytes) if options.cache_dir else None
        self.policy = options.policy()
        # The store's latency and bandwidth and this reader's pace, from its last epoch on: the
        # gauge of its store, once a remote shard is started.
        self.gauge: Gauge | None = None
        self._running = self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._remote: bool | None = None  # its shards are remote (decided by the first in its order)
        self._paced_at = 0.0

    def extend(self, order: Sequence[int], needs: Sequence[int] | None = None, batches: int = 0) -> None:
        """The next window's shards, in the order its batches first need them, after those so far;
        ``needs[i]``: the batch of the window (from 0) that first needs ``order[i]``; ``batches``:
        the window's batches."""
        for i, s in enumerate(order):
            if s not in self.position:
                self.position[s] = len(self.order)
                self.order.append(s)
                self.need[s] = self.batches + (0 if needs is None else int(needs[i]))
        self.batches += batches

    def reached(self) -> None:
        """The reader starts on its next batch: the pace is measured, and what it asks for started."""
        self.batch += 1
        if self.gauge is not None:
            self.gauge.reached(self.batch)
        if self._paced():
            now = time.monotonic()
            if now - self._paced_at >= PACE_EVERY or not self.pending:  # what it asks for moves slowly
                self._pace()
                self._paced_at = now

    def _size(self, s: int) -> int:
        return max(0, int(self.sizes[s]))

    def _waiting_bytes(self) -> int:
        return sum(self._size(s) for s in self.pending)

    def _start(self, s: int) -> None:
        if self.gauge is None:
            self.gauge = gauge_for(self.urls[s])
        if self.pool is None:  # threads only once there is something remote (and after any fork)
            # One thread per download in flight: a store's single stream is often slower than the
            # node (S3: ~50-100 MB/s per connection); the next shard needed is always started first.
            fixed = self.options.read_ahead
            most = fixed if fixed is not None else self.options.max_requests
            self.pool = ThreadPoolExecutor(max_workers=max(1, most), thread_name_prefix="wdsprep-fetch")
        self.pending[s] = self.pool.submit(self._fetch, s)

    def _fetch(self, s: int) -> tuple[LocalCopy, int, int]:
        url = self.urls[s]
        expected = int(self.sizes[s]) if self.sizes[s] >= 0 else None
        checksum = None if self.checksums is None else self.checksums[s]
        timing = Timing()
        with self._lock:
            self._running += 1
            self.peak_in_flight = max(self.peak_in_flight, self._running)
        try:
            if self.cache is not None:
                copy, retries, hit = self.cache.fetch(url, expected=expected, checksum=checksum, policy=self.policy,
                                                      cancel=self.cancel, timing=timing)
                nbytes = 0 if hit else copy.size
            else:
                copy, retries = fetch_shard(url, expected=expected, checksum=checksum, policy=self.policy,
                                            cancel=self.cancel, timing=timing)
                nbytes = copy.size
        finally:
            with self._lock:
                self._running -= 1
        if timing.size and self.gauge is not None:
            self.gauge.fetched(timing.first_byte, timing.body, timing.size)
        return copy, retries, nbytes

    def _paced(self) -> bool:
        """Whether the shards ahead are started by the store's pace: ``read_ahead`` not fixed, and
        the reader's shards remote (local ones are asked into the page cache :data:`LEAST_AHEAD`
        ahead, as cheaply as ever: a local reader reads a thousand batches a second)."""
        if self.options.read_ahead is not None or not self.order:
            return False
        if self._remote is None:
            self._remote = is_url(self.urls[self.order[0]])
        return self._remote

    def _ahead(self, position: int) -> None:
        """Start the shards ahead: by the pace (:meth:`_pace`), else the ``read_ahead`` after
        ``position`` in the order, within the byte bound."""
        if self._paced():
            self._pace()
            return
        bound = self.options.read_ahead_bytes
        fixed = self.options.read_ahead
        last = position + (LEAST_AHEAD if fixed is None else fixed)
        while self.next < len(self.order) and self.next <= last:
            s = self.order[self.next]
            if s in self.opened or s in self.pending:
                self.next += 1
                continue
            if not is_url(self.urls[s]):
                prefetch_shard(self.urls[s])  # local: into the page cache, no memory of ours
                self.next += 1
                continue
            if bound is not None and self.pending and self._waiting_bytes() + self._size(s) > bound:
                return  # room is made when a waiting shard is opened
            self._start(s)
            self.next += 1

    def _pace(self) -> None:
        """Start every shard that would arrive late unless started now (:func:`~wdsprep.remote.pace.window`)."""
        budget = self.options.read_ahead_bytes
        ahead: list[tuple[int, int, int]] = []  # (shard, bytes, batches until first needed), in order
        seen = 0
        k = self.next
        while k < len(self.order) and len(ahead) < PACE_HORIZON and (budget is None or seen <= budget):
            s = self.order[k]
            k += 1
            if s in self.opened or s in self.pending:
                continue
            ahead.append((s, self._size(s), max(0, self.need.get(s, 0) - self.batch)))
            seen += self._size(s)
        if not ahead:
            return
        queued = sum(self._size(s) for s, f in self.pending.items() if not f.done())
        estimate = self.gauge.estimate if self.gauge is not None else Estimate()
        n = window([(size, batches) for _, size, batches in ahead], estimate,
                   most=self.options.max_requests, budget=budget, waiting=self._waiting_bytes(), queued=queued)
        for s, _, _ in ahead[:n]:
            if is_url(self.urls[s]):
                self._start(s)
            else:
                prefetch_shard(self.urls[s])  # local: into the page cache, no memory of ours
        if n:
            self.next = self.position[ahead[n - 1][0]] + 1

    def open(self, s: int) -> Opened:
        """Shard ``s``, once fetched (waiting for it if need be), with the next ones started.

        Raises ``FetchError`` (its ``retries`` spent) when it cannot be had; ``ChangedError`` (a
        FetchError) when the server's copy is not the size or checksum its index recorded.
        """
        self._ahead(self.position.get(s, self.next - 1))
        url = self.urls[s]
        if not is_url(url):
            self.opened.add(s)
            return Opened(None, 0, 0)
        if s not in self.pending:  # needed before its turn in the order (or past the byte bound)
            self._start(s)
        future = self.pending.pop(s)
        self.opened.add(s)
        try:
            waited = time.monotonic()
            done = future.done()
            copy, retries, nbytes = future.result()
            if self.gauge is not None and not done:
                self.gauge.waited(time.monotonic() - waited)
        finally:
            self._ahead(self.position.get(s, self.next - 1))  # its bytes no longer wait: room for more
        return Opened(ShardFile(redact(url), copy), retries, nbytes)

    def close(self) -> None:
        """Stop: downloads in flight give up at their next chunk, and what waited is let go."""
        self.cancel.set()
        for future in self.pending.values():
            future.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        for future in self.pending.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result()[0].close()
        self.pending = {}


__all__ = ["Cancelled", "FetchError", "Opened", "ShardFetcher"]
