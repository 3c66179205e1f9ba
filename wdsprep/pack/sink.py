"""Writing utterances into length-grouped shards, shared by ``pack`` and ``pack-audio``.

A worker writes each planned shard through a :class:`GroupedSink`: it checks every utterance,
writes it into the shard of its length group and records every utterance it could not pack, with
the reason.  Shards are written under hidden names (``.w000-00000.tar``, invisible to
``data-*.tar`` globs); ``publish.py`` gives them their final names and publishes them.

A pack is a commit (:mod:`wdsprep.format.commit`): :func:`prepare_output` marks the directory
before it changes anything there, and the marker goes only once everything is written and on
disk; until then the folder grows shard by shard, and a stopped pack resumes.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import TMP_SUFFIX, make_dir, naming, sync
from wdsprep.format.commit import PARTS_DIR, PLAN_NAME, PackPlan, begin, marker, read_plan
from wdsprep.format.index import AUDIO_INDEX_FILES, FROM_UTT2SPK, INDEX_FILES, ShardInfo, Speakers
from wdsprep.format.keys import decode_key, layout_exts, speaker_of
from wdsprep.format.writer import ShardWriter
from wdsprep.pack.groups import Groups
from wdsprep.report import Report

DTYPES = ("float32", "float16")


@dataclass
class DimTally:
    """The feature dimensions found: utterances per dimension and the first utterance with each."""

    counts: dict[int, int] = field(default_factory=dict)
    first: dict[int, str] = field(default_factory=dict)

    def add(self, dims: int, uttid: str) -> None:
        self.counts[dims] = self.counts.get(dims, 0) + 1
        self.first.setdefault(dims, uttid)

    def merge(self, other: DimTally) -> None:
        """Add ``other``'s, found after these (its first utterances come after these)."""
        for dims, n in other.counts.items():
            self.counts[dims] = self.counts.get(dims, 0) + n
            self.first.setdefault(dims, other.first[dims])

    def check(self, keep: int | None) -> None:
        """A pack without ``keep`` (``--dims``) fails on features of several dimensions, naming
        each with its count and first utterance."""
        if keep is not None or len(self.counts) < 2:
            return
        ranked = sorted(self.counts, key=lambda d: (-self.counts[d], d))
        found = "; ".join(f"{d} dims in {self.counts[d]:,} utterance(s), the first {self.first[d]}" for d in ranked)
        raise DataError(f"the features have different dimensions ({found}); nothing was packed. Pack each "
                        f"dimension into a directory of its own, or pass --dims {ranked[0]} (dims={ranked[0]}) to "
                        f"pack the {ranked[0]}-dim features and report the others as other_dims")


@dataclass
class SinkResult:
    """What one worker wrote and what it could not pack."""

    shards: dict[str, list[ShardInfo]] = field(default_factory=lambda: defaultdict(list))  # folder -> shards
    report: Report = field(default_factory=Report)
    dims: int | None = None  # of the features written
    dims_found: DimTally = field(default_factory=DimTally)  # of every utterance seen, written or not


class GroupedSink:
    """Routes (uttid, features, text) to per-group shards of at most ``utts_per_shard`` utterances.

    Feature dimensions must agree across the whole pack.  With ``dims`` set, utterances of other
    dimensions are dropped as ``other_dims``.  Without it, every utterance's dimension is counted;
    once a second one turns up the pack is bound to fail (:func:`finalize` names the dimensions
    and their counts), so the sink stops writing and only counts (:attr:`counting_only`: the
    caller may then pass dimensions alone, to :meth:`count`).  Either way the outcome depends
    neither on the order of the input nor on the number of workers.
    """

    def __init__(self, d_out: str | os.PathLike, groups: Groups | None, *, worker: int = 0,
                 utts_per_shard: int = 2000, layout: str = "cat", dtype: str = "float32", dims: int | None = None,
                 sample_rate: int | None = None):
        if utts_per_shard < 1:
            raise ValueError("utts_per_shard must be >= 1")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {DTYPES}")
        check_dims(dims)
        layout_exts(layout)
        self.d_out = Path(d_out)
        self.groups = groups
        self.worker = worker
        self.utts_per_shard = utts_per_shard
        self.layout = layout
        self.dtype = np.dtype(dtype)
        self.keep_dims = dims
        self.sample_rate = sample_rate  # an audio layout's: the rate of the samples add_audio takes
        self.counting_only = False
        self.result = SinkResult()
        self._open: dict[str, ShardWriter] = {}

    def count(self, uttid: str, dims: int) -> None:
        """Note an utterance's feature dimension; in counting-only mode that is all there is to do."""
        self.result.dims_found.add(dims, uttid)
        if self.keep_dims is None and not self.counting_only and len(self.result.dims_found.counts) > 1:
            self.counting_only = True
            self.abort()  # the pack will fail; writing on would only fill the disk

    def add(self, uttid: str, feats: np.ndarray, text: str, folder: str | None = None) -> None:
        """Pack one utterance, or record why it cannot be packed; ``folder``: its length group's,
        when already decided (a planned pack), else found from its frames."""
        if isinstance(feats, np.ndarray) and feats.ndim == 2 and feats.shape[1] > 0:
            self.count(uttid, feats.shape[1])
            if self.counting_only:
                return
            if self.keep_dims is not None and feats.shape[1] != self.keep_dims:
                self.result.report.drop("other_dims", uttid, f"{feats.shape[1]} feature dims; only "
                                                             f"{self.keep_dims}-dim features are packed (dims)")
                return
        elif self.counting_only:
            return
        problem = feature_problem(feats)
        if problem is None and self.dtype != feats.dtype:
            feats = feats.astype(self.dtype)
            if not np.isfinite(feats).all():
                problem = f"values do not fit {self.dtype}"
        if problem is not None:
            self.result.report.drop("bad_features", uttid, problem)
            return
        frames = feats.shape[0]
        if folder is None and self.groups is None:
            folder = ""
        elif folder is None:
            group = self.groups.find(frames)
            if group is None:
                self.result.report.drop("outside_groups", uttid, f"{frames} frames")
                return
            folder = group.folder
        self.result.dims = feats.shape[1]
        writer = self._writer(folder, uttid, text)
        with naming(writer.tmp_path):  # a full disk fails a write() that names no file
            writer.write(uttid, feats, text)
        if len(writer) >= self.utts_per_shard:
            del self._open[folder]
            self.result.shards[folder].append(_close(writer))

    def add_audio(self, uttid: str, pcm: np.ndarray, text: str, folder: str) -> None:
        """Pack one utterance's audio (an audio layout: 1-D int16 samples at the sink's rate) into its
        planned length group ``folder``."""
        writer = self._writer(folder, uttid, text)
        with naming(writer.tmp_path):  # a full disk fails a write() that names no file
            writer.write_audio(uttid, pcm, text)

    def _writer(self, folder: str, uttid: str, text: str) -> ShardWriter:
        """The open shard of ``folder`` that takes ``uttid`` next (a new one if none is open)."""
        if not text:
            self.result.report.note("empty_text", uttid)
        writer = self._open.get(folder)
        if writer is None:
            writer = self._open[folder] = self._new_shard(folder)
        return writer

    def drop(self, reason: str, uttid: str, detail: str | None = None) -> None:
        self.result.report.drop(reason, uttid, detail)

    def end_shard(self, folder: str) -> None:
        """Close ``folder``'s open shard now, full or not (a planned shard is complete)."""
        writer = self._open.pop(folder, None)
        if writer is not None:
            self.result.shards[folder].append(_close(writer))

    def _new_shard(self, folder: str) -> ShardWriter:
        d = self.d_out / folder
        d.mkdir(parents=True, exist_ok=True)
        n = len(self.result.shards[folder])
        # mtime 0: the same input gives byte-identical shards.
        return ShardWriter(d / f".w{self.worker:03d}-{n:05d}.tar", self.layout, mtime=0, sample_rate=self.sample_rate)

    def close(self) -> SinkResult:
        while self._open:
            folder, writer = self._open.popitem()
            self.result.shards[folder].append(_close(writer))
        return self.result

    def abort(self) -> None:
        """Drop the open shards; quietly, so the error that brought us here is the one reported
        (on a full disk, closing a shard fails again)."""
        while self._open:
            _, writer = self._open.popitem()
            try:
                writer.abort()
            except OSError:
                pass


def _close(writer: ShardWriter) -> ShardInfo:
    """Finish a shard and get its bytes onto the disk before the pack may declare itself complete
    (here, in the worker, the syncs of many shards overlap with packing)."""
    try:
        with naming(writer.tmp_path):
            info = writer.close()
    except BaseException:
        try:
            writer.abort()  # the partial file goes; closing it again may fail as the first close did
        except OSError:
            pass
        raise
    sync(writer.path)
    return info


def check_dims(dims: int | None) -> None:
    if dims is not None and (not isinstance(dims, int) or dims < 1):
        raise ValueError(f"dims must be a positive number of feature dimensions, got {dims!r}")


def feature_problem(feats: np.ndarray) -> str | None:
    """Why a feature matrix cannot be packed, or None."""
    if not isinstance(feats, np.ndarray) or feats.ndim != 2:
        shape = getattr(feats, "shape", type(feats).__name__)
        return f"features must be 2-D (frames x dims), got {shape}"
    if feats.shape[0] == 0 or feats.shape[1] == 0:
        return f"empty feature matrix {feats.shape}"
    if not np.issubdtype(feats.dtype, np.floating):
        return f"features must be floating point, got {feats.dtype}"
    if not np.isfinite(feats).all():
        return "NaN or Inf in features"
    return None


@dataclass
class Output:
    """A pack's output folder, held for it (no other pack may write there meanwhile), and the plan of
    the stopped pack it resumes (None: a new pack)."""

    d: Path
    prior: PackPlan | None
    _lock: int | None = None

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def hold(d: Path) -> int:
    """An exclusive lock on folder ``d`` while the returned descriptor is open (and a killed pack's
    workers are gone): a second pack into ``d`` is refused instead of writing the same files."""
    import fcntl

    fd = os.open(d, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FileExistsError(f"{d}: another pack is writing there now; wait for it to end (or stop it) "
                              f"first") from None
    return fd


def prepare_output(d_out: str | os.PathLike, overwrite: bool, resume: bool = False) -> Output:
    """Make ``d_out`` ready for a pack, and hold it: the folder and the plan of the stopped pack to
    resume (None for a new pack).  The caller releases it when the pack ends.

    A new pack: ``d_out`` is created and marked as being packed; a non-empty one is refused unless
    ``overwrite``, which removes earlier pack output: ``*.tar``, partial and hidden worker shards,
    indexes and published entries, ``pack_report.json`` and ``pack_plan.json``, in ``d_out`` and its
    immediate sub-folders, then any sub-folder left empty; other files are kept.  The marker goes in
    first, so a pack killed while it removes the old output leaves no folder that looks complete.

    ``resume``: the pack whose plan ``d_out`` holds goes on (or, complete, is reported); without a
    plan (a pack killed before it planned, or an empty folder) it starts anew.
    """
    d = Path(d_out)
    if d.exists() and not d.is_dir():
        raise FileExistsError(f"{d} exists and is not a directory")
    if resume and overwrite:
        raise ValueError("--resume keeps what a stopped pack published, --overwrite replaces it: give one")
    lock = hold(make_dir(d))
    try:
        return _prepare(d, overwrite, resume, lock)
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise


def _prepare(d: Path, overwrite: bool, resume: bool, lock: int) -> Output:
    plan = read_plan(d)
    if resume and plan is not None:
        return Output(d, plan, lock)
    if d.is_dir() and any(d.iterdir()):
        unfinished = os.path.lexists(marker(d))
        if resume and not unfinished:
            raise FileExistsError(f"{d} holds no pack to resume (no {PLAN_NAME}); pick a new output directory or pass "
                                  f"--overwrite (overwrite=True) to replace the shards, indexes and report there")
        if not overwrite and not resume:
            raise FileExistsError(
                f"{d} holds a pack that did not finish; pass --resume to finish it (keeping the shards it published), "
                f"or --overwrite (overwrite=True) to redo it"
                if unfinished and plan is not None else
                f"{d} holds a pack that did not finish; pass --overwrite (overwrite=True) to redo it"
                if unfinished else
                f"{d} is not empty; pick a new output directory or pass --overwrite (overwrite=True) "
                f"to replace the shards, indexes and report an earlier pack wrote there"
            )
        overwrite = True  # resume without a plan: nothing was published in order, so it starts anew
    begin(d)
    if overwrite:
        for folder in [d, *(p for p in d.iterdir() if p.is_dir())]:
            shutil.rmtree(folder / PARTS_DIR, ignore_errors=True)
            shutil.rmtree(folder / f"{PARTS_DIR}.done", ignore_errors=True)
            for p in folder.iterdir():
                if p.is_file() and (p.name.endswith((".tar", TMP_SUFFIX))
                                    or p.name in (*INDEX_FILES, *AUDIO_INDEX_FILES, REPORT_NAME)
                                    or (folder == d and p.name == PLAN_NAME)):
                    p.unlink()
            if folder != d and not any(folder.iterdir()):
                folder.rmdir()
        remove_partial(d)
    return Output(d, None, lock)


REPORT_NAME = "pack_report.json"


def given_speakers(infos: Sequence[ShardInfo], utt2spk: dict[str, str], report: Report) -> Speakers:
    """The speakers ``utt2spk`` gives the shards' utterances; one it lacks is flagged ``no_speaker``
    and gets the speaker its id names (the key rule)."""
    names = []
    for key in (k for i in infos for k in i.keys):
        uttid = decode_key(key)
        name = utt2spk.get(uttid)
        if name is None:
            report.note("no_speaker", uttid)
            name = speaker_of(uttid)
        names.append(name)
    return Speakers.of(names, FROM_UTT2SPK)


def remove_partial(d_out: str | os.PathLike) -> None:
    """After a failed pack: remove hidden worker shards so nothing partial is mistaken for output."""
    d = Path(d_out)
    # .w000-00000.tar, and ..w000-00000.tar.tmp while it is being written
    for p in [*d.glob(".w*"), *d.glob("*/.w*"), *d.glob("..w*"), *d.glob("*/..w*")]:
        if p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


PathOrPaths = str | os.PathLike | Sequence[str | os.PathLike]


def as_list(p: PathOrPaths) -> list[str]:
    return [str(p)] if isinstance(p, (str, os.PathLike)) else [str(x) for x in p]


def check_fmt(fmt: str) -> None:
    try:
        name = fmt % 0
    except (TypeError, ValueError):
        raise ValueError(f"shard name format {fmt!r} must take one integer, e.g. data-%05d.tar") from None
    if "/" in name or not name.endswith(".tar") or name.startswith("."):
        raise ValueError(f"shard name format {fmt!r} must give a plain file name ending in .tar")


FLOAT16_NOTE = ("float16 features: wdsprep's loader returns them as float32, but CAT's own reader (webdataset's "
                 ".decode()) hands the float16 arrays to the model as they are; train on these shards with wdsprep's "
                 "loader, or pack float32 for CAT")


def check_dtype(dtype: str, layout: str) -> None:
    """Refuse an unknown dtype before any work starts; say plainly what float16 means for CAT.

    Both layouts are CAT's, so a float16 shard looks like one CAT can read; it can, but its
    model gets float16 tensors it was not built for.
    """
    layout_exts(layout)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if dtype == "float16":
        warnings.warn(f"{layout} layout with {FLOAT16_NOTE}", UserWarning, stacklevel=3)
