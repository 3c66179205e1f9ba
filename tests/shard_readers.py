"""Readers the tests (and the benchmarks) hold the library's against, kept out of the library.

``iter_tar_samples`` is the reference: Python's ``tarfile``, slow but independent of webdataset
and of the library's fast walk.  ``iter_shard_samples`` is the library's walk (C or Python) with
each member's raw bytes, and ``decode_npy`` the library's ``.npy`` rules on bytes in memory.
"""

from __future__ import annotations

import os
import tarfile
from typing import Iterator

import numpy as np

from wdsprep.format.keys import split_member
from wdsprep.format.npy import as_features, npy_header_end, npy_layout
from wdsprep.format.samples import OnCorrupt, shard_samples
from wdsprep.format.tar import member_bytes


def iter_tar_samples(path: str | os.PathLike) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {ext: bytes}) for each sample of a tar, read with the standard library."""
    current: str | None = None
    members: dict[str, bytes] = {}
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            key, ext = split_member(m.name)
            data = tf.extractfile(m).read()
            if key != current:
                if current is not None:
                    yield current, members
                current, members = key, {}
            members[ext] = data
    if current is not None:
        yield current, members


def iter_shard_samples(url: str, *, on_error: str = "warn", on_corrupt: OnCorrupt | None = None,
                       whole: bool = False) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) for every sample of a shard, through the library's walk.

    ``whole=True`` reads a local file into memory at once instead of by positional reads (same result).
    Damage is reported as the loader reports it (:func:`~wdsprep.format.samples.shard_samples`).
    """
    for src, key, group in shard_samples(url, on_error=on_error, on_corrupt=on_corrupt, whole=whole):
        yield key, {ext: member_bytes(src, m) for ext, m in group.items()}


def decode_npy(buf: bytes | bytearray | memoryview, *, float32: bool = True) -> np.ndarray:
    """A 2-D feature matrix from ``.npy`` bytes, by the rules the readers apply (no pickle, only
    little-endian float16/32/64, 2-D); float16 stays float16 with ``float32=False``."""
    view = memoryview(buf)
    dtype, fortran, shape, start = npy_layout(bytes(view[:npy_header_end(bytes(view[:12]))]), len(view))
    flat = np.frombuffer(view, dtype=dtype, count=shape[0] * shape[1], offset=start)
    return as_features(flat, shape, fortran, float32)
