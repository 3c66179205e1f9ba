"""Writing one tar shard in a layout, under a temporary name until it is complete."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

from wdsprep.files import temp_path
from wdsprep.format.index import ShardInfo
from wdsprep.format.keys import encode_key, layout_exts
from wdsprep.format.npy import npy_bytes


class _Hashing:
    """A file written through, hashing (SHA-256) every byte on the way: a shard's checksum, for its
    index, at no extra read (0.8 s per GB of CPU)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.hash = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()


class ShardWriter:
    """Writes one tar shard under a temporary name; ``close()`` renames it to its final name.

    An interrupted job therefore never leaves a half-written file under a final name.  The tar
    is what webdataset's ``TarWriter`` writes (POSIX tar via the standard library), without
    importing webdataset, which imports torch: seconds per worker process for no gain.
    """

    def __init__(self, path: str | os.PathLike, layout: str = "cat", mtime: float | None = None):
        self.path = Path(path)
        self.tmp_path = temp_path(self.path)
        self.feat_ext, self.text_ext = layout_exts(layout)
        self.info = ShardInfo(self.path.name)
        # A fixed mtime makes shards byte-for-byte reproducible from the same inputs.
        self.mtime = time.time() if mtime is None else mtime
        # A large buffer: tarfile copies members in 16 KiB pieces, one write() syscall each otherwise.
        self._file = open(self.tmp_path, "wb", buffering=4 << 20)
        self._hashing = _Hashing(self._file)
        self._tar = tarfile.open(fileobj=self._hashing, mode="w", format=tarfile.PAX_FORMAT)

    def _add(self, name: str, data: bytes) -> None:
        member = tarfile.TarInfo(name)
        member.size, member.mtime, member.mode = len(data), self.mtime, 0o444
        self._tar.addfile(member, io.BytesIO(data))

    def write(self, uttid: str, feats: np.ndarray, text: str) -> None:
        key = encode_key(uttid)
        text_bytes = text.encode("utf-8")
        self._add(f"{key}.{self.feat_ext}", npy_bytes(feats))
        self._add(f"{key}.{self.text_ext}", text_bytes)
        self.info.keys.append(key)
        self.info.frames.append(int(feats.shape[0]))
        self.info.text_lens.append(len(text))

    def __len__(self) -> int:
        return self.info.num_utts

    def close(self) -> ShardInfo:
        """Finish the tar and give it its final name."""
        self._tar.close()  # writes the end-of-archive blocks; the file is ours to close
        self._file.close()
        os.replace(self.tmp_path, self.path)
        self.info.sha256 = self._hashing.hash.hexdigest()
        return self.info

    def abort(self) -> None:
        """Drop the partial shard."""
        try:
            self._tar.close()
            self._file.close()
        finally:
            self.tmp_path.unlink(missing_ok=True)
