"""How many shard downloads a reader keeps in flight: enough to cover the store's latency at the pace it reads.

On a real store a request waits 20-100 ms for its first byte and a connection carries tens of
MB/s, so what keeps a trainer fed is how many requests are in flight, not how fast one is.  A
reader (a rank's main process or a DataLoader worker) knows its planned batches before it reads
them, so it knows for every shard the batch that first needs it, and it starts downloads in that
order.  When to start each follows from three measurements, each a moving average:

- the store's first-byte **latency** and each connection's **bandwidth**, from the downloads
  themselves (:meth:`Gauge.fetched`);
- the **seconds the reader takes per batch** when it is not waiting for a shard
  (:meth:`Gauge.reached`, less :meth:`Gauge.waited`): waiting for data is not reading, so a
  starved reader's pace is not underestimated by its own starvation; a trainer that takes
  batches slowly slows it, and then fewer downloads are needed ahead.

A shard first needed ``b`` batches from now is needed in ``b * batch_seconds``.  Started now,
behind the ones before it on ``most`` connections, it would arrive after about ``latency`` plus
the longer of its own bytes over one connection's bandwidth and the bytes before and with it over
all ``most`` connections'.  :func:`window` starts every shard up to the last one
that would not arrive ``margin`` times sooner than it is needed, within a byte budget (bytes, not
a count: one 80 MB shard weighs as much as eleven 7 MB ones).  So the shards the first batches of
a new length pool need together (most of the pool's) are on their way while the pool before is
read, and a shard needed much later waits, holding no memory.  Slow store or fast reader: more in
flight; fast store or slow trainer: fewer.  Until a reader has measured all three (its first
two batches) it starts what the byte budget allows: measured through a latency relay, a start
that waited for the pace let 80 MB shards arrive late for 10% of the epoch, against 1.3%.  Pure
arithmetic, no I/O: the rule is unit-tested as it is.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Sequence

# Each new measurement's weight in the moving averages: a few shards to adapt, not one outlier.
WEIGHT = 0.3
# A shard is started once its fetch would not arrive this many times sooner than it is needed:
# bandwidth shared with other readers and a burst of shards needed by one batch eat into it.
MARGIN = 2.0


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - WEIGHT) * old + WEIGHT * new


@dataclass
class Estimate:
    """What a reader knows: seconds to a response's first byte, bytes/s per connection, and the
    seconds it takes per batch when not waiting (None: not measured yet)."""

    latency: float | None = None
    bandwidth: float | None = None
    batch_seconds: float | None = None

    @property
    def known(self) -> bool:
        return None not in (self.latency, self.bandwidth, self.batch_seconds)


def window(shards: Sequence[tuple[int, float]], estimate: Estimate, *, most: int, budget: int | None = None,
           waiting: int = 0, queued: int = 0, margin: float = MARGIN) -> int:
    """How many of the shards not yet started to start now.

    ``shards``: each one's bytes and the batches until the reader first needs it (0: the batch it
    reads now), in the order they are needed.  ``queued``: bytes still downloading ahead of them;
    ``waiting``: bytes started and not yet opened (downloading or downloaded), which with the ones
    started now stay within ``budget`` (None: no bound), though one is always allowed when
    nothing waits.  Before the pace is measured: every one, as far as the budget goes.
    """
    n = len(shards)
    if not estimate.known:
        # Until the reader has read two batches, how soon it needs each shard is unknown: all it
        # will need, as far as the budget goes (a first batch may need a whole length pool's
        # shards, and one large shard takes seconds on one connection).
        want = n
    else:
        assert estimate.latency is not None and estimate.bandwidth is not None and estimate.batch_seconds is not None
        bandwidth = max(estimate.bandwidth, 1.0)
        total = queued
        want = 0
        for k, (size, batches) in enumerate(shards):
            total += max(0, size)
            # Its own connection carries it at the bandwidth, and all connections together the
            # bytes queued before and with it.
            arrive = estimate.latency + max(max(0, size) / bandwidth, total / (most * bandwidth))
            if margin * arrive >= max(0.0, batches) * estimate.batch_seconds:
                want = k + 1  # late unless started now: it, and every one before it
    if budget is not None:
        total = waiting
        for k in range(want):
            total += max(0, shards[k][0])
            if total > budget and (k > 0 or waiting > 0):
                return k
    return want


class Gauge:
    """A reader's measurements (thread-safe: downloads finish on other threads).  One per process
    and store (:func:`gauge_for`), so a reader's next epoch starts from what the last one learned."""

    def __init__(self) -> None:
        self.estimate = Estimate()
        self._lock = threading.Lock()
        self._last: tuple[float, int] | None = None  # (when, batch) of the last batch reached
        self._waited = 0.0

    def fetched(self, first_byte: float, body: float, size: int) -> None:
        """A download's seconds to its first byte and reading its body of ``size`` bytes."""
        with self._lock:
            e = self.estimate
            e.latency = _average(e.latency, max(0.0, first_byte))
            if size > 0 and body > 0:
                e.bandwidth = _average(e.bandwidth, size / body)

    def restart(self) -> None:
        """A new epoch: the time since the last batch is no reading (the estimates stay)."""
        with self._lock:
            self._last, self._waited = None, 0.0

    def waited(self, seconds: float) -> None:
        """The reader waited this long for a shard to arrive (not reading)."""
        with self._lock:
            self._waited += seconds

    def reached(self, batch: int, now: float | None = None) -> None:
        """The reader starts on batch ``batch`` (of its epoch, counted from 0): the batches since
        the last one took the time since, less what it waited."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._last is not None and batch > self._last[1]:
                busy = now - self._last[0] - self._waited
                if busy > 0:
                    e = self.estimate
                    e.batch_seconds = _average(e.batch_seconds, busy / (batch - self._last[1]))
            self._last, self._waited = (now, batch), 0.0


_gauges: dict[tuple[int, str], Gauge] = {}
_gauges_lock = threading.Lock()


def gauge_for(url: str) -> Gauge:
    """This process's gauge of the store ``url`` is in (its scheme and host or bucket), restarted
    for a new epoch; a forked worker gets fresh ones (its parent's pace is not its own)."""
    scheme, _, rest = url.partition("://")
    key = (os.getpid(), f"{scheme}://{rest.split('/', 1)[0]}")
    with _gauges_lock:
        gauge = _gauges.get(key)
        if gauge is None:
            gauge = _gauges[key] = Gauge()
    gauge.restart()
    return gauge
