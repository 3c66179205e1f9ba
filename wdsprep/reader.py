"""Fast shard reading: tar headers walked with positional reads, features read straight into the batch.

Python's ``tarfile`` plus ``np.load`` (webdataset's default path) spends ~10x longer than reading
the same bytes.  Here a local shard is never read as a whole: the walk reads each 512-byte header
together with the first bytes of its member (enough for the ``.npy`` header and most transcripts),
one ``pread`` per member, and a sample's features stay on disk (shard, offset, shape: a row of
:class:`~wdsprep.records.Records` for the loader, a :class:`FileFeats` otherwise) until the
collate reads them straight into their row of the batch.  That is the only copy of the feature
bytes, and samples waiting in the shuffle and bucketing buffers cost a few hundred bytes each,
whatever the size of the data set.

Shards from pipes and URLs are read into memory whole and sliced the same way.  Anything unusual
about a tar (sparse files, pax records beyond path/size...) falls back to ``tarfile``, so the fast
path never has to be complete.

The plain case of the walk (for the loader, up to whole samples), the collate's row reads and the
shard readahead run in C (``wdsprep/_native.c``) when it was built; anything else, and everything
when ``WDSPREP_PURE_PYTHON=1`` is set, takes the Python code below, which stays the reference the
tests compare the C with.

Nothing is ever unpickled: ``.npy`` headers are parsed with :func:`ast.literal_eval` (literals
only) and only little-endian float dtypes are accepted.
"""

from __future__ import annotations

import ast
import functools
import io
import itertools
import os
import re
import subprocess
import tarfile
import threading
import warnings
import weakref
from collections import OrderedDict, deque
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np

from wdsprep.records import Records
from wdsprep.shardlist import is_url
from wdsprep.shards import LAYOUTS, decode_key, split_name

_native: Any
try:
    from wdsprep import _native
except ImportError:  # installed without a C compiler: the same results, slower
    _native = None
if os.environ.get("WDSPREP_PURE_PYTHON", "") not in ("", "0"):
    _native = None


def _tracked(obj: Any) -> Any:
    return obj


# FileFeats, which a caller may keep by the thousand (the loader's buffers once held one per
# utterance), are taken off the cyclic GC's books: as tracked objects they were promoted to the
# oldest generation and triggered about one full collection per epoch, ~10% of the loader's time.
# They cannot be part of a reference cycle: they hold strings, tuples and shard files.
untrack: Callable[[Any], Any] = _native.untrack if _native is not None else _tracked

BLOCK = 512
# Member bytes read together with each header: a .npy header (128 bytes as numpy writes it) and
# transcripts up to this size come with the header's pread instead of needing their own.
PEEK = 512
_ZERO_BLOCK = bytes(BLOCK)
# Type flags of members that carry data ('0', and '\0' from pre-POSIX writers) or nothing to read.
_REGULAR = (b"0", b"\0", b"7")
_SKIP = (b"5", b"1", b"2", b"3", b"4", b"6")  # directories, links, devices, fifos
# dtypes a feature matrix may have on disk; everything else (object, big-endian, ints) is refused.
_NPY_DTYPES = {"<f4": np.dtype("<f4"), "<f2": np.dtype("<f2"), "<f8": np.dtype("<f8")}
_NPY_MAGIC = b"\x93NUMPY"
_PAX_KNOWN = frozenset({"path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"})
_MTIME_ONLY = re.compile(rb"\A\d+ mtime=[0-9.]+\n\Z")
# The header numpy itself writes; a regex is ~10x faster than literal_eval, which remains the fallback.
_NPY_HEADER_RE = re.compile(
    r"^\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), 'shape': \(((?:\d+, ?)*\d*)\), \}")


class ShardError(ValueError):
    """A shard (or one of its samples) cannot be read; the message names the shard and key."""


# One regular file in a tar: (name, offset of its data, size, its first PEEK bytes).  A plain
# tuple, not a NamedTuple or dataclass: a shard's members stay alive while it is read, and the
# GC stops tracking exact tuples of plain values only.  Tracked objects that live long (members,
# samples waiting in the buffers) are what drives CPython's full collections, which cost the
# loader ~15% of its time before.
Member = tuple[str, int, int, bytes]


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
    """

    __slots__ = ("url", "fd", "size", "ident", "__weakref__")

    def __init__(self, url: str) -> None:
        self.url = url
        self.fd = -1
        self.ident: tuple[int, ...] | None = None
        self._open()
        self.size = self.ident[2]  # type: ignore[index]

    def _open(self) -> int:
        fd = os.open(self.url, os.O_RDONLY)
        st = os.fstat(fd)
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
        # Callers slice with 0 <= start; pread itself stops at the end of the file.
        return os.pread(self.fileno(), s.stop - s.start, s.start) if s.stop > s.start else b""

    def readinto(self, out: np.ndarray, offset: int, what: str) -> None:
        """Fill ``out`` (C-contiguous) with the bytes at ``offset``; ShardError naming ``what`` when short."""
        fd = self.fileno()
        view = memoryview(out).cast("B")
        done = os.preadv(fd, [view], offset)
        while done < len(view):  # regular files only read short at the end of the file
            more = os.preadv(fd, [view[done:]], offset + done)
            if more == 0:
                raise ShardError(f"shard {self.url}: {what}: needs {len(view)} bytes at byte {offset}, "
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
        self.file.readinto(out, self.offset, f"utterance {_uttid(self.key)!r}")

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
                reader.submit(out, out[0].nbytes, self.rows, half)
                self.reader = reader
            else:
                self.short = _native.read_rows(out, out[0].nbytes, self.rows, half)
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
    return None if _native is None or not len(files) else RowReads(files, offsets, nbytes, itemsize)


def row_reader() -> Any:
    """A thread in C that runs :class:`RowReads` in the background, started with the first; None
    without the C part.  ``close()`` it: that waits for reads in flight and ends the thread."""
    return None if _native is None else _native.RowReader()


def read_shard_bytes(url: str) -> bytes | bytearray:
    """The whole shard: a local file read at once, or a ``pipe:CMD``'s stdout, or a URL via webdataset."""
    if url.startswith("pipe:"):
        cmd = url[len("pipe:"):]
        proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-500:]
            raise ShardError(f"{url}: command exited with status {proc.returncode}: {err}")
        return proc.stdout
    if is_url(url):
        from webdataset.gopen import gopen  # only remote URLs need webdataset's openers

        with gopen(url, "rb") as f:
            return f.read()
    with open(url, "rb") as f:
        return f.read()


def open_shard(url: str, *, whole: bool = False) -> Source:
    """A local shard as a :class:`ShardFile` (or, with ``whole``, its bytes); a pipe or URL as its bytes."""
    if whole or url.startswith("pipe:") or is_url(url):
        return read_shard_bytes(url)
    return ShardFile(url)


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
        if _native is not None:
            _native.readahead(fd, size, _READAHEAD_CHUNK)  # without the GIL; skips a cached file
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
    if not (url.startswith("pipe:") or is_url(url)):
        _ahead.put(url)


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        return int.from_bytes(field[1:], "big")
    field = field.rstrip(b" \0")
    return int(field, 8) if field else 0


class _Exotic(Exception):
    """A header the fast path does not handle; use tarfile."""


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header (``"%d %s=%s\\n"`` each)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8")
        pos += length
    return out


def _first_bad_checksum(headers: list[bytes]) -> int | None:
    """Index of the first header whose checksum is wrong, or None.

    Vectorized over all headers at once: a Python ``sum`` per header cost more than the rest of
    the scan.  The checksum is the byte sum of the header with its checksum field read as spaces.
    """
    if not headers:
        return None
    blocks = np.frombuffer(b"".join(headers), np.uint8).reshape(-1, BLOCK)
    actual = blocks[:, :148].sum(1, dtype=np.int64) + blocks[:, 156:].sum(1, dtype=np.int64) + 8 * 32
    stored = np.full(len(headers), -1, np.int64)
    for i, h in enumerate(headers):
        field = h[148:156].rstrip(b" \0")
        try:
            stored[i] = int(field, 8)
        except ValueError:
            pass
    bad = np.flatnonzero(stored != actual)
    return int(bad[0]) if len(bad) else None


def scan_ustar(src: Source) -> tuple[list[Member], str | None]:
    """Walk the 512-byte headers of a tar (a :class:`ShardFile` or bytes in memory).

    Handles ustar, pax extended headers (``x``: path/size overrides; Python's tarfile writes one
    per member when mtime is a float, as webdataset's TarWriter does) and GNU long names (``L``).
    Returns the members found and, when the tar is corrupt or truncated, a description of the
    problem (the members before it are good).  Raises ``_Exotic`` for headers left to tarfile.
    """
    if _native is not None:
        found = _native.walk(src.fileno() if isinstance(src, ShardFile) else src, PEEK, len(src))
        if found is not None:  # a plain tar, all checksums right; else the walk below says what is wrong
            return found, None
    headers: list[bytes] = []  # every header walked, checksummed together at the end
    positions: list[int] = []
    owners: list[int] = []  # number of members complete before each header
    members: list[Member] = []
    problem: str | None = None
    exotic: bytes | None = None
    try:
        problem = _walk(src, headers, positions, owners, members)
    except _Exotic as e:
        exotic = e.args[0]
    bad = _first_bad_checksum(headers)
    if bad is not None:
        # The walk trusted that header's size field, so nothing from it on can be trusted.
        return members[:owners[bad]], f"header checksum mismatch at byte {positions[bad]}"
    if exotic is not None:
        raise _Exotic(exotic)
    return members, problem


def _walk(src: Source, headers: list[bytes], positions: list[int], owners: list[int],
          members: list[Member]) -> str | None:
    n = len(src)
    pos = 0
    pending: dict[str, str] = {}  # overrides from a pax/GNU header for the next member
    while True:
        if pos + BLOCK > n:
            # A tar ends with zero blocks; running out of bytes before them means truncation,
            # even at a member boundary (the cut may have split a sample's members).
            return f"truncated at byte {pos} (file has {n} bytes)"
        chunk = bytes(src[pos:pos + BLOCK + PEEK])  # one read: the header and the start of its member
        header = chunk[:BLOCK]
        if header[0] == 0 and header == _ZERO_BLOCK:
            return None
        headers.append(header)
        positions.append(pos)
        owners.append(len(members))
        typeflag = header[156:157]
        try:
            size = _octal(header[124:136])
        except ValueError:
            return f"bad size field at byte {pos}"
        if typeflag in _REGULAR and "size" in pending:
            size = int(pending["size"])
        data = pos + BLOCK
        if data + size > n:
            return f"member at byte {pos} needs {size} bytes, only {n - data} left (truncated)"
        if typeflag == b"x":
            record = chunk[BLOCK:BLOCK + size] if size <= PEEK else bytes(src[data:data + size])
            # tarfile writes an mtime-only record per member for a float mtime (webdataset's
            # TarWriter does): nothing the reader needs, and skipping its parse halves the scan.
            if not _MTIME_ONLY.match(record):
                try:
                    pending.update(_pax_records(record))
                except (ValueError, UnicodeDecodeError):
                    return f"bad pax header at byte {pos}"
                if pending.keys() - _PAX_KNOWN:
                    raise _Exotic(b"x")  # e.g. sparse-file or charset records: tarfile knows them
        elif typeflag == b"L":
            raw = chunk[BLOCK:BLOCK + size] if size <= PEEK else bytes(src[data:data + size])
            pending["path"] = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif typeflag in _REGULAR:
            if "path" in pending:
                name = pending["path"]
            else:
                raw = header[:100].split(b"\0", 1)[0]
                if header[257:262] == b"ustar":
                    prefix = header[345:500].split(b"\0", 1)[0]
                    if prefix:
                        raw = prefix + b"/" + raw
                try:
                    name = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _Exotic(b"name") from None
            members.append((name, data, size, chunk[BLOCK:BLOCK + size]))
            pending = {}
        elif typeflag in _SKIP:
            pending = {}
        else:
            raise _Exotic(typeflag)
        pos = data + (size + BLOCK - 1) // BLOCK * BLOCK


def scan_tarfile(src: Source) -> tuple[list[Member], str | None]:
    """The fallback: tarfile finds the members (pax, GNU long names...), we still slice the bytes."""
    members: list[Member] = []
    fileobj = open(src.url, "rb") if isinstance(src, ShardFile) else io.BytesIO(src)
    try:
        with fileobj, tarfile.open(fileobj=fileobj, mode="r:") as tf:
            for m in tf:
                if m.isfile():
                    if m.offset_data + m.size > len(src):
                        return members, f"member {m.name!r} truncated"
                    head = bytes(src[m.offset_data:m.offset_data + min(m.size, PEEK)])
                    members.append((m.name, m.offset_data, m.size, head))
    except tarfile.TarError as e:
        return members, f"{type(e).__name__}: {e}"
    return members, None


def member_bytes(src: Source, m: Member) -> bytes:
    """All bytes of a member (no read when the walk already has them)."""
    _, offset, size, head = m
    return head if size <= PEEK else bytes(src[offset:offset + size])


def _check_on_error(on_error: str) -> None:
    if on_error not in ("warn", "raise"):
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")


def _shard_samples(url: str, *, on_error: str, on_corrupt: Callable[[str, str | None, str], None] | None,
                   whole: bool) -> Iterator[tuple[Source, str, dict[str, Member]]]:
    """(source, key, {extension: member}) for every complete sample; damage reported at the end."""
    _check_on_error(on_error)
    src: Source
    try:
        src = open_shard(url, whole=whole)
    except (OSError, ValueError, ShardError) as e:
        members, problem, src = [], f"cannot read: {e}", b""
    else:
        try:
            members, problem = scan_ustar(src)
        except _Exotic:
            members, problem = scan_tarfile(src)

    # Group consecutive members by key, one sample at a time (a list of all groups would keep
    # thousands of dicts alive for the GC to walk).  When the tar is damaged the last group may
    # be missing members (e.g. the .npy arrived but not the .txt), so it is reported, not yielded.
    key: str | None = None
    group: dict[str, Member] = {}
    count = 0
    for m in members:
        k, ext = split_name(m[0])
        if k != key:
            if key is not None:
                count += 1
                yield src, key, group
            key, group = k, {}
        group[ext] = m
    del members
    bad_key: str | None = None
    if key is not None:
        if problem is None:
            count += 1
            yield src, key, group
        else:
            bad_key = key
    if problem is not None:
        if on_corrupt is not None:
            on_corrupt(url, bad_key, problem)
        where = f" (at or after utterance {_uttid(bad_key)!r})" if bad_key else ""
        _skip_rest(url, f"{problem}{where}; {count} samples read,", on_error)


def _skip_rest(url: str, why: str, on_error: str, cause: Exception | None = None) -> None:
    """Raise or warn (per ``on_error``) that the rest of shard ``url`` is skipped, ``why``."""
    msg = (f"shard {url}: {why} the rest of the shard skipped. "
           f"Re-create the shard (wdsprep pack) or remove it from the shard list")
    if on_error == "raise":
        raise ShardError(msg) from cause
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def iter_shard_samples(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: Callable[[str, str | None, str], None] | None = None,
    whole: bool = False,
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) for every sample of a shard.

    ``whole=True`` reads a local file into memory at once instead of by positional reads (same result).

    A corrupt or truncated shard yields its complete samples before the damage, then (with
    ``on_error="warn"``) warns naming the shard and the first key not read and stops; with
    ``on_error="raise"`` it raises :class:`ShardError`.  ``on_corrupt(url, key, why)`` is called
    either way so the caller can count it.
    """
    for src, key, group in _shard_samples(url, on_error=on_error, on_corrupt=on_corrupt, whole=whole):
        yield key, {ext: member_bytes(src, m) for ext, m in group.items()}


def _uttid(key: str | None) -> str | None:
    """The utterance id for messages; the raw key when it does not decode."""
    try:
        return decode_key(key) if key else key
    except UnicodeDecodeError:
        return key


@functools.lru_cache(maxsize=4096)  # one header per distinct shape: most repeat within a corpus
def _parse_npy_header(text: str) -> tuple[str, bool, tuple[int, ...]]:
    m = _NPY_HEADER_RE.match(text)
    if m:
        shape = tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x)
        return m.group(1), m.group(2) == "True", shape
    try:
        d = ast.literal_eval(text)  # literals only: no code runs
    except (SyntaxError, TypeError, RecursionError, MemoryError) as e:  # a damaged header
        raise ValueError(f"not an npy header ({type(e).__name__}): {text[:80]!r}") from None
    if not isinstance(d, dict) or not {"descr", "fortran_order", "shape"} <= d.keys():
        raise ValueError(f"not an npy header: {text[:80]!r}")
    return d["descr"], bool(d["fortran_order"]), tuple(int(x) for x in d["shape"])


def _npy_header_end(head: bytes) -> int:
    """Where the data of an ``.npy`` starts, from its first 12 bytes."""
    if head[:6] != _NPY_MAGIC:
        raise ValueError("not an .npy file (bad magic)")
    major = head[6] if len(head) > 6 else 0
    if major == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    if major in (2, 3):
        return 12 + int.from_bytes(head[8:12], "little")
    raise ValueError(f"unsupported .npy version {major}")


def _npy_layout(head: bytes, size: int) -> tuple[np.dtype, bool, tuple[int, int], int]:
    """(dtype, fortran order, shape, data offset) of an ``.npy`` of ``size`` bytes; ``head`` holds its header."""
    end = _npy_header_end(head)
    start = 10 if head[6] == 1 else 12
    descr, fortran, shape = _parse_npy_header(head[start:end].decode("latin1"))
    dtype = _NPY_DTYPES.get(descr)
    if dtype is None:
        raise ValueError(f"feature dtype {descr!r} refused: only little-endian float16/32/64 are read "
                         f"(object arrays would need unpickling)")
    if len(shape) != 2:
        raise ValueError(f"features must be 2-D (frames x dims), got shape {shape}")
    need = shape[0] * shape[1] * dtype.itemsize
    if end + need > size:
        raise ValueError(f"npy data truncated: shape {shape} needs {need} bytes, {size - end} present")
    return dtype, fortran, shape, end  # type: ignore[return-value]


def _as_features(flat: np.ndarray, shape: tuple[int, int], fortran: bool, float32: bool) -> np.ndarray:
    """The 2-D matrix from its flat data: float64 (and with ``float32`` float16) become float32."""
    arr = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    if flat.dtype.itemsize == 8 or (float32 and flat.dtype.itemsize == 2) or fortran:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def decode_npy(buf: bytes | bytearray | memoryview, *, float32: bool = True) -> np.ndarray:
    """A 2-D feature matrix from ``.npy`` bytes, without pickle and without copying float32 data.

    Only little-endian float16/32/64 are accepted (object arrays could only be read by unpickling).
    With ``float32=False`` float16 stays float16 (the collate converts while padding, one copy
    fewer); float64 is always converted.  The result may be a read-only view of ``buf``.
    """
    view = memoryview(buf)
    dtype, fortran, shape, start = _npy_layout(bytes(view[:_npy_header_end(bytes(view[:12]))]), len(view))
    flat = np.frombuffer(view, dtype=dtype, count=shape[0] * shape[1], offset=start)
    return _as_features(flat, shape, fortran, float32)


def _features(src: Source, m: Member, key: str, *, float32: bool, lazy: bool) -> np.ndarray | FileFeats:
    _, offset, size, head = m
    end = _npy_header_end(head)
    if end > len(head):  # a header longer than numpy writes: read all of it
        head = bytes(src[offset:offset + end])
    dtype, fortran, shape, start = _npy_layout(head, size)
    count = shape[0] * shape[1]
    if not isinstance(src, ShardFile):
        return _as_features(np.frombuffer(src, dtype, count, offset + start), shape, fortran, float32)
    feats = FileFeats(src, offset + start, shape[::-1] if fortran else shape, dtype, key)
    if lazy and not fortran and dtype.itemsize != 8:
        return feats
    return _as_features(feats.read().reshape(-1), shape, fortran, float32)


def split_sample(members: dict[str, Member]) -> tuple[Member, Member]:
    """(feature member, transcript member) of a sample in either layout, or KeyError naming what is there."""
    for feat_ext, text_ext in LAYOUTS.values():
        if feat_ext in members and text_ext in members:
            return members[feat_ext], members[text_ext]
    raise KeyError(f"no features + transcript pair among members {sorted(members)}; "
                   f"expected one of {sorted(LAYOUTS.values())}")


_LAYOUT_EXTS = [(feats.encode(), text.encode()) for feats, text in LAYOUTS.values()]  # split_sample's order
_ITEMSIZE_DTYPES = {4: _NPY_DTYPES["<f4"], 2: _NPY_DTYPES["<f2"]}


def _native_samples(url: str) -> tuple[ShardFile, list[str], list[str], np.ndarray] | None:
    """A local shard's samples as the C part reads them: the file, keys, transcripts and
    int64 [n, 4] (offset, frames, dims, item size); None when it leaves the shard to Python."""
    if _native is None or url.startswith("pipe:") or is_url(url):
        return None
    try:
        src = ShardFile(url)
    except OSError:
        return None  # the Python path reports it
    found = _native.samples(src.fileno(), PEEK, len(src), _LAYOUT_EXTS)
    if found is None:
        return None
    keys, texts, layout = found
    return src, keys, texts, np.frombuffer(layout, np.int64).reshape(-1, 4)


def _native_records(url: str) -> tuple[Records, list[str], tuple[str, Exception] | None] | None:
    """:func:`_native_samples` as one block and the raw keys, cut before the first key that does
    not decode (then also that key and why, for the caller to report after yielding the rows before it)."""
    found = _native_samples(url)
    if found is None:
        return None
    src, keys, texts, layout = found
    uttids, bad = keys, None
    if any("%" in k for k in keys):  # rare; unquoting costs more than the walk
        uttids = []
        for k in keys:
            try:
                uttids.append(decode_key(k) if "%" in k else k)
            except UnicodeDecodeError as e:
                bad = (k, e)
                break
        n = len(uttids)
        texts, layout = texts[:n], layout[:n]
    return Records.in_shard(src, uttids, texts, layout), keys, bad


def iter_records(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: Callable[[str, str | None, str], None] | None = None,
    block: int = 256,
) -> Iterator[Records]:
    """A shard's samples as :class:`~wdsprep.records.Records` of up to ``block`` rows each: what
    ``iter_decoded(url, lazy=True, float32=False)`` yields (same order, same damage handling), as
    columns.  A plain local shard takes one C call and no Python step per sample."""
    _check_on_error(on_error)
    found = _native_records(url)
    if found is not None:
        rows, _, bad = found
        for start in range(0, len(rows), block):
            yield rows[start:start + block]
        if bad is not None:
            _undecodable(url, bad[0], bad[1], on_error, on_corrupt)
        return
    samples = iter_decoded(url, on_error=on_error, on_corrupt=on_corrupt, float32=False, lazy=True)
    while chunk := list(itertools.islice(samples, block)):
        yield Records.of(chunk)


def _undecodable(url: str, key: str, e: Exception, on_error: str,
                 on_corrupt: Callable[[str, str | None, str], None] | None) -> None:
    """Report a sample that cannot be decoded (raise or warn, per ``on_error``)."""
    problem = f"sample cannot be decoded ({e})"
    if on_corrupt is not None:
        on_corrupt(url, key, problem)
    _skip_rest(url, f"utterance {_uttid(key)!r}: {problem};", on_error, e)


def iter_decoded(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: Callable[[str, str | None, str], None] | None = None,
    float32: bool = True,
    lazy: bool = False,
    whole: bool = False,
) -> Iterator[tuple[str, np.ndarray | FileFeats, str]]:
    """(utterance id, features, transcript) for every sample of a shard, either layout.

    Features are arrays in their own memory (pipe/URL shards and ``whole=True``: read-only views
    on the shard's bytes).  With ``lazy``, float16/32 features of a local shard stay on disk as
    :class:`FileFeats` until read; with ``float32=False`` float16 stays float16.

    A sample that cannot be decoded counts as corruption of the shard (same warning/raise path),
    because a shard that holds one bad sample was most likely damaged in writing or copying.
    """
    _check_on_error(on_error)
    # The loader's case in one C call per shard: the plain shards our writer makes.
    found = _native_records(url) if lazy and not whole else None
    if found is not None:
        rows, keys, bad = found
        for key, uttid, text, file, offset, frames, dims, itemsize in zip(
                keys, rows.uttids.tolist(), rows.texts.tolist(), rows.sources.tolist(), rows.offsets.tolist(),
                rows.frames.tolist(), rows.dims.tolist(), rows.itemsizes.tolist()):
            yield uttid, FileFeats(file, offset, (frames, dims), _ITEMSIZE_DTYPES[itemsize], key), text
        if bad is not None:
            _undecodable(url, bad[0], bad[1], on_error, on_corrupt)
        return
    samples = _shard_samples(url, on_error=on_error, on_corrupt=on_corrupt, whole=whole)
    for src, key, group in samples:
        try:
            feat_m, text_m = split_sample(group)
            feats = _features(src, feat_m, key, float32=float32, lazy=lazy)
            text = str(member_bytes(src, text_m), "utf-8")
            uttid = decode_key(key) if "%" in key else key  # unquote costs more than the npy decode
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            samples.close()
            _undecodable(url, key, e, on_error, on_corrupt)
            return
        yield uttid, feats, text
