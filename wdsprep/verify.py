"""``verify``: read every member of every shard and name everything a loader would trip over.

Checks, per shard: the tar is complete (a truncated copy is named, not mistaken for a short
shard); every sample has exactly the two members of one layout; features are 2-D floating-point
``.npy`` with finite values, decoded with ``allow_pickle=False`` (a pickled object array is
refused from its header, never loaded); transcripts are UTF-8; keys percent-decode to valid
utterance ids and no id occurs twice across the given shards.  Where a folder has an
``index.json``: it lists the shard, and its keys (in order), frames, transcript lengths, layout,
dims and dtype match the tar; shards it lists that are missing on disk are named too.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.format.index import INDEX_NAME, FolderIndex, ShardInfo, read_index
from wdsprep.format.keys import LAYOUTS, decode_key
from wdsprep.format.shardlist import expand_shards, is_url
from wdsprep.inspect_shards import member_kind, read_npy_header, tar_end_problem


@dataclass(frozen=True)
class Problem:
    """One thing wrong: the shard (or index) file, the member or key, and what is wrong and what to do."""

    shard: str
    what: str
    member: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = f"member {self.member!r}" if self.member else f"key {self.key!r}" if self.key else None
        return f"{self.shard}: {where}: {self.what}" if where else f"{self.shard}: {self.what}"


@dataclass
class VerifyResult:
    """The shards checked, how many samples they hold and every problem found."""

    shards: list[str]
    samples: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        lines = [str(p) for p in self.problems]
        if self.ok:
            lines.append(f"verify: {len(self.shards)} shards, {self.samples:,} samples: OK")
        else:
            bad = len({p.shard for p in self.problems})
            lines.append(f"verify: {len(self.shards)} shards, {self.samples:,} samples: "
                         f"{len(self.problems)} problem(s) in {bad} file(s)")
        return "\n".join(lines)


@dataclass
class _Sample:
    """What the tar holds for one key; ``frames``/``text_len`` stay None when the member is bad or missing."""

    key: str
    members: list[tuple[str, str, str]] = field(default_factory=list)  # (member name, layout, role)
    frames: int | None = None
    dims: int | None = None
    dtype: str | None = None
    text_len: int | None = None


def verify_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike]) -> VerifyResult:
    """Read every member of every shard the pattern(s) name and check them and their folders' indexes."""
    paths = expand_shards(patterns)
    urls = [p for p in paths if is_url(p)]
    if urls:
        raise ValueError(f"verify reads local shards only, got {urls[0]!r}; copy the shards or mount them")
    problems: list[Problem] = []
    seen_ids: dict[str, tuple[str, str]] = {}  # uttid -> (shard, key) where first seen
    indexes: dict[str, FolderIndex | None] = {}
    samples = 0
    for path in paths:
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in indexes:
            indexes[folder] = _read_index(folder, problems)
        shard_samples = _read_tar(path, problems)
        samples += len(shard_samples)
        for s in shard_samples:
            _check_key(path, s, seen_ids, problems)
        index = indexes[folder]
        if index is not None:
            listed = {info.name: info for info in index.shards}
            info = listed.get(os.path.basename(path))
            if info is None:
                problems.append(Problem(path, f"not listed in {Path(folder) / INDEX_NAME}: the index is stale, so "
                                              f"loaders that trust it skip this shard; repack the folder, or delete "
                                              f"{INDEX_NAME} to have readers scan the tars"))
            else:
                _compare_index(path, info, index, shard_samples, problems)
    for folder, index in indexes.items():
        for info in index.shards if index else []:
            shard = Path(folder) / info.name
            if not shard.is_file():
                problems.append(Problem(str(shard), f"listed in {Path(folder) / INDEX_NAME} ({info.num_utts} "
                                                    f"utterances) but missing on disk; restore it or repack the folder"))
    return VerifyResult(paths, samples, problems)


def _read_index(folder: str, problems: list[Problem]) -> FolderIndex | None:
    try:
        return read_index(folder)
    except ValueError as e:
        problems.append(Problem(str(Path(folder) / INDEX_NAME), str(e)))
        return None


def _read_tar(path: str, problems: list[Problem]) -> list[_Sample]:
    """Read every member, checking each; a sample is the run of consecutive members sharing a key."""
    samples: list[_Sample] = []
    members: list[tarfile.TarInfo] = []
    try:
        tf = tarfile.open(path, "r:")
    except (tarfile.TarError, OSError) as e:
        problems.append(Problem(path, f"not a readable tar ({e}); copy it again or repack it"))
        return samples
    with tf:
        try:
            for m in tf:
                if not m.isfile():
                    continue
                members.append(m)
                kind = member_kind(m.name)
                if kind is None:
                    problems.append(Problem(path, "not a member of a known layout; expected KEY.npy + KEY.txt (cat) "
                                                  "or KEY.mat.npy + KEY.label.txt (cat-v3)", member=m.name))
                    continue
                key, layout, role = kind
                if not samples or samples[-1].key != key:
                    if samples:
                        _check_members(path, samples[-1], problems)
                    samples.append(_Sample(key))
                sample = samples[-1]
                sample.members.append((m.name, layout, role))
                data = tf.extractfile(m).read()  # raises ReadError when the member's data is cut off
                if role == "feats":
                    _check_feats(path, m.name, data, sample, problems)
                else:
                    _check_text(path, m.name, data, sample, problems)
        except (tarfile.TarError, EOFError, OSError) as e:
            at = f"at member {members[-1].name!r}" if members else "before the first member"
            problems.append(Problem(path, f"tar cannot be read {at} ({e}): the shard is truncated or damaged and "
                                          f"everything from there on is lost; copy it again or repack it"))
        else:
            end = tar_end_problem(path, members)
            if end:
                problems.append(Problem(path, end))
    if samples:
        _check_members(path, samples[-1], problems)
    return samples


def _check_members(path: str, s: _Sample, problems: list[Problem]) -> None:
    """A sample is exactly one features and one transcript member of one layout."""
    layouts = sorted({layout for _, layout, _ in s.members})
    if len(layouts) > 1:
        names = [n for n, _, _ in s.members]
        problems.append(Problem(path, f"members {names} mix layouts {layouts}; a sample is KEY.npy + KEY.txt (cat) "
                                      f"or KEY.mat.npy + KEY.label.txt (cat-v3); repack it", key=s.key))
        return
    feat_ext, text_ext = LAYOUTS[layouts[0]]
    roles = [role for _, _, role in s.members]
    for role, ext in (("feats", feat_ext), ("text", text_ext)):
        if roles.count(role) == 0:
            have = ", ".join(n for n, _, _ in s.members)
            problems.append(Problem(path, f"has {have} but no {s.key}.{ext}; the loader cannot use this sample; "
                                          f"repack it", key=s.key))
        elif roles.count(role) > 1:
            problems.append(Problem(path, f"{s.key}.{ext} occurs {roles.count(role)} times in a row; repack it",
                                    key=s.key))


def _check_feats(path: str, member: str, data: bytes, s: _Sample, problems: list[Problem]) -> None:
    def bad(what: str) -> None:
        problems.append(Problem(path, what, member=member))

    try:
        shape, dtype = read_npy_header(io.BytesIO(data))
    except ValueError as e:
        return bad(f"not a valid .npy header ({e}); the member is corrupt, repack the shard")
    if dtype.hasobject:
        # Decoding it would mean unpickling bytes from a file: refused, whoever wrote them.
        return bad(f"pickled object array (dtype {dtype}) refused: nothing in a shard is unpickled; "
                   f"repack from the Kaldi features")
    if len(shape) != 2 or not np.issubdtype(dtype, np.floating):
        return bad(f"features are {dtype} with shape {shape}; expected 2-D floating point (frames x dims)")
    try:
        feats = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        return bad(f"features cannot be decoded ({e}); the member is corrupt, repack the shard")
    if 0 in feats.shape:
        return bad(f"empty feature matrix {feats.shape}")
    finite = np.isfinite(feats)
    if not finite.all():
        return bad(f"{int(feats.size - finite.sum())} NaN/Inf value(s) in the features; fix the source features "
                   f"and repack")
    s.frames, s.dims, s.dtype = int(feats.shape[0]), int(feats.shape[1]), str(feats.dtype)


def _check_text(path: str, member: str, data: bytes, s: _Sample, problems: list[Problem]) -> None:
    try:
        s.text_len = len(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.append(Problem(path, f"transcript is not UTF-8 ({e}); fix the text file and repack", member=member))


def _check_key(path: str, s: _Sample, seen: dict[str, tuple[str, str]], problems: list[Problem]) -> None:
    if "." in s.key:
        problems.append(Problem(path, f"key contains '.': webdataset ends a key at the first '.', so the loader "
                                      f"would see key {s.key.partition('.')[0]!r}; repack with wdsprep, which "
                                      f"percent-encodes ids", key=s.key))
    try:
        uttid = decode_key(s.key)
    except UnicodeDecodeError as e:
        problems.append(Problem(path, f"key does not percent-decode to a UTF-8 id ({e}); repack it", key=s.key))
        return
    if not uttid or any(c.isspace() for c in uttid):
        problems.append(Problem(path, f"id {uttid!r} is empty or has whitespace, which Kaldi ids cannot; repack it",
                                key=s.key))
    first = seen.get(uttid)
    if first is None:
        seen[uttid] = (path, s.key)
        return
    where = "earlier in this shard" if first[0] == path else f"also in {first[0]}"
    problems.append(Problem(path, f"utterance {uttid!r} is {where} (key {first[1]!r}); each id may be packed once, "
                                  f"drop one of the copies", key=s.key))


def _compare_index(path: str, info: ShardInfo, index: FolderIndex, samples: list[_Sample],
                   problems: list[Problem]) -> None:
    """The index's record of a shard must match the tar, key by key."""
    where = f"{INDEX_NAME} of {os.path.dirname(path) or '.'}"
    if not len(info.keys) == len(info.frames) == len(info.text_lens):
        problems.append(Problem(path, f"{where} has {len(info.keys)} keys, {len(info.frames)} frame counts and "
                                      f"{len(info.text_lens)} text lengths; the index is damaged, repack the folder"))
    tar_keys = [s.key for s in samples]
    if tar_keys != info.keys:
        in_tar, in_index = set(tar_keys), set(info.keys)
        for k in info.keys:
            if k not in in_tar:
                problems.append(Problem(path, f"listed in {where} but not in the tar", key=k))
        for k in tar_keys:
            if k not in in_index:
                problems.append(Problem(path, f"in the tar but not in {where}", key=k))
        if in_tar == in_index:
            i = next(i for i, (a, b) in enumerate(zip(tar_keys, info.keys)) if a != b)
            problems.append(Problem(path, f"samples are in a different order than in {where} (first at sample {i}: "
                                          f"tar {tar_keys[i]!r}, index {info.keys[i]!r}); repack the folder"))
    by_key = {s.key: s for s in samples}
    for k, frames, text_len in zip(info.keys, info.frames, info.text_lens):
        s = by_key.get(k)
        if s is None:
            continue
        if s.frames is not None and s.frames != frames:
            problems.append(Problem(path, f"{where} says {frames} frames, the tar has {s.frames}", key=k))
        if s.text_len is not None and s.text_len != text_len:
            problems.append(Problem(path, f"{where} says a {text_len}-character transcript, the tar has {s.text_len}",
                                    key=k))
        if s.dims is not None and index.dims is not None and s.dims != index.dims:
            problems.append(Problem(path, f"{s.dims} feature dims, {where} says {index.dims}", key=k))
        if s.dtype is not None and s.dtype != index.dtype:
            problems.append(Problem(path, f"features are {s.dtype}, {where} says {index.dtype}", key=k))
    layouts = {layout for s in samples for _, layout, _ in s.members}
    if layouts - {index.layout}:
        problems.append(Problem(path, f"members of layout {sorted(layouts)} but {where} says {index.layout!r}; "
                                      f"repack the folder"))
