"""``wdsprep index``: a folder's index written from its shards' headers, for shards packed elsewhere.

Above the index reader (:mod:`wdsprep.format.index`), which never imports it: reading an index
needs no tar reader.  :func:`scan_shard` reads one shard's tar, ``.npy`` and audio headers and
transcripts into an index entry (the loader scans a folder without an index this way too), with
the fields its samples carry and the values of those to index (the language always);
:func:`index_shards` brings each folder's index up to date from those entries, keeping what an
intact index knew that no tar holds (the speakers from ``utt2spk``, which fields were indexed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from wdsprep.errors import DataError
from wdsprep.files import file_sha256
from wdsprep.format.index import (
    FROM_KEYS,
    AudioIndex,
    DamagedIndexError,
    FolderIndex,
    ShardInfo,
    Speakers,
    read_index,
    stale_reason,
    write_index,
)
from wdsprep.format.keys import (
    AUDIO_LAYOUTS,
    LANG,
    check_field_name,
    decode_key,
    is_field_member,
    member_role,
    speaker_of,
    uttid_for_message,
)
from wdsprep.format.samples import (
    decode_fields,
    feature_layout,
    group_samples,
    open_members,
    read_audio_header,
    samples_before_damage,
    split_sample,
)
from wdsprep.format.shardfile import ShardFile
from wdsprep.format.shardlist import expand_shards, is_url
from wdsprep.format.tar import member_bytes
from wdsprep.remote.urls import redact
from wdsprep.units import fbank_frames

if TYPE_CHECKING:
    from tqdm import tqdm


def _carried_speakers(old: FolderIndex, keys: Sequence[str]) -> Speakers:
    """The speakers an earlier index had (from ``utt2spk``) for ``keys``; the key rule for keys it lacks."""
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
    fields: tuple[str, ...] = ()  # the fields the samples read carry (members KEY.NAME), each by some of them


def scan_shard(path: str | os.PathLike, *, source: ShardFile | None = None,
               index_fields: Sequence[str] = ()) -> ShardScan:
    """Keys, frames and transcript lengths of a shard from its tar and ``.npy`` headers and its
    transcripts (feature data is not read), as an index entry; an audio shard's from its audio
    headers (samples and rate: the frames are their fbank frames; no audio is decoded).
    ``source``: the shard fetched by the caller (a pipe's or URL's: the format does not fetch),
    ``path`` then only names it.  The entry holds the values of the language and of
    ``index_fields`` (``info.values``) the samples carry, None for a sample without one (a field a
    manifest line may leave out).

    Like the loader, the scan leaves out alone each sample the loader refuses in a tar that is whole
    (a member cut short, of garbage, with a header the readers do not use, a key that does not
    decode: ``format/samples.py``), and stops at damage to the tar itself; every sample left out
    is counted in ``lost`` and named in ``problems`` (``verify`` gives the full diagnosis).
    """
    path = str(path)
    scan = ShardScan(ShardInfo(os.path.basename(path)))
    src, members, problem = open_members(path, source=source)
    carried: set[str] = set()  # the field names of the samples so far
    wanted = list(dict.fromkeys([LANG, *index_fields]))
    values: dict[str, list[str | None]] = {n: [] for n in wanted}
    skipped: list[str] = []  # the samples left out alone, and why
    for key, group in samples_before_damage(members, problem):
        where = f"key {key!r}"
        try:
            decode_key(key)
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
            where = f"key {key!r}: a field member"
            for name, value in zip(wanted, decode_fields(src, group, wanted)):
                values[name].append(value)
        except ValueError as e:  # refused in a tar that is whole: left out alone, the shard read on (as the loader)
            skipped.append(f"{where}: {e}")
            continue
        names = {ext for ext in group if is_field_member(ext)}
        carried |= names
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
    scan.fields = tuple(sorted(carried))
    n = scan.info.num_utts
    scan.info.values = {k: v[:n] for k, v in values.items() if k in scan.fields}
    for why in skipped:
        scan.problems.append(f"{path}: {why}; the loader leaves this sample out (counted as unreadable) and reads on "
                             f"(repack the shard from its source to keep it)")
    if problem is not None or skipped:
        scan.lost = sum(1 for _ in group_samples(members)) - scan.info.num_utts
    if problem is not None:
        before = scan.info.num_utts
        scan.problems.append(f"{path}: {problem}; the loader reads the {before} usable samples before it, "
                             f"{scan.lost - len(skipped)} are lost (copy the shard again or repack it)")
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
                 force: bool = False, index_fields: Sequence[str] = (), progress: bool | None = None) -> IndexResult:
    """Write the index of every folder the pattern(s) name, from the shards' headers (no feature data).

    A folder without an index gets one.  A folder whose index is current is left alone, but for
    the shards it counts samples lost in: those are read again, and their samples named again
    (``ok`` stays False while a shard loses one: a script's ``index && train`` stops).  One whose
    shards changed since it was indexed (size or mtime) is an error, unless ``refresh``: then the
    changed shards (and those it does not list) are read again and the rest kept.  ``force`` reads
    every shard again and needs nothing of the old index: a damaged one is rebuilt from the shards
    (the speakers an intact one had from ``utt2spk`` are kept).  Entries of shards the patterns do
    not name are kept while the shard exists; those of shards no longer on disk are dropped, and
    the output says so.  The fields the samples carry (``pack --field``, a manifest's keys; a sample
    may leave one out) are listed in the index;
    the language is a column of it, and so are ``index_fields`` and those the old index had.
    """
    from tqdm import tqdm  # here: the loader imports this module for scan_shard alone

    for name in index_fields:
        check_field_name(name)
    named = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    urls = [str(p) for p in named if is_url(str(p))]  # before expanding too: a URL glob is not listed here
    paths = [] if urls else expand_shards(named)
    urls = urls or [p for p in paths if is_url(p)]
    if urls:
        raise ValueError(f"index_shards reads local shards, got {redact(urls[0])!r}; shards in a bucket are indexed in "
                         f"place by `wdsprep index URL...` (wdsprep.check.index_remote.index_remote)")
    by_folder: dict[Path, list[Path]] = {}
    for p in paths:
        by_folder.setdefault(Path(p).resolve().parent, []).append(Path(p).resolve())
    result = IndexResult()
    with tqdm(total=len(paths), desc="index", unit="shard", disable=None if progress is None else not progress) as bar:
        for folder, shards in by_folder.items():
            _index_folder(folder, shards, _Reindex(refresh, force, tuple(index_fields)), result, bar)
    return result


@dataclass(frozen=True)
class _Reindex:
    """How :func:`index_shards` was asked to treat an index that exists."""

    refresh: bool
    force: bool
    index_fields: tuple[str, ...]


@dataclass
class _Entries:
    """A folder's shards as the new index will list them: name -> (entry, size, mtime, samples lost),
    and the fields each one's samples carry."""

    entries: dict[str, tuple[ShardInfo, int, int, int]] = field(default_factory=dict)
    carried: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class _Kinds:
    """What a folder's shards are: one layout, feature dim, dtype and sample rate, or an error."""

    layouts: set[str] = field(default_factory=set)
    dims: set[int] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    rates: set[int] = field(default_factory=set)

    def add(self, scan: ShardScan) -> None:
        self.layouts |= scan.layouts
        self.dims |= scan.dims
        self.dtypes |= scan.dtypes
        self.rates |= scan.rates

    def add_index(self, old: FolderIndex) -> None:
        """The kinds of the shards an index lists (for the entries kept from it)."""
        self.layouts.add(old.layout)
        self.dtypes.add(old.dtype)
        if old.dims is not None and old.audio is None:
            self.dims.add(old.dims)
        if old.audio is not None:
            self.rates.add(old.audio.sample_rate)

    def check(self, folder: Path) -> None:
        for what, found in (("layouts", self.layouts), ("feature dims", self.dims), ("dtypes", self.dtypes),
                            ("sample rates", self.rates)):
            if len(found) > 1:
                raise ValueError(f"{folder}: shards of different {what} {sorted(map(str, found))}; a folder is "
                                 f"one shard set: move them apart")


def _index_folder(folder: Path, shards: list[Path], how: _Reindex, result: IndexResult, bar: tqdm) -> None:
    """One folder of :func:`index_shards`: the entries of its index that still hold kept, the rest
    (and the shards named) read, the index written; what was done into ``result``."""
    notes: list[str] = []
    old = _old_index(folder, how.force, notes)
    gone = [] if old is None else [n for n in old.names if not (folder / n).is_file()]
    if gone:
        notes.append(f"dropped {len(gone)} shard(s) no longer on disk ({', '.join(gone[:3])}"
                     f"{', ...' if len(gone) > 3 else ''})")
    # Version 1 (no sizes), or a field to index that the old index did not: read it all again.
    version1 = old is not None and bool((old.sizes < 0).any())
    upgrade = version1 or (old is not None and bool(set(how.index_fields) - set(old.columns)))
    kept, stale, lossy = _Entries(), [], []
    if old is not None and not how.force and not upgrade:
        kept, stale, lossy = _kept_entries(old, folder, gone)
    # The named shards and the listed ones still there, less those kept: read (again).
    listed = [] if old is None else [folder / n for n in old.names if n not in gone]
    todo = list({p.name: p for p in [*shards, *listed] if p.name not in kept.entries}.values())
    if stale and not how.refresh and not how.force:
        raise ValueError(f"{folder}: {len(stale)} shard(s) changed since they were indexed (e.g. {stale[0]}); "
                         f"pass --refresh to read them again (or repack the folder)")
    # Version 2 without a speakers column or checksums is rewritten, without a header read
    # (the checksums read each shard once).
    if (not todo and old is not None and not how.force and not gone and not upgrade and old.has_speakers
            and None not in old.checksums):
        result.folders[str(folder)] = "up to date"
        result.shards += len(old.names)
        result.utterances += old.num_utts
        bar.update(len(shards))
        return
    named = {p.name for p in shards}
    bar.total += sum(1 for p in todo if p.name not in named)  # listed shards the patterns leave out
    bar.refresh()
    kinds = _Kinds()
    indexed = list(dict.fromkeys([*how.index_fields, *(old.columns if old is not None else ())]))
    for path in todo:
        st = path.stat()
        scan = scan_shard(path, index_fields=indexed)
        scan.info.sha256 = file_sha256(path)
        kept.carried[path.name] = scan.fields
        result.scanned += 1
        result.problems.extend(scan.problems)
        kinds.add(scan)
        kept.entries[path.name] = (scan.info, st.st_size, st.st_mtime_ns, scan.lost)
        bar.update(1)
    bar.update(sum(1 for p in shards if p.name in kept.entries and p not in todo))
    if old is not None and kept.entries.keys() - {p.name for p in todo}:
        kinds.add_index(old)
    kinds.check(folder)
    if lossy:
        notes.append(f"{len(lossy)} shard(s) read again: the index counts samples in them the loader cannot "
                     f"read (named below)")
    what = "indexed" if old is None and not notes else "upgraded from version 1" if version1 else "re-indexed"
    index = _new_index(folder, old, kept, kinds, how.index_fields, notes)
    write_index(folder, index)
    result.folders[str(folder)] = "; ".join([f"{what}: {len(kept.entries)} shards, {len(todo)} read", *notes])
    result.shards += len(kept.entries)
    result.utterances += index.num_utts


def _old_index(folder: Path, force: bool, notes: list[str]) -> FolderIndex | None:
    """The folder's index, None where it has none; a damaged one is an error, but for ``force``."""
    try:
        return read_index(folder)
    except DataError as e:
        if not force:
            raise
        where = f"{e.path}: {e.what}" if isinstance(e, DamagedIndexError) else str(e)
        notes.append(f"the old index was damaged ({where}), so it was rebuilt from the shards alone "
                     f"(speakers by the key rule)")
        return None


def _kept_entries(old: FolderIndex, folder: Path, gone: list[str]) -> tuple[_Entries, list[str], list[str]]:
    """The entries of ``old`` still true of their shards; the shards changed since (stale), and
    those it counts samples lost in (read again, so what the loader cannot read is named again)."""
    kept, stale, lossy = _Entries(), [], []
    for i, name in enumerate(old.names):
        if name in gone:
            continue
        if stale_reason(old, i, (folder / name).stat()) is not None or old.mtimes[i] < 0:  # no mtime
            stale.append(name)
        elif old.lost[i] > 0:
            lossy.append(name)
        else:
            kept.entries[name] = (old.shard(i), int(old.sizes[i]), int(old.mtimes[i]), int(old.lost[i]))
            kept.carried[name] = old.fields
            if kept.entries[name][0].sha256 is None:  # version 2 without checksums: one read adds it
                kept.entries[name][0].sha256 = file_sha256(folder / name)
    return kept, stale, lossy


def _new_index(folder: Path, old: FolderIndex | None, kept: _Entries, kinds: _Kinds, index_fields: Sequence[str],
               notes: list[str]) -> FolderIndex:
    """The folder's index of ``kept``'s entries, in name order, with what the old one knew that no
    tar holds (its ``utt2spk`` speakers)."""
    rows = [kept.entries[n] for n in sorted(kept.entries)]
    infos = [info for info, _, _, _ in rows]
    speakers = None  # speakers packed from utt2spk are in no tar: keep them for the utterances still there
    try:
        if old is not None and old.speakers().source != FROM_KEYS:
            speakers = _carried_speakers(old, [k for i in infos for k in i.keys])
    except DataError as e:  # damaged keys: the key rule it is
        notes.append(f"speakers by the key rule: the old index's utt2spk speakers could not be carried over "
                     f"({e.path}: {e.what})" if isinstance(e, DamagedIndexError) else str(e))
    layout = kinds.layouts.pop() if kinds.layouts else "cat"
    audio = _folder_audio(old, layout, kinds.rates.pop() if kinds.rates else None, notes)
    common = set().union(*(set(kept.carried[n]) for n in kept.entries))
    missing = sorted(n for n in index_fields if n not in common)
    if missing:
        notes.append(f"field(s) {missing} not indexed: no sample carries them")
    return FolderIndex.from_shards(layout, audio.num_mel_bins if audio else kinds.dims.pop() if kinds.dims else None,
                                   kinds.dtypes.pop() if kinds.dtypes else "float32", infos,
                                   sizes=[r[1] for r in rows], mtimes=[r[2] for r in rows], lost=[r[3] for r in rows],
                                   speakers=speakers, audio=audio, fields=sorted(common))


def _folder_audio(old: FolderIndex | None, layout: str, rate: int | None, notes: list[str]) -> AudioIndex | None:
    """The audio fields of a folder (re)indexed from its shards: the old index's fbank options when
    it had them for this format and rate, else the defaults (said in ``notes``); None for features."""
    if layout not in AUDIO_LAYOUTS:
        return None
    rate = rate or 16000  # a folder of no readable sample: any rate will do
    if old is not None and old.audio is not None and (old.audio.layout, old.audio.sample_rate) == (layout, rate):
        return old.audio
    audio = AudioIndex(layout, rate)
    notes.append(f"audio at {rate} Hz: the loader computes fbank with the default options (num_mel_bins "
                 f"{audio.num_mel_bins}, dither {audio.dither}, backend {audio.backend}); make_loader(fbank=...) "
                 f"changes them")
    return audio
