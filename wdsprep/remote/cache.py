"""An optional local cache of fetched shards: bounded in bytes, least recently used out first.

Files mirror the URLs (``DIR/s3/BUCKET/KEY``, ``DIR/http/HOST_PORT/PATH``, ``DIR/pipe/DIGEST.tar``),
so ``du`` and ``ls`` show what is cached.  A shard is downloaded under a temporary name and
renamed when complete (``wdsprep.files.atomic_path``): an interrupted download never leaves a
file under its final name.  A cached file is used only when its size is the one the index
records, and, where the index records the shard's SHA-256, its bytes hash to it (one read of the
file, which also brings it into the page cache for the reader); otherwise it is fetched again.

Several processes (the ranks and workers of a node) may share one directory:

- one download per file: a process takes an exclusive ``flock`` on the file's lock
  (``DIR/.locks/``) before fetching it, and whoever waited finds it there when the lock is free;
- eviction runs under one lock of its own and only unlinks: a reader that has the file open
  keeps reading it (POSIX keeps an unlinked file's data until it is closed), and one that finds it
  gone fetches it again.  A shard is opened before anything is evicted, so a cache smaller than one
  shard still works (the file is read from its open descriptor);
- a temporary file left by a killed process is removed by the next eviction, once its lock is free.

A use refreshes a file's mtime: the eviction order is the order of last use.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from wdsprep.files import TMP_SUFFIX, atomic_path, file_sha256, make_dir, temp_path
from wdsprep.remote.fetch import FileSink, LocalCopy, RetryPolicy, Timing, fetch_into
from wdsprep.remote.stores import cache_parts

LOCKS = ".locks"


def _safe(parts: list[str]) -> list[str]:
    """Path parts that stay inside the cache: no empty or ``.`` parts, ``..`` escaped, and no
    leading dot (a cached file never looks like a temporary file or the lock folder)."""
    out = []
    for p in parts:
        if p in ("", "."):
            continue
        out.append("_" + p if p.startswith(".") else p)
    return out


class ShardCache:
    """Fetched shards in ``root``, at most ``max_bytes`` of them (None: no bound)."""

    def __init__(self, root: str | os.PathLike, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {max_bytes}")
        self.root = make_dir(root)
        self.max_bytes = max_bytes
        make_dir(self.root / LOCKS)
        self._evicting = threading.Lock()

    def path_for(self, url: str) -> Path:
        """Where ``url`` is cached (its store says: :meth:`~wdsprep.remote.stores.Store.cache_parts`)."""
        return self.root.joinpath(*_safe(cache_parts(url)))

    def _lock_path(self, path: Path) -> Path:
        return self.root / LOCKS / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".lock")

    @contextmanager
    def _locked(self, lock: Path, *, wait: bool = True) -> Iterator[bool]:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _hit(self, path: Path, expected: int | None, checksum: str | None) -> LocalCopy | None:
        """The cached file open, if it is there and of the expected size and checksum."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        size = os.fstat(fd).st_size
        if (expected is not None and size != expected) or (checksum is not None and file_sha256(fd) != checksum):
            os.close(fd)  # an older version of the shard: fetched again, under the lock
            return None
        try:
            os.utime(path)  # the eviction order is the order of last use
        except OSError:
            pass
        return LocalCopy(fd, size, path=str(path))

    def fetch(self, url: str, *, expected: int | None = None, checksum: str | None = None,
              policy: RetryPolicy = RetryPolicy(), cancel: threading.Event | None = None,
              timing: Timing | None = None) -> tuple[LocalCopy, int, bool]:
        """``url`` from the cache, fetching it first if needed: (open copy, retries, was it a hit);
        ``timing``: how the download went, where there was one."""
        path = self.path_for(url)
        hit = self._hit(path, expected, checksum)
        if hit is not None:
            return hit, 0, True
        make_dir(path.parent)
        with self._locked(self._lock_path(path)):
            hit = self._hit(path, expected, checksum)  # another process fetched it while this one waited
            if hit is not None:
                return hit, 0, True
            fd = -1
            try:
                with atomic_path(path) as tmp:
                    with open(tmp, "w+b") as f:
                        retries = fetch_into(url, FileSink(f), expected=expected, checksum=checksum, policy=policy,
                                             cancel=cancel, timing=timing)
                        f.flush()
                        # Kept open across the rename: an eviction (another thread or process) may
                        # unlink the final name the moment it exists, and this copy must stay readable.
                        fd = os.dup(f.fileno())
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                raise
        copy = LocalCopy(fd, os.fstat(fd).st_size, path=str(path))
        self.evict()
        return copy, retries, False

    def evict(self) -> int:
        """Remove least recently used files until the cache holds at most ``max_bytes``, and
        temporary files nobody is writing; bytes removed."""
        if self.max_bytes is None:
            return 0
        removed = 0
        with self._evicting, self._locked(self.root / LOCKS / "evict.lock"):
            files: list[tuple[int, int, Path]] = []
            for folder, dirs, names in os.walk(self.root):
                if folder == str(self.root):
                    dirs[:] = [d for d in dirs if d != LOCKS]
                for name in names:
                    p = Path(folder) / name
                    try:
                        st = p.stat()
                    except FileNotFoundError:
                        continue
                    if name.startswith(".") and name.endswith(TMP_SUFFIX):
                        final = p.with_name(name[1:-len(TMP_SUFFIX)])
                        if temp_path(final) == p:
                            with self._locked(self._lock_path(final), wait=False) as free:
                                if free:  # left by a process that died mid-download
                                    p.unlink(missing_ok=True)
                        continue
                    files.append((st.st_mtime_ns, st.st_size, p))
            total = sum(size for _, size, _ in files)
            for _, size, p in sorted(files):
                if total <= self.max_bytes:
                    break
                try:
                    p.unlink()
                    removed += size
                except FileNotFoundError:
                    pass  # another process evicted it
                total -= size
        return removed
