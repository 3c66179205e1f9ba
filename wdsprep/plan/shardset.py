"""The indexed shard set an epoch is planned from: every shard's utterances and every utterance's frames.

Built once per loader from each folder's index (``format/index/``): O(shards) JSON plus one
memory-mapped frame column per folder, and the speakers column where the index stores one.  A
shard that changed since it was indexed (its size or mtime differ) is refused at once, naming
it: it is never read against a stale index.  Shards that no index lists (CAT's, a copied folder,
``pipe:`` commands) are scanned here, headers only, with a warning that ``wdsprep index`` would
save that scan.

Shards on S3 or a web server are planned from the index files uploaded beside them, fetched once
per loader (``index.json`` and its columns, speakers included, not the keys), each bounded by
what an index of that many utterances can be (:func:`~wdsprep.format.index.remote.index_file_limit`):
a server cannot make the loader hold more.  A remote folder without one is an error saying how to make and upload it:
scanning would download the whole corpus on every rank before the first step.  Their staleness
is checked by size: against the bucket listing when the pattern was a glob (before the epoch),
else when each shard is downloaded, and then by the SHA-256 the index records too.

This is where a remote shard becomes something ``wdsprep.format`` reads (:func:`fetched_shard`,
for the scan of shards no index lists, ``verify`` and ``inspect``): the format does not fetch, so
the user's retry options reach every read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format.index import (
    INDEX_NAME,
    AudioIndex,
    FolderIndex,
    ShardInfo,
    Speakers,
    Values,
    frames_digest,
    read_index,
    read_index_at,
    stale_reason,
)
from wdsprep.format.keys import AUDIO_LAYOUTS, decode_key
from wdsprep.format.reindex import ShardScan, scan_shard
from wdsprep.format.shardfile import ShardFile
from wdsprep.format.shardlist import expand_shards, index_place, is_url
from wdsprep.remote.fetch import RetryPolicy, fetch_file, fetch_shard
from wdsprep.remote.listing import lister, take_listed_size
from wdsprep.remote.urls import has_folder, redact
from wdsprep.units import fbank_frames, resampled_lengths


class TokenCounts(Protocol):
    """Each label's length in tokens (``plan/tokens.LabelTokens``): per index folder, or for a
    shard in no index."""

    def folder(self, folder: str, index: FolderIndex) -> np.ndarray: ...

    def shard(self, url: str) -> np.ndarray: ...


# Remote folders whose index files are fetched at once when a shard set is built.
INDEX_REQUESTS = 16


class StaleIndexError(DataError):
    """A shard differs from what its folder's index says; the message names it and what to do."""


def fetched_shard(url: str, *, policy: RetryPolicy, expected: int | None = None,
                  checksum: str | None = None) -> ShardFile:
    """A pipe's or URL's shard fetched whole into memory with ``policy``'s retries, checked against
    the size and SHA-256 its index recorded (where given), and open for the format's readers like a
    local one (named in messages with its secrets masked).  Raises ``FetchError``."""
    copy, _ = fetch_shard(url, expected=expected, checksum=checksum, policy=policy)
    return ShardFile(redact(url), copy)


@dataclass
class ShardSet:
    """Shards in list order, their utterances as rows ``starts[i]:starts[i + 1]`` of ``frames``."""

    urls: list[str]
    utts: np.ndarray  # int64 [S]
    frames: np.ndarray  # int32 [N]: every utterance's frames, shard after shard
    digests: list[str]  # per shard: frames_digest of its rows
    sizes: np.ndarray  # int64 [S]: bytes each shard should have, -1 where unknown
    dims: int | None = None  # feature dims, when an index or a scan says
    scanned: int = 0  # shards read here because no index listed them
    lost: np.ndarray | None = None  # int64 [S]: samples a scan found the loader cannot read (damage)
    corpora: tuple[str, ...] = ("",)  # the named corpora, in order (one unnamed without names)
    corpus: np.ndarray | None = None  # int64 [S]: each shard's corpus; its shards are contiguous
    # Every utterance's speaker, where every shard's index gives them (see shard_set), else None.
    speakers: Speakers | None = None
    checksums: list[str | None] | None = None  # per shard: the SHA-256 its index records (None: not recorded)
    tokens: np.ndarray | None = None  # int32 [N]: every label's length in tokens, where a cost model needs them
    # Audio shards: their format, rate and fbank options (one for the whole set), every row's sample count.
    audio: AudioIndex | None = None
    samples: np.ndarray | None = None  # int32 [N]
    # Audio shards: every row's stored sample rate (folders may differ; the readers resample to
    # ``audio.sample_rate`` once :meth:`at_rate` set it, and ``samples``/``frames`` are at that rate).
    rates: np.ndarray | None = None  # int32 [N]
    # The fields every shard's samples carry (pack --field, --utt2lang), and each row's value of those
    # every shard's index has a column of (the language, "lang", and the pack's --index-field).
    fields: tuple[str, ...] = ()
    columns: dict[str, Values] | None = None

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.utts)]).astype(np.int64)
        if self.lost is None:
            self.lost = np.zeros(len(self.urls), np.int64)
        if self.corpus is None:
            self.corpus = np.zeros(len(self.urls), np.int64)
        if self.checksums is None:
            self.checksums = [None] * len(self.urls)
        if self.columns is None:
            self.columns = {}

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def num_utts(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, utts: np.ndarray) -> np.ndarray:
        """The shard of each global utterance row."""
        return np.searchsorted(self.starts, utts, side="right") - 1

    def fingerprint(self) -> str:
        """What the plan depends on: per shard its last two path parts (a moved corpus keeps its
        fingerprint), utterance count and frame column; and the corpora's names, when named."""
        doc: list = [["/".join(u.rstrip("/").split("/")[-2:]), int(n), d]
                     for u, n, d in zip(self.urls, self.utts, self.digests)]
        if self.corpora != ("",):
            doc = [list(self.corpora), self.corpus.tolist(), doc]
        return hashlib.blake2b(json.dumps(doc).encode(), digest_size=8).hexdigest()

    def shards_of(self, corpus: int) -> slice:
        """The shards of corpus ``corpus`` (contiguous)."""
        at = np.flatnonzero(self.corpus == corpus)
        return slice(int(at[0]), int(at[-1]) + 1) if len(at) else slice(0, 0)

    def of_corpus(self, corpus: int) -> ShardSet:
        """Corpus ``corpus`` alone, as a shard set of its own (rows and shards counted from 0)."""
        sl = self.shards_of(corpus)
        rows = slice(int(self.starts[sl.start]), int(self.starts[sl.stop]))
        speakers = None if self.speakers is None else self.speakers.rows(rows.start, rows.stop)
        return ShardSet(self.urls[sl], self.utts[sl], self.frames[rows], self.digests[sl], self.sizes[sl], self.dims,
                        0, self.lost[sl], speakers=speakers, checksums=self.checksums[sl],
                        tokens=None if self.tokens is None else self.tokens[rows], audio=self.audio,
                        samples=None if self.samples is None else self.samples[rows],
                        rates=None if self.rates is None else self.rates[rows], fields=self.fields,
                        columns={k: c.rows(rows.start, rows.stop) for k, c in self.columns.items()})

    def subset(self, rows: np.ndarray) -> ShardSet:
        """The rows ``rows`` (global, ascending) alone, as a shard set of their own: each shard that
        holds some of them, with those (a part of a corpus split by a column: ``mix_by``).  Its
        shards are named by their files; its rows are numbered from 0 in the order given."""
        rows = np.asarray(rows, np.int64)
        owner = self.shard_of(rows)
        used, counts = np.unique(owner, return_counts=True)
        # A shard's digest is of the rows taken from it, so two parts of one shard differ.
        digests = [frames_digest(np.asarray(self.frames[rows[owner == s]], np.int32)) for s in used.tolist()]
        speakers = None if self.speakers is None else self.speakers.take(rows)
        return ShardSet([self.urls[s] for s in used.tolist()], counts.astype(np.int64), self.frames[rows], digests,
                        self.sizes[used], self.dims, 0, self.lost[used] * 0, speakers=speakers,
                        checksums=[self.checksums[s] for s in used.tolist()],
                        tokens=None if self.tokens is None else self.tokens[rows], audio=self.audio,
                        samples=None if self.samples is None else self.samples[rows],
                        rates=None if self.rates is None else self.rates[rows], fields=self.fields,
                        columns={k: c.take(rows) for k, c in self.columns.items()})

    def at_rate(self, sample_rate: int) -> ShardSet:
        """Audio shards as the readers deliver them at ``sample_rate``: each row's samples after the
        readers' exact rational resampling from its stored rate (``resampled_lengths``) and the
        frames fbank gives of them, what the plan cuts by; itself when every row is at that rate."""
        if self.audio is None or self.samples is None or self.rates is None:
            return self
        if (self.rates == sample_rate).all() and self.audio.sample_rate == sample_rate:
            return self
        samples = resampled_lengths(self.samples, self.rates, sample_rate).astype(np.int32)
        return replace(self, samples=samples, frames=fbank_frames(samples, sample_rate).astype(np.int32),
                       audio=replace(self.audio, sample_rate=sample_rate))

    @property
    def mixed_rates(self) -> list[int]:
        """The stored sample rates of audio rows, when more than one (else [])."""
        found = [] if self.rates is None else np.unique(self.rates).tolist()
        return found if len(found) > 1 else []

    def values(self, name: str, rows: np.ndarray) -> list[str | None] | None:
        """Rows' values of index column ``name`` (the language: ``lang``), or None when it has none
        (a row of a corpus whose index has none: None)."""
        column = self.columns.get(name)
        return None if column is None else column.values(rows)

    def has_some(self, name: str, corpus: int) -> bool:
        """Whether some row of corpus ``corpus`` has a value of index column ``name``."""
        column = self.columns.get(name)
        sl = self.shards_of(corpus)
        return column is not None and bool((np.asarray(column.ids)[self.starts[sl.start]:self.starts[sl.stop]] >= 0)
                                           .any())

    def lacks(self, name: str, corpus: int) -> bool:
        """Whether some row of corpus ``corpus`` has no value of index column ``name``."""
        column = self.columns.get(name)
        sl = self.shards_of(corpus)
        return column is None or bool((np.asarray(column.ids)[self.starts[sl.start]:self.starts[sl.stop]] < 0).any())


def union(named: dict[str, ShardSet]) -> ShardSet:
    """Named corpora as one shard set, corpus after corpus: shard ``i``'s corpus is ``corpus[i]``."""
    parts = list(named.values())
    if not parts:
        raise ValueError("no corpora given")
    dims = {p.dims for p in parts if p.dims is not None}
    if len(dims) > 1:
        each = ", ".join(f"{n}: {p.dims}" for n, p in named.items())
        raise ValueError(f"the corpora's features differ in dimension ({each}): one model reads one dimension")
    seen: dict[str, str] = {}
    for name, p in named.items():
        for url in p.urls:
            if seen.setdefault(url, name) != name:
                raise ValueError(f"shard {redact(url)} is in corpus {seen[url]!r} and in corpus {name!r}: a shard "
                                 f"belongs to one corpus (narrow one of the patterns)")
    speakers = [p.speakers for p in parts if p.speakers is not None]
    tokens = [p.tokens for p in parts if p.tokens is not None]
    audio = one_audio({name: p.audio for name, p in named.items()}, "corpus")
    fields = tuple(sorted(set.intersection(*(set(p.fields) for p in parts))))
    # A column some corpora have: the others' rows have none (id -1), so each corpus keeps its own.
    names = list(dict.fromkeys(k for p in parts for k in p.columns))
    columns = {k: Values.concat([p.columns.get(k) or Values(np.full(p.num_utts, -1, np.int32), []) for p in parts])
               for k in names}
    return ShardSet([u for p in parts for u in p.urls], np.concatenate([p.utts for p in parts]),
                    np.concatenate([p.frames for p in parts]), [d for p in parts for d in p.digests],
                    np.concatenate([p.sizes for p in parts]), dims.pop() if dims else None,
                    sum(p.scanned for p in parts), np.concatenate([p.lost for p in parts]), tuple(named),
                    np.concatenate([np.full(len(p), c, np.int64) for c, p in enumerate(parts)]),
                    Speakers.concat(speakers) if len(speakers) == len(parts) else None,
                    [c for p in parts for c in p.checksums],
                    np.concatenate(tokens) if len(tokens) == len(parts) else None,
                    audio, None if audio is None else np.concatenate([p.samples for p in parts]),
                    None if audio is None else np.concatenate([p.rates for p in parts]), fields, columns)


def indexed_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike], *, policy: RetryPolicy | None = None,
                   derive_speakers: bool = False, tokens: TokenCounts | None = None) -> ShardSet:
    """The shard set the pattern(s) name: expanded (an S3 glob listed) and indexed, remote reads
    with ``policy``'s retries (see :func:`shard_set`)."""
    policy = policy or RetryPolicy()
    return shard_set(expand_shards(patterns, list_glob=lister(policy)), policy=policy, derive_speakers=derive_speakers,
                     tokens=tokens)


def one_audio(found: dict[str, AudioIndex | None], what: str) -> AudioIndex | None:
    """The one audio description of shards described by ``found`` (``what``: a folder or corpus
    each); None when all hold features.  A mix of audio and features, or of audio of other rates or
    fbank options, is an error naming two of them: one loader delivers one kind of features.  Rates
    may differ (each row's is kept, ``ShardSet.rates``; the readers resample): the first folder's is
    returned until :meth:`ShardSet.at_rate` sets the loader's."""
    kinds = {}
    first: dict[AudioIndex | None, AudioIndex | None] = {}
    for name, audio in found.items():
        # Compared without its rate: one valid rate (AudioIndex checks it) stands in for every one.
        alike = None if audio is None else replace(audio, sample_rate=16000)
        kinds.setdefault(alike, name)
        first.setdefault(alike, audio)
    if len(kinds) < 2:
        return next(iter(first.values()), None)
    (a, x), (b, y) = list(kinds.items())[:2]

    def say(audio: AudioIndex | None) -> str:
        return "features" if audio is None else (f"{audio.layout} audio, fbank "
                                                 f"{audio.num_mel_bins} bins/dither {audio.dither}/{audio.backend}")

    raise ValueError(f"{what} {x} holds {say(a)}, {what} {y} {say(b)}: one loader reads one kind, so pack them alike "
                     f"(or index the audio folders with the same fbank options) or load them apart")


@dataclass
class ShardRows:
    """One shard of a shard set as a record: its utterances' columns and what its index (or a scan
    of its headers) says of it.  A new per-shard column is a field here and a line in :func:`_assemble`."""

    where: str  # its folder (an indexed shard) or itself (a scanned one): what names its kind of audio
    frames: np.ndarray  # int32, one per utterance
    size: int = -1  # bytes, -1: unknown
    digest: str = ""
    checksum: str | None = None
    lost: int = 0  # samples the loader cannot read
    dims: frozenset[int] = frozenset()  # the feature dimensions it holds
    audio: AudioIndex | None = None
    samples: np.ndarray | None = None  # int32, an audio shard's sample counts
    speakers: Speakers | None = None  # None: its index stores none
    tokens: np.ndarray | None = None  # int32, its labels' lengths in tokens (when counted)
    fields: frozenset[str] = frozenset()
    columns: dict[str, Values] = field(default_factory=dict)


class _Indexes:
    """Folders' indexes, each read once (a remote one fetched with the retries), and their token
    columns; ``known``: folders' indexes already read (a growing folder's, as it stood)."""

    def __init__(self, policy: RetryPolicy, known: Mapping[str, FolderIndex] | None = None,
                 tokens: TokenCounts | None = None) -> None:
        self.policy, self.tokens = policy, tokens
        self.read: dict[str, FolderIndex | None] = dict(known or {})
        self.token_columns: dict[str, np.ndarray] = {}

    def of(self, url: str, *, keys: bool = False) -> tuple[str, FolderIndex | None, int | None]:
        """(the folder of ``url``, its index or None, the shard's place in it or None)."""
        folder, name = index_place(url)
        if folder not in self.read:
            if has_folder(url):
                self.read[folder] = read_index_at(folder, partial(fetch_file, policy=self.policy), keys=keys)
            else:
                self.read[folder] = None if is_url(url) else read_index(folder)
            _unmap_pages(self.read[folder])
        index = self.read[folder]
        return folder, index, None if index is None else index.position(name)

    def prefetch(self, urls: Sequence[str]) -> None:
        """The indexes of every remote folder of ``urls`` fetched at once, :data:`INDEX_REQUESTS` at a
        time: one after another, 100 folders of ~5 files at 50 ms a request are 25 s of waiting
        before the first step.  A failure is raised for the first folder (in the order of ``urls``)
        that has one, the fetches not yet begun cancelled."""
        folders = [f for f in dict.fromkeys(index_place(u)[0] for u in urls if has_folder(u)) if f not in self.read]
        if len(folders) < 2:
            return
        fetch = partial(fetch_file, policy=self.policy)
        with ThreadPoolExecutor(min(INDEX_REQUESTS, len(folders)), thread_name_prefix="wdsprep-index") as pool:
            futures = [pool.submit(read_index_at, f, fetch) for f in folders]
            try:
                for folder, future in zip(folders, futures):
                    self.read[folder] = future.result()
                    _unmap_pages(self.read[folder])
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def with_keys(self, folder: str) -> FolderIndex:
        """A remote folder's index with its keys (fetched only when the key rule needs them)."""
        index = self.read[folder] = read_index_at(folder, partial(fetch_file, policy=self.policy), keys=True)
        return index

    def token_rows(self, folder: str, index: FolderIndex, a: int, b: int) -> np.ndarray | None:
        if self.tokens is None:
            return None
        if folder not in self.token_columns:
            self.token_columns[folder] = self.tokens.folder(folder, index)
        return np.asarray(self.token_columns[folder][a:b], np.int32)


def _unmap_pages(index: FolderIndex | None) -> None:
    """Let go of the pages of ``index``'s mapped columns that reading it touched (its checks read every
    value): they stay in the page cache and come back when a row is read, but until then they would
    count in this process's memory, every folder's at once (432 MB at 36 M utterances).  Where the
    platform has no ``madvise`` (or numpy no mapping to give it), nothing is done."""
    if index is None:
        return
    speakers = index.speakers() if index.has_speakers else None  # stored: read, not derived
    for column in (index.frames, index.text_lens, index.samples, None if speakers is None else speakers.ids,
                   *(c.ids for c in index.columns.values())):
        mapping = getattr(column, "_mmap", None)  # np.memmap's mapping of the file
        if mapping is not None and hasattr(mapping, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mapping.madvise(mmap.MADV_DONTNEED)  # read-only and shared: the file's bytes stay as they are
            except (OSError, ValueError):
                pass


def shard_set(urls: Sequence[str], *, policy: RetryPolicy | None = None, derive_speakers: bool = False,
              tokens: TokenCounts | None = None, indexes: Mapping[str, FolderIndex] | None = None) -> ShardSet:
    """The shard set of ``urls`` (in that order), from their folders' indexes, scanning what none lists.

    ``policy``: retries for fetching remote indexes, and the shards of pipes no index lists.
    Every utterance's speaker comes with the set where every index stores them; with
    ``derive_speakers`` also by the key rule from the keys of an index that stores none
    (``Speakers.from_keys``; a remote index's keys are fetched for it).  A shard in no index leaves
    the set without speakers.  ``tokens``: every label's length in tokens comes with the set (a
    cost model that counts them needs it).  ``indexes``: folders' indexes already read (a growing
    folder's, as it stood when an epoch was planned), used instead of reading them."""
    policy = policy or RetryPolicy()
    found = _Indexes(policy, indexes, tokens)
    found.prefetch(urls)
    started = time.perf_counter()
    retimed: dict[str, int] = {}  # folder -> its shards whose times are not the index's, checked by content
    rows = [_indexed_rows(url, found, retimed, derive_speakers) for url in urls]
    if retimed:
        folder, n = next(iter(retimed.items()))
        warnings.warn(f"{sum(retimed.values())} shards (e.g. {n} in {redact(folder)}) have other modification times "
                      f"than their index records (a copy that did not keep them?): their bytes matched the index's "
                      f"SHA-256, checked at every start ({time.perf_counter() - started:.1f} s); `wdsprep index "
                      f"--refresh '{Path(folder)}/*.tar'` records the new times once", UserWarning, stacklevel=3)
    unlisted = [k for k, r in enumerate(rows) if r is None]
    if unlisted:
        t0 = time.perf_counter()
        for k in unlisted:
            rows[k] = _scanned_rows(urls[k], policy, tokens)
        warnings.warn(f"{len(unlisted)} of {len(urls)} shards have no index entry (e.g. {redact(urls[unlisted[0]])}): "
                      f"read their headers to plan the epochs ({time.perf_counter() - t0:.1f} s). `wdsprep index` "
                      f"writes the index beside them once", UserWarning, stacklevel=3)
    del found  # the folders' indexes: each one's mapped columns go once its shards' rows are copied
    return _assemble(list(urls), rows, scanned=len(unlisted), tokens=tokens is not None)  # type: ignore[arg-type]


def _indexed_rows(url: str, found: _Indexes, retimed: dict[str, int], derive_speakers: bool) -> ShardRows | None:
    """Shard ``url`` as its folder's index lists it (None: in no index, to be scanned), checked for
    staleness: a local shard by its size and time (a copy's time: by content, counted in
    ``retimed``), a remote one by the store's listed size."""
    remote = has_folder(url)
    folder, index, i = found.of(url)
    if i is None and remote:
        raise DataError(f"shard {redact(url)} is not in {redact(folder)}/{INDEX_NAME}: index a local copy of the "
                        f"folder again (wdsprep index --refresh) and upload its index files, or leave the shard out of "
                        f"the pattern")
    if index is None or i is None:
        return None
    if remote:
        listed, size = take_listed_size(url), int(index.sizes[i])
        why = (f"the store lists {listed:,} bytes, the index says {size:,}" if listed is not None and size >= 0
               and listed != size else None)  # without a listing: checked when it is downloaded
        if why is not None:
            raise StaleIndexError(
                f"shard {redact(url)} changed since it was indexed ({why}): its utterances may not be the ones "
                f"{redact(folder)}/{INDEX_NAME} lists. Index a local copy of the folder again (wdsprep index "
                f"--refresh) and upload its index files, or restore the shard")
    else:
        st = os.stat(url)
        if index.mtimes[i] >= 0 and st.st_mtime_ns != index.mtimes[i]:
            retimed[folder] = retimed.get(folder, 0) + 1
        why = stale_reason(index, i, st, url)
        if why is not None:
            raise StaleIndexError(
                f"shard {url} changed since it was indexed ({why}): its utterances may not be the ones "
                f"{Path(folder) / INDEX_NAME} lists. If it was replaced on purpose, re-index the folder (wdsprep "
                f"index --refresh '{Path(folder)}/*.tar'); otherwise copy it again, restore it or repack")
    a, b = int(index.starts[i]), int(index.starts[i + 1])
    speakers = None
    if index.has_speakers or derive_speakers:
        if not index.has_speakers and remote:  # the key rule needs the keys, not fetched for planning
            index = found.with_keys(folder)
        speakers = index.speakers().rows(a, b)
    dims = frozenset() if index.dims is None else frozenset([int(index.dims)])
    samples = None if index.samples is None else np.asarray(index.samples[a:b], np.int32)
    return ShardRows(folder, np.asarray(index.frames[a:b], np.int32), int(index.sizes[i]), index.digests[i],
                     index.checksums[i], int(index.lost[i]), dims, index.audio, samples, speakers,
                     found.token_rows(folder, index, a, b), frozenset(index.fields),
                     {name: c.rows(a, b) for name, c in index.columns.items()})


def _scanned_rows(url: str, policy: RetryPolicy, tokens: TokenCounts | None) -> ShardRows:
    """A shard no index lists, from its headers (a pipe's fetched first, with the user's retries)."""
    scan = scan_shard(redact(url), source=fetched_shard(url, policy=policy)) if is_url(url) else scan_shard(url)
    for problem in scan.problems:
        warnings.warn(problem, RuntimeWarning, stacklevel=4)
    frames = np.asarray(scan.info.frames, np.int32)
    return ShardRows(url, frames, digest=frames_digest(frames), lost=scan.lost,
                     dims=frozenset(scan.dims),
                     audio=_scanned_audio(url, scan), samples=np.asarray(scan.info.samples, np.int32),
                     tokens=None if tokens is None else tokens.shard(url), fields=frozenset(scan.fields),
                     columns={name: Values.of(v) for name, v in scan.info.values.items()})


def _assemble(urls: list[str], rows: list[ShardRows], *, scanned: int, tokens: bool) -> ShardSet:
    """The shard set of ``rows``, shard after shard: each column copied into one array; the set's speakers
    where every shard has them, the fields every shard carries, the columns every shard's index has.

    Each shard's columns are let go once copied (:func:`_taken`): a folder's memory-mapped index
    files then leave the process's memory as soon as its last shard is copied, instead of all of
    them staying mapped beside the copies until the end (at 36 M utterances, 288 MB more at the peak)."""
    audio = one_audio({r.where: r.audio for r in rows}, "folder")
    dims = set().union(*(r.dims for r in rows))
    fields = frozenset.intersection(*(r.fields for r in rows)) if rows else frozenset()
    names = [n for n in (rows[0].columns if rows else {}) if all(n in r.columns for r in rows)]
    utts = np.array([len(r.frames) for r in rows], np.int64)
    total = int(utts.sum())

    def joined(column: str) -> np.ndarray:
        out = np.empty(total, np.int32)
        at = 0
        for values in _taken(rows, column):
            out[at:at + len(values)] = values
            at += len(values)
        return out

    rates = None if audio is None else np.repeat(
        np.array([0 if r.audio is None else r.audio.sample_rate for r in rows], np.int32), utts)
    has_speakers = bool(rows) and all(r.speakers is not None for r in rows)
    columns = {n: Values.concat(_taken(rows, "columns", n), total) for n in names}
    return ShardSet(urls, utts, joined("frames"),
                    [r.digest for r in rows], np.array([r.size for r in rows], np.int64),
                    audio.num_mel_bins if audio else dims.pop() if len(dims) == 1 else None, scanned,
                    np.array([r.lost for r in rows], np.int64),
                    speakers=Speakers.concat(_taken(rows, "speakers"), total) if has_speakers else None,
                    checksums=[r.checksum for r in rows], tokens=joined("tokens") if tokens else None,
                    audio=audio, samples=None if audio is None else joined("samples"),
                    rates=rates, fields=tuple(sorted(fields)), columns=columns)


def _taken(rows: list[ShardRows], column: str, name: str | None = None) -> Iterator[Any]:
    """Each shard's ``column`` (of its ``columns``, ``name``'s), in order, each let go as it is handed on."""
    for r in rows:
        if name is None:
            value = getattr(r, column)
            setattr(r, column, None)
        else:
            value = r.columns.pop(name)
        yield value


def _scanned_audio(url: str, scan: ShardScan) -> AudioIndex | None:
    """What a shard in no index holds, from its scan: audio (with the default fbank options) or features."""
    layout = next((x for x in scan.layouts if x in AUDIO_LAYOUTS), None)
    if layout is None:
        return None
    if len(scan.rates) > 1:
        raise ValueError(f"shard {url} holds audio at {sorted(scan.rates)} Hz; one loader reads one rate: repack it")
    return AudioIndex(layout, scan.rates.pop() if scan.rates else 16000)


def row_keys(shards: ShardSet, *, policy: RetryPolicy | None = None) -> list[str]:
    """Every row's utterance id, from the indexes' keys (a shard in no index: from its headers);
    for what names planned batches without reading them (``dry-run --plan --dump-keys``)."""
    keys = _row_values(shards, lambda index, a, b: index.keys()[a:b], lambda info: info.keys, keys=True, policy=policy)
    return [decode_key(key) for key in keys]


def row_text_lens(shards: ShardSet, *, policy: RetryPolicy | None = None) -> np.ndarray:
    """int64: every row's transcript length in characters, from the indexes (a shard in no index:
    from its headers); what bounds a label's length under subword sampling (``dry-run --plan``)."""
    return np.asarray(_row_values(shards, lambda index, a, b: index.text_lens[a:b].tolist(),
                                  lambda info: info.text_lens, keys=False, policy=policy), np.int64)


def _row_values(shards: ShardSet, indexed: Callable[[FolderIndex, int, int], Sequence[Any]],
                scanned: Callable[[ShardInfo], Sequence[Any]], *, keys: bool,
                policy: RetryPolicy | None) -> list[Any]:
    """A value per row, shard by shard: ``indexed(index, first row, end row)`` of the shard's folder
    index, else ``scanned`` of its headers' record; ``keys``: remote indexes are fetched with their keys."""
    policy = policy or RetryPolicy()
    found = _Indexes(policy)
    out: list[Any] = []
    for k, url in enumerate(shards.urls):
        _, index, i = found.of(url, keys=keys)
        if index is None or i is None:  # in no index: its headers
            values = scanned((scan_shard(redact(url), source=fetched_shard(url, policy=policy)) if is_url(url)
                              else scan_shard(url)).info)
        else:
            values = indexed(index, int(index.starts[i]), int(index.starts[i + 1]))
        if len(values) != shards.utts[k]:
            raise StaleIndexError(f"shard {redact(url)}: {len(values)} utterances in its index or headers, "
                                  f"{shards.utts[k]} planned: it changed since the loader read its index; run again")
        out.extend(values)
    return out
