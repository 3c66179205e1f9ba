"""The per-folder index of a shard set: every shard's size and totals, every utterance's frames.

Written by ``pack`` (and by ``wdsprep index`` for shards packed elsewhere) beside the shards; the
loader plans every epoch from it without reading a tar, ``inspect`` reads it instead of the
tars, ``verify`` holds it against them.  On disk, per folder:

- ``index.json``: layout, dims, dtype and per shard its name, byte size, mtime, utterances, frames,
  a digest of its frame column and the SHA-256 of its bytes (``sha256``: a remote shard is checked
  against it when downloaded; indexes written before it have none): small, read in O(shards);
- ``index.frames.npy``, ``index.text_lens.npy``: int32 per utterance, in shard order, memory-mapped
  when read, so a process touches only the pages it uses;
- ``index.keys.txt``: the sample keys, one per line, read only by what needs them (``verify``);
- ``index.speakers.npy`` (int32 per utterance) and ``index.speaker_names.txt`` (the names it
  numbers, one per line): each utterance's speaker, from the ``utt2spk`` given to ``pack``, else
  by the key rule (:func:`~wdsprep.format.keys.speaker_of`); ``index.json`` says which.  An index
  without them (written before they existed) gets its speakers from the keys when asked.

``index.json`` is written last: a folder whose ``index.json`` is there has the rest.  Version 1
indexes (one JSON holding every key) are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import atomic_path, file_sha256, write_text

if TYPE_CHECKING:
    from wdsprep.format.shardfile import ShardFile

INDEX_NAME = "index.json"
INDEX_VERSION = 2
FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE = "index.frames.npy", "index.text_lens.npy", "index.keys.txt"
SPEAKERS_FILE, SPEAKER_NAMES_FILE = "index.speakers.npy", "index.speaker_names.txt"
# everything an index writes
INDEX_FILES = (INDEX_NAME, FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE, SPEAKERS_FILE, SPEAKER_NAMES_FILE)
FROM_UTT2SPK, FROM_KEYS = "utt2spk", "key prefix"  # where a speakers column came from


@dataclass
class ShardInfo:
    """One shard's record, utterance by utterance (what the writer and a scan produce)."""

    name: str
    keys: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    text_lens: list[int] = field(default_factory=list)
    sha256: str | None = field(default=None, compare=False)  # of the shard's bytes (hex), where known

    @property
    def num_utts(self) -> int:
        return len(self.keys)

    @property
    def num_frames(self) -> int:
        return int(sum(self.frames))


@dataclass
class Speakers:
    """Each utterance's speaker, as ``names[ids[row]]``; ``source`` says where they came from."""

    ids: np.ndarray  # int32 per utterance
    names: list[str]
    source: str

    @classmethod
    def of(cls, per_utt: Sequence[str], source: str) -> Speakers:
        """From one speaker name per utterance; names are numbered in order of first appearance."""
        numbers: dict[str, int] = {}
        ids = np.fromiter((numbers.setdefault(s, len(numbers)) for s in per_utt), np.int32, len(per_utt))
        return cls(ids, list(numbers), source)

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> Speakers:
        """By the key rule: :func:`~wdsprep.format.keys.speaker_of` of each key's utterance id."""
        from wdsprep.format.keys import speaker_of, uttid_for_message

        return cls.of([speaker_of(uttid_for_message(k) or "") for k in keys], FROM_KEYS)

    def rows(self, a: int, b: int) -> Speakers:
        """The speakers of rows ``a:b`` (the names stay: ids keep their meaning)."""
        return Speakers(self.ids[a:b], self.names, self.source)

    @classmethod
    def concat(cls, parts: Sequence[Speakers]) -> Speakers:
        """Parts one after another (shards, corpora), each name numbered once, in the order the
        parts' name lists are met (parts of one index share its list: it is numbered once)."""
        numbers: dict[str, int] = {}
        mappings: dict[int, np.ndarray] = {}  # id of a names list -> its numbers
        ids = []
        for p in parts:
            mapping = mappings.get(id(p.names))
            if mapping is None:
                mapping = mappings[id(p.names)] = np.array([numbers.setdefault(n, len(numbers)) for n in p.names],
                                                           np.int32)
            ids.append(mapping[np.asarray(p.ids)] if len(p.ids) else np.zeros(0, np.int32))
        sources = sorted({p.source for p in parts})
        return cls(np.concatenate(ids) if ids else np.zeros(0, np.int32), list(numbers),
                   sources[0] if len(sources) == 1 else " + ".join(sources) or FROM_KEYS)


def frames_digest(frames: np.ndarray) -> str:
    """A short digest of a shard's frame column: the plan depends on every value of it."""
    return hashlib.blake2b(np.ascontiguousarray(frames, np.int32).tobytes(), digest_size=8).hexdigest()


class FolderIndex:
    """The index of one shard folder: columns over all its utterances, in shard order.

    ``utts[i]`` utterances of shard ``names[i]`` start at row ``starts[i]`` of ``frames`` and
    ``text_lens``; ``sizes``/``mtimes`` are -1 where unknown (a version 1 index).
    """

    def __init__(self, layout: str, dims: int | None, dtype: str, names: Sequence[str], utts: np.ndarray,
                 frames: np.ndarray, text_lens: np.ndarray, *, sizes: np.ndarray | None = None,
                 mtimes: np.ndarray | None = None, digests: Sequence[str] | None = None,
                 keys: list[str] | None = None, folder: str | os.PathLike | None = None,
                 lost: np.ndarray | None = None, speakers: Speakers | None = None,
                 speakers_meta: dict | None = None, checksums: Sequence[str | None] | None = None) -> None:
        self.layout, self.dims, self.dtype = layout, dims, dtype
        self.names = list(names)
        self.utts = np.asarray(utts, np.int64)
        self.frames, self.text_lens = frames, text_lens
        n = len(self.names)
        self.sizes = np.full(n, -1, np.int64) if sizes is None else np.asarray(sizes, np.int64)
        self.mtimes = np.full(n, -1, np.int64) if mtimes is None else np.asarray(mtimes, np.int64)
        # Samples past the first one the loader refuses (a damaged shard indexed as it is).
        self.lost = np.zeros(n, np.int64) if lost is None else np.asarray(lost, np.int64)
        # Each shard's SHA-256 (hex), None where not recorded (an index written before it was).
        self.checksums: list[str | None] = [None] * n if checksums is None else list(checksums)
        self.starts = np.concatenate([[0], np.cumsum(self.utts)])
        self.digests = list(digests) if digests is not None else [
            frames_digest(frames[a:b]) for a, b in zip(self.starts[:-1], self.starts[1:])]
        self._keys = keys
        self.folder = None if folder is None else Path(folder)
        self._position: dict[str, int] | None = None
        self._speakers = speakers
        self._speakers_meta = speakers_meta  # index.json's "speakers": the column is on disk, read on first use
        if len(frames) != self.starts[-1] or len(text_lens) != len(frames):
            raise ValueError(f"index columns hold {len(frames)} frame counts and {len(text_lens)} transcript "
                             f"lengths for {self.starts[-1]} utterances")

    @classmethod
    def from_shards(cls, layout: str, dims: int | None, dtype: str, infos: Sequence[ShardInfo], *,
                    sizes: Sequence[int] | None = None, mtimes: Sequence[int] | None = None,
                    lost: Sequence[int] | None = None, speakers: Speakers | None = None) -> FolderIndex:
        frames = np.fromiter((f for i in infos for f in i.frames), np.int32)
        text_lens = np.fromiter((x for i in infos for x in i.text_lens), np.int32)
        return cls(layout, dims, dtype, [i.name for i in infos], np.array([i.num_utts for i in infos], np.int64),
                   frames, text_lens, sizes=None if sizes is None else np.asarray(sizes),
                   mtimes=None if mtimes is None else np.asarray(mtimes), keys=[k for i in infos for k in i.keys],
                   lost=None if lost is None else np.asarray(lost), speakers=speakers,
                   checksums=[i.sha256 for i in infos])

    @property
    def num_utts(self) -> int:
        return int(self.starts[-1])

    @property
    def num_frames(self) -> int:
        return int(self.frames.sum(dtype=np.int64))

    def position(self, name: str) -> int | None:
        """Which shard of the index ``name`` is, or None when the index does not list it."""
        if self._position is None:
            self._position = {n: i for i, n in enumerate(self.names)}
        return self._position.get(name)

    def keys(self) -> list[str]:
        """Every sample key, in shard order (read from ``index.keys.txt`` on first use)."""
        if self._keys is None:
            assert self.folder is not None
            path = self.folder / KEYS_FILE
            try:
                self._keys = path.read_text(encoding="utf-8").split("\n")[:-1]
            except (OSError, UnicodeDecodeError) as e:
                raise DataError(f"{path}: cannot read the index's keys ({e}); re-index the folder "
                                f"(wdsprep index --force)") from None
            if len(self._keys) != self.num_utts:
                raise DataError(f"{path}: {len(self._keys)} keys for {self.num_utts} utterances; the index is "
                                f"damaged, re-index the folder (wdsprep index --force)")
        return self._keys

    @property
    def has_speakers(self) -> bool:
        """Whether the speakers are stored (or given), not to be derived from the keys."""
        return self._speakers is not None or self._speakers_meta is not None

    def speakers(self) -> Speakers:
        """Every utterance's speaker, in shard order: the stored column (read on first use), else by
        the key rule from the keys (an index written before the column existed)."""
        if self._speakers is None:
            if self._speakers_meta is not None:
                assert self.folder is not None
                self._speakers = _read_speakers(self.folder, self._speakers_meta, self.num_utts)
            else:
                self._speakers = Speakers.from_keys(self.keys())
        return self._speakers

    def shard(self, i: int) -> ShardInfo:
        """Shard ``i``'s record, keys included."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return ShardInfo(self.names[i], self.keys()[a:b], self.frames[a:b].tolist(), self.text_lens[a:b].tolist(),
                         self.checksums[i])

    @property
    def shards(self) -> list[ShardInfo]:
        """Every shard's record (reads the keys: for ``verify``, not for planning)."""
        return [self.shard(i) for i in range(len(self.names))]

    def summary(self) -> dict:
        """``index.json``'s content."""
        sp = self._speakers
        meta = self._speakers_meta if sp is None else {"count": len(sp.names), "source": sp.source}
        speakers = {"speakers": meta} if meta is not None else {}
        return {
            "version": INDEX_VERSION, "layout": self.layout, "dims": self.dims, "dtype": self.dtype,
            "num_utts": self.num_utts, "num_frames": self.num_frames,
            "shards": [{"name": n, "size": int(s), "mtime_ns": int(m), "utts": int(u),
                        "frames": int(self.frames[a:a + u].sum(dtype=np.int64)), "frames_digest": d,
                        **({"lost": int(x)} if x else {}), **({"sha256": c} if c else {})}
                       for n, s, m, u, a, d, x, c in zip(self.names, self.sizes, self.mtimes, self.utts, self.starts,
                                                         self.digests, self.lost, self.checksums)],
            **speakers,
        }


def stale_reason(index: FolderIndex, i: int, st: os.stat_result) -> str | None:
    """Why local shard ``i`` of ``index`` no longer is the shard indexed (``st`` its stat), or None."""
    size, mtime = int(index.sizes[i]), int(index.mtimes[i])
    if size >= 0 and st.st_size != size:
        return f"it has {st.st_size:,} bytes, the index says {size:,}"
    if mtime >= 0 and st.st_mtime_ns != mtime:
        return "its modification time differs from the index's (same size)"
    return None


def write_index(folder: str | os.PathLike, index: FolderIndex) -> Path:
    """Write a folder's index, every file atomically and ``index.json`` last."""
    folder = Path(folder)
    keys = index.keys()
    bad = next((k for k in keys if "\n" in k), None)
    if bad is not None:
        raise ValueError(f"{folder}: sample key {bad!r} holds a newline; such a shard cannot be indexed")
    for name, column in ((FRAMES_FILE, index.frames), (TEXT_LENS_FILE, index.text_lens)):
        with atomic_path(folder / name) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(column, np.int32), allow_pickle=False)
    write_text(folder / KEYS_FILE, "".join(k + "\n" for k in keys))
    speakers = index.speakers()  # by the key rule when none were given
    bad = next((n for n in speakers.names if "\n" in n), None)
    if bad is not None:
        raise ValueError(f"{folder}: speaker name {bad!r} holds a newline; such a speaker cannot be indexed")
    with atomic_path(folder / SPEAKERS_FILE) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(speakers.ids, np.int32), allow_pickle=False)
    write_text(folder / SPEAKER_NAMES_FILE, "".join(n + "\n" for n in speakers.names))
    return write_text(folder / INDEX_NAME, json.dumps(index.summary(), ensure_ascii=False, separators=(",", ":")))


def read_index(folder: str | os.PathLike) -> FolderIndex | None:
    """The index of a shard folder, or None when it has none (e.g. shards CAT wrote)."""
    folder = Path(folder)
    path = folder / INDEX_NAME
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        version = d.get("version")
        if version == 1:
            infos = [ShardInfo(s["name"], list(s["keys"]), [int(x) for x in s["frames"]],
                               [int(x) for x in s["text_lens"]]) for s in d["shards"]]
            index = FolderIndex.from_shards(d["layout"], d.get("dims"), d.get("dtype", "float32"), infos)
            index.folder = folder
            return index
        if version != INDEX_VERSION:
            raise ValueError(f"index version {version!r}; this wdsprep reads 1 and {INDEX_VERSION}")
        shards = d["shards"]
        # mmap: a loader over 15M utterances maps 60 MB per column instead of reading it.
        frames = np.load(folder / FRAMES_FILE, mmap_mode="r", allow_pickle=False)
        text_lens = np.load(folder / TEXT_LENS_FILE, mmap_mode="r", allow_pickle=False)
        return FolderIndex(d["layout"], d.get("dims"), d.get("dtype", "float32"), [s["name"] for s in shards],
                           np.array([s["utts"] for s in shards], np.int64), frames, text_lens,
                           sizes=np.array([s["size"] for s in shards], np.int64),
                           mtimes=np.array([s["mtime_ns"] for s in shards], np.int64),
                           digests=[s["frames_digest"] for s in shards], folder=folder,
                           lost=np.array([s.get("lost", 0) for s in shards], np.int64),
                           speakers_meta=d.get("speakers"), checksums=[_sha256_field(s) for s in shards])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: unreadable shard index ({e}); re-index the folder (wdsprep index --force) or "
                        f"delete {', '.join(INDEX_FILES)} to read the shards without one") from e


def _sha256_field(entry: dict) -> str | None:
    """A shard entry's ``sha256``: 64 hex digits, or absent (an index written before it was recorded)."""
    c = entry.get("sha256")
    if c is not None and not (isinstance(c, str) and len(c) == 64 and all(ch in "0123456789abcdef" for ch in c)):
        raise ValueError(f"shard {entry.get('name')!r}: sha256 {str(c)[:80]!r} is not 64 hex digits")
    return c


def _carried_speakers(old: FolderIndex, keys: Sequence[str]) -> Speakers:
    """The speakers an earlier index had (from ``utt2spk``) for ``keys``; the key rule for keys it lacks."""
    from wdsprep.format.keys import speaker_of, uttid_for_message

    sp = old.speakers()
    known = {k: sp.names[i] for k, i in zip(old.keys(), sp.ids.tolist())}
    names = [known.get(k) for k in keys]
    if all(n is not None for n in names):
        return Speakers.of(names, sp.source)
    return Speakers.of([n if n is not None else speaker_of(uttid_for_message(k) or "") for n, k in zip(names, keys)],
                       f"{sp.source}, {FROM_KEYS} for utterances it lacked")


def _read_speakers(folder: Path, meta: dict, num_utts: int) -> Speakers:
    """The speakers column ``index.json`` says is beside it, checked against the index."""
    try:
        ids = np.load(folder / SPEAKERS_FILE, mmap_mode="r", allow_pickle=False)
        names = (folder / SPEAKER_NAMES_FILE).read_text(encoding="utf-8").split("\n")[:-1]
        in_range = not len(ids) or 0 <= ids.min() <= ids.max() < len(names)
        if len(ids) != num_utts or len(names) != meta["count"] or not in_range:
            raise ValueError(f"{len(ids)} speaker ids for {num_utts} utterances, {len(names)} names for "
                             f"{meta['count']} speakers")
        return Speakers(ids, names, str(meta["source"]))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{folder / SPEAKERS_FILE}: cannot read the index's speakers ({e}); re-index the folder "
                        f"(wdsprep index --force) or repack it") from None


@dataclass
class ShardScan:
    """What reading a shard's headers found: the samples the loader reads (as an index entry), what
    it would refuse, layouts, dims and dtypes."""

    info: ShardInfo
    layouts: set[str] = field(default_factory=set)
    dims: set[int] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    lost: int = 0  # samples from the first refused one on: the loader stops reading there


def scan_shard(path: str | os.PathLike, *, source: ShardFile | None = None) -> ShardScan:
    """Keys, frames and transcript lengths of a shard from its tar and ``.npy`` headers and its
    transcripts (feature data is not read), as an index entry.  ``source``: the shard fetched by
    the caller (a pipe's or URL's: the format does not fetch), ``path`` then only names it.

    Like the loader, the scan stops at the first sample the loader refuses: what is before it is
    the entry, and that sample and every one after it are counted in ``lost`` and named in
    ``problems``, as is damage to the tar (``verify`` gives the full diagnosis).
    """
    from wdsprep.format.keys import member_role
    from wdsprep.format.samples import feature_layout, group_samples, open_members, samples_before_damage, split_sample
    from wdsprep.format.tar import member_bytes

    path = str(path)
    scan = ShardScan(ShardInfo(os.path.basename(path)))
    src, members, problem = open_members(path, source=source)
    for key, group in samples_before_damage(members, problem):
        where = f"key {key!r}"
        try:
            feat_m, text_m = split_sample(group)
            where = f"member {feat_m[0]!r}"
            dtype, _, shape, _ = feature_layout(src, feat_m)
            where = f"member {text_m[0]!r}"
            text_len = len(member_bytes(src, text_m).decode("utf-8"))
        except ValueError as e:
            problem = f"{where}: {e}"
            break
        role = member_role(feat_m[0])
        scan.layouts.add(role[1] if role else "?")
        scan.dims.add(int(shape[1]))
        scan.dtypes.add(str(dtype.newbyteorder("=")))
        scan.info.keys.append(key)
        scan.info.frames.append(int(shape[0]))
        scan.info.text_lens.append(text_len)
    if problem is not None:
        scan.lost = sum(1 for _ in group_samples(members)) - scan.info.num_utts
        scan.problems.append(f"{path}: {problem}; the loader reads the {scan.info.num_utts} samples before it, "
                             f"{scan.lost} are lost (copy the shard again or repack it)")
    return scan


@dataclass
class IndexResult:
    """What ``wdsprep index`` did, per folder, and every sample it found the loader cannot read."""

    folders: dict[str, str] = field(default_factory=dict)  # folder -> what was done ("written", "up to date", ...)
    shards: int = 0
    scanned: int = 0
    utterances: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        lines = [f"{folder}: {what}" for folder, what in self.folders.items()]
        lines += self.problems
        lines.append(f"index: {len(self.folders)} folder(s), {self.shards} shards ({self.scanned} read), "
                     f"{self.utterances:,} utterances" + ("" if self.ok else f"; {len(self.problems)} problem(s)"))
        return "\n".join(lines)


def index_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike], *, refresh: bool = False,
                 force: bool = False, progress: bool | None = None) -> IndexResult:
    """Write the index of every folder the pattern(s) name, from the shards' headers (no feature data).

    A folder without an index gets one.  A folder whose index is current is left alone.  One whose
    shards changed since it was indexed (size or mtime) is an error, unless ``refresh``: then the
    changed shards (and those it does not list) are read again and the rest kept; ``force`` reads
    every shard again.  Entries of shards the patterns do not name are kept while the shard exists.
    """
    from tqdm import tqdm

    from wdsprep.format.shardlist import expand_shards, is_url
    from wdsprep.remote.urls import redact

    named = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    urls = [str(p) for p in named if is_url(str(p))]  # before expanding too: a URL glob is not listed here
    paths = [] if urls else expand_shards(named)
    urls = urls or [p for p in paths if is_url(p)]
    if urls:
        raise ValueError(f"index reads local shards, got {redact(urls[0])!r}; index a local copy and upload its index "
                         f"files ({', '.join(INDEX_FILES)}) beside the shards")
    by_folder: dict[Path, list[Path]] = {}
    for p in paths:
        by_folder.setdefault(Path(p).resolve().parent, []).append(Path(p).resolve())
    result = IndexResult()
    bar = tqdm(total=len(paths), desc="index", unit="shard", disable=None if progress is None else not progress)
    with bar:
        for folder, shards in by_folder.items():
            old = read_index(folder)
            entries: dict[str, tuple[ShardInfo, int, int, int]] = {}  # name -> (info, size, mtime, lost)
            stale: list[str] = []
            upgrade = old is not None and bool((old.sizes < 0).any())  # version 1: no sizes, read it all again
            if old is not None and not force and not upgrade:
                for i, name in enumerate(old.names):
                    path = folder / name
                    if not path.is_file():
                        continue  # gone: its entry goes too
                    if stale_reason(old, i, path.stat()) is not None or old.mtimes[i] < 0:  # no mtime: cannot tell
                        stale.append(name)
                    else:
                        entries[name] = (old.shard(i), int(old.sizes[i]), int(old.mtimes[i]), int(old.lost[i]))
                        if entries[name][0].sha256 is None:  # an index from before checksums: one read adds it
                            entries[name][0].sha256 = file_sha256(path)
            todo = [s for s in shards if s.name not in entries]
            if stale and not refresh and not force:
                raise ValueError(f"{folder}: {len(stale)} shard(s) changed since they were indexed (e.g. {stale[0]}); "
                                 f"pass --refresh to read them again (or repack the folder)")
            # An index without a speakers column or checksums (written before them) is rewritten,
            # without a header read (the checksums read each shard once).
            if (not todo and old is not None and not force and not stale and not upgrade and old.has_speakers
                    and None not in old.checksums):
                result.folders[str(folder)] = "up to date"
                result.shards += len(shards)
                result.utterances += old.num_utts
                bar.update(len(shards))
                continue
            layouts, dims, dtypes = set(), set(), set()
            for path in todo:
                st = path.stat()
                scan = scan_shard(path)
                scan.info.sha256 = file_sha256(path)
                result.scanned += 1
                result.problems.extend(scan.problems)
                layouts |= scan.layouts
                dims |= scan.dims
                dtypes |= scan.dtypes
                entries[path.name] = (scan.info, st.st_size, st.st_mtime_ns, scan.lost)
                bar.update(1)
            bar.update(len(shards) - len(todo))
            if old is not None and entries.keys() - {p.name for p in todo}:
                layouts.add(old.layout)
                dtypes.add(old.dtype)
                if old.dims is not None:
                    dims.add(old.dims)
            for what, found in (("layouts", layouts), ("feature dims", dims), ("dtypes", dtypes)):
                if len(found) > 1:
                    raise ValueError(f"{folder}: shards of different {what} {sorted(map(str, found))}; a folder is "
                                     f"one shard set: move them apart")
            names = sorted(entries)
            infos = [entries[n][0] for n in names]
            carried = None  # speakers packed from utt2spk are in no tar: keep them for the utterances still there
            try:
                if old is not None and old.speakers().source != FROM_KEYS:
                    carried = _carried_speakers(old, [k for i in infos for k in i.keys])
            except DataError:
                pass  # a damaged column: the key rule it is
            index = FolderIndex.from_shards(layouts.pop() if layouts else "cat", dims.pop() if dims else None,
                                            dtypes.pop() if dtypes else "float32", infos,
                                            sizes=[entries[n][1] for n in names], mtimes=[entries[n][2] for n in names],
                                            lost=[entries[n][3] for n in names], speakers=carried)
            write_index(folder, index)
            what = "indexed" if old is None else "upgraded from version 1" if upgrade else "re-indexed"
            result.folders[str(folder)] = f"{what}: {len(names)} shards, {len(todo)} read"
            result.shards += len(shards)
            result.utterances += index.num_utts
    return result
