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


@dataclass
class ShardScan:
    """What reading a shard's headers found: its complete samples (as an index entry), layouts, problems."""

    info: ShardInfo
    layouts: set[str] = field(default_factory=set)
    dims: set[int] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def scan_shard(path: str | os.PathLike) -> ShardScan:
    """Keys, frames and transcript lengths of a shard from its tar and ``.npy`` headers and its
    transcripts (feature data is not read), as an index entry.

    A sample the loader would refuse is left out and named in ``problems``, as is damage to the
    tar (``verify`` gives the full diagnosis).
    """
    from wdsprep.format.keys import member_role
    from wdsprep.format.npy import npy_header_end, npy_layout
    from wdsprep.format.samples import open_members, samples_before_damage, split_sample
    from wdsprep.format.tar import member_bytes

    path = str(path)
    scan = ShardScan(ShardInfo(os.path.basename(path)))
    src, members, problem = open_members(path)
    for key, group in samples_before_damage(members, problem):
        where = f"key {key!r}"
        try:
            feat_m, text_m = split_sample(group)
            where = f"member {feat_m[0]!r}"
            head = feat_m[3]
            end = npy_header_end(head)
            if end > len(head):  # a header longer than numpy writes
                head = bytes(src[feat_m[1]:feat_m[1] + end])
            dtype, fortran, shape, _ = npy_layout(head, feat_m[2])
            where = f"member {text_m[0]!r}"
            text_len = len(member_bytes(src, text_m).decode("utf-8"))
        except ValueError as e:
            scan.problems.append(f"{path}: {where}: {e}; sample left out")
            continue
        role = member_role(feat_m[0])
        scan.layouts.add(role[1] if role else "?")
        scan.dims.add(int(shape[1]))
        scan.dtypes.add(str(dtype.newbyteorder("=")))
        scan.info.keys.append(key)
        scan.info.frames.append(int(shape[0]))
        scan.info.text_lens.append(text_len)
    if problem is not None:
        scan.problems.append(f"{path}: {problem}; the rest of the shard is lost (copy it again or repack it)")
    return scan
