"""``verify``: read every member of every shard and name everything a loader would trip over.

Built on the format's own reader (``wdsprep.format``), so what it calls a problem is what the
loader refuses, for the same reason and in the same words: a damaged tar, a sample without one
features and one transcript member of a layout, an ``.npy`` member the readers refuse (pickled
object arrays from their header, never loaded; big-endian or integer data; not 2-D; empty;
truncated), an audio member (``flac``/``wav`` layouts) whose header is not 16-bit mono PCM of at
least one frame or that does not decode to the samples it says, a transcript that is not UTF-8,
a key that does not percent-decode.  The loader leaves a refused sample out alone and reads on
(counted as unreadable: the index counts it lost), and stops reading a shard only where the tar
itself is damaged; verify names every problem, and how many samples the loader leaves out.  On
top of that: features with NaN/Inf values, ids that are empty, hold
whitespace or occur twice across the given shards, and, where a folder has an index, every
difference between the index and the tars (keys in order, frames, transcript lengths, layout,
dims, dtype; an audio folder's sample counts and rate; the shard's SHA-256, so a shard changed in
place with its size and mtime kept is found), shards it lists that are missing and
shards it does not list.  A folder of a pack that did not finish (its marker is still there,
:mod:`wdsprep.format.commit`) is a problem too: the loader refuses it (``growing``: one still being
written in plan order is not, and what it published is checked); so are shards whose
features differ in dimension from the others given.

Shards on S3 or a web server are downloaded one at a time, with the loader's retries, and checked
the same way against the index uploaded beside them (keys included): a folder without one, a
shard whose size or checksum differs from its index's, and a shard that cannot be downloaded are
problems, as the loader refuses or skips them.  URLs are named with their passwords and tokens
masked.  ``pipe:`` commands are not verified: run one into a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.files import file_sha256, naming
from wdsprep.format import commit
from wdsprep.format.index import (
    INDEX_NAME,
    DamagedIndexError,
    FolderIndex,
    ShardInfo,
    read_index,
    read_index_at,
    stale_reason,
)
from wdsprep.format.keys import (
    AUDIO_LAYOUTS,
    LAYOUTS,
    decode_key,
    describe_layouts,
    is_field_member,
    member_layouts,
    member_role,
    name_problem,
    split_member,
)
from wdsprep.format.samples import (
    open_members,
    read_audio,
    read_features,
    sample_layout,
    samples_before_damage,
    split_sample,
)
from wdsprep.format.shardfile import ShardFile
from wdsprep.format.shardlist import expand_shards, index_place, is_url, refuse_commands
from wdsprep.format.tar import Member, member_bytes
from wdsprep.plan.options import FetchOptions
from wdsprep.plan.shardset import fetched_shard
from wdsprep.remote.fetch import ChangedError, FetchError, RetryPolicy, fetch_file
from wdsprep.remote.listing import lister
from wdsprep.remote.urls import redact
from wdsprep.units import fbank_frames


@dataclass(frozen=True)
class Problem:
    """One thing wrong: the shard (or index) file, the member or key, and what is wrong and what to do."""

    shard: str
    what: str
    member: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        # Whatever named a URL here (the shard, or a message quoting one), no password or token is shown.
        object.__setattr__(self, "shard", redact(self.shard))
        object.__setattr__(self, "what", redact(self.what))

    def __str__(self) -> str:
        where = f"member {self.member!r}" if self.member else f"key {self.key!r}" if self.key else None
        return f"{self.shard}: {where}: {self.what}" if where else f"{self.shard}: {self.what}"


@dataclass
class VerifyResult:
    """The shards checked, how many samples they hold, every problem found and notes that are not problems."""

    shards: list[str]
    samples: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        lines = [str(p) for p in self.problems] + [f"note: {n}" for n in self.notes]
        growing = sum("still being packed" in n.what for n in self.notes)
        if self.ok and growing:
            lines.append(f"verify: {len(self.shards)} shards, {self.samples:,} samples: OK so far ({growing} folder(s) "
                         f"still being packed)")
        elif self.ok:
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
    layout: str | None = None
    frames: int | None = None
    dims: int | None = None
    dtype: str | None = None
    text_len: int | None = None
    samples: int | None = None  # an audio member's
    rate: int | None = None
    refused: bool = False  # the loader refuses its members or its key
    skipped: bool = False  # refused alone (in a tar that is whole): the loader leaves it out and reads on
    fields: dict[str, str] = field(default_factory=dict)  # its field members' values (KEY.NAME), by name


def verify_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike], *,
                  retries: int = FetchOptions.retries, retry_backoff: float = FetchOptions.retry_backoff,
                  min_rate: float = FetchOptions.min_rate, growing: bool = False) -> VerifyResult:
    """Read every member of every shard the pattern(s) name and check them and their folders' indexes.

    ``retries``, ``retry_backoff`` and ``min_rate``: as the loader's, for shards on S3 or a web server.
    A folder whose pack has not committed is a problem (the pack may have been killed: a script that
    takes verify's word must not take it as finished); ``growing``: one a pack is still writing, in
    plan order, is not, and its published shards are checked (as a loader with ``growing=True`` reads
    them).
    """
    policy = RetryPolicy(retries=retries, backoff=retry_backoff, min_rate=min_rate)
    paths = expand_shards(patterns, check_commit=False, list_glob=lister(policy))  # commits: reported below
    refuse_commands(paths, "verify")
    result = VerifyResult(paths, 0)
    seen_ids: dict[str, tuple[str, str]] = {}  # uttid -> (shard, key) where first seen
    indexes: dict[str, FolderIndex | None] = {}
    dims_seen: dict[int, tuple[int, str]] = {}  # feature dims -> (samples, first shard)
    # folder -> audio sample rate -> (samples, first shard): a folder (an index) holds one rate; the
    # loader resamples folders of different rates to its fbank's sample_rate.
    rates_seen: dict[str, dict[int, tuple[int, str]]] = {}
    pending: dict[str, int] = {}  # folder of an uncommitted pack -> its shards named, not published yet (skipped)
    for path in paths:
        remote = is_url(path)
        folder, name = index_place(path)
        if folder not in indexes:
            indexes[folder] = _folder_index(folder, policy, result, pending)
        index = indexes[folder]
        i = None if index is None else index.position(name)
        if folder in pending and i is None:  # written, not published yet: a growing loader does not read it
            pending[folder] += 1
            continue
        if remote:
            listed = i is not None and index is not None
            expected = int(index.sizes[i]) if listed and index.sizes[i] >= 0 else None
            shard_samples = _check_remote_shard(path, expected, index.checksums[i] if listed else None, policy,
                                                result, seen_ids)
            if shard_samples is None:
                continue
        else:
            with naming(path):  # a read error (EIO) says which shard
                shard_samples = _check_shard(path, result, seen_ids)
        result.samples += len(shard_samples)
        for sample in shard_samples:
            if sample.dims is not None:
                _seen(dims_seen, sample.dims, path)
            if sample.rate is not None:
                _seen(rates_seen.setdefault(folder, {}), sample.rate, path)
        if index is not None:
            _check_listing(path, folder, index, i, shard_samples, result.problems)
    _check_dims(dims_seen, result.problems)
    for rates in rates_seen.values():
        _check_rates(rates, result.problems)
    _check_pending(pending, indexes, growing, result)
    _check_listed_exist(indexes, result.problems)
    return result


def _folder_index(folder: str, policy: RetryPolicy, result: VerifyResult,
                  pending: dict[str, int]) -> FolderIndex | None:
    """The index of a folder verify meets first (None: it has none, or it is refused, said in
    ``result``); a local folder a pack is writing in plan order goes into ``pending``, one whose
    pack did not commit is a problem."""
    if is_url(folder):
        return _read_remote_index(folder, policy, result.problems)
    g = commit.pending_folder(folder)
    if g is not None and g.followable:
        pending[folder] = 0
    else:
        unfinished = commit.problem(folder)
        if unfinished is not None:
            result.problems.append(Problem(folder, f"{unfinished}; the loader refuses these shards"))
    return _read_index(folder, result.problems)


def _check_listing(path: str, folder: str, index: FolderIndex, i: int | None, shard_samples: list[_Sample],
                   problems: list[Problem]) -> None:
    """A shard against its folder's index: listed, unchanged since (its size, times or bytes), and
    holding the samples its entry says."""
    remote = is_url(path)
    where = f"{redact(folder)}/{INDEX_NAME}" if remote else Path(folder) / INDEX_NAME
    if i is None:
        problems.append(Problem(path, f"not listed in {where}: the index is stale; "
                                      f"repack the folder, or re-index it (wdsprep index --refresh)"))
        return
    st = None if remote else os.stat(path)
    # A copy's new times: stale_reason judges the shard by its SHA-256 (remote: the size, checked when fetched).
    why = None if st is None else stale_reason(index, i, st, path)
    hashed = st is not None and index.checksums[i] is not None and st.st_mtime_ns != index.mtimes[i]
    if why is not None:
        problems.append(Problem(path, f"changed since it was indexed ({why}): the loader refuses "
                                      f"it; re-index it (wdsprep index --refresh) or repack"))
    elif not remote and index.checksums[i] is not None and not hashed:  # remote: checked by the fetch
        with naming(path):
            if file_sha256(path) != index.checksums[i]:
                why = "sha256"
                problems.append(Problem(path, "its bytes differ from the SHA-256 its index records, with its size "
                                              "and mtime kept: it was changed in place (a bad disk or copy?); copy "
                                              "it again, or repack"))
    _compare_index(path, index.shard(i), index, shard_samples, problems)
    if why is None:  # a changed shard is named above
        _compare_lost(path, int(index.lost[i]), shard_samples, problems)


def _check_pending(pending: dict[str, int], indexes: dict[str, FolderIndex | None], growing: bool,
                   result: VerifyResult) -> None:
    """Folders a pack is still writing: a note with ``growing``, else a problem (not committed)."""
    for folder, skipped in pending.items():
        g = commit.pending_folder(folder)
        planned = None if g is None else g.planned
        index = indexes[folder]
        n = 0 if index is None else len(index.names)
        of = "" if planned is None else f" of {planned.shards:,}"
        so_far = (f"{n:,}{of} shards published and checked"
                  f"{f', {skipped} not published yet and skipped' if skipped else ''}")
        if growing:
            result.notes.append(Problem(folder, f"still being packed: {so_far}; a loader reads them with "
                                                f"growing=True"))
        else:
            marker = g.marker if g is not None else commit.MARKER_NAME
            result.problems.append(Problem(folder, f"the pack has not committed ({marker} is there): {so_far}; the "
                                                   f"loader refuses it as a complete corpus. A stopped pack: run it "
                                                   f"again with --resume; one still being written: verify --growing "
                                                   f"checks what it published"))


def _check_listed_exist(indexes: dict[str, FolderIndex | None], problems: list[Problem]) -> None:
    """Every shard a local folder's index lists is on disk (a web server cannot list: not looked for)."""
    for folder, index in indexes.items():
        if is_url(folder):
            continue
        for info in index.shards if index else []:
            shard = Path(folder) / info.name
            if not shard.is_file():
                problems.append(Problem(str(shard), f"listed in {Path(folder) / INDEX_NAME} ({info.num_utts} "
                                                    f"utterances) but missing on disk; restore it or repack"))


def _seen(seen: dict[int, tuple[int, str]], value: int, path: str) -> None:
    """Count one sample of ``value`` (its samples so far, and the first shard it was seen in)."""
    n, first = seen.get(value, (0, path))
    seen[value] = (n + 1, first)


def _mixed(seen: dict[int, tuple[int, str]], unit: str) -> tuple[str, str] | None:
    """Where values of ``seen`` differ: (the first shard of the second most common value, every
    value with its samples and first shard, most common first), or None for one value."""
    if len(seen) < 2:
        return None
    ranked = sorted(seen, key=lambda v: (-seen[v][0], v))
    return seen[ranked[1]][1], "; ".join(f"{v} {unit} in {seen[v][0]:,} sample(s), the first in {seen[v][1]}"
                                         for v in ranked)


def _check_dims(dims_seen: dict[int, tuple[int, str]], problems: list[Problem]) -> None:
    """One loader reads all the shards given, and refuses a batch whose features differ in dimension."""
    mixed = _mixed(dims_seen, "dims")
    if mixed is not None:
        shard, found = mixed
        problems.append(Problem(shard, f"the shards hold features of different dimensions ({found}): the loader "
                                       f"fails on the first batch that mixes them; give it (and verify) one feature "
                                       f"set at a time"))


def _check_rates(rates_seen: dict[int, tuple[int, str]], problems: list[Problem]) -> None:
    """A folder's audio is of one sample rate: ``index`` refuses a folder of two, and so does the
    loader (the same verdict here; folders of different rates load together, resampled)."""
    mixed = _mixed(rates_seen, "Hz")
    if mixed is not None:
        shard, found = mixed
        problems.append(Problem(shard, f"the shards of one folder hold audio at different sample rates ({found}): "
                                       f"the loader and wdsprep index refuse them; repack the audio at one rate "
                                       f"(pack-audio --sample-rate)"))


def _read_index(folder: str, problems: list[Problem]) -> FolderIndex | None:
    """The folder's index as the loader reads it (so what it refuses is a problem here), keys too."""
    try:
        index = read_index(folder)
        if index is not None:
            index.keys()  # read here, so a missing or damaged keys file is one problem, named
        return index
    except DamagedIndexError as e:  # named by the index file at fault
        problems.append(Problem(e.path, str(e).removeprefix(f"{e.path}: ")))
    except ValueError as e:
        problems.append(Problem(str(Path(folder) / INDEX_NAME), str(e)))
    return None


def _read_remote_index(folder: str, policy: RetryPolicy, problems: list[Problem]) -> FolderIndex | None:
    """The index uploaded beside remote shards, keys too; a folder without one is a problem (the
    loader refuses it)."""
    try:
        return read_index_at(folder, partial(fetch_file, policy=policy), keys=True)
    except (ValueError, OSError) as e:  # DataError is a ValueError, FetchError an OSError
        where = f"{redact(folder)}/{INDEX_NAME}"
        problems.append(Problem(where, str(e).removeprefix(f"{where}: ")))
        return None


def _check_remote_shard(url: str, expected: int | None, checksum: str | None, policy: RetryPolicy,
                        result: VerifyResult, seen: dict[str, tuple[str, str]]) -> list[_Sample] | None:
    """A remote shard downloaded (its size and checksum checked against the index's) and checked as
    a local one, named with its secrets masked; None when it could not be downloaded whole."""
    name = redact(url)
    try:
        source = fetched_shard(url, policy=policy, expected=expected, checksum=checksum)
    except ChangedError as e:
        result.problems.append(Problem(name, f"{str(e).removeprefix(name + ' ')}; the loader refuses it"))
        return None
    except FetchError as e:
        result.problems.append(Problem(name, f"cannot be downloaded: {str(e).removeprefix(name + ': ')}; the loader "
                                             f"skips it (or stops, with on_error='raise')"))
        return None
    try:
        return _check_shard(name, result, seen, source=source)
    finally:
        assert source.copy is not None
        source.copy.close()


# What the loader does with a sample it refuses in a tar that is whole (format/samples.py).
LEFT_OUT = "the loader leaves this sample out (counted as unreadable) and reads on"


def _check_shard(path: str, result: VerifyResult, seen: dict[str, tuple[str, str]],
                 source: ShardFile | None = None) -> list[_Sample]:
    """Every sample of a shard checked as the loader reads it; a sample is a run of members sharing a key.
    ``source``: the shard already fetched (a remote one)."""
    problems = result.problems
    src, members, damage = open_members(path, source=source)
    samples: list[_Sample] = []
    for key, group in samples_before_damage(members, damage):
        s = _Sample(key)
        s.refused = _check_sample(path, src, s, group, problems) or _check_key(path, s, seen, result)
        s.skipped = s.refused  # in a tar that is whole: left out alone, the shard read on
        samples.append(s)
    if damage is not None:
        problems.append(Problem(path, f"the tar is damaged: {damage}; everything from there on is lost (the loader "
                                      f"stops there); copy the shard again or repack it"))
    return samples


def _check_sample(path: str, src: object, s: _Sample, group: dict[str, Member], problems: list[Problem]) -> bool:
    """Check one sample's members; True when the loader refuses it."""
    names = [m[0] for m in group.values()]
    roles = [member_role(n) for n in names]
    refused = False
    for (ext, m), role in zip(group.items(), roles):
        if role is None and is_field_member(ext):
            try:
                s.fields[ext] = member_bytes(src, m).decode("utf-8")
            except UnicodeDecodeError as e:
                problems.append(Problem(path, f"field {ext} is not UTF-8 ({e}); {LEFT_OUT}; fix its table and repack",
                                        member=m[0]))
                refused = True
        elif role is None:
            problems.append(Problem(path, f"not a member of a known layout; expected {describe_layouts()} (and "
                                          f"fields KEY.NAME)", member=m[0]))
    names = [n for n, r in zip(names, roles) if r is not None or not is_field_member(split_member(n)[1])]
    roles = [member_role(n) for n in names]
    # The layouts every member of the sample can belong to (a KEY.txt is cat's and the audio layouts').
    candidates = [set(member_layouts(n)) for n, r in zip(names, roles) if r is not None]
    layouts = sorted(set.intersection(*candidates)) if candidates else []
    if candidates and not layouts:
        found = sorted({layout for c in candidates for layout in c})
        problems.append(Problem(path, f"members {names} mix layouts {found}; a sample is one of "
                                      f"{describe_layouts()}; repack it", key=s.key))
    try:
        feat_m, text_m = split_sample(group)
    except ValueError:
        if layouts:
            have = {r[2] for r in roles if r is not None}
            missing = " or ".join(sorted({f"{s.key}.{LAYOUTS[layout][0 if 'text' in have else 1]}"
                                          for layout in layouts}))
            problems.append(Problem(path, f"has {', '.join(names)} but no {missing}; {LEFT_OUT}; repack it",
                                    key=s.key))
        return True
    s.layout = sample_layout(group, feat_m)
    check = _check_audio if s.layout in AUDIO_LAYOUTS else _check_feats
    refused = check(path, src, s, feat_m, problems) or refused
    try:
        s.text_len = len(member_bytes(src, text_m).decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.append(Problem(path, f"transcript is not UTF-8 ({e}); {LEFT_OUT}; fix the text file and repack",
                                member=text_m[0]))
        refused = True
    return refused


def _check_feats(path: str, src: object, s: _Sample, m: Member, problems: list[Problem]) -> bool:
    """A features member: read whole, NaN/Inf counted; True when refused."""
    try:
        feats = read_features(src, m, s.key, float32=False, lazy=False)
    except ValueError as e:
        problems.append(Problem(path, f"{e}; {LEFT_OUT}; repack the shard from the Kaldi features", member=m[0]))
        return True
    finite = np.isfinite(feats)
    if not finite.all():
        problems.append(Problem(path, f"{int(feats.size - finite.sum())} NaN/Inf value(s) in the features; fix "
                                      f"the source features and repack", member=m[0]))
    s.frames, s.dims, s.dtype = int(feats.shape[0]), int(feats.shape[1]), str(feats.dtype)
    return False


def _check_audio(path: str, src: object, s: _Sample, m: Member, problems: list[Problem]) -> bool:
    """An audio member: its header as the loader reads it, then every sample decoded; True when refused."""
    try:
        audio = read_audio(src, m, s.key)
    except ValueError as e:  # RefusedAudio too
        problems.append(Problem(path, f"{e}; {LEFT_OUT}; repack the shard from the audio", member=m[0]))
        return True
    try:
        pcm = audio.pcm()
    except ValueError as e:  # the header was fine: the loader reads on, and drops only this utterance
        problems.append(Problem(path, f"{e}; the loader leaves it out of its batch (bad_audio); repack the shard "
                                      f"from the audio", member=m[0]))
        return False
    s.samples, s.rate = len(pcm), audio.header.sample_rate
    s.frames = int(fbank_frames(s.samples, s.rate))
    return False


def _check_key(path: str, s: _Sample, seen: dict[str, tuple[str, str]], result: VerifyResult) -> bool:
    """Check a sample's key and id; True when the loader refuses it (a key that does not decode)."""
    problems = result.problems
    try:
        uttid = decode_key(s.key)
    except UnicodeDecodeError as e:
        problems.append(Problem(path, f"key does not percent-decode to a UTF-8 id ({e}); {LEFT_OUT}; repack it",
                                key=s.key))
        return True
    if "." in s.key:
        result.notes.append(Problem(path, "key contains '.': wdsprep reads it whole, but webdataset and CAT's own "
                                          "readers end a key at the first '.'", key=s.key))
    wrong = name_problem(uttid)
    if wrong is not None:
        problems.append(Problem(path, f"id {uttid!r} {wrong}; repack it", key=s.key))
    first = seen.get(uttid)
    if first is None:
        seen[uttid] = (path, s.key)
    else:
        where = "earlier in this shard" if first[0] == path else f"also in {first[0]}"
        problems.append(Problem(path, f"utterance {uttid!r} is {where} (key {first[1]!r}); each id may be packed "
                                      f"once, drop one of the copies", key=s.key))
    return False


def _compare_lost(path: str, lost: int, samples: list[_Sample], problems: list[Problem]) -> None:
    """The index's count of a shard's samples lost (from the first one the loader refuses on, as
    ``wdsprep index`` counts them) must not exceed the tar's: the loader reports them as unreadable
    drops.  (Fewer is a shard damaged since it was indexed: named above, sample by sample.)"""
    tar_lost = sum(s.skipped for s in samples)
    if lost > tar_lost:
        problems.append(Problem(path, f"{INDEX_NAME} of {os.path.dirname(path) or '.'} says {lost:,} samples of this "
                                      f"shard are lost, the tar has {tar_lost:,}; the loader reports them "
                                      f"as unreadable drops: re-index the folder (wdsprep index --force)"))


def _compare_index(path: str, info: ShardInfo, index: FolderIndex, samples: list[_Sample],
                   problems: list[Problem]) -> None:
    """The index's record of a shard must match the tar, key by key."""
    where = f"{INDEX_NAME} of {os.path.dirname(path) or '.'}"
    # Left out alone, as the index leaves them out: named above (one the index lists is compared by key alone).
    listed = set(info.keys)
    samples = [s for s in samples if not s.skipped or s.key in listed]
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
    for j, (k, frames, text_len) in enumerate(zip(info.keys, info.frames, info.text_lens)):
        s = by_key.get(k)
        if s is None:
            continue
        if s.samples is not None and info.samples and s.samples != info.samples[j]:
            problems.append(Problem(path, f"{where} says {info.samples[j]} samples, the tar has {s.samples}", key=k))
        if s.rate is not None and index.audio is not None and s.rate != index.audio.sample_rate:
            problems.append(Problem(path, f"audio at {s.rate} Hz, {where} says {index.audio.sample_rate}", key=k))
        if s.frames is not None and s.frames != frames:
            problems.append(Problem(path, f"{where} says {frames} frames, the tar has {s.frames}", key=k))
        if s.text_len is not None and s.text_len != text_len:
            problems.append(Problem(path, f"{where} says a {text_len}-character transcript, the tar has {s.text_len}",
                                    key=k))
        if s.dims is not None and index.dims is not None and s.dims != index.dims:
            problems.append(Problem(path, f"{s.dims} feature dims, {where} says {index.dims}", key=k))
        if s.dtype is not None and s.dtype != index.dtype:
            problems.append(Problem(path, f"features are {s.dtype}, {where} says {index.dtype}", key=k))
    for k in info.keys:
        s = by_key.get(k)
        if s is None or s.refused:
            continue
        # A sample may leave a field out (a manifest line without the key), never carry one unlisted.
        if set(s.fields) - set(index.fields):
            problems.append(Problem(path, f"has fields {sorted(s.fields)}, {where} says the samples carry "
                                          f"{list(index.fields)}; re-index the folder (wdsprep index --force)", key=k))
    for name, values in info.values.items():
        for k, v in zip(info.keys, values):
            s = by_key.get(k)
            if s is None or s.refused or s.fields.get(name) == v:
                continue
            said = f"field {name} is {s.fields[name]!r}" if name in s.fields else f"has no field {name}"
            problems.append(Problem(path, f"{said}, {where} says {'none' if v is None else repr(v)}", key=k))
    layouts = {s.layout for s in samples if s.layout}
    if layouts - {index.layout}:
        problems.append(Problem(path, f"members of layout {sorted(layouts)} but {where} says {index.layout!r}; "
                                      f"repack the folder"))
