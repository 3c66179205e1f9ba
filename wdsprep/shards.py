"""The shard format: sample keys, member layouts, the per-folder index and an atomic shard writer.

Everything that writes or reads shards goes through the names defined here, so the writer
(``pack``, ``pack-audio``) and the readers (loader, ``inspect``, ``verify``) cannot drift apart.

A shard is a plain POSIX tar. One sample is the pair of members that share a key:

============  ======================  ==========================
layout        features                transcript
============  ======================  ==========================
``cat``       ``<key>.npy``           ``<key>.txt``
``cat-v3``    ``<key>.mat.npy``       ``<key>.label.txt``
============  ======================  ==========================

Features are 2-D (frames x dims) in numpy's ``.npy`` format, never pickled; transcripts are
raw UTF-8 so the tokenizer can change without repacking.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote

import numpy as np

LAYOUTS: dict[str, tuple[str, str]] = {
    "cat": ("npy", "txt"),
    "cat-v3": ("mat.npy", "label.txt"),
}
INDEX_NAME = "index.json"
INDEX_VERSION = 1
TMP_SUFFIX = ".tmp"

# Bytes that survive as themselves in a key; everything else is percent-encoded.  '.' must go
# (webdataset ends a key at the first dot of a member name), and so must '/' and '%'.
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def encode_key(uttid: str) -> str:
    """Make an utterance id safe as a tar sample key; ``urllib.parse.unquote`` inverts it.

    Percent-encoding is injective (``%`` itself is encoded), so two ids never share a key.
    """
    return "".join(chr(b) if b in _KEY_SAFE else f"%{b:02X}" for b in uttid.encode("utf-8"))


def decode_key(key: str) -> str:
    """The utterance id a key was made from."""
    return unquote(key, errors="strict")


def layout_exts(layout: str) -> tuple[str, str]:
    """(features extension, transcript extension) of a layout, or a clear error."""
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown shard layout {layout!r}; choose one of {sorted(LAYOUTS)}") from None


def npy_bytes(feats: np.ndarray) -> bytes:
    """Serialize a feature matrix as ``.npy`` (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(feats), allow_pickle=False)
    return buf.getvalue()


@dataclass
class ShardInfo:
    """What the index records about one shard."""

    name: str
    keys: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    text_lens: list[int] = field(default_factory=list)

    @property
    def num_utts(self) -> int:
        return len(self.keys)

    @property
    def num_frames(self) -> int:
        return int(sum(self.frames))

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "num_utts": self.num_utts,
            "num_frames": self.num_frames,
            "keys": self.keys,
            "frames": self.frames,
            "text_lens": self.text_lens,
        }

    @classmethod
    def from_json(cls, d: dict) -> "ShardInfo":
        return cls(d["name"], list(d["keys"]), [int(x) for x in d["frames"]], [int(x) for x in d["text_lens"]])


@dataclass
class FolderIndex:
    """The index of one shard folder (``index.json``): layout, feature dims and every shard."""

    layout: str
    dims: int | None
    dtype: str
    shards: list[ShardInfo]

    @property
    def num_utts(self) -> int:
        return sum(s.num_utts for s in self.shards)

    @property
    def num_frames(self) -> int:
        return sum(s.num_frames for s in self.shards)

    def to_json(self) -> dict:
        return {
            "version": INDEX_VERSION,
            "layout": self.layout,
            "dims": self.dims,
            "dtype": self.dtype,
            "num_utts": self.num_utts,
            "num_frames": self.num_frames,
            "shards": [s.to_json() for s in self.shards],
        }


def write_index(folder: str | os.PathLike, index: FolderIndex) -> Path:
    """Write ``folder/index.json`` atomically."""
    path = Path(folder) / INDEX_NAME
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.write_text(json.dumps(index.to_json(), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_index(folder: str | os.PathLike) -> FolderIndex | None:
    """The index of a shard folder, or None when it has none (e.g. shards CAT wrote)."""
    path = Path(folder) / INDEX_NAME
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("version") != INDEX_VERSION:
            raise ValueError(f"index version {d.get('version')!r}, this wdsprep reads {INDEX_VERSION}")
        return FolderIndex(d["layout"], d.get("dims"), d.get("dtype", "float32"),
                           [ShardInfo.from_json(s) for s in d["shards"]])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: unreadable shard index ({e}); delete it to read the shards without one") from e


class ShardWriter:
    """Writes one tar shard under a temporary name; ``close()`` renames it to its final name.

    An interrupted job therefore never leaves a half-written file under a final name.  The tar
    is what webdataset's ``TarWriter`` writes (POSIX tar via the standard library), without
    importing webdataset, which imports torch: seconds per worker process for no gain.
    """

    def __init__(self, path: str | os.PathLike, layout: str = "cat", mtime: float | None = None):
        self.path = Path(path)
        self.tmp_path = self.path.with_name(self.path.name + TMP_SUFFIX)
        self.feat_ext, self.text_ext = layout_exts(layout)
        self.info = ShardInfo(self.path.name)
        # A fixed mtime makes shards byte-for-byte reproducible from the same inputs.
        self.mtime = time.time() if mtime is None else mtime
        # A large buffer: tarfile copies members in 16 KiB pieces, one write() syscall each otherwise.
        self._file = open(self.tmp_path, "wb", buffering=4 << 20)
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)

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
        return self.info

    def abort(self) -> None:
        """Drop the partial shard."""
        try:
            self._tar.close()
            self._file.close()
        finally:
            self.tmp_path.unlink(missing_ok=True)


def split_name(name: str) -> tuple[str, str]:
    """(key, extension) of a member name the way webdataset splits it: the key ends at the first dot."""
    dirname, _, base = name.rpartition("/")
    key, _, ext = base.partition(".")
    return (f"{dirname}/{key}" if dirname else key), ext


def iter_tar_samples(path: str | os.PathLike) -> Iterable[tuple[str, dict[str, bytes]]]:
    """(key, {ext: bytes}) for each sample of a tar, read with the standard library.

    The reference reader: slow but independent of webdataset and of the fast reader
    (``wdsprep.reader``), which tests and the benchmark check against it.
    """
    current: str | None = None
    members: dict[str, bytes] = {}
    with tarfile.open(path, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            key, ext = split_name(m.name)
            data = tf.extractfile(m).read()
            if key != current:
                if current is not None:
                    yield current, members
                current, members = key, {}
            members[ext] = data
    if current is not None:
        yield current, members
