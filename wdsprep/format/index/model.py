"""An index in memory: what the loader plans from, ``verify`` holds against the tars and the writers fill.

:class:`FolderIndex` holds one folder's columns over all its utterances, in shard order;
:class:`ShardInfo` is one shard's record (what the shard writer and a scan produce),
:class:`Speakers` each utterance's speaker, :class:`Values` each utterance's value of an indexed
field (its language, ``pack --index-field``'s), :class:`AudioIndex` what an audio folder's index
says of its audio.  Nothing here reads a tar; the keys are read from their file on first use.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from wdsprep.format.audio import AUDIO_BITS, AUDIO_FORMATS, FBANK_BACKENDS, MAX_MEL_BINS
from wdsprep.format.index.files import INDEX_NAME, INDEX_VERSION, KEYS_FILE, DamagedIndexError, read_lines

FROM_UTT2SPK, FROM_KEYS = "utt2spk", "key prefix"  # where a speakers column came from


@dataclass
class ShardInfo:
    """One shard's record, utterance by utterance (what the writer and a scan produce)."""

    name: str
    keys: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    text_lens: list[int] = field(default_factory=list)
    sha256: str | None = field(default=None, compare=False)  # of the shard's bytes (hex), where known
    samples: list[int] = field(default_factory=list)  # an audio shard's sample counts (empty for features)
    # Each indexed field's value per utterance (the language, pack --index-field's), by field name;
    # None where the utterance has none (a field a manifest line may leave out).
    values: dict[str, list[str | None]] = field(default_factory=dict)

    @property
    def num_utts(self) -> int:
        return len(self.keys)

    @property
    def num_frames(self) -> int:
        return int(sum(self.frames))


@dataclass
class Values:
    """Each utterance's value of an indexed field, as ``names[ids[row]]``: the same value once in ``names``."""

    ids: np.ndarray  # int32 per utterance
    names: list[str]

    @classmethod
    def numbered(cls, per_utt: Sequence[str | None]) -> tuple[np.ndarray, list[str]]:
        """(ids, names) of one value per utterance; values are numbered in order of first appearance,
        an utterance without one (None: a manifest line without the key) is id -1."""
        numbers: dict[str, int] = {}
        ids = np.fromiter((-1 if s is None else numbers.setdefault(s, len(numbers)) for s in per_utt), np.int32,
                          len(per_utt))
        return ids, list(numbers)

    @classmethod
    def of(cls, per_utt: Sequence[str | None]) -> Values:
        return cls(*cls.numbered(per_utt))

    def values(self, rows: np.ndarray | slice | None = None) -> list[str]:
        """The values of ``rows`` (all rows when None), as strings (None for an id of -1: rows of
        a loader's corpus whose index has no such column)."""
        ids = self.ids if rows is None else self.ids[rows]
        names = self.names
        return [names[i] if i >= 0 else None for i in np.asarray(ids).tolist()]  # type: ignore[misc]

    def rows(self, a: int, b: int) -> Values:
        """The values of rows ``a:b`` (the names stay: ids keep their meaning)."""
        return type(self)(self.ids[a:b], self.names)

    def take(self, rows: np.ndarray) -> Values:
        """The values of the rows ``rows`` (an index array), names kept."""
        return type(self)(np.asarray(self.ids)[rows], self.names)

    @staticmethod
    def joined(parts: Iterable[Values], total: int | None = None) -> tuple[np.ndarray, list[str]]:
        """(ids, names) of parts one after another (shards, corpora), each name numbered once, in the
        order the parts' name lists are met (parts of one index share its list: it is numbered once).
        ``total``: the rows of all parts, when ``parts`` is an iterator that lets each go once read."""
        if total is None:
            parts = list(parts)
            total = sum(len(p.ids) for p in parts)
        numbers: dict[str, int] = {}
        mappings: dict[int, np.ndarray] = {}  # id of a names list -> its numbers
        # One output filled part by part: a list of per-part copies and their concatenation would
        # hold the column twice (288 MB at 36 M rows).
        ids = np.empty(total, np.int32)
        at = 0
        for p in parts:
            mapping = mappings.get(id(p.names))
            if mapping is None:
                mapping = mappings[id(p.names)] = np.array([numbers.setdefault(n, len(numbers)) for n in p.names],
                                                           np.int32)
            mine = np.asarray(p.ids)
            out = ids[at:at + len(mine)]
            at += len(mine)
            if not len(mine) or not len(mapping):
                out[:] = -1  # none of its rows has a value
            else:
                np.copyto(out, np.where(mine >= 0, mapping[np.maximum(mine, 0)], -1), casting="unsafe")
        if at != total:
            raise ValueError(f"parts of {at:,} rows joined as {total:,}")
        return ids, list(numbers)

    @classmethod
    def concat(cls, parts: Iterable[Values], total: int | None = None) -> Values:
        return cls(*cls.joined(parts, total))

    def counts(self) -> dict[str, np.ndarray]:
        """Each value's rows (a boolean mask over the rows), in ``names`` order, for values present."""
        ids = np.asarray(self.ids)
        return {n: ids == i for i, n in enumerate(self.names) if (ids == i).any()}


@dataclass
class Speakers(Values):
    """Each utterance's speaker, as ``names[ids[row]]``; ``source`` says where they came from."""

    source: str = FROM_KEYS

    @classmethod
    def of(cls, per_utt: Sequence[str], source: str = FROM_KEYS) -> Speakers:  # type: ignore[override]
        """From one speaker name per utterance; names are numbered in order of first appearance."""
        return cls(*cls.numbered(per_utt), source)

    @classmethod
    def from_keys(cls, keys: Sequence[str]) -> Speakers:
        """By the key rule: :func:`~wdsprep.format.keys.speaker_of` of each key's utterance id."""
        from wdsprep.format.keys import speaker_of, uttid_for_message

        return cls.of([speaker_of(uttid_for_message(k) or "") for k in keys], FROM_KEYS)

    def rows(self, a: int, b: int) -> Speakers:
        """The speakers of rows ``a:b`` (the names stay: ids keep their meaning)."""
        return Speakers(self.ids[a:b], self.names, self.source)

    def take(self, rows: np.ndarray) -> Speakers:
        return Speakers(np.asarray(self.ids)[rows], self.names, self.source)

    @classmethod
    def concat(cls, parts: Iterable[Speakers], total: int | None = None) -> Speakers:  # type: ignore[override]
        """Parts one after another (shards, corpora), each name numbered once (see :meth:`Values.joined`)."""
        found: set[str] = set()

        def seen() -> Iterator[Speakers]:
            for p in parts:
                found.add(p.source)
                yield p

        ids, names = cls.joined(seen(), total)
        sources = sorted(found)
        return cls(ids, names, sources[0] if len(sources) == 1 else " + ".join(sources) or FROM_KEYS)


@dataclass(frozen=True)
class AudioIndex:
    """What ``index.json`` says of an audio folder: the audio's layout (its key ``format`` there), sample rate
    and bits, and the fbank options the loader computes the features with (those of
    :class:`~wdsprep.prep.fbank.FbankOptions`, at the audio's rate)."""

    layout: str
    sample_rate: int
    num_mel_bins: int = 80
    dither: float = 0.0
    backend: str = "numpy"

    def __post_init__(self) -> None:
        problem = audio_problem(self)
        if problem is not None:
            raise ValueError(f"audio index: {problem}")

    def to_json(self) -> dict[str, Any]:
        return {"format": self.layout, "sample_rate": self.sample_rate, "bits": AUDIO_BITS,
                "fbank": {"num_mel_bins": self.num_mel_bins, "dither": self.dither, "backend": self.backend}}


def audio_problem(a: AudioIndex) -> str | None:
    """What is wrong with an AudioIndex's fields (None: nothing): the one check for the writer and the reader."""
    if a.layout not in AUDIO_FORMATS:
        return f"format {a.layout!r} is not one of {sorted(AUDIO_FORMATS)}"
    if type(a.sample_rate) is not int or not 1000 <= a.sample_rate <= 1_000_000:
        return f"sample_rate {a.sample_rate!r} is not a whole number of Hz in [1,000, 1,000,000]"
    if type(a.num_mel_bins) is not int or not 1 <= a.num_mel_bins <= MAX_MEL_BINS:
        return f"num_mel_bins {a.num_mel_bins!r} is not a whole number in [1, {MAX_MEL_BINS:,}]"
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
    ``text_lens``; ``sizes``/``mtimes`` are -1 where unknown (a version 1 index).  ``fields``: the
    fields every sample carries as members (``pack --utt2lang``, ``--field``), by name; ``columns``
    those of them indexed, each utterance's value (the language always, when the samples carry one).
    """

    def __init__(self, layout: str, dims: int | None, dtype: str, names: Sequence[str], utts: np.ndarray,
                 frames: np.ndarray, text_lens: np.ndarray, *, sizes: np.ndarray | None = None,
                 mtimes: np.ndarray | None = None, digests: Sequence[str] | None = None,
                 keys: list[str] | Callable[[], list[str]] | None = None, folder: str | os.PathLike | None = None,
                 lost: np.ndarray | None = None, speakers: Speakers | None = None,
                 checksums: Sequence[str | None] | None = None, audio: AudioIndex | None = None,
                 samples: np.ndarray | None = None, fields: Sequence[str] = (),
                 columns: Mapping[str, Values] | None = None) -> None:
        self.layout, self.dims, self.dtype = layout, dims, dtype
        self.fields = tuple(fields)
        self.columns: dict[str, Values] = dict(columns or {})
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
        # Each shard's SHA-256 (hex), None where the index has none (version 1, version 2 without checksums).
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
        for name, column in self.columns.items():
            if name not in self.fields or len(column.ids) != len(frames):
                raise ValueError(f"index column {name!r}: {len(column.ids)} values for {len(frames)} utterances of "
                                 f"fields {list(self.fields)}")

    @classmethod
    def from_shards(cls, layout: str, dims: int | None, dtype: str, infos: Sequence[ShardInfo], *,
                    sizes: Sequence[int] | None = None, mtimes: Sequence[int] | None = None,
                    lost: Sequence[int] | None = None, speakers: Speakers | None = None,
                    audio: AudioIndex | None = None, fields: Sequence[str] = ()) -> FolderIndex:
        """The index of shards ``infos``; an audio folder's (``audio`` given) takes their sample counts
        too; ``fields``: what the samples carry, whose values ``infos`` hold are indexed."""
        indexed = [n for n in fields if any(n in i.values for i in infos)]  # a shard without: none of its rows has one
        columns = {n: Values.of([v for i in infos for v in i.values.get(n, [None] * i.num_utts)]) for n in indexed}
        frames = np.fromiter((f for i in infos for f in i.frames), np.int32)
        text_lens = np.fromiter((x for i in infos for x in i.text_lens), np.int32)
        samples = None if audio is None else np.fromiter((x for i in infos for x in i.samples), np.int32)
        return cls(layout, dims, dtype, [i.name for i in infos], np.array([i.num_utts for i in infos], np.int64),
                   frames, text_lens, sizes=None if sizes is None else np.asarray(sizes),
                   mtimes=None if mtimes is None else np.asarray(mtimes), keys=[k for i in infos for k in i.keys],
                   lost=None if lost is None else np.asarray(lost), speakers=speakers,
                   checksums=[i.sha256 for i in infos], audio=audio, samples=samples, fields=fields, columns=columns)

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
            keys = read_lines(path)
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
        the keys (version 1, version 2 without a speakers column)."""
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
                           samples=None if self.samples is None else self.samples[:rows], fields=self.fields,
                           columns={k: c.rows(0, rows) for k, c in self.columns.items()})

    def shard(self, i: int) -> ShardInfo:
        """Shard ``i``'s record, keys included."""
        a, b = int(self.starts[i]), int(self.starts[i + 1])
        return ShardInfo(self.names[i], self.keys()[a:b], self.frames[a:b].tolist(), self.text_lens[a:b].tolist(),
                         self.checksums[i], [] if self.samples is None else self.samples[a:b].tolist(),
                         {k: c.values(slice(a, b)) for k, c in self.columns.items()})

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
            **({"fields": {n: ({"values": len(self.columns[n].names)} if n in self.columns else {})
                           for n in self.fields}} if self.fields else {}),
        }


def stale_reason(index: FolderIndex, i: int, st: os.stat_result, path: str | os.PathLike | None = None) -> str | None:
    """Why local shard ``i`` of ``index`` no longer is the shard indexed (``st`` its stat), or None.

    A shard of the indexed size whose modification time differs (a folder copied with ``cp -r``, or
    synced without times) is judged by its content when ``path`` is given and the index holds its
    SHA-256: the same bytes are the same shard."""
    size, mtime = int(index.sizes[i]), int(index.mtimes[i])
    if size >= 0 and st.st_size != size:
        return f"it has {st.st_size:,} bytes, the index says {size:,}"
    if mtime >= 0 and st.st_mtime_ns != mtime:
        checksum = index.checksums[i]
        if path is None or checksum is None:
            return "its modification time differs from the index's (same size)"
        from wdsprep.files import file_sha256

        if file_sha256(path) != checksum:
            return "its bytes differ from the SHA-256 its index records (same size, another modification time)"
    return None
