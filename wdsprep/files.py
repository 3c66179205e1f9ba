"""Output files appear whole or not at all.

Everything wdsprep writes (shards, arks, indexes, reports, tokenizers, plots) is written under a
hidden temporary name in the destination folder and renamed to its final name once complete, so
an interrupted or failed job never leaves a file under a final name; ``os.replace`` is atomic
within a file system.  The temporary name starts with a dot and ends in :data:`TMP_SUFFIX`, so
globs such as ``data-*.tar`` never match it, and ``pack --overwrite`` knows what to clean up.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

TMP_SUFFIX = ".tmp"


def temp_path(path: str | os.PathLike) -> Path:
    """The hidden name ``path`` is written under until it is complete."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Write to the yielded temporary path; on leaving the block it becomes ``path``, or is removed
    if the block raised."""
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
