"""The per-folder index of a shard set: every shard's utterances, frames and transcript lengths.

Written by ``pack`` beside the shards it packs; the loader plans from it, ``inspect`` reads it
instead of the tars, ``verify`` holds it against them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from wdsprep.files import write_text

INDEX_NAME = "index.json"
INDEX_VERSION = 1


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
    return write_text(Path(folder) / INDEX_NAME, json.dumps(index.to_json(), ensure_ascii=False,
                                                            separators=(",", ":")))


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
