"""A local shard file read by position: headers, features straight into batch rows, readahead.

A local shard is never read as a whole: the walk (``tar.py``) reads each 512-byte header together
with the first bytes of its member, and a sample's features stay on disk (:class:`FileFeats`, or
a row of the loader's columns) until the collate reads them straight into their row of the
batch, in one C call for the batch (:class:`RowReads`).  That is the only copy of the feature
bytes.  Shards from pipes and URLs are fetched whole by the layers above (``loading/readahead.py``,
with the user's retries: into memory, or into the local cache) and handed here as a copy open
for positional reads (:class:`Fetched`), read the same way through its descriptor.  Nothing here
fetches.
"""

from __future__ import annotations

import os
import stat
import threading
import weakref
from collections import OrderedDict, deque
from typing import Any, Protocol, Sequence, Union

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format import native
from wdsprep.format.keys import uttid_for_message
from wdsprep.format.native import untrack
from wdsprep.format.shardlist import file_kind, is_url
from wdsprep.remote.urls import redact


class ShardError(DataError):
    """A shard (or one of its samples) cannot be read; the message names the shard and key."""


class Fetched(Protocol):
    """A shard's bytes brought here by the layers above (``wdsprep.remote``'s ``LocalCopy``): an
    open descriptor for positional reads, and its size (the descriptor's file may be larger)."""

    fd: int
    size: int


# Shard files one process keeps open at once.  Samples waiting in the loader's buffers reference
# their shard, so small shards and large buffers could otherwise hold more files open than the
# usual limit of 1024 ("Too many open files"); the oldest are closed and reopened on demand.
MAX_OPEN_SHARDS = 64
_open: OrderedDict[int, weakref.ref[ShardFile]] = OrderedDict()  # id -> file, oldest opened first


class ShardFile:
    """A local shard open for positional reads; slicing it reads those bytes (one ``pread``).

    Lives as long as the samples that need it (they hold it), but keeps a file descriptor only
    while it is among the :data:`MAX_OPEN_SHARDS` most recently opened; a read after that reopens
    the file and checks it is still the same one (device, inode, size, mtime).

    A fetched shard (``copy``: a pipe's or URL's bytes in memory or in the local cache) keeps the
    copy's descriptor for its whole life instead: it is the memory itself, or a cache file that
    may be evicted (unlinked) while it is read.  ``url`` then only names it in messages (with its
    secrets masked by whoever fetched it).
    """

    __slots__ = ("url", "fd", "size", "ident", "copy", "__weakref__")

    def __init__(self, url: str, copy: Fetched | None = None) -> None:
        self.url = url
        self.fd = -1
        self.ident: tuple[int, ...] | None = None
        self.copy = copy
        if copy is not None:
            self.fd, self.size = copy.fd, copy.size
            return
        self._open()
        self.size = self.ident[2]  # type: ignore[index]

    def _open(self) -> int:
        # O_NONBLOCK: a FIFO that matched a shard glob would otherwise block the open for good.
        fd = os.open(self.url, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ShardError(f"shard {self.url} is not a regular file (a {file_kind(st.st_mode)}): only files "
                             f"(or URLs) are shards; remove it from the shard list")
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self.ident is not None and ident != self.ident:
            os.close(fd)
            raise ShardError(f"shard {self.url} was replaced or changed while samples from it were waiting "
                             f"to be read; don't rewrite shards during training")
        self.ident, self.fd = ident, fd
        _open[id(self)] = weakref.ref(self)
        while len(_open) > MAX_OPEN_SHARDS:
            _, ref = _open.popitem(last=False)
            old = ref()
            if old is not None:
                old._close()
        return fd

    def _close(self) -> None:
        if self.copy is not None:
            return  # the copy's descriptor goes with the copy, when nothing holds this shard any more
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            _open.pop(id(self), None)

    def fileno(self) -> int:
        """An open descriptor of the shard (reopening it if it was closed)."""
        return self.fd if self.fd >= 0 else self._open()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        # Callers slice with 0 <= start; pread itself stops at the end of the file, and a fetched
        # copy's buffer (which may be larger, reused) at the shard's size.
        stop = min(s.stop, self.size) if self.copy is not None else s.stop
        return os.pread(self.fileno(), stop - s.start, s.start) if stop > s.start else b""

    def readinto(self, out: np.ndarray, offset: int, what: str) -> None:
        """Fill ``out`` (C-contiguous) with the bytes at ``offset``; ShardError naming ``what`` when short."""
        fd = self.fileno()
        view = memoryview(out).cast("B")
        if self.copy is not None and offset + len(view) > self.size:  # past the shard, in a reused buffer
            view = view[:max(0, self.size - offset)]
        done = os.preadv(fd, [view], offset)
        while done < out.nbytes:  # regular files only read short at the end of the file
            more = os.preadv(fd, [view[done:]], offset + done) if done < len(view) else 0
            if more == 0:
                raise ShardError(f"shard {self.url}: {what}: needs {out.nbytes} bytes at byte {offset}, "
                                 f"the file ends after {done}: was it changed or truncated while training "
                                 f"read it? Re-create it (wdsprep pack) or remove it from the shard list")
            done += more

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # interpreter shutdown took os or the registry first; the OS closes the file
            pass


Source = Union[bytes, bytearray, memoryview, ShardFile]


class FileFeats:
    """A feature matrix left in its shard: the collate reads it straight into the batch.

    Has ``shape`` and ``dtype`` like the array it stands for; ``np.asarray`` reads it.
    """

    __slots__ = ("file", "offset", "shape", "dtype", "key")

    def __init__(self, file: ShardFile, offset: int, shape: tuple[int, int], dtype: np.dtype, key: str) -> None:
        self.file = file
        self.offset = offset
        self.shape = shape
        self.dtype = dtype
        self.key = key
        untrack(self)

    def read_into(self, out: np.ndarray) -> None:
        """Fill ``out``, a C-contiguous array of this shape and dtype."""
        self.file.readinto(out, self.offset, f"utterance {uttid_for_message(self.key)!r}")

    def read(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.read_into(out)
        return out

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        out = self.read()
        return out if dtype is None else out.astype(dtype, copy=False)


class RowReads:
    """The bulk read of a batch's rows (see :func:`read_rows`), prepared in the calling thread;
    :meth:`start` it once, then :meth:`wait` for it.

    The shards' descriptors are duplicated for the read: while it runs in another thread, the
    stages may open the next shard and so close one of these (see :data:`MAX_OPEN_SHARDS`), and a
    closed descriptor's number is soon reused by another file.
    """

    def __init__(self, files: Sequence[ShardFile], offsets: np.ndarray, nbytes: np.ndarray, itemsize: int) -> None:
        self.itemsize = itemsize
        self.reader: Any = None
        self.short = -1
        # bad[i]: row i holds a NaN or an infinity (checked in C right after its read).
        self.bad = np.zeros(len(files), np.uint8)
        self.fds: dict[ShardFile, int] = dict.fromkeys(files, -1)
        try:
            for file in self.fds:
                self.fds[file] = os.dup(file.fileno())
            self.rows = np.empty((len(files), 3), np.int64)  # fd, offset, nbytes: what the C part reads
            self.rows[:, 0] = list(map(self.fds.__getitem__, files))
            self.rows[:, 1] = offsets
            self.rows[:, 2] = nbytes
        except BaseException:
            self.close()
            raise

    def start(self, out: np.ndarray, reader: Any = None) -> None:
        """Read row ``i`` into ``out[i, :frames]`` and zero the rest of it: on ``reader``'s thread
        (a :func:`row_reader`; ``out`` is then not to be touched until :meth:`wait`), or now.
        float16 rows read into a float32 ``out`` are converted on the way."""
        half = self.itemsize == 2 and out.dtype == np.float32
        try:
            if reader is not None:
                reader.submit(out, out[0].nbytes, self.rows, half, self.bad)
                self.reader = reader
            else:
                self.short = native.lib.read_rows(out, out[0].nbytes, self.rows, half, self.bad)
        except BaseException:
            self.close()
            raise

    def wait(self) -> int:
        """How many rows were read (all, or those before the first whose shard ended early)."""
        try:
            if self.reader is not None:
                self.short = self.reader.wait()
        finally:
            self.close()
        return len(self.rows) if self.short < 0 else self.short

    def close(self) -> None:
        for fd in self.fds.values():
            if fd >= 0:
                os.close(fd)
        self.fds = {}


def read_rows(out: np.ndarray, feats: Sequence[FileFeats]) -> int:
    """Read ``feats[i]`` into ``out[i, :frames]`` and zero the rest of the row, in C; how many rows were done.

    ``out`` is a C-contiguous [B, T, D] array of the features' dtype, or float32 for float16
    features (converted on the way).  The features have one dtype.  Fewer than ``len(feats)``
    rows are done when the C part is not built or when a shard ends before row ``i``'s features
    (the caller's :meth:`FileFeats.read_into` of that row then raises the error naming it).
    """
    if not feats:
        return 0
    itemsize = feats[0].dtype.itemsize
    reads = bulk_reads([f.file for f in feats], np.array([f.offset for f in feats], np.int64),
                       np.array([f.shape[0] * f.shape[1] * itemsize for f in feats], np.int64), itemsize)
    if reads is None:
        return 0
    reads.start(out)
    return reads.wait()


def bulk_reads(files: Sequence[ShardFile], offsets: np.ndarray, nbytes: np.ndarray, itemsize: int) -> RowReads | None:
    """``nbytes[i]`` at ``offsets[i]`` of ``files[i]`` for each row, as one :class:`RowReads`; None
    without the C part (read them one by one)."""
    return None if native.lib is None or not len(files) else RowReads(files, offsets, nbytes, itemsize)


def row_reader() -> Any:
    """A thread in C that runs :class:`RowReads` in the background, started with the first; None
    without the C part.  ``close()`` it: that waits for reads in flight and ends the thread."""
    return None if native.lib is None else native.lib.RowReader()


def open_shard(path: str, *, whole: bool = False) -> Source:
    """A local shard as a :class:`ShardFile`; with ``whole``, its bytes read at once.

    A pipe's or URL's shard is not opened here: the layers above fetch it (with the user's retries)
    and hand it over as a :class:`ShardFile` over the copy (``source=`` of the readers)."""
    if is_url(path):
        raise TypeError(f"{redact(path)}: not fetched; the format reads local files and fetched copies: fetch it "
                        f"first (wdsprep.loading.readahead.fetched_shard) and pass it as source=")
    if whole:
        with open(path, "rb") as f:
            return f.read()
    return ShardFile(path)


# Bytes per POSIX_FADV_WILLNEED call.  Linux reads at most max(readahead window, the device's
# largest request) per call, and the window is 128 KiB by default: a larger chunk would leave
# holes.  From Python each call is a GIL hand-off, which a busy main thread makes cost up to the
# switch interval (5 ms), so without the C part fewer, larger calls (holes and all) do better.
_READAHEAD_CHUNK = 128 << 10
_READAHEAD_CHUNK_PY = 8 << 20


def _readahead(url: str) -> None:
    """Have the kernel read the whole local file ``url`` into the page cache (reads in flight on return)."""
    try:
        fd = os.open(url, os.O_RDONLY)
    except OSError:
        return  # reported when the shard itself is read
    try:
        size = os.fstat(fd).st_size
        if native.lib is not None:
            native.lib.readahead(fd, size, _READAHEAD_CHUNK)  # without the GIL; skips a cached file
        elif hasattr(os, "posix_fadvise"):
            for offset in range(0, size, _READAHEAD_CHUNK_PY):
                os.posix_fadvise(fd, offset, _READAHEAD_CHUNK_PY, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Readahead:
    """Shards waiting to be read ahead, and whether a thread is working through them.

    Asking for a whole shard can block for ~50 ms while the requests queue up at the disk, so it
    happens in a thread that lives only while there is work: no thread is left running when a
    DataLoader forks its workers, and :func:`os.register_at_fork` gives a child a fresh state.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: deque[str] = deque()
        self.running = False

    def put(self, url: str) -> None:
        with self.lock:
            self.pending.append(url)
            if self.running:
                return
            self.running = True
        threading.Thread(target=self._drain, name="wdsprep-readahead", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self.lock:
                if not self.pending:
                    self.running = False
                    return
                url = self.pending.popleft()
            _readahead(url)


_ahead = _Readahead()


def _fresh_readahead() -> None:
    global _ahead
    _ahead = _Readahead()  # the parent's lock may have been held by its thread, which the child lacks


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_readahead)


def prefetch_shard(url: str) -> None:
    """Start reading a local shard into the page cache in the background (pipes and URLs: no-op).

    The loader calls it for the next shard while the current one is decoded, so a cold read
    overlaps the work.  The kernel's own readahead would not help: the walk reads one header every
    few hundred KB, and the collate reads features in shuffled order.  A shard already cached
    costs ~20 us.
    """
    if not is_url(url):
        _ahead.put(url)

