"""Output files appear whole or not at all, and an IO error names the file it happened on.

Everything wdsprep writes (shards, arks, indexes, reports, tokenizers, plots) is written under a
hidden temporary name in the destination folder and renamed to its final name once complete, so
an interrupted or failed job never leaves a half-written file under a final name; ``os.replace``
is atomic within a file system.  The temporary name starts with a dot and ends in
:data:`TMP_SUFFIX`, so globs such as ``data-*.tar`` never match it, and ``pack --overwrite``
knows what to clean up.  Output of many files that only make sense together (a pack's shards,
indexes and report) is committed as a whole: :mod:`wdsprep.format.commit`.

A ``write()`` or ``close()`` that fails (a full disk: ``ENOSPC``) raises an ``OSError`` naming no
file; :func:`naming` gives it the name of the file being written, so the message can say where.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

TMP_SUFFIX = ".tmp"
# The longest line a line-by-line input (a Kaldi table, a JSON-lines manifest) may have, in bytes:
# a longer one is no table's line (a device such as /dev/zero, a gzip bomb's one line of gigabytes).
MAX_LINE_BYTES = 16 << 20


def temp_path(path: str | os.PathLike) -> Path:
    """The hidden name ``path`` is written under until it is complete."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


@contextmanager
def naming(path: str | os.PathLike, *aliases: str | os.PathLike) -> Iterator[None]:
    """An ``OSError`` raised in the block about no file (or about one of ``aliases``, e.g. the
    temporary name) is re-raised about ``path``: the error then names the file the user knows."""
    try:
        yield
    except OSError as e:
        if e.errno is not None and (e.filename is None or str(e.filename) in {str(a) for a in aliases}):
            e.filename, e.filename2 = str(path), None
        raise


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Write to the yielded temporary path; on leaving the block it becomes ``path``, or is removed
    if the block raised.  An ``OSError`` of the write or the rename names ``path``.

    Nothing at ``path`` is opened, so nothing there is followed or waited on: a symbolic link there
    is replaced, not written through (into a file anywhere on the disk), and a FIFO is replaced, not
    opened (which waits for a reader forever).  Whatever a killed job left at the temporary name (a
    planted link too) is removed first, never written through."""
    tmp = temp_path(path)
    try:
        with naming(path, tmp):
            clear_path(tmp)
            yield tmp
            os.replace(tmp, path)
    except BaseException:
        try:
            clear_path(tmp)
        except OSError:  # e.g. its folder is a file: the error being raised already says so
            pass
        raise


@contextmanager
def atomic_named(path: str | os.PathLike) -> Iterator[Path]:
    """:func:`atomic_path` for a writer that picks its format by the file's name (lhotse's
    ``to_file``: ``.jsonl.gz``): the yielded path has ``path``'s name, in a hidden temporary folder
    beside it, which goes once the file is renamed into place (or the block raised)."""
    path = Path(path)
    folder = temp_path(path)
    inside = folder / path.name
    with naming(path, folder, inside):
        clear_path(folder)
        folder.mkdir()
        try:
            yield inside
            os.replace(inside, path)
        finally:
            clear_path(folder)


@contextmanager
def open_output(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """``open(path, mode)`` for writing a file whole (:func:`atomic_path`): the writes go to the
    temporary name, created anew (:func:`open_new`)."""
    with atomic_path(path) as tmp, open_new(tmp, mode, **kwargs) as f:
        yield f


def open_new(tmp: str | os.PathLike, mode: str = "wb", **kwargs: Any) -> IO[Any]:
    """A temporary file opened for writing as a new file: whatever stands at ``tmp`` (a killed job's
    leftover, a planted link or FIFO) is removed first, and the open is exclusive (mode ``x``,
    ``O_EXCL``), so no write goes through a link or waits on a FIFO."""
    clear_path(Path(tmp))
    return open(tmp, mode.replace("w", "x"), **kwargs)


def clear_path(p: Path) -> None:
    """Remove what ``p`` names, whatever it is, without following it: a file, a link, a FIFO or a
    folder (its own entries; links in it are removed, not followed)."""
    import shutil

    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``Path.write_text`` (UTF-8), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``Path.write_bytes``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def make_dir(path: str | os.PathLike) -> Path:
    """``mkdir -p path``; when a file stands where a folder must be, the error names that file."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        where = "" if blocker == path else f", so the folder {path} cannot be made there"
        raise NotADirectoryError(f"{blocker} is a file, not a folder{where}; pick another path or move the file") \
            from None
    return path


def sync(path: str | os.PathLike) -> None:
    """Flush a file's data, or a folder's entries (names made by rename), to the disk.

    A job that declares its output complete syncs it first: after a power cut, what the
    declaration covers must be on the disk, not only in the page cache.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(file: str | os.PathLike | int) -> str:
    """The SHA-256 (hex) of a file's bytes, by path or open descriptor (read by position, from 0):
    what an index records of each shard (~0.8 s per GB on the build machine)."""
    import hashlib

    h = hashlib.sha256()
    fd = file if isinstance(file, int) else os.open(file, os.O_RDONLY)
    try:
        at = 0
        while chunk := os.pread(fd, 4 << 20, at):
            h.update(chunk)
            at += len(chunk)
    finally:
        if not isinstance(file, int):
            os.close(fd)
    return h.hexdigest()


def read_small(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of a small file (a pack's plan, an option's JSON file), refused before it is read
    unless it is a regular file of at most ``limit`` bytes: a FIFO there would wait for a writer
    forever, a device (a link to ``/dev/zero``) has no end.  ValueError naming ``path`` and
    ``what`` it should be; FileNotFoundError (and other OSErrors) as ``open`` raises them."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, without a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is {file_kind(st.st_mode)}, not a regular file ({what} must be one)")
        if st.st_size > limit:
            raise ValueError(f"{path} holds {st.st_size:,} bytes, more than {what} can ({limit:,}); is it the "
                             f"right file?")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while read
                raise ValueError(f"{path} holds more than {limit:,} bytes, more than {what} can; is it the right "
                                 f"file?")
        return b"".join(chunks)
    finally:
        os.close(fd)


def bounded_lines(f: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) of each line of ``f``, each read up to ``limit`` bytes; a longer line is
    yielded as None and ends the reading (what follows it is not read: it has no end in sight)."""
    number = 0
    while line := f.readline(limit + 1):
        number += 1
        if len(line) > limit and not line.endswith(b"\n"):
            yield number, None
            return
        yield number, line


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) that is no regular file is, for a message: ``"a FIFO"``, ..."""
    import stat

    return ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")


def not_regular(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it is there but no regular file (``"a FIFO"``, ``"a device"``, ...), for
    a message; None for a regular file or nothing there.  Links are followed, as ``open`` does."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)
