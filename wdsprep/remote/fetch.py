"""A whole object brought here, checked against its expected size and checksum, with retries.

A shard is only handed on once every byte arrived and the count is the one the index recorded
(or, without an index, the server's Content-Length): a body cut short is never read as a short
shard, and a body longer than the index's size is refused, not grown into.  Where the index
records the shard's SHA-256, the bytes are hashed as they arrive and a shard whose content is not
the one indexed (a same-size change) is refused like one of another size.  A retry after a cut
resumes at the byte where the body stopped (a ``Range`` request pinned to the version first sent,
by its ETag or Last-Modified date) when the server supports it; a resumed response of another
version (a server that ignores ``If-Range``), and any retry of a server that names no version,
starts over from byte 0 instead, so a shard is never stitched from two versions.  Either way the
shard is read once, whole, so a retry can never make an utterance appear twice.  Retries wait
``backoff`` seconds, doubling up to ``max_backoff``, with a jitter that is a function of the URL
and the attempt (ranks waiting on one failure do not retry in step).

Every attempt is held to a minimum rate (:mod:`wdsprep.remote.deadline`): a server that trickles
is cut off and retried like one that drops the connection.  Every message names the URL through
:func:`~wdsprep.remote.urls.redact`: no password or token is ever printed.

Where the bytes go (:class:`MemorySink`): an anonymous memory file (``memfd``) mapped into the
process, so the download counts in its resident memory like any buffer and is freed when the
last reference to the shard goes, and yet it has a file descriptor: the C tar walk and the
batch row reads (``pread``) read it as they read a local shard.  With a cache
(:mod:`wdsprep.remote.cache`) the bytes go to a file instead (:class:`FileSink`).
"""

from __future__ import annotations

import atexit
import hashlib
import mmap
import os
import queue
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, TypeVar

from wdsprep.errors import OverLimit
from wdsprep.remote import deadline
from wdsprep.remote.clients import Final, Retryable
from wdsprep.remote.stores import open_stream
from wdsprep.remote.urls import redact

CHUNK = 1 << 20  # bytes per read from the connection
MIN_RATE = 64 << 10  # bytes/s: the default minimum rate of a download (about 0.5 Mbit/s)
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


class ChangedError(FetchError):
    """The object is not the one its index recorded (another size, or the same size and another
    checksum): it changed since it was indexed."""


class TooLargeError(FetchError, OverLimit):
    """The object is larger than the bound its caller set (an index file can only be so large)."""


class Cancelled(Exception):
    """The fetch was given up by its owner (the epoch stopped)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``retries`` more attempts after the first, waiting ``backoff`` seconds
    before the first retry and doubling up to ``max_backoff`` (a server's Retry-After is honoured up
    to that too); ``timeout``: seconds to connect or between two reads before the attempt counts as
    failed; ``min_rate``: bytes/s an attempt must average, after a grace of the time 1 MiB takes at
    that rate (:mod:`~wdsprep.remote.deadline`; 0: no minimum)."""

    retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0
    timeout: float = 60.0
    min_rate: float = MIN_RATE

    def __post_init__(self) -> None:
        if not (self.retries >= 0 and self.backoff >= 0 and self.timeout > 0 and self.min_rate >= 0):
            raise ValueError(f"retries, retry backoff and min_rate must be >= 0 and the timeout > 0, got {self}")

    def delay(self, url: str, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1, 2, ...) of ``url``: exponential, with a jitter of
        0.5-1.5x taken from the URL and attempt, not from a global random state."""
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        jitter = zlib.crc32(f"{url}#{attempt}".encode()) / 0xFFFFFFFF
        return base * (0.5 + jitter)


@dataclass
class Timing:
    """How a fetch's last attempt went, for the pace of the reads ahead (:mod:`~wdsprep.remote.pace`):
    seconds from the request to the response's first byte (its headers), seconds reading the
    body, and the body's bytes."""

    first_byte: float = 0.0
    body: float = 0.0
    size: int = 0


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
        """Keep a buffer nothing reads any more, or release it in the background; at exit, at once.

        A copy can be let go at interpreter exit (the last reference was in a traceback): no
        thread is started then, as a thread started while the interpreter finalizes never runs,
        and its start would wait for it for good."""
        if _exiting or sys.is_finalizing():
            _release(mapping, fd)
            return
        with self.lock:
            self._mine()
            if len(self.free) < self.MAX:
                self.free.append((fd, mapping))
                return
            if self.reaper is None:
                self.reaper = queue.SimpleQueue()
                threading.Thread(target=_reap, args=(self.reaper,), name="wdsprep-release", daemon=True).start()
            self.reaper.put((mapping, fd))


_exiting = False


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True


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


class _Sink:
    """What both sinks share: the size so far, and the SHA-256 of the bytes, kept as they arrive
    when asked for (:meth:`track`)."""

    size = 0
    where = ""  # for messages: where the bytes go
    _hash: Any = None
    _hashed = 0  # bytes the running hash covers: the first ones, while nothing was written over

    def track(self) -> None:
        self._hash, self._hashed = hashlib.sha256(), 0

    def _arrived(self, data: memoryview) -> None:
        """``data``: the bytes just received at ``self.size`` (before it is advanced)."""
        if self._hash is not None and self._hashed == self.size:
            self._hash.update(data)
            self._hashed += len(data)

    def reset(self, pos: int) -> None:
        if pos == 0 and self._hash is not None:
            self.track()
        self.size = pos

    def contents(self) -> Any:
        raise NotImplementedError

    def sha256(self) -> str:
        """The SHA-256 of the bytes (from the running hash, else read again: a resume that was not
        the continuation of what arrived)."""
        if self._hash is not None and self._hashed == self.size:
            return self._hash.hexdigest()
        h = hashlib.sha256()
        for piece in self.contents():
            h.update(piece)
        return h.hexdigest()


class MemorySink(_Sink):
    """Bytes received straight into a memory file's mapping (a kept buffer, or a new one sized up
    front when the size is known, else grown by doubling)."""

    where = "in memory"

    def __init__(self) -> None:
        self.fd = -1
        self.map: mmap.mmap | None = None
        self.size = 0

    def reserve(self, n: int | None) -> None:
        if n is None or n <= 0 or (self.map is not None and len(self.map) >= n):
            return
        if n > _MAX_IN_MEMORY:
            raise OSError(12, f"more than half of this machine's {_PHYSICAL:,} bytes of memory")
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
        if self._hash is not None:
            assert self.map is not None
            with memoryview(self.map)[self.size:self.size + n] as data:
                self._arrived(data)
        self.size += n

    def contents(self) -> Any:
        if self.map is not None:
            for at in range(0, self.size, CHUNK):
                with memoryview(self.map)[at:min(at + CHUNK, self.size)] as piece:
                    yield piece

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


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


# A download held in memory is at most half the machine's memory: an index (or a server) that
# claims a larger shard gets a named error saying to use a cache directory, not the OOM killer.
_PHYSICAL = _physical_memory()
_MAX_IN_MEMORY = _PHYSICAL // 2


class FileSink(_Sink):
    """Bytes written into an open file (a cache file under its temporary name), through one scratch buffer."""

    where = "on disk"

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = 0
        self.scratch = memoryview(bytearray(CHUNK))

    def reserve(self, n: int | None) -> None:
        pass

    def view(self, n: int) -> memoryview:
        return self.scratch[:min(n, CHUNK)]

    def advance(self, n: int) -> None:
        self._arrived(self.scratch[:n])
        self.f.write(self.scratch[:n])
        self.size += n

    def reset(self, pos: int) -> None:
        self.f.seek(pos)
        self.f.truncate()
        super().reset(pos)

    def contents(self) -> Any:
        self.f.flush()
        for at in range(0, self.size, CHUNK):
            yield os.pread(self.f.fileno(), min(CHUNK, self.size - at), at)


def _wait(seconds: float, cancel: threading.Event | None) -> None:
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled()


def with_retries(attempt: Callable[[], T], url: str, policy: RetryPolicy,
                 cancel: threading.Event | None = None) -> tuple[T, int]:
    """``attempt()`` until it succeeds or the retries are spent: (its result, retries used).

    ``attempt`` raises :class:`Retryable` (try again) or :class:`Final`; FetchError names ``url``
    (redacted: the message quotes no password or token, wherever a library put it).
    """
    retries = 0
    while True:
        try:
            return attempt(), retries
        except Retryable as e:
            if retries >= policy.retries:
                raise FetchError(redact(f"{url}: {e}; gave up after {retries + 1} attempt(s) (retries="
                                        f"{policy.retries}): check the server or network and run again, or raise the "
                                        f"retries", url),
                                 url=redact(url), retries=retries) from None
            retries += 1
            # The server's Retry-After, up to the longest wait of the policy: a server cannot park a reader.
            _wait(max(policy.delay(url, retries), min(e.wait or 0.0, policy.max_backoff)), cancel)
        except Final as e:
            cls = NotFoundError if e.missing else FetchError
            raise cls(redact(f"{url}: {e}", url), url=redact(url), retries=retries) from None


def _changed(name: str, why: str) -> ChangedError:
    """The error of an object that is not the one its index recorded (``name``: its redacted URL)."""
    return ChangedError(f"{name} {why}: it changed since it was indexed. Index a local copy again (wdsprep index "
                        f"--refresh) and upload the index files, or restore the shard", url=name)


def _too_large(name: str, limit: int | None, size: str) -> TooLargeError:
    """The error of an object of more than ``limit`` bytes (``size``: how many it has, said)."""
    return TooLargeError(f"{name}: {size} bytes, more than the {limit:,} it can have", url=name)


def fetch_into(url: str, sink: Any, *, expected: int | None = None, checksum: str | None = None,
               limit: int | None = None, policy: RetryPolicy = RetryPolicy(),
               cancel: threading.Event | None = None, timing: Timing | None = None) -> int:
    """Fetch ``url`` whole into ``sink``; the retries it took.

    ``expected``: the size the index recorded, ``checksum`` its SHA-256 (hex); a server that sends
    another size or other bytes raises :class:`ChangedError` (no retry: the object changed since it
    was indexed).  ``limit``: the most bytes the object may have (:class:`TooLargeError` beyond).
    ``timing``: filled with how the attempt that succeeded went.
    """
    name = redact(url)
    state: dict[str, Any] = {"validator": None}  # the version of the bytes kept (ETag or Last-Modified)
    if checksum is not None:
        sink.track()

    def body(stream: Any, watch: deadline.Watch) -> None:
        if sink.size and stream.start == sink.size and stream.validator != state["validator"]:
            # A resumed read of another version (a server that ignores If-Range): never stitched.
            raise Retryable(f"the object changed on the server while it was downloaded (version {state['validator']} "
                            f"then {stream.validator}): downloading it again from the start", restart=True)
        if stream.start != sink.size:
            sink.reset(stream.start)  # the server sent it from the start (no ranges, or it changed)
        if expected is not None and stream.total is not None and stream.total != expected:
            raise _changed(name, f"has {stream.total:,} bytes on the server, its index says {expected:,}")
        if limit is not None and stream.total is not None and stream.total > limit:
            raise _too_large(name, limit, f"{stream.total:,}")
        if not sink.size:
            state["validator"] = stream.validator
        want = expected if expected is not None else stream.total
        sink.reserve(want)
        received = 0
        while want is None or sink.size < want:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            ask = CHUNK if want is None else min(CHUNK, want - sink.size)
            if limit is not None and want is None:
                ask = max(1, min(ask, limit + 1 - sink.size))  # one byte past the bound shows it crossed
            view = sink.view(ask)
            watch.expect(received, len(view))
            try:
                n = stream.readinto(view)  # straight from the socket into the mapping: one copy
            finally:
                view.release()
            if not n:
                break
            sink.advance(n)
            received += n
            if limit is not None and sink.size > limit:
                raise _too_large(name, limit, f"over {limit:,}")
        if watch.why is not None:  # cut off: the end of the bytes is no end of the object
            raise Retryable(watch.why)
        if want is not None and sink.size != want:
            raise Retryable(f"the body ended after {sink.size:,} of {want:,} bytes")
        if stream.total is None and expected is not None:
            watch.expect(received, 1)
            if stream.read(1):
                # No length from the server (chunked): more bytes than the index's means another object.
                raise _changed(name, f"has more than the {expected:,} bytes its index says")

    def attempt() -> None:
        if sink.size and state["validator"] is None:
            sink.reset(0)  # the server named no version: a resumed read could not be checked, so none
        with deadline.watching(policy.min_rate, cancel) as watch:
            stream = None
            try:
                watch.expect(0, CHUNK if expected is None else min(CHUNK, expected))
                asked = time.monotonic()
                stream = open_stream(url, start=sink.size, validator=state["validator"], timeout=policy.timeout)
                first = time.monotonic()
                body(stream, watch)
                if timing is not None:
                    timing.first_byte, timing.body = first - asked, time.monotonic() - first
                    timing.size = sink.size - stream.start
            except FetchError:
                raise
            except (Retryable, Cancelled) as e:
                why = e
                if watch.why is not None:  # the watchdog cut the connection: say why
                    if watch.cancelled:
                        raise Cancelled() from None
                    why = Retryable(watch.why)
                if isinstance(why, Retryable) and why.restart:
                    sink.reset(0)
                    state["validator"] = None
                raise why from None
            except OSError as e:  # the sink's: no memory or disk for the bytes
                room = "memory, or give the loader a cache_dir on a local disk" if sink.where == "in memory" else \
                    "disk space"
                raise FetchError(f"{name}: cannot hold its bytes {sink.where} ({e.strerror or e}); free {room}, "
                                 f"and run again", url=name) from None
            finally:
                if stream is not None:
                    stream.close()

    retries = with_retries(attempt, url, policy, cancel)[1]
    if checksum is not None and sink.sha256() != checksum:
        raise _changed(name, f"has other bytes than its index's checksum (SHA-256), at the same size "
                             f"({sink.size:,} bytes)")
    return retries


def fetch_shard(url: str, *, expected: int | None = None, checksum: str | None = None,
                policy: RetryPolicy = RetryPolicy(), cancel: threading.Event | None = None,
                timing: Timing | None = None) -> tuple[LocalCopy, int]:
    """``url`` whole in memory (see :class:`MemorySink`), and the retries it took."""
    sink = MemorySink()
    try:
        retries = fetch_into(url, sink, expected=expected, checksum=checksum, policy=policy, cancel=cancel,
                             timing=timing)
        return sink.finish(), retries
    except BaseException:
        sink.discard()
        raise


def fetch_file(url: str, path: str | os.PathLike, *, limit: int, policy: RetryPolicy = RetryPolicy()) -> bool:
    """A small object (an index file) into the file ``path``, at most ``limit`` bytes
    (:class:`TooLargeError` beyond); False when there is no such object.  On disk, not in memory:
    a server that sends more than it should costs disk space up to the bound, never memory."""
    with open(path, "w+b") as f:
        try:
            fetch_into(url, FileSink(f), limit=limit, policy=policy)
        except NotFoundError:
            return False
    return True

