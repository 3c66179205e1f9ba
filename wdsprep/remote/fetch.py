"""A whole object brought here, checked against its expected size, with retries.

A shard is only handed on once every byte arrived and the count is the one the index recorded
(or, without an index, the server's Content-Length): a body cut short is never read as a short
shard.  A retry after a cut resumes at the byte where the body stopped (a ``Range`` request,
pinned to the same object version by its ETag) when the server supports it, and starts over
otherwise; either way the shard is read once, whole, so a retry can never make an utterance
appear twice.  Retries wait ``backoff`` seconds, doubling up to ``max_backoff``, with a jitter
that is a function of the URL and the attempt (ranks waiting on one failure do not retry in step).

Where the bytes go (:class:`MemorySink`): an anonymous memory file (``memfd``) mapped into the
process, so the download counts in its resident memory like any buffer and is freed when the
last reference to the shard goes, and yet it has a file descriptor: the C tar walk and the
batch row reads (``pread``) read it as they read a local shard.  With a cache
(:mod:`wdsprep.remote.cache`) the bytes go to a file instead (:class:`FileSink`).
"""

from __future__ import annotations

import mmap
import os
import queue
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, TypeVar

from wdsprep.remote.clients import Final, Retryable, open_stream

CHUNK = 1 << 20  # bytes per read from the connection
T = TypeVar("T")


class FetchError(OSError):
    """An object could not be fetched: the message names the URL, what happened and what to do.

    ``retries``: the retries spent before giving up (0 for a failure no retry can fix).
    """

    def __init__(self, message: str, *, url: str = "", retries: int = 0) -> None:
        super().__init__(message)
        self.url, self.retries = url, retries

    def __str__(self) -> str:
        return str(self.args[0])


class NotFoundError(FetchError):
    """No such object (HTTP 404, S3 NoSuchKey)."""


class SizeMismatchError(FetchError):
    """The object's size differs from the size its index recorded: it changed since it was indexed."""


class Cancelled(Exception):
    """The fetch was given up by its owner (the epoch stopped)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``retries`` more attempts after the first, waiting ``backoff`` seconds
    before the first retry and doubling up to ``max_backoff``; ``timeout``: seconds to connect or
    between two reads before the attempt counts as failed."""

    retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.timeout <= 0:
            raise ValueError(f"retries and retry backoff must be >= 0 and the timeout > 0, got {self}")

    def delay(self, url: str, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1, 2, ...) of ``url``: exponential, with a jitter of
        0.5-1.5x taken from the URL and attempt, not from a global random state."""
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        jitter = zlib.crc32(f"{url}#{attempt}".encode()) / 0xFFFFFFFF
        return base * (0.5 + jitter)


class _Held:
    """Fetched copies alive in memory in this process, now and at most (for benchmarks and tests)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = self.bytes = self.peak_count = self.peak_bytes = 0

    def add(self, n: int, k: int) -> None:
        with self.lock:
            self.count += k
            self.bytes += n
            self.peak_count = max(self.peak_count, self.count)
            self.peak_bytes = max(self.peak_bytes, self.bytes)


HELD = _Held()


def held_in_memory() -> dict[str, int]:
    """Fetched shards held in this process's memory: now (``shards``, ``bytes``) and at most
    (``peak_shards``, ``peak_bytes``)."""
    return {"shards": HELD.count, "bytes": HELD.bytes, "peak_shards": HELD.peak_count, "peak_bytes": HELD.peak_bytes}


class _Buffers:
    """Memory files kept for the next download, per process.

    Filling fresh pages of a memory file costs the kernel ~1 s of CPU per GB (each page allocated,
    zeroed, and freed again when the shard goes), 6x the cost of receiving the bytes (measured on
    loopback: 0.97 against 0.16 s/GB); on the cores training needs.  A released shard's buffer is
    therefore kept (at most :attr:`MAX`) and the next download written over it.  It is released only
    once nothing can read it: the last reference to its copy is gone, and that includes the batch
    reads in flight (``RowReads`` holds the shards it reads until it is done).  Freeing a buffer
    that is not kept happens on a thread of its own, off the loader's main thread.
    """

    MAX = 4

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.free: list[tuple[int, mmap.mmap]] = []
        self.reaper: queue.SimpleQueue | None = None

    def _mine(self) -> None:
        if self.pid != os.getpid():  # a forked child: its parent's buffers are not its own to reuse
            self.pid, self.free, self.reaper = os.getpid(), [], None

    def take(self, n: int) -> tuple[int, mmap.mmap] | None:
        """A kept buffer for ``n`` bytes (the smallest large enough, else the largest), or None."""
        with self.lock:
            self._mine()
            if not self.free:
                return None
            fits = [b for b in self.free if len(b[1]) >= n]
            pick = min(fits, key=lambda b: len(b[1])) if fits else max(self.free, key=lambda b: len(b[1]))
            self.free.remove(pick)
            return pick

    def give(self, fd: int, mapping: mmap.mmap) -> None:
        """Keep a buffer nothing reads any more, or release it in the background."""
        with self.lock:
            self._mine()
            if len(self.free) < self.MAX:
                self.free.append((fd, mapping))
                return
            if self.reaper is None:
                self.reaper = queue.SimpleQueue()
                threading.Thread(target=_reap, args=(self.reaper,), name="wdsprep-release", daemon=True).start()
            self.reaper.put((mapping, fd))


def _reap(q: queue.SimpleQueue) -> None:
    while True:
        _release(*q.get())


def _release(mapping: mmap.mmap | None, fd: int) -> None:
    if mapping is not None:
        mapping.close()
    if fd >= 0:
        os.close(fd)


BUFFERS = _Buffers()


class LocalCopy:
    """A fetched object open for positional reads: ``fd`` (memory file or cache file), ``size``.

    Owns the descriptor and, for memory, its mapping (which may be larger than ``size``: a reused
    buffer): both go back with the last reference (the shard that wraps it, which the loader lets
    go after the shard's last planned row).
    """

    def __init__(self, fd: int, size: int, mapping: mmap.mmap | None = None, path: str | None = None) -> None:
        self.fd, self.size, self.mapping, self.path = fd, size, mapping, path
        self._held = path is None
        if self._held:
            HELD.add(size, 1)

    def read(self) -> bytes:
        """Every byte, as one bytes object (for callers that want the whole object)."""
        return self.mapping[:self.size] if self.mapping is not None else os.pread(self.fd, self.size, 0)

    def close(self) -> None:
        """Release it: a memory buffer is kept for the next download (see :class:`_Buffers`)."""
        if self._held:
            self._held = False
            HELD.add(-self.size, -1)
        mapping, fd = self.mapping, self.fd
        self.mapping, self.fd = None, -1
        if mapping is not None:
            BUFFERS.give(fd, mapping)
        elif fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown took os first: the OS closes it
            pass


def _anonymous_fd() -> int:
    """A file that lives in memory only: a memfd, else an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create("wdsprep-shard", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            pass
    f = tempfile.TemporaryFile()
    fd = os.dup(f.fileno())
    f.close()
    return fd


class MemorySink:
    """Bytes received straight into a memory file's mapping (a kept buffer, or a new one sized up
    front when the size is known, else grown by doubling)."""

    def __init__(self) -> None:
        self.fd = -1
        self.map: mmap.mmap | None = None
        self.size = 0

    def reserve(self, n: int | None) -> None:
        if n is None or n <= 0 or (self.map is not None and len(self.map) >= n):
            return
        if self.map is None:
            kept = BUFFERS.take(n)
            if kept is not None:
                self.fd, self.map = kept
                if len(self.map) < n:
                    self.map.resize(n)  # the file grows with it
                return
            self.fd = _anonymous_fd()
            os.ftruncate(self.fd, n)
            # All pages at once (one call instead of a fault per 4 KiB as the body arrives).
            self.map = mmap.mmap(self.fd, n, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        else:
            self.map.resize(n)

    def view(self, n: int) -> memoryview:
        """Where the next ``n`` bytes go (release it before the next call)."""
        end = self.size + n
        if self.map is None or end > len(self.map):
            self.reserve(max(end, 2 * (len(self.map) if self.map is not None else 0), CHUNK))
        assert self.map is not None
        return memoryview(self.map)[self.size:end]

    def advance(self, n: int) -> None:
        self.size += n

    def reset(self, pos: int) -> None:
        self.size = pos

    def finish(self) -> LocalCopy:
        if self.fd < 0:  # an empty object
            self.fd = _anonymous_fd()
        copy = LocalCopy(self.fd, self.size, self.map)
        self.fd, self.map = -1, None
        return copy

    def discard(self) -> None:
        if self.map is not None:
            BUFFERS.give(self.fd, self.map)
        elif self.fd >= 0:
            os.close(self.fd)
        self.fd, self.map = -1, None


class FileSink:
    """Bytes written into an open file (a cache file under its temporary name), through one scratch buffer."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = 0
        self.scratch = memoryview(bytearray(CHUNK))

    def reserve(self, n: int | None) -> None:
        pass

    def view(self, n: int) -> memoryview:
        return self.scratch[:min(n, CHUNK)]

    def advance(self, n: int) -> None:
        self.f.write(self.scratch[:n])
        self.size += n

    def reset(self, pos: int) -> None:
        self.f.seek(pos)
        self.f.truncate()
        self.size = pos


def _wait(seconds: float, cancel: threading.Event | None) -> None:
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled()


def with_retries(attempt: Callable[[], T], url: str, policy: RetryPolicy,
                 cancel: threading.Event | None = None) -> tuple[T, int]:
    """``attempt()`` until it succeeds or the retries are spent: (its result, retries used).

    ``attempt`` raises :class:`Retryable` (try again) or :class:`Final`; FetchError names ``url``.
    """
    retries = 0
    while True:
        try:
            return attempt(), retries
        except Retryable as e:
            if retries >= policy.retries:
                raise FetchError(f"{url}: {e}; gave up after {retries + 1} attempt(s) (retries={policy.retries}): "
                                 f"check the server or network and run again, or raise the retries", url=url,
                                 retries=retries) from None
            retries += 1
            _wait(max(policy.delay(url, retries), e.wait or 0.0), cancel)
        except Final as e:
            cls = NotFoundError if e.missing else FetchError
            raise cls(f"{url}: {e}", url=url, retries=retries) from None


def fetch_into(url: str, sink: Any, *, expected: int | None = None, policy: RetryPolicy = RetryPolicy(),
               cancel: threading.Event | None = None) -> int:
    """Fetch ``url`` whole into ``sink``; the retries it took.

    ``expected``: the size the index recorded; a server that reports another size raises
    :class:`SizeMismatchError` (no retry: the shard changed since it was indexed).
    """
    state: dict[str, Any] = {"validator": None}

    def attempt() -> None:
        stream = open_stream(url, start=sink.size, validator=state["validator"], timeout=policy.timeout)
        try:
            if stream.start != sink.size:
                sink.reset(stream.start)  # the server sent it from the start (no ranges, or it changed)
            if expected is not None and stream.total is not None and stream.total != expected:
                raise SizeMismatchError(f"{url} has {stream.total:,} bytes on the server, its index says {expected:,}: "
                                        f"it changed since it was indexed. Index a local copy again (wdsprep index "
                                        f"--refresh) and upload the index files, or restore the shard", url=url)
            want = expected if expected is not None else stream.total
            state["validator"] = stream.validator
            sink.reserve(want)
            while want is None or sink.size < want:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                view = sink.view(CHUNK if want is None else min(CHUNK, want - sink.size))
                try:
                    n = stream.readinto(view)  # straight from the socket into the mapping: one copy
                finally:
                    view.release()
                if not n:
                    break
                sink.advance(n)
            if want is not None and sink.size != want:
                raise Retryable(f"the body ended after {sink.size:,} of {want:,} bytes")
            if stream.total is None and expected is not None and stream.read(1):
                # No length from the server (chunked): more bytes than the index's means another object.
                raise SizeMismatchError(f"{url} has more than the {expected:,} bytes its index says: it changed "
                                        f"since it was indexed. Index a local copy again (wdsprep index --refresh) "
                                        f"and upload the index files, or restore the shard", url=url)
        except Retryable as e:
            if e.restart:
                sink.reset(0)
                state["validator"] = None
            raise
        finally:
            stream.close()

    return with_retries(attempt, url, policy, cancel)[1]


def fetch_shard(url: str, *, expected: int | None = None, policy: RetryPolicy = RetryPolicy(),
                cancel: threading.Event | None = None) -> tuple[LocalCopy, int]:
    """``url`` whole in memory (see :class:`MemorySink`), and the retries it took."""
    sink = MemorySink()
    try:
        retries = fetch_into(url, sink, expected=expected, policy=policy, cancel=cancel)
        return sink.finish(), retries
    except BaseException:
        sink.discard()
        raise


def fetch_bytes(url: str, *, policy: RetryPolicy = RetryPolicy()) -> bytes | None:
    """A small object's bytes (an index file), or None when there is no such object."""
    try:
        copy, _ = fetch_shard(url, policy=policy)
    except NotFoundError:
        return None
    try:
        return copy.read()
    finally:
        copy.close()
