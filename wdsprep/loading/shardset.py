"""The indexed shard set an epoch is planned from: every shard's utterances and every utterance's frames.

Built once per loader from each folder's index (``format/index.py``): O(shards) JSON plus one
memory-mapped frame column per folder, and the speakers column where the index stores one.  A
shard that changed since it was indexed (its size or mtime differ) is refused at once, naming
it: it is never read against a stale index.  Shards that no index lists (CAT's, a copied folder,
``pipe:`` commands) are scanned here, headers only, with a warning that ``wdsprep index`` would
save that scan.

Shards on S3 or a web server are planned from the index files uploaded beside them, fetched once
per loader (``index.json`` and its columns, speakers included, not the keys), each bounded by
what an index of that many utterances can be (:func:`index_file_limit`): a server cannot make
the loader hold more.  A remote folder without one is an error saying how to make and upload it:
scanning would download the whole corpus on every rank before the first step.  Their staleness
is checked by size: against the bucket listing when the pattern was a glob (before the epoch),
else when each shard is downloaded, and then by the SHA-256 the index records too.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format.index import (
    FRAMES_FILE,
    INDEX_FILES,
    INDEX_NAME,
    KEYS_FILE,
    SPEAKER_NAMES_FILE,
    SPEAKERS_FILE,
    TEXT_LENS_FILE,
    FolderIndex,
    Speakers,
    frames_digest,
    read_index,
    scan_shard,
    stale_reason,
)
from wdsprep.format.shardlist import expand_shards, index_place, is_url
from wdsprep.loading.fetch import fetched_shard
from wdsprep.remote.fetch import RetryPolicy, TooLargeError, fetch_file
from wdsprep.remote.listing import lister, take_listed_size
from wdsprep.remote.urls import has_folder, redact


class StaleIndexError(DataError):
    """A shard differs from what its folder's index says; the message names it and what to do."""


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
    # Every utterance's speaker, where every shard's index stores them (else None: see quality.shard_speakers).
    speakers: Speakers | None = None
    checksums: list[str | None] | None = None  # per shard: the SHA-256 its index records (None: not recorded)

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.utts)]).astype(np.int64)
        if self.lost is None:
            self.lost = np.zeros(len(self.urls), np.int64)
        if self.corpus is None:
            self.corpus = np.zeros(len(self.urls), np.int64)
        if self.checksums is None:
            self.checksums = [None] * len(self.urls)

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

    def part(self, corpus: int) -> ShardSet:
        """Corpus ``corpus`` alone, as a shard set of its own (rows and shards counted from 0)."""
        sl = self.shards_of(corpus)
        rows = slice(int(self.starts[sl.start]), int(self.starts[sl.stop]))
        speakers = None if self.speakers is None else self.speakers.rows(rows.start, rows.stop)
        return ShardSet(self.urls[sl], self.utts[sl], self.frames[rows], self.digests[sl], self.sizes[sl], self.dims,
                        0, self.lost[sl], speakers=speakers, checksums=self.checksums[sl])


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
    return ShardSet([u for p in parts for u in p.urls], np.concatenate([p.utts for p in parts]),
                    np.concatenate([p.frames for p in parts]), [d for p in parts for d in p.digests],
                    np.concatenate([p.sizes for p in parts]), dims.pop() if dims else None,
                    sum(p.scanned for p in parts), np.concatenate([p.lost for p in parts]), tuple(named),
                    np.concatenate([np.full(len(p), c, np.int64) for c, p in enumerate(parts)]),
                    Speakers.concat(speakers) if len(speakers) == len(parts) else None,
                    [c for p in parts for c in p.checksums])


# The most bytes an index file downloaded beside remote shards may have.  index.json is O(shards)
# (~200 bytes a shard: 32 MiB holds ~160,000 shards in one folder); the others follow from the
# utterances (and speakers) it lists: int32 columns, and keys or speaker names of up to 1 KiB on
# average.  A server sending more (a Content-Length of 10^12, an endless body) is cut off there.
MAX_SUMMARY_BYTES = 32 << 20
_SLACK = 64 << 10  # an .npy header, a text file's last line
_PER_ROW = {FRAMES_FILE: 4, TEXT_LENS_FILE: 4, SPEAKERS_FILE: 4, KEYS_FILE: 1024, SPEAKER_NAMES_FILE: 1024}


def index_file_limit(name: str, summary: dict) -> int:
    """The most bytes index file ``name`` can have beside the ``index.json`` ``summary`` (parsed)."""
    if name == INDEX_NAME:
        return MAX_SUMMARY_BYTES
    try:
        rows = (int(summary["speakers"]["count"]) if name == SPEAKER_NAMES_FILE
                else sum(int(shard["utts"]) for shard in summary["shards"]))
    except (KeyError, TypeError, ValueError):
        rows = 0  # a damaged index.json: read_index names what is wrong with it
    return _SLACK + _PER_ROW[name] * max(0, rows)


def remote_index(folder: str, *, policy: RetryPolicy = RetryPolicy(), keys: bool = False) -> FolderIndex:
    """The index uploaded beside remote shards in ``folder`` (an s3:// or http(s):// folder URL).

    Fetched into a temporary folder (each file bounded by :func:`index_file_limit`) and read there;
    its columns (the stored speakers too) stay memory-mapped after the folder is gone.  The keys
    are fetched only with ``keys`` (``verify``, speakers by the key rule): planning does not need them.
    """
    shown = redact(folder)
    with tempfile.TemporaryDirectory(prefix="wdsprep-index-") as tmp:
        summary: dict = {}
        for name in INDEX_FILES:
            if name == KEYS_FILE and not keys:
                continue
            url, path = f"{folder}/{name}", os.path.join(tmp, name)
            limit = index_file_limit(name, summary)
            try:
                found = fetch_file(url, path, limit=limit, policy=policy)
            except TooLargeError:
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


def indexed_shards(patterns: str | os.PathLike | Sequence[str | os.PathLike], *,
                   policy: RetryPolicy | None = None) -> ShardSet:
    """The shard set the pattern(s) name: expanded (an S3 glob listed) and indexed, remote reads
    with ``policy``'s retries."""
    policy = policy or RetryPolicy()
    return shard_set(expand_shards(patterns, list_glob=lister(policy)), policy=policy)


def shard_set(urls: Sequence[str], *, policy: RetryPolicy | None = None) -> ShardSet:
    """The shard set of ``urls`` (in that order), from their folders' indexes, scanning what none lists.

    ``policy``: retries for fetching remote indexes, and the shards of pipes no index lists."""
    policy = policy or RetryPolicy()
    indexes: dict[str, FolderIndex | None] = {}
    utts: list[int] = []
    sizes: list[int] = []
    digests: list[str] = []
    checksums: list[str | None] = []
    columns: list[np.ndarray] = []
    unlisted: list[int] = []
    dims: set[int] = set()
    lost_in = np.zeros(len(urls), np.int64)  # samples the loader cannot read, per shard
    speakers: list[Speakers] | None = []  # per shard, while every index so far stores them
    for k, url in enumerate(urls):
        remote = has_folder(url)
        folder, name = index_place(url)
        if folder not in indexes:
            if remote:
                indexes[folder] = remote_index(folder, policy=policy)
            else:
                indexes[folder] = None if is_url(url) else read_index(folder)
        index = indexes[folder]
        i = None if index is None else index.position(name)
        if i is None and remote:
            raise DataError(f"shard {redact(url)} is not in {redact(folder)}/{INDEX_NAME}: index a local copy of the "
                            f"folder again "
                            f"(wdsprep index --refresh) and upload its index files, or leave the shard out of the "
                            f"pattern")
        if i is None:
            speakers = None
            unlisted.append(k)
            utts.append(0)
            sizes.append(-1)
            digests.append("")
            checksums.append(None)
            columns.append(np.zeros(0, np.int32))
            continue
        assert index is not None
        if index.dims is not None:
            dims.add(int(index.dims))
        if remote:
            listed, size = take_listed_size(url), int(index.sizes[i])
            why = (f"the store lists {listed:,} bytes, the index says {size:,}" if listed is not None and size >= 0
                   and listed != size else None)  # without a listing: checked when it is downloaded
        else:
            why = stale_reason(index, i, os.stat(url))
        if why is not None and remote:
            raise StaleIndexError(
                f"shard {redact(url)} changed since it was indexed ({why}): its utterances may not be the ones "
                f"{redact(folder)}/{INDEX_NAME} lists. Index a local copy of the folder again (wdsprep index "
                f"--refresh) and upload its index files, or restore the shard")
        if why is not None:
            raise StaleIndexError(
                f"shard {url} changed since it was indexed ({why}): its utterances may not be the ones "
                f"{Path(folder) / INDEX_NAME} lists. If the folder was copied without keeping file times, "
                f"or the shard was replaced on purpose, re-index it (wdsprep index --refresh '{url}'); "
                f"otherwise restore the shard or repack")
        a, b = int(index.starts[i]), int(index.starts[i + 1])
        if speakers is not None and index.has_speakers:
            speakers.append(index.speakers().rows(a, b))
        else:
            speakers = None
        lost_in[k] = int(index.lost[i])
        utts.append(b - a)
        sizes.append(int(index.sizes[i]))
        digests.append(index.digests[i])
        checksums.append(index.checksums[i])
        columns.append(np.asarray(index.frames[a:b], np.int32))
    lost = lost_in
    if unlisted:
        t0 = time.perf_counter()
        for k in unlisted:
            # A pipe's shard is fetched (with the user's retries) and scanned from its copy.
            url = urls[k]
            scan = scan_shard(redact(url), source=fetched_shard(url, policy=policy)) if is_url(url) else scan_shard(url)
            lost[k] = scan.lost
            for problem in scan.problems:
                warnings.warn(problem, RuntimeWarning, stacklevel=3)
            frames = np.asarray(scan.info.frames, np.int32)
            utts[k], columns[k], digests[k] = len(frames), frames, frames_digest(frames)
            dims |= scan.dims
        some = urls[unlisted[0]]
        warnings.warn(f"{len(unlisted)} of {len(urls)} shards have no index entry (e.g. {redact(some)}): read their "
                      f"headers to plan the epochs ({time.perf_counter() - t0:.1f} s). `wdsprep index` writes "
                      f"the index beside them once", UserWarning, stacklevel=3)
    frames = np.concatenate(columns) if columns else np.zeros(0, np.int32)
    return ShardSet(list(urls), np.array(utts, np.int64), frames, digests, np.array(sizes, np.int64),
                    dims.pop() if len(dims) == 1 else None, len(unlisted), lost,
                    speakers=None if speakers is None else Speakers.concat(speakers), checksums=checksums)
