"""Shards brought to a reader ahead of use, in the order its planned streams read them.

The assignment tells each reader (a rank's main process or DataLoader worker) which shards it
reads and in what order, so it reads ahead along exactly that order and nothing else: under DDP
each node fetches only its own ranks' shards.  While a shard is in use the next ``read_ahead``
ones are fetched in the background (remote: downloaded, into memory or the cache directory;
local: asked into the page cache), at most ``read_ahead_bytes`` of them waiting in memory.  A
fetch that fails is retried (``wdsprep.remote.fetch``); the retries are handed back with the
shard, for the reader's counts.  Pure threads and numpy: no torch.

The options it reads with (``FetchOptions``) are the plan's (``wdsprep/plan/options.py``): the
plan reads remote indexes with the same retries.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, Sequence

import numpy as np

from wdsprep.format.shardfile import ShardFile, prefetch_shard
from wdsprep.plan.options import FetchOptions
from wdsprep.remote.cache import ShardCache
from wdsprep.remote.fetch import Cancelled, FetchError, LocalCopy, fetch_shard
from wdsprep.remote.urls import is_url, redact


class Opened(NamedTuple):
    """A shard ready to read: its fetched copy (None: a local file, read by its path), the retries
    the fetch took and the bytes it downloaded."""

    source: ShardFile | None
    retries: int
    fetched_bytes: int


class ShardFetcher:
    """One reader's shards, fetched ahead along ``order`` (shard indices in the order its streams
    read them); :meth:`open` each shard when it is needed, :meth:`close` at the end.

    ``sizes[s]``: the bytes shard ``s`` has according to the index (-1: unknown), which a fetch
    checks and which the byte bound counts; ``checksums[s]``: its SHA-256, which a fetch checks
    (None: not recorded).
    """

    def __init__(self, urls: Sequence[str], sizes: np.ndarray, order: Sequence[int], options: FetchOptions,
                 checksums: Sequence[str | None] | None = None) -> None:
        self.urls, self.sizes, self.order = urls, sizes, list(order)
        self.checksums = checksums
        self.options = options
        self.position = {s: i for i, s in enumerate(self.order)}
        self.next = 0  # self.order[:next] were started (remote) or asked into the page cache (local)
        self.pending: dict[int, Future] = {}  # started, not yet opened
        self.opened: set[int] = set()
        self.cancel = threading.Event()
        self.pool: ThreadPoolExecutor | None = None
        self.cache = ShardCache(options.cache_dir, options.cache_bytes) if options.cache_dir else None
        self.policy = options.policy()

    def extend(self, order: Sequence[int]) -> None:
        """More shards to fetch ahead, after those in the order so far (the next window's)."""
        for s in order:
            if s not in self.position:
                self.position[s] = len(self.order)
                self.order.append(s)

    def _size(self, s: int) -> int:
        return max(0, int(self.sizes[s]))

    def _waiting_bytes(self) -> int:
        return sum(self._size(s) for s in self.pending)

    def _start(self, s: int) -> None:
        if self.pool is None:  # threads only once there is something remote (and after any fork)
            # One thread per shard ahead: a store's single stream is often slower than the node
            # (S3: ~50-100 MB/s per connection); the next shard needed is always started first.
            self.pool = ThreadPoolExecutor(max_workers=max(1, self.options.read_ahead),
                                           thread_name_prefix="wdsprep-fetch")
        self.pending[s] = self.pool.submit(self._fetch, s)

    def _fetch(self, s: int) -> tuple[LocalCopy, int, int]:
        url = self.urls[s]
        expected = int(self.sizes[s]) if self.sizes[s] >= 0 else None
        checksum = None if self.checksums is None else self.checksums[s]
        if self.cache is not None:
            copy, retries, hit = self.cache.fetch(url, expected=expected, checksum=checksum, policy=self.policy,
                                                  cancel=self.cancel)
            return copy, retries, 0 if hit else copy.size
        copy, retries = fetch_shard(url, expected=expected, checksum=checksum, policy=self.policy, cancel=self.cancel)
        return copy, retries, copy.size

    def _ahead(self, position: int) -> None:
        """Start the shards up to ``read_ahead`` past ``position`` in the order, within the byte bound."""
        bound = self.options.read_ahead_bytes
        while self.next < len(self.order) and self.next <= position + self.options.read_ahead:
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
            copy, retries, nbytes = future.result()
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
