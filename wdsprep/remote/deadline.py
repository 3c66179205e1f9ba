"""How slow a download may be: a minimum rate, held from outside the blocked read.

A read timeout does not end a download from a server that sends one byte every 20 s: every read
gets its byte in time.  So an attempt is held to a minimum average rate as well: ``t`` seconds
after it started it must have received ``min_rate * (t - grace)`` bytes, where the grace, for
connecting and the server's first byte, is the time 1 MiB takes at that rate (at least 1 s).

The reads block inside the HTTP libraries (and a 1 MiB read returns only once 1 MiB arrived), so
the check runs on one watchdog thread per process.  Each attempt is a :class:`Watch`: the fetch
says before every read how many bytes it has and how many it asks for, which gives the time that
read must end by; the connection an attempt uses registers itself (:func:`current`).  When an
attempt falls behind, or its owner gave up (the loader's epoch stopped), the watchdog shuts its
socket down (or kills its command): the blocked read returns at once, and the attempt fails with
a message that names the rate, to be retried like any failed attempt.  No fetch thread is left
blocked on a server that trickles, so a process never waits on one at exit.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

GRACE_BYTES = 1 << 20  # the grace is the time this takes at the minimum rate
MIN_GRACE = 1.0  # seconds
POLL = 0.25  # seconds between looks at the owners' cancel events


class Watch:
    """One download attempt held to ``min_rate`` bytes/s (0: no minimum) and to ``cancel``."""

    def __init__(self, min_rate: float, cancel: threading.Event | None = None) -> None:
        self.min_rate = min_rate
        self.cancel = cancel
        self.start = time.monotonic()
        self.grace = max(MIN_GRACE, GRACE_BYTES / min_rate) if min_rate > 0 else math.inf
        self.deadline = math.inf
        self.received = 0
        self.why: str | None = None  # set when the watchdog ended the attempt
        self.cancelled = False
        self._aborts: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._closed = False

    def expect(self, received: int, upcoming: int) -> None:
        """The attempt has ``received`` bytes and now reads up to ``upcoming`` more: that read must
        end before the average rate falls below the minimum, counting those bytes as arrived."""
        self.received = received
        if self.min_rate > 0:
            self.deadline = self.start + self.grace + (received + upcoming) / self.min_rate

    def attach(self, abort: Callable[[], None]) -> None:
        """``abort()`` ends the attempt's blocked read (shuts its socket down, kills its command)."""
        with self._lock:
            if self._closed:
                return
            if self.why is None:
                self._aborts.append(abort)
                return
        _quietly(abort)  # already over: end this read too

    def expire(self, why: str, *, cancelled: bool = False) -> None:
        """End the attempt: ``why`` says how; every registered read is aborted."""
        with self._lock:
            if self._closed or self.why is not None:
                return
            self.why, self.cancelled = why, cancelled
            aborts, self._aborts = self._aborts, []
        for abort in aborts:
            _quietly(abort)

    def close(self) -> None:
        """The attempt is over: nothing of it is aborted any more (its connection may serve another)."""
        with self._lock:
            self._closed = True
            self._aborts = []

    def too_slow(self, now: float) -> str:
        elapsed = now - self.start
        return (f"too slow: {self.received:,} bytes in {elapsed:.1f} s, below the minimum rate of "
                f"{self.min_rate:,.0f} bytes/s (min_rate, --min-rate; a slower network needs a lower one)")


def _quietly(abort: Callable[[], None]) -> None:
    try:
        abort()
    except Exception:  # the socket or process is already gone
        pass


def shutdown(sock: Any) -> None:
    """Shut a socket down both ways: a read blocked on it returns.  Not closed: its owner does that,
    so the descriptor's number is not reused under it."""
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Watchdog:
    """The thread that ends attempts past their time or given up; started with the first watch."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.watches: set[Watch] = set()
        self.thread: threading.Thread | None = None

    def add(self, w: Watch) -> None:
        with self.cond:
            self.watches.add(w)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="wdsprep-watchdog", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, w: Watch) -> None:
        with self.cond:
            self.watches.discard(w)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.watches:
                    self.cond.wait()
                now = time.monotonic()
                live = [w for w in self.watches if w.why is None]  # an ended one waits for its thread to see it
                late = [w for w in live if now >= w.deadline]
                given_up = [w for w in live if w.cancel is not None and w.cancel.is_set()]
                soonest = min((w.deadline for w in live), default=math.inf) - now
            for w in given_up:
                w.expire("given up by its owner", cancelled=True)
            for w in late:
                w.expire(w.too_slow(now))
            with self.cond:
                self.cond.wait(max(0.01, min(POLL, soonest)))


_watchdog = _Watchdog()
_local = threading.local()


def _fresh() -> None:
    global _watchdog, _local
    _watchdog, _local = _Watchdog(), threading.local()  # the parent's thread is not the child's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh)


@contextmanager
def watching(min_rate: float, cancel: threading.Event | None = None) -> Iterator[Watch]:
    """A :class:`Watch` for one attempt, current in this thread while the block runs."""
    w = Watch(min_rate, cancel)
    _watchdog.add(w)
    _local.watch = w
    try:
        yield w
    finally:
        _local.watch = None
        _watchdog.remove(w)
        w.close()


def current() -> Watch | None:
    """The attempt this thread is making, if it is watched (a connection registers itself with it)."""
    return getattr(_local, "watch", None)
