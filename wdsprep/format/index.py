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
- audio folders only (layout ``flac`` or ``wav``): ``index.samples.npy``, int32 per utterance, its
  sample count, and in ``index.json`` an ``audio`` object (:class:`AudioIndex`: the format, sample
  rate and bits, and the fbank options the loader computes the features with).  Their ``frames``
  are the fbank frames of those samples (``units.fbank_frames``), so the plan works unchanged,
  ``dims`` is the mel bins and ``dtype`` float32, what the loader delivers.  Speed perturbation
  plans with the sample counts.

``index.json`` is written last: a folder whose ``index.json`` is there has the rest.  Version 1
indexes (one JSON holding every key) are still read.

A folder a pack is still writing has no ``index.json`` yet: each shard it publishes gets an index
of its own, in this same format, in ``FOLDER/.index.parts/NNNNNNNN/`` (:func:`write_part`: written
whole in a hidden folder, synced, then renamed into place, so a reader sees a published shard's
entry whole or not at all).  :func:`read_index` reads such a folder as the index of the shards
published so far (parts 0, 1, ... without a gap), every part checked as a whole index is; the
pack's last step writes the folder's ``index.json`` from the parts and removes them.

Every reader reads an index through :func:`read_index`, which checks it whole (:func:`check_index`)
and opens regular files only: a damaged index is one :class:`DamagedIndexError` naming the file
and field, whoever reads it, and ``wdsprep index --force`` rebuilds it from the shards whatever
state it is in.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Protocol, Sequence

import numpy as np

from wdsprep.errors import DataError, OverLimit
from wdsprep.files import atomic_path, file_sha256, naming, sync, write_text
from wdsprep.format.audio import AUDIO_BITS, AUDIO_FORMATS, FBANK_BACKENDS
from wdsprep.format.commit import PARTS_DIR, published_count
from wdsprep.format.npy import FEATURE_DTYPES, npy_header_end, parse_npy_header
from wdsprep.format.shardlist import file_kind
from wdsprep.units import fbank_frames

if TYPE_CHECKING:
    from wdsprep.format.shardfile import ShardFile

INDEX_NAME = "index.json"
INDEX_VERSION = 2
FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE = "index.frames.npy", "index.text_lens.npy", "index.keys.txt"
SPEAKERS_FILE, SPEAKER_NAMES_FILE = "index.speakers.npy", "index.speaker_names.txt"
SAMPLES_FILE = "index.samples.npy"
# everything an index writes; an audio folder's also AUDIO_INDEX_FILES
INDEX_FILES = (INDEX_NAME, FRAMES_FILE, TEXT_LENS_FILE, KEYS_FILE, SPEAKERS_FILE, SPEAKER_NAMES_FILE)
AUDIO_INDEX_FILES = (SAMPLES_FILE,)
FROM_UTT2SPK, FROM_KEYS = "utt2spk", "key prefix"  # where a speakers column came from
PART_NAME = "part.json"  # in a published shard's part, beside its index: which planned shard, what it dropped
INDEX_DTYPES = frozenset(str(d.newbyteorder("=")) for d in FEATURE_DTYPES.values())  # "float32", ...


@dataclass
class ShardInfo:
    """One shard's record, utterance by utterance (what the writer and a scan produce)."""

    name: str
    keys: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    text_lens: list[int] = field(default_factory=list)
    sha256: str | None = field(default=None, compare=False)  # of the shard's bytes (hex), where known
    samples: list[int] = field(default_factory=list)  # an audio shard's sample counts (empty for features)

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


@dataclass(frozen=True)
class AudioIndex:
    """What ``index.json`` says of an audio folder: the audio's format (its layout), sample rate
    and bits, and the fbank options the loader computes the features with (those of
    :class:`~wdsprep.prep.fbank.FbankOptions`, at the audio's rate)."""

    format: str
    sample_rate: int
    num_mel_bins: int = 80
    dither: float = 0.0
    backend: str = "numpy"

    def __post_init__(self) -> None:
        problem = _audio_problem(self)
        if problem is not None:
            raise ValueError(f"audio index: {problem}")

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "sample_rate": self.sample_rate, "bits": AUDIO_BITS,
                "fbank": {"num_mel_bins": self.num_mel_bins, "dither": self.dither, "backend": self.backend}}


def _audio_problem(a: AudioIndex) -> str | None:
    """What is wrong with an AudioIndex's fields (None: nothing): the one check for the writer and the reader."""
    if a.format not in AUDIO_FORMATS:
        return f"format {a.format!r} is not one of {sorted(AUDIO_FORMATS)}"
    if type(a.sample_rate) is not int or not 1000 <= a.sample_rate <= 1_000_000:
        return f"sample_rate {a.sample_rate!r} is not a whole number of Hz in [1,000, 1,000,000]"
    if type(a.num_mel_bins) is not int or not 1 <= a.num_mel_bins <= 1024:
        return f"num_mel_bins {a.num_mel_bins!r} is not a whole number in [1, 1,024]"
    if isinstance(a.dither, bool) or not isinstance(a.dither, (int, float)) or not 0 <= a.dither < 1e6:
        return f"dither {a.dither!r} is not a number >= 0"
    if a.backend not in FBANK_BACKENDS:
        return f"backend {a.backend!r} is not one of {list(FBANK_BACKENDS)}"
    return None


def frames_digest(frames: np.ndarray) -> str:
    """A short digest of a shard's frame column: the plan depends on every value of it."""
    return hashlib.blake2b(np.ascontiguousarray(frames, np.int32), digest_size=8).hexdigest()


class FolderIndex:
    """The index of one shard folder: columns over all its utterances, in shard order.

    ``utts[i]`` utterances of shard ``names[i]`` start at row ``starts[i]`` of ``frames`` and
    ``text_lens``; ``sizes``/``mtimes`` are -1 where unknown (a version 1 index).
    """

    def __init__(self, layout: str, dims: int | None, dtype: str, names: Sequence[str], utts: np.ndarray,
                 frames: np.ndarray, text_lens: np.ndarray, *, sizes: np.ndarray | None = None,
                 mtimes: np.ndarray | None = None, digests: Sequence[str] | None = None,
                 keys: list[str] | Callable[[], list[str]] | None = None, folder: str | os.PathLike | None = None,
                 lost: np.ndarray | None = None, speakers: Speakers | None = None,
                 checksums: Sequence[str | None] | None = None, audio: AudioIndex | None = None,
                 samples: np.ndarray | None = None) -> None:
        self.layout, self.dims, self.dtype = layout, dims, dtype
        self.audio = audio  # an audio folder's format, rate and fbank options (None: features)
        self.samples = samples  # int32 per utterance: an audio folder's sample counts
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
        if len(frames) != self.starts[-1] or len(text_lens) != len(frames):
            raise ValueError(f"index columns hold {len(frames)} frame counts and {len(text_lens)} transcript "
                             f"lengths for {self.starts[-1]} utterances")
        if (audio is None) != (samples is None) or (samples is not None and len(samples) != len(frames)):
            raise ValueError("an audio folder's index needs its audio fields and one sample count per utterance; "
                             "a features folder's has neither")

    @classmethod
    def from_shards(cls, layout: str, dims: int | None, dtype: str, infos: Sequence[ShardInfo], *,
                    sizes: Sequence[int] | None = None, mtimes: Sequence[int] | None = None,
                    lost: Sequence[int] | None = None, speakers: Speakers | None = None,
                    audio: AudioIndex | None = None) -> FolderIndex:
        """The index of shards ``infos``; an audio folder's (``audio`` given) takes their sample counts too."""
        frames = np.fromiter((f for i in infos for f in i.frames), np.int32)
        text_lens = np.fromiter((x for i in infos for x in i.text_lens), np.int32)
        samples = None if audio is None else np.fromiter((x for i in infos for x in i.samples), np.int32)
        return cls(layout, dims, dtype, [i.name for i in infos], np.array([i.num_utts for i in infos], np.int64),
                   frames, text_lens, sizes=None if sizes is None else np.asarray(sizes),
                   mtimes=None if mtimes is None else np.asarray(mtimes), keys=[k for i in infos for k in i.keys],
                   lost=None if lost is None else np.asarray(lost), speakers=speakers,
                   checksums=[i.sha256 for i in infos], audio=audio, samples=samples)

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
        if callable(self._keys):
            keys = self._keys()
            if len(keys) != self.num_utts:
                raise DamagedIndexError(self.folder / KEYS_FILE if self.folder else KEYS_FILE,
                                        f"{len(keys):,} keys for {self.num_utts:,} utterances")
            self._keys = keys
        if self._keys is None:
            assert self.folder is not None
            path = self.folder / KEYS_FILE
            keys = _read_lines(path)
            if len(keys) != self.num_utts:
                raise DamagedIndexError(path, f"{len(keys):,} keys; {INDEX_NAME} lists {self.num_utts:,} utterances")
            if not all(keys):
                raise DamagedIndexError(path, f"an empty key at line {keys.index('') + 1}")
            self._keys = keys
        return self._keys

    @property
    def has_speakers(self) -> bool:
        """Whether the speakers are stored (or given), not to be derived from the keys."""
        return self._speakers is not None

    def speakers(self) -> Speakers:
        """Every utterance's speaker, in shard order: the stored column, else by the key rule from
        the keys (an index written before the column existed)."""
        if self._speakers is None:
            self._speakers = Speakers.from_keys(self.keys())
        return self._speakers

    def head(self, n: int) -> FolderIndex:
        """The index of the first ``n`` shards alone (a growing folder as it was when ``n`` were published)."""
        if n >= len(self.names):
            return self
        rows = int(self.starts[n])
        speakers = None if self._speakers is None else self._speakers.rows(0, rows)
        return FolderIndex(self.layout, self.dims, self.dtype, self.names[:n], self.utts[:n], self.frames[:rows],
                           self.text_lens[:rows], sizes=self.sizes[:n], mtimes=self.mtimes[:n],
                           digests=self.digests[:n], keys=lambda: self.keys()[:rows], folder=self.folder,
                           lost=self.lost[:n], speakers=speakers, checksums=self.checksums[:n], audio=self.audio,
                           samples=None if self.samples is None else self.samples[:rows])

    def shard(self, i: int) -> ShardInfo:
        """Shard ``i``'s record, keys included."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return ShardInfo(self.names[i], self.keys()[a:b], self.frames[a:b].tolist(), self.text_lens[a:b].tolist(),
                         self.checksums[i], [] if self.samples is None else self.samples[a:b].tolist())

    @property
    def shards(self) -> list[ShardInfo]:
        """Every shard's record (reads the keys: for ``verify``, not for planning)."""
        return [self.shard(i) for i in range(len(self.names))]

    def summary(self) -> dict:
        """``index.json``'s content."""
        sp = self._speakers
        speakers = {"speakers": {"count": len(sp.names), "source": sp.source}} if sp is not None else {}
        return {
            "version": INDEX_VERSION, "layout": self.layout, "dims": self.dims, "dtype": self.dtype,
            "num_utts": self.num_utts, "num_frames": self.num_frames,
            "shards": [{"name": n, "size": int(s), "mtime_ns": int(m), "utts": int(u),
                        "frames": int(self.frames[a:a + u].sum(dtype=np.int64)), "frames_digest": d,
                        **({"lost": int(x)} if x else {}), **({"sha256": c} if c else {})}
                       for n, s, m, u, a, d, x, c in zip(self.names, self.sizes, self.mtimes, self.utts, self.starts,
                                                         self.digests, self.lost, self.checksums)],
            **speakers,
            **({"audio": self.audio.to_json()} if self.audio is not None else {}),
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
    """Write a folder's index, every file atomically and ``index.json`` last.  Whatever stands in a
    file's place is replaced (a FIFO, an empty folder); a folder with files in it is an error naming it."""
    folder = Path(folder)
    for name in (*INDEX_FILES, *AUDIO_INDEX_FILES):
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            try:
                (folder / name).rmdir()
            except OSError:
                raise DataError(f"{folder / name} is a folder with files in it where the index writes its {name}; "
                                f"move it away and index again") from None
    keys = index.keys()
    bad = next((k for k in keys if "\n" in k), None)
    if bad is not None:
        raise ValueError(f"{folder}: sample key {bad!r} holds a newline; such a shard cannot be indexed")
    columns = [(FRAMES_FILE, index.frames), (TEXT_LENS_FILE, index.text_lens)]
    if index.samples is not None:
        columns.append((SAMPLES_FILE, index.samples))
    for name, column in columns:
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


def part_dir(folder: str | os.PathLike, k: int) -> Path:
    """Where the ``k``-th published shard of a growing ``folder`` has its index entry."""
    return Path(folder) / PARTS_DIR / f"{k:08d}"


def write_part(folder: str | os.PathLike, k: int, index: FolderIndex, record: dict[str, Any]) -> Path:
    """Publish shard ``k`` of a growing folder: its index (one shard, the format of a folder's) and
    ``record`` (JSON: which planned shard it is, what it dropped), written whole in a hidden
    folder, synced, and renamed into place: a reader sees all of it or nothing."""
    import shutil

    parts = Path(folder) / PARTS_DIR
    parts.mkdir(exist_ok=True)
    tmp = parts / f".tmp-{k:08d}"
    if tmp.exists():  # left by a pack that was killed here
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_index(tmp, index)
    write_text(tmp / PART_NAME, json.dumps(record, ensure_ascii=False, separators=(",", ":")))
    for p in tmp.iterdir():
        sync(p)
    sync(tmp)
    final = part_dir(folder, k)
    os.rename(tmp, final)
    sync(parts)
    return final


def read_part_record(folder: str | os.PathLike, k: int) -> dict[str, Any]:
    """The record :func:`write_part` stored with published shard ``k`` (a JSON object)."""
    path = part_dir(folder, k) / PART_NAME
    data = _read_file(path)
    try:
        doc = json.loads(data.decode("utf-8"))  # type: ignore[union-attr]
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise DamagedIndexError(path, "not a JSON object")
    return doc


# A growing folder's parts, read once per process: (folder) -> (each part's stat, their index).
_parts_read: dict[str, tuple[list[tuple[int, int]], FolderIndex]] = {}


def read_parts(folder: str | os.PathLike) -> FolderIndex:
    """The index of the shards a growing ``folder`` has published: its parts 0, 1, ... (up to the
    first gap), each read and checked as a folder's index is, holding one shard, all of one layout,
    dims and dtype.  Parts never change once published, so those read before are kept (by their
    files' identity) and only the new ones are read."""
    folder = Path(folder)
    count = published_count(folder)
    stats = []
    for k in range(count):
        try:
            st = os.stat(part_dir(folder, k) / INDEX_NAME)
        except FileNotFoundError:  # a part being removed (the pack just wrote index.json)
            count = k
            break
        stats.append((st.st_ino, st.st_mtime_ns))
    key = str(folder)
    known, have = _parts_read.get(key, ([], None))
    keep = 0
    while keep < min(len(known), count) and known[keep] == stats[keep]:
        keep += 1
    if have is not None and keep == len(known) == count:
        return have
    pieces = [have.head(keep)] if have is not None and keep else []
    for k in range(keep, count):
        d = part_dir(folder, k)
        part = read_index(d)
        if part is None or len(part.names) != 1:
            raise DamagedIndexError(d / INDEX_NAME, f"lists {0 if part is None else len(part.names)} shards; a "
                                                    f"published shard's entry lists one")
        pieces.append(_in_memory(part))
    index = _concat(folder, pieces)
    _parts_read[key] = (stats, index)
    return index


def _in_memory(part: FolderIndex) -> FolderIndex:
    """A part's index with its columns copied out of their memory maps: thousands of parts must
    not hold a file descriptor each (a map keeps one open).  Its keys are still read when asked."""
    sp = part._speakers
    speakers = None if sp is None else Speakers(np.array(sp.ids, np.int32), sp.names, sp.source)
    return FolderIndex(part.layout, part.dims, part.dtype, part.names, part.utts, np.array(part.frames, np.int32),
                       np.array(part.text_lens, np.int32), sizes=part.sizes, mtimes=part.mtimes,
                       digests=part.digests, folder=part.folder, lost=part.lost, speakers=speakers,
                       checksums=part.checksums, audio=part.audio,
                       samples=None if part.samples is None else np.array(part.samples, np.int32))


def _concat(folder: Path, pieces: Sequence[FolderIndex]) -> FolderIndex:
    """Indexes of consecutive shards of ``folder`` as one, checked whole (names unique, ...)."""
    if not pieces:
        return FolderIndex("cat", None, "float32", [], np.zeros(0, np.int64), np.zeros(0, np.int32),
                           np.zeros(0, np.int32), folder=folder, keys=[],
                           speakers=Speakers(np.zeros(0, np.int32), [], FROM_KEYS))
    first = pieces[0]
    for p in pieces[1:]:
        for what in ("layout", "dims", "dtype", "audio"):
            if getattr(p, what) != getattr(first, what):
                raise DamagedIndexError(Path(p.folder or folder) / INDEX_NAME,
                                        f"{what} {getattr(p, what)!r}, the folder's first shard has "
                                        f"{getattr(first, what)!r}")
    has = [p.has_speakers for p in pieces]
    speakers = Speakers.concat([p.speakers() for p in pieces]) if all(has) else None

    def keys() -> list[str]:
        return [k for p in pieces for k in p.keys()]

    index = FolderIndex(first.layout, first.dims, first.dtype, [n for p in pieces for n in p.names],
                        np.concatenate([p.utts for p in pieces]),
                        np.concatenate([np.asarray(p.frames, np.int32) for p in pieces]),
                        np.concatenate([np.asarray(p.text_lens, np.int32) for p in pieces]),
                        sizes=np.concatenate([p.sizes for p in pieces]),
                        mtimes=np.concatenate([p.mtimes for p in pieces]),
                        digests=[d for p in pieces for d in p.digests], keys=keys, folder=folder,
                        lost=np.concatenate([p.lost for p in pieces]), speakers=speakers,
                        checksums=[c for p in pieces for c in p.checksums], audio=first.audio,
                        samples=None if first.audio is None else np.concatenate([np.asarray(p.samples, np.int32)
                                                                                for p in pieces]))
    check_index(index)
    return index


REINDEX = "re-index the folder (wdsprep index --force)"
_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1
_TAR_BLOCK = 512  # every tar member takes at least its header block
_MAX_NPY_HEADER = 1 << 16  # numpy itself refuses headers over 10,000 bytes
_REQUIRED = object()
COLUMN_DTYPE = np.dtype(np.int32)  # every column file: native int32, as np.save writes it


class DamagedIndexError(DataError):
    """A file of a folder's index is not what the index writer writes (missing, not a regular file,
    a field of the wrong type or range, columns that disagree): ``path`` names it, ``what`` says how."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path, self.what = str(path), what
        super().__init__(f"{path}: {what}; the index is damaged: {REINDEX}, or delete {', '.join(INDEX_FILES)} to "
                         f"read the shards without one")

    def __reduce__(self) -> tuple:  # to cross a process boundary whole (its args are not the message's)
        return type(self), (self.path, self.what)


def read_index(folder: str | os.PathLike) -> FolderIndex | None:
    """The index of a shard folder, or None when it has none (e.g. shards CAT wrote).

    Every reader (the loader, ``verify``, ``inspect``, ``index``) gets its index from here, so all
    give one verdict on it: :func:`check_index` holds every field and column against the others,
    and anything the writer would not have written is a :class:`DamagedIndexError` naming the file
    and field.  Only regular files are opened (a FIFO in a column's place would block the open).
    The keys are the one part read later, by what needs them (:meth:`FolderIndex.keys`): the
    loader does not, and remote loaders do not even fetch them.  A folder a pack is still writing
    (no ``index.json`` yet) gives the index of the shards it has published so far.
    """
    folder = Path(folder)
    path = folder / INDEX_NAME
    data = _read_file(path, required=False)
    if data is None:
        if not os.path.isdir(folder / PARTS_DIR):
            return None
        try:
            index: FolderIndex | None = read_parts(folder)
        except DamagedIndexError:
            index = None
            if not (folder / INDEX_NAME).is_file():
                raise
        if index is None or not os.path.isdir(folder / PARTS_DIR):  # the pack finished while they were read
            if (folder / INDEX_NAME).is_file():
                return read_index(folder)
        return index
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DamagedIndexError(path, f"not valid JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(d, dict):
        raise DamagedIndexError(path, f"holds {_show(d)}, not a JSON object")
    version = _field(path, d, "version", f"1 or {INDEX_VERSION}", lambda v: type(v) is int and v in (1, INDEX_VERSION))
    index, stated = (_index_v1 if version == 1 else _index_v2)(folder, path, d)
    check_index(index, stated)
    return index


@dataclass
class _Stated:
    """What ``index.json`` states besides the columns (totals, per-shard frames), to hold against them."""

    shard_frames: list[int]
    num_utts: int
    num_frames: int


def _index_v2(folder: Path, path: Path, d: dict) -> tuple[FolderIndex, _Stated]:
    """The index ``index.json`` (version 2) describes, its fields' types and ranges checked, its
    columns' headers and sizes checked and mapped."""
    layout, dims, dtype = _layout_fields(path, d)
    shards = _field(path, d, "shards", "a list", lambda v: isinstance(v, list))
    rows = []
    for i, s in enumerate(shards):
        at = f"shards[{i}]."
        if not isinstance(s, dict):
            raise DamagedIndexError(path, f"field 'shards[{i}]' is {_show(s)}, not a JSON object")
        rows.append((_field(path, s, "name", *_NAME, at), _field(path, s, "size", *_SIZE, at),
                     _field(path, s, "mtime_ns", *_MTIME, at), _field(path, s, "utts", *_COUNT, at),
                     _field(path, s, "frames", *_SIZE, at), _field(path, s, "frames_digest", *_DIGEST, at),
                     _field(path, s, "lost", *_SIZE, at, default=0),
                     _field(path, s, "sha256", *_SHA256, at, default=None)))
    names, sizes, mtimes, utts, shard_frames, digests, lost, checksums = (
        (list(c) for c in zip(*rows)) if rows else ([],) * 8)
    stated = _Stated(shard_frames, _field(path, d, "num_utts", *_SIZE), _field(path, d, "num_frames", *_SIZE))
    n = sum(utts)
    if stated.num_utts != n:
        raise DamagedIndexError(path, f"field 'num_utts' is {stated.num_utts:,}, its shards' 'utts' add up to {n:,}")
    # mmap: a loader over 15M utterances maps 60 MB per column instead of reading it.
    frames, text_lens = _column(folder / FRAMES_FILE, n), _column(folder / TEXT_LENS_FILE, n)
    meta = _field(path, d, "speakers", "a JSON object with 'count' and 'source'", lambda v: isinstance(v, dict),
                  default=None)
    speakers = None
    if meta is not None:
        count = _field(path, meta, "count", *_COUNT, "speakers.")
        source = _field(path, meta, "source", "a string", lambda v: isinstance(v, str), "speakers.")
        names_path = folder / SPEAKER_NAMES_FILE
        speaker_names = _read_lines(names_path)
        if len(speaker_names) != count:
            raise DamagedIndexError(names_path, f"{len(speaker_names):,} names; index.json's field 'speakers.count' "
                                                f"says {count:,}")
        speakers = Speakers(_column(folder / SPEAKERS_FILE, n), speaker_names, source)
    audio = _audio_field(path, d, layout)
    samples = None if audio is None else _column(folder / SAMPLES_FILE, n)
    index = FolderIndex(layout, dims, dtype, names, np.array(utts, np.int64), frames, text_lens,
                        sizes=np.array(sizes, np.int64),
                        mtimes=np.array(mtimes, np.int64), digests=digests, folder=folder,
                        lost=np.array(lost, np.int64), speakers=speakers, checksums=checksums, audio=audio,
                        samples=samples)
    return index, stated


def _audio_field(path: Path, d: dict, layout: str) -> AudioIndex | None:
    """``index.json``'s ``audio`` object, which an audio layout needs and a features layout must not have."""
    from wdsprep.format.keys import AUDIO_LAYOUTS

    raw = _field(path, d, "audio", "a JSON object with 'format', 'sample_rate', 'bits' and 'fbank'",
                 lambda v: isinstance(v, dict), default=None)
    if raw is None:
        if layout in AUDIO_LAYOUTS:
            raise DamagedIndexError(path, f"field 'audio' is missing: layout {layout!r} holds audio, and the index "
                                          f"says its rate and the fbank options the loader computes features with")
        return None
    if layout not in AUDIO_LAYOUTS:
        raise DamagedIndexError(path, f"field 'audio' is there, but layout {layout!r} holds features")
    fmt = _field(path, raw, "format", f"the layout, {layout!r}", lambda v: v == layout, "audio.")
    rate = _field(path, raw, "sample_rate", *_whole(1000, 1_000_000), "audio.")
    _field(path, raw, "bits", str(AUDIO_BITS), lambda v: type(v) is int and v == AUDIO_BITS, "audio.")
    fb = _field(path, raw, "fbank", "a JSON object", lambda v: isinstance(v, dict), "audio.")
    audio = AudioIndex(fmt, rate, num_mel_bins=_field(path, fb, "num_mel_bins", *_whole(1, 1024), "audio.fbank."),
                       dither=_field(path, fb, "dither", "a number >= 0", lambda v: not isinstance(v, bool) and
                                     isinstance(v, (int, float)) and 0 <= v < 1e6, "audio.fbank."),
                       backend=_field(path, fb, "backend", f"one of {list(FBANK_BACKENDS)}",
                                      lambda v: v in FBANK_BACKENDS, "audio.fbank."))
    return audio


def _index_v1(folder: Path, path: Path, d: dict) -> tuple[FolderIndex, None]:
    """A version 1 index: every shard's keys, frames and transcript lengths in ``index.json``."""
    layout, dims, dtype = _layout_fields(path, d)
    infos = []
    for i, s in enumerate(_field(path, d, "shards", "a list", lambda v: isinstance(v, list))):
        at = f"shards[{i}]."
        if not isinstance(s, dict):
            raise DamagedIndexError(path, f"field 'shards[{i}]' is {_show(s)}, not a JSON object")
        keys = _field(path, s, "keys", "a list of keys", lambda v: isinstance(v, list) and all(
            isinstance(k, str) and k for k in v), at)
        columns = [_field(path, s, c, f"a list of {len(keys)} whole numbers in [0, {_INT32_MAX:,}]",
                          lambda v: isinstance(v, list) and len(v) == len(keys) and all(
                              type(x) is int and 0 <= x <= _INT32_MAX for x in v), at)
                   for c in ("frames", "text_lens")]
        infos.append(ShardInfo(_field(path, s, "name", *_NAME, at), list(keys), *columns))
    index = FolderIndex.from_shards(layout, dims, dtype, infos)
    index.folder = folder
    return index, None


def _layout_fields(path: Path, d: dict) -> tuple[str, int | None, str]:
    from wdsprep.format.keys import LAYOUTS

    return (_field(path, d, "layout", f"one of {sorted(LAYOUTS)}", lambda v: isinstance(v, str) and v in LAYOUTS),
            _field(path, d, "dims", "null or " + _DIMS[0], lambda v: v is None or _DIMS[1](v), default=None),
            _field(path, d, "dtype", f"one of {sorted(INDEX_DTYPES)}",
                   lambda v: isinstance(v, str) and v in INDEX_DTYPES, default="float32"))


def check_index(index: FolderIndex, stated: _Stated | None = None) -> None:
    """Hold every field and column of an index against the others (and against what ``index.json``
    ``stated`` about them): a DamagedIndexError naming the file and field of the first that does not fit.

    Utterance counts against the columns, each shard's utterances and lost samples against its byte
    size (a tar member takes at least a 512-byte block), frames >= 1 and transcript lengths >= 0,
    each shard's frame digest and frame total against its rows, speaker ids within the speaker
    table, shard names unique plain file names.
    """
    folder = index.folder if index.folder is not None else Path(".")
    path = folder / INDEX_NAME
    seen: set[str] = set()
    for i, name in enumerate(index.names):
        if name in seen:
            raise DamagedIndexError(path, f"field 'shards[{i}].name' is {name!r}, which an earlier shard has too")
        seen.add(name)
    # An indexed sample has two members, a lost one at least one (lost on the left: 2**63 - 1 is a valid int64).
    for i in np.flatnonzero((index.sizes >= 0) & (index.lost > index.sizes // _TAR_BLOCK - 2 * index.utts)):
        raise DamagedIndexError(path, f"fields 'shards[{i}].utts' ({int(index.utts[i]):,}) and 'lost' "
                                      f"({int(index.lost[i]):,}) are more samples than its {int(index.sizes[i]):,} "
                                      f"bytes can hold")
    frames, text_lens = index.frames, index.text_lens
    if len(frames) and int(frames.min()) < 1:
        raise DamagedIndexError(folder / FRAMES_FILE, f"frame count {int(frames.min())} at row "
                                                      f"{int(np.argmin(frames))}; every utterance has at least 1")
    if len(text_lens) and int(text_lens.min()) < 0:
        raise DamagedIndexError(folder / TEXT_LENS_FILE, f"transcript length {int(text_lens.min())} at row "
                                                         f"{int(np.argmin(text_lens))}")
    plain = np.asarray(frames).view(np.ndarray)  # slices of a plain view cost less than a memmap's
    total = 0
    for i, (a, b) in enumerate(zip(index.starts[:-1].tolist(), index.starts[1:].tolist())):
        rows = plain[a:b]
        if frames_digest(rows) != index.digests[i]:
            raise DamagedIndexError(path, f"field 'shards[{i}].frames_digest' does not match rows {a:,}:{b:,} of "
                                          f"{FRAMES_FILE}")
        n = int(rows.sum(dtype=np.int64))  # per shard: one int64 copy of the column would be 120 MB at 15M rows
        if stated is not None and stated.shard_frames[i] != n:
            raise DamagedIndexError(path, f"field 'shards[{i}].frames' is {stated.shard_frames[i]:,}, its rows of "
                                          f"{FRAMES_FILE} add up to {n:,}")
        total += n
    if stated is not None and stated.num_frames != total:
        raise DamagedIndexError(path, f"field 'num_frames' is {stated.num_frames:,}, {FRAMES_FILE} adds up to "
                                      f"{total:,}")
    if index.audio is not None and index.samples is not None:
        _check_audio(index, folder)
    sp = index._speakers
    if sp is not None and len(sp.ids):
        lo, hi = int(sp.ids.min()), int(sp.ids.max())
        if lo < 0 or hi >= len(sp.names):
            bad = lo if lo < 0 else hi
            raise DamagedIndexError(folder / SPEAKERS_FILE, f"speaker id {bad} at row "
                                                            f"{int(np.flatnonzero(sp.ids == bad)[0])}; "
                                                            f"{SPEAKER_NAMES_FILE} names {len(sp.names):,} speakers")


def _check_audio(index: FolderIndex, folder: Path) -> None:
    """An audio folder: a sample count >= 1 per utterance, frames the fbank framing of it, dims its mel bins."""
    audio, samples = index.audio, index.samples
    assert audio is not None and samples is not None
    problem = _audio_problem(audio)
    if problem is not None:
        raise DamagedIndexError(folder / INDEX_NAME, f"field 'audio': {problem}")
    if index.dims != audio.num_mel_bins:
        raise DamagedIndexError(folder / INDEX_NAME, f"field 'dims' is {index.dims}, its audio's fbank gives "
                                                     f"{audio.num_mel_bins} mel bins")
    if len(samples) and int(samples.min()) < 1:
        raise DamagedIndexError(folder / SAMPLES_FILE, f"sample count {int(samples.min())} at row "
                                                       f"{int(np.argmin(samples))}; every utterance has at least 1")
    odd = np.flatnonzero(fbank_frames(np.asarray(samples), audio.sample_rate) != np.asarray(index.frames))
    if len(odd):
        r = int(odd[0])
        raise DamagedIndexError(folder / FRAMES_FILE, f"row {r:,} says {int(index.frames[r]):,} frames, but its "
                                                      f"{int(samples[r]):,} samples at {audio.sample_rate} Hz give "
                                                      f"{int(fbank_frames(int(samples[r]), audio.sample_rate)):,} "
                                                      f"({SAMPLES_FILE})")


def _field(path: Path, obj: dict, key: str, want: str, ok: Callable[[object], bool], where: str = "", *,
           default: object = _REQUIRED) -> Any:
    """``obj[key]`` when ``ok`` holds for it; else a DamagedIndexError naming field ``where + key``
    and saying it should be ``want``.  A missing key is ``default``, when one is given."""
    if key not in obj:
        if default is _REQUIRED:
            raise DamagedIndexError(path, f"field {where + key!r} is missing")
        return default
    value = obj[key]
    if not ok(value):
        raise DamagedIndexError(path, f"field {where + key!r} is {_show(value)}, not {want}")
    return value


def _whole(lo: int, hi: int) -> tuple[str, Callable[[object], bool]]:
    """(what, test) of a whole number in ``[lo, hi]`` (JSON's true/false are not numbers)."""
    return f"a whole number in [{lo:,}, {hi:,}]", lambda v: type(v) is int and lo <= v <= hi


_COUNT, _SIZE, _DIMS = _whole(0, _INT32_MAX), _whole(0, _INT64_MAX), _whole(1, _INT32_MAX)
_MTIME = _whole(-_INT64_MAX, _INT64_MAX)


def _is_name(v: object) -> bool:
    """A shard's file name in its folder: nothing that leaves it or could not be one line."""
    return isinstance(v, str) and v not in ("", ".", "..") and not any(c in v for c in "/\\\0\n")


def _is_digest(v: object) -> bool:
    return isinstance(v, str) and _DIGEST_RE.fullmatch(v) is not None


_NAME, _DIGEST = ("a file name", _is_name), ("16 hex digits", _is_digest)
# A shard's SHA-256, absent in indexes written before it was recorded.
_SHA256 = ("64 lowercase hex digits", lambda v: isinstance(v, str) and len(v) == 64
           and all(c in "0123456789abcdef" for c in v))
_DIGEST_RE = re.compile("[0-9a-f]{16}")


def _show(v: object) -> str:
    """A JSON value for a message: short, whatever it holds (nested 1,000 deep, 5,000 digits)."""
    if isinstance(v, dict):
        return f"a JSON object of {len(v)} field(s)"
    if isinstance(v, list):
        return f"a list of {len(v)} item(s)"
    if isinstance(v, str):
        return repr(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int) and abs(v) >= 10**18:
        return f"a {len(str(abs(v)))}-digit number"
    return repr(v)


def _read_file(path: Path, *, required: bool = True) -> bytes | None:
    """The bytes of index file ``path``: only a regular file is opened; None when it is missing
    and not ``required``."""
    f = _open_regular(path)
    if f is None:
        if required:
            raise DamagedIndexError(path, "is missing")
        return None
    with f, naming(path):
        return f.read()


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 index file, one item each, every one ended by a newline."""
    data = _read_file(path)
    assert data is not None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedIndexError(path, f"not UTF-8 ({e})") from None
    if text and not text.endswith("\n"):
        raise DamagedIndexError(path, "does not end in a newline (cut short?)")
    return text.split("\n")[:-1]


def _open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened for reading, or None when there is none.  Anything but a regular file (a
    FIFO, a device, a folder) is damage, found by ``stat`` before any open: opening a FIFO blocks."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise DamagedIndexError(path, f"is a {file_kind(mode)}, not a regular file")
        # O_NONBLOCK: a FIFO put in its place since the stat does not block the open either.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DamagedIndexError(path, f"cannot be opened ({e.strerror})") from None
    f = os.fdopen(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        f.close()
        raise DamagedIndexError(path, f"is a {file_kind(mode)}, not a regular file")
    return f


def _column(path: Path, rows: int) -> np.ndarray:
    """Column file ``path`` of ``rows`` int32 values, memory-mapped; its header, dtype, shape and
    byte size are checked first, so nothing past the file is mapped."""
    f = _open_regular(path)
    if f is None:
        raise DamagedIndexError(path, "is missing")
    with f, naming(path):
        size = os.fstat(f.fileno()).st_size
        head = f.read(12)
        try:
            end = npy_header_end(head)
            if not 12 <= end <= min(size, _MAX_NPY_HEADER):
                raise ValueError(f"a header of {end:,} bytes in a file of {size:,}")
            head += f.read(end - len(head))
            descr, _, shape = parse_npy_header(head[10 if head[6] == 1 else 12:end].decode("latin1"))
        except ValueError as e:
            raise DamagedIndexError(path, f"not an .npy column ({e})") from None
        if descr != COLUMN_DTYPE.str:
            raise DamagedIndexError(path, f"holds values of type {descr!r}; an index column is {COLUMN_DTYPE.str!r} "
                                          f"(int32)")
        if shape != (rows,):
            raise DamagedIndexError(path, f"has shape {shape}; index.json's shards hold {rows:,} utterances")
        if size != end + rows * COLUMN_DTYPE.itemsize:
            raise DamagedIndexError(path, f"has {size:,} bytes; a column of {rows:,} rows has "
                                          f"{end + rows * COLUMN_DTYPE.itemsize:,}")
        if not rows:
            return np.zeros(0, COLUMN_DTYPE)
        return np.memmap(f, COLUMN_DTYPE, "r", end, (rows,))


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


@dataclass
class ShardScan:
    """What reading a shard's headers found: the samples the loader reads (as an index entry), what
    it would refuse, layouts, dims and dtypes."""

    info: ShardInfo
    layouts: set[str] = field(default_factory=set)
    dims: set[int] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    rates: set[int] = field(default_factory=set)  # an audio shard's sample rates
    problems: list[str] = field(default_factory=list)
    lost: int = 0  # samples from the first refused one on: the loader stops reading there


def scan_shard(path: str | os.PathLike, *, source: ShardFile | None = None) -> ShardScan:
    """Keys, frames and transcript lengths of a shard from its tar and ``.npy`` headers and its
    transcripts (feature data is not read), as an index entry; an audio shard's from its audio
    headers (samples and rate: the frames are their fbank frames; no audio is decoded).
    ``source``: the shard fetched by the caller (a pipe's or URL's: the format does not fetch),
    ``path`` then only names it.

    Like the loader, the scan stops at the first sample the loader refuses: what is before it is
    the entry, and that sample and every one after it are counted in ``lost`` and named in
    ``problems``, as is damage to the tar (``verify`` gives the full diagnosis).
    """
    from wdsprep.format.keys import AUDIO_LAYOUTS, member_role
    from wdsprep.format.samples import (
        feature_layout,
        group_samples,
        open_members,
        read_audio_header,
        samples_before_damage,
        split_sample,
    )
    from wdsprep.format.tar import member_bytes

    path = str(path)
    scan = ShardScan(ShardInfo(os.path.basename(path)))
    src, members, problem = open_members(path, source=source)
    for key, group in samples_before_damage(members, problem):
        where = f"key {key!r}"
        try:
            feat_m, text_m = split_sample(group)
            where = f"member {feat_m[0]!r}"
            role = member_role(feat_m[0])
            if role is not None and role[1] in AUDIO_LAYOUTS:
                header = read_audio_header(src, feat_m)
                frames = int(fbank_frames(header.samples, header.sample_rate))
            else:
                dtype, _, shape, _ = feature_layout(src, feat_m)
                header, frames = None, int(shape[0])
            where = f"member {text_m[0]!r}"
            text_len = len(member_bytes(src, text_m).decode("utf-8"))
        except ValueError as e:
            problem = f"{where}: {e}"
            break
        scan.layouts.add(role[1] if role else "?")
        if header is None:
            scan.dims.add(int(shape[1]))
            scan.dtypes.add(str(dtype.newbyteorder("=")))
        else:
            scan.rates.add(header.sample_rate)
            scan.info.samples.append(header.samples)
        scan.info.keys.append(key)
        scan.info.frames.append(frames)
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
    changed shards (and those it does not list) are read again and the rest kept.  ``force`` reads
    every shard again and needs nothing of the old index: a damaged one is rebuilt from the shards
    (the speakers an intact one had from ``utt2spk`` are kept).  Entries of shards the patterns do
    not name are kept while the shard exists; those of shards no longer on disk are dropped, and
    the output says so.
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
            notes: list[str] = []
            try:
                old = read_index(folder)
            except DataError as e:
                if not force:
                    raise
                old = None
                where = f"{e.path}: {e.what}" if isinstance(e, DamagedIndexError) else str(e)
                notes.append(f"the old index was damaged ({where}), so it was rebuilt from the shards alone "
                             f"(speakers by the key rule)")
            entries: dict[str, tuple[ShardInfo, int, int, int]] = {}  # name -> (info, size, mtime, lost)
            stale: list[str] = []
            gone = [] if old is None else [n for n in old.names if not (folder / n).is_file()]
            if gone:
                notes.append(f"dropped {len(gone)} shard(s) no longer on disk ({', '.join(gone[:3])}"
                             f"{', ...' if len(gone) > 3 else ''})")
            upgrade = old is not None and bool((old.sizes < 0).any())  # version 1: no sizes, read it all again
            if old is not None and not force and not upgrade:
                for i, name in enumerate(old.names):
                    if name in gone:
                        continue
                    if stale_reason(old, i, (folder / name).stat()) is not None or old.mtimes[i] < 0:  # no mtime
                        stale.append(name)
                    else:
                        entries[name] = (old.shard(i), int(old.sizes[i]), int(old.mtimes[i]), int(old.lost[i]))
                        if entries[name][0].sha256 is None:  # an index from before checksums: one read adds it
                            entries[name][0].sha256 = file_sha256(folder / name)
            # The named shards and the listed ones still there, less those kept: read (again).
            listed = [] if old is None else [folder / n for n in old.names if n not in gone]
            todo = list({p.name: p for p in [*shards, *listed] if p.name not in entries}.values())
            if stale and not refresh and not force:
                raise ValueError(f"{folder}: {len(stale)} shard(s) changed since they were indexed (e.g. {stale[0]}); "
                                 f"pass --refresh to read them again (or repack the folder)")
            # An index without a speakers column or checksums (written before them) is rewritten,
            # without a header read (the checksums read each shard once).
            if (not todo and old is not None and not force and not gone and not upgrade and old.has_speakers
                    and None not in old.checksums):
                result.folders[str(folder)] = "up to date"
                result.shards += len(old.names)
                result.utterances += old.num_utts
                bar.update(len(shards))
                continue
            named = {p.name for p in shards}
            bar.total += sum(1 for p in todo if p.name not in named)  # listed shards the patterns leave out
            bar.refresh()
            layouts, dims, dtypes, rates = set(), set(), set(), set()
            for path in todo:
                st = path.stat()
                scan = scan_shard(path)
                scan.info.sha256 = file_sha256(path)
                result.scanned += 1
                result.problems.extend(scan.problems)
                layouts |= scan.layouts
                dims |= scan.dims
                dtypes |= scan.dtypes
                rates |= scan.rates
                entries[path.name] = (scan.info, st.st_size, st.st_mtime_ns, scan.lost)
                bar.update(1)
            bar.update(sum(1 for p in shards if p.name in entries and p not in todo))
            if old is not None and entries.keys() - {p.name for p in todo}:
                layouts.add(old.layout)
                dtypes.add(old.dtype)
                if old.dims is not None and old.audio is None:
                    dims.add(old.dims)
                if old.audio is not None:
                    rates.add(old.audio.sample_rate)
            for what, found in (("layouts", layouts), ("feature dims", dims), ("dtypes", dtypes),
                                ("sample rates", rates)):
                if len(found) > 1:
                    raise ValueError(f"{folder}: shards of different {what} {sorted(map(str, found))}; a folder is "
                                     f"one shard set: move them apart")
            names = sorted(entries)
            infos = [entries[n][0] for n in names]
            carried = None  # speakers packed from utt2spk are in no tar: keep them for the utterances still there
            try:
                if old is not None and old.speakers().source != FROM_KEYS:
                    carried = _carried_speakers(old, [k for i in infos for k in i.keys])
            except DataError as e:  # damaged keys: the key rule it is
                notes.append(f"speakers by the key rule: the old index's utt2spk speakers could not be carried over "
                             f"({e.path}: {e.what})" if isinstance(e, DamagedIndexError) else str(e))
            what = "indexed" if old is None and not notes else "upgraded from version 1" if upgrade else "re-indexed"
            layout = layouts.pop() if layouts else "cat"
            audio = _folder_audio(old, layout, rates.pop() if rates else None, notes)
            index = FolderIndex.from_shards(layout, audio.num_mel_bins if audio else dims.pop() if dims else None,
                                            dtypes.pop() if dtypes else "float32", infos,
                                            sizes=[entries[n][1] for n in names], mtimes=[entries[n][2] for n in names],
                                            lost=[entries[n][3] for n in names], speakers=carried, audio=audio)
            write_index(folder, index)
            result.folders[str(folder)] = "; ".join([f"{what}: {len(names)} shards, {len(todo)} read", *notes])
            result.shards += len(names)
            result.utterances += index.num_utts
    return result


def _folder_audio(old: FolderIndex | None, layout: str, rate: int | None, notes: list[str]) -> AudioIndex | None:
    """The audio fields of a folder (re)indexed from its shards: the old index's fbank options when
    it had them for this format and rate, else the defaults (said in ``notes``); None for features."""
    from wdsprep.format.keys import AUDIO_LAYOUTS

    if layout not in AUDIO_LAYOUTS:
        return None
    rate = rate or 16000  # a folder of no readable sample: any rate will do
    if old is not None and old.audio is not None and (old.audio.format, old.audio.sample_rate) == (layout, rate):
        return old.audio
    audio = AudioIndex(layout, rate)
    notes.append(f"audio at {rate} Hz: the loader computes fbank with the default options (num_mel_bins "
                 f"{audio.num_mel_bins}, dither {audio.dither}, backend {audio.backend}); make_loader(fbank=...) "
                 f"changes them")
    return audio


# Each label's length in one tokenizer's tokens, beside the index it counts (the cost model's u):
# named by the tokenizer and the index's shards, so another tokenizer or a re-indexed folder
# gets a column of its own instead of a stale one.
TOKENS_PREFIX = "index.tokens."


def tokens_name(index: FolderIndex, tokenizer_digest: str) -> str:
    """The file name of ``index``'s token column for the tokenizer of ``tokenizer_digest``."""
    doc = json.dumps([tokenizer_digest, index.names, index.digests, index.utts.tolist()])
    return f"{TOKENS_PREFIX}{hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()}.npy"


def parse_tokens(data: bytes | Path, num_utts: int, where: str) -> np.ndarray:
    """A token column read from its file (or bytes), checked: int32, one count >= 0 per utterance."""
    try:
        column = np.load(io.BytesIO(data) if isinstance(data, bytes) else data, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{where}: not a token column ({e}); delete it, the loader counts the tokens again") from None
    if column.dtype != np.int32 or column.shape != (num_utts,) or (len(column) and int(column.min()) < 0):
        raise DataError(f"{where}: a token column of {column.dtype} {column.shape}, the index has {num_utts} "
                        f"utterances; delete it, the loader counts the tokens again")
    return column


def write_tokens(folder: str | os.PathLike, name: str, column: np.ndarray) -> Path:
    """Write a token column beside the index, atomically."""
    path = Path(folder) / name
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(column, np.int32), allow_pickle=False)
    return path


# -- an index beside shards on S3 or a web server ------------------------------------------------



class FetchFile(Protocol):
    """A small object at a URL into a local file, at most ``limit`` bytes (an ``OverLimit`` error
    beyond): True when it was there.  The layers above pass one that fetches with the user's
    retries (``remote.fetch.fetch_file``): the format reads, it does not fetch."""

    def __call__(self, url: str, path: str, *, limit: int) -> bool: ...



# The most bytes an index file downloaded beside remote shards may have.  index.json is O(shards)
# (~200 bytes a shard: 32 MiB holds ~160,000 shards in one folder); the others follow from the
# utterances (and speakers) it lists: int32 columns, and keys or speaker names of up to 1 KiB on
# average.  A server sending more (a Content-Length of 10^12, an endless body) is cut off there.
MAX_SUMMARY_BYTES = 32 << 20
_SLACK = 64 << 10  # an .npy header, a text file's last line
_PER_ROW = {FRAMES_FILE: 4, TEXT_LENS_FILE: 4, SPEAKERS_FILE: 4, SAMPLES_FILE: 4, KEYS_FILE: 1024,
            SPEAKER_NAMES_FILE: 1024}


def index_file_limit(name: str, summary: dict) -> int:
    """The most bytes index file ``name`` can have beside the ``index.json`` ``summary`` (parsed)."""
    if name == INDEX_NAME:
        return MAX_SUMMARY_BYTES
    try:
        rows = (int(summary["speakers"]["count"]) if name == SPEAKER_NAMES_FILE
                else sum(int(shard["utts"]) for shard in summary["shards"]))
    except (KeyError, TypeError, ValueError):
        rows = 0  # a damaged index.json: read_index names what is wrong with it
    return _SLACK + _PER_ROW.get(name, 4) * max(0, rows)


def read_index_at(folder: str, fetch: FetchFile, *, keys: bool = False) -> FolderIndex:
    """The index uploaded beside remote shards in ``folder`` (an s3:// or http(s):// folder URL),
    its files fetched by ``fetch``, each bounded by :func:`index_file_limit`, into a temporary
    folder and read there by :func:`read_index`; its columns (the stored speakers too) stay
    memory-mapped after the folder is gone.  The keys are fetched only with ``keys`` (``verify``,
    speakers by the key rule): planning does not need them."""
    from wdsprep.remote.urls import redact

    shown = redact(folder)
    with tempfile.TemporaryDirectory(prefix="wdsprep-index-") as tmp:
        summary: dict = {}
        for name in (*INDEX_FILES, *AUDIO_INDEX_FILES):  # an audio folder's sample counts too
            if name == KEYS_FILE and not keys:
                continue
            path = os.path.join(tmp, name)
            limit = index_file_limit(name, summary)
            try:
                found = fetch(f"{folder}/{name}", path, limit=limit)
            except OverLimit:
                bound = ("about 200 bytes per shard" if name == INDEX_NAME
                         else f"for the utterances its {INDEX_NAME} lists")
                raise DataError(
                    f"{shown}/{name}: more than the {limit:,} bytes an index file can have here ({bound}): not an "
                    f"index wdsprep wrote, or the server sends more than the file; check the server, or index a "
                    f"local copy again (wdsprep index --force) and upload its index files") from None
            if name == INDEX_NAME and not found:
                raise DataError(
                    f"{shown}/{INDEX_NAME}: the shards there have no index; the loader plans every epoch from it and "
                    f"will not download a whole remote corpus on every rank to read its headers. Index a local copy "
                    f"(wdsprep index 'DIR/*/data-*.tar'; pack writes it too) and upload its index files "
                    f"({', '.join(INDEX_FILES)}) beside the shards, e.g. aws s3 sync DIR s3://BUCKET/PREFIX "
                    f"--exclude '*' --include '*index*'")
            if not found:
                os.unlink(path)  # missing: read_index says what it lacks
            elif name == INDEX_NAME:
                try:
                    summary = json.loads(Path(path).read_bytes())
                except ValueError:
                    summary = {}  # read_index names what is wrong with it
                summary = summary if isinstance(summary, dict) else {}
        try:
            index = read_index(tmp)
            if index is not None and keys:
                index.keys()  # read now: the folder goes
            if index is not None and index.has_speakers:
                index.speakers()
        except DataError as e:
            raise DataError(str(e).replace(tmp, shown)) from None
    assert index is not None
    return index


def read_tokens_at(folder: str, name: str, num_utts: int, fetch: FetchFile) -> np.ndarray | None:
    """A token column uploaded beside a remote index (:func:`tokens_name`), or None when there is none."""
    from wdsprep.remote.urls import redact

    with tempfile.TemporaryDirectory(prefix="wdsprep-tokens-") as tmp:
        path = os.path.join(tmp, name)
        try:
            if not fetch(f"{folder}/{name}", path, limit=_SLACK + 4 * num_utts):
                return None
        except OverLimit:
            raise DataError(f"{redact(folder)}/{name}: longer than a token column of {num_utts:,} labels can be; "
                            f"count the labels again and upload the column") from None
        return parse_tokens(Path(path).read_bytes(), num_utts, f"{redact(folder)}/{name}")
