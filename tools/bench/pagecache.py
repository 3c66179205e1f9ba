"""Page-cache control for benchmarks and tests: evict files, read them, see how much is cached.

Nothing here needs root: ``posix_fadvise(DONTNEED)`` drops a file's clean pages, ``mincore`` says
which pages are resident.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Sequence


def evict(files: Sequence[os.PathLike | str]) -> None:
    """Drop ``files`` from the page cache (no root needed). Dirty pages cannot be dropped, so sync first."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(files: Sequence[os.PathLike | str], bufsize: int = 1 << 20, buffers: int = 1) -> int:
    """Read every byte of ``files`` into ``buffers`` reused buffers in turn; the I/O floor for any shard reader.

    One 1 MiB buffer stays in the CPU cache.  Two buffers of a batch's size do not, as a loader's
    batches do not: that is the copy any loader handing out batches must make.
    """
    views = [memoryview(bytearray(bufsize)) for _ in range(buffers)]
    total = i = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(views[i % buffers]):
                total += n
                i += 1
    return total


def resident_fraction(files: Sequence[os.PathLike | str]) -> float | None:
    """Fraction of the files' pages in the page cache (``mincore``), to check eviction worked; None if unknown."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        res = tot = 0
        for f in files:
            size = os.path.getsize(f)
            if size == 0:
                continue
            with open(f, "rb") as fh:
                # ACCESS_COPY gives a writable buffer ctypes can take an address of; nothing is written.
                mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
                try:
                    npages = (size + page - 1) // page
                    vec = (ctypes.c_ubyte * npages)()
                    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
                    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                        return None
                    res += sum(v & 1 for v in bytes(vec))
                    tot += npages
                    del addr
                finally:
                    try:
                        mm.close()
                    except BufferError:  # a ctypes view still alive; the GC closes it
                        pass
        return res / tot if tot else None
    except (OSError, AttributeError, TypeError, ValueError):
        return None
