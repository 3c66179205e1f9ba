"""Writing utterances into length-grouped shards, shared by ``pack`` and ``pack-audio``.

Each worker process owns a :class:`GroupedSink`: it checks every utterance, routes it to the
shard of its length group and records every utterance it could not pack, with the reason.
Workers write shards under hidden names (``.w000-00000.tar``, invisible to ``data-*.tar``
globs); :func:`finalize` then gives them their final names in a deterministic order, writes each
folder's ``index.json`` and ``DIR/pack_report.json``.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wdsprep.files import TMP_SUFFIX
from wdsprep.format.index import INDEX_NAME, FolderIndex, ShardInfo, write_index
from wdsprep.format.keys import layout_exts
from wdsprep.format.writer import ShardWriter
from wdsprep.pack.groups import Groups
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report, StrictError
from wdsprep.units import hours

DTYPES = ("float32", "float16")


@dataclass
class SinkResult:
    """What one worker wrote and what it could not pack."""

    shards: dict[str, list[ShardInfo]] = field(default_factory=lambda: defaultdict(list))  # folder -> shards
    report: Report = field(default_factory=Report)
    dims: int | None = None


class GroupedSink:
    """Routes (uttid, features, text) to per-group shards of at most ``utts_per_shard`` utterances."""

    def __init__(self, d_out: str | os.PathLike, groups: Groups | None, *, worker: int = 0,
                 utts_per_shard: int = 2000, layout: str = "cat", dtype: str = "float32"):
        if utts_per_shard < 1:
            raise ValueError("utts_per_shard must be >= 1")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {DTYPES}")
        layout_exts(layout)
        self.d_out = Path(d_out)
        self.groups = groups
        self.worker = worker
        self.utts_per_shard = utts_per_shard
        self.layout = layout
        self.dtype = np.dtype(dtype)
        self.result = SinkResult()
        self._open: dict[str, ShardWriter] = {}

    def add(self, uttid: str, feats: np.ndarray, text: str) -> None:
        """Pack one utterance, or record why it cannot be packed."""
        problem = feature_problem(feats)
        if problem is None and self.result.dims is not None and feats.shape[1] != self.result.dims:
            problem = f"{feats.shape[1]} feature dims, earlier utterances have {self.result.dims}"
        if problem is None and self.dtype != feats.dtype:
            feats = feats.astype(self.dtype)
            if not np.isfinite(feats).all():
                problem = f"values do not fit {self.dtype}"
        if problem is not None:
            self.result.report.drop("bad_features", uttid, problem)
            return
        frames = feats.shape[0]
        if self.groups is None:
            folder = ""
        else:
            group = self.groups.find(frames)
            if group is None:
                self.result.report.drop("outside_groups", uttid, f"{frames} frames")
                return
            folder = group.folder
        self.result.dims = feats.shape[1]
        if not text:
            self.result.report.note("empty_text", uttid)
        writer = self._open.get(folder)
        if writer is None:
            writer = self._open[folder] = self._new_shard(folder)
        writer.write(uttid, feats, text)
        if len(writer) >= self.utts_per_shard:
            self.result.shards[folder].append(writer.close())
            del self._open[folder]

    def drop(self, reason: str, uttid: str, detail: str | None = None) -> None:
        self.result.report.drop(reason, uttid, detail)

    def _new_shard(self, folder: str) -> ShardWriter:
        d = self.d_out / folder
        d.mkdir(parents=True, exist_ok=True)
        n = len(self.result.shards[folder])
        # mtime 0: the same input gives byte-identical shards.
        return ShardWriter(d / f".w{self.worker:03d}-{n:05d}.tar", self.layout, mtime=0)

    def close(self) -> SinkResult:
        for folder, writer in self._open.items():
            self.result.shards[folder].append(writer.close())
        self._open.clear()
        return self.result

    def abort(self) -> None:
        for writer in self._open.values():
            writer.abort()
        self._open.clear()


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


def prepare_output(d_out: str | os.PathLike, overwrite: bool) -> Path:
    """Create ``d_out``; refuse a non-empty one unless ``overwrite``, which removes earlier pack output.

    Overwrite removes only what pack writes (``*.tar``, partial and hidden worker shards,
    ``index.json``, ``pack_report.json``) in ``d_out`` and its immediate sub-folders, then any
    sub-folder left empty; other files are kept.
    """
    d = Path(d_out)
    if d.exists() and not d.is_dir():
        raise FileExistsError(f"{d} exists and is not a directory")
    if d.is_dir() and any(d.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{d} is not empty; pick a new output directory or pass --overwrite (overwrite=True) "
                f"to replace the shards, indexes and report an earlier pack wrote there"
            )
        for folder in [d, *(p for p in d.iterdir() if p.is_dir())]:
            for p in folder.iterdir():
                if p.is_file() and (p.name.endswith((".tar", TMP_SUFFIX)) or p.name in (INDEX_NAME, REPORT_NAME)):
                    p.unlink()
            if folder != d and not any(folder.iterdir()):
                folder.rmdir()
    d.mkdir(parents=True, exist_ok=True)
    return d


REPORT_NAME = "pack_report.json"


def finalize(d_out: str | os.PathLike, results: list[SinkResult], *, fmt: str, layout: str, dtype: str,
             groups: Groups | None, report: Report) -> Report:
    """Rename worker shards to ``fmt % i`` (worker order, then shard order), write indexes and the report.

    ``report`` already holds what was found before packing (e.g. missing labels); the workers'
    findings are merged into it.
    """
    d = Path(d_out)
    dims = {r.dims for r in results if r.dims is not None}
    if len(dims) > 1:
        raise ValueError(f"utterances have different feature dims {sorted(dims)}; pack them separately")
    folders = [""] if groups is None else [g.folder for g in groups]
    summary = {}
    for folder in folders:
        infos = []
        for r in results:
            for info in r.shards.get(folder, []):
                final = fmt % len(infos)
                os.replace(d / folder / info.name, d / folder / final)
                infos.append(ShardInfo(final, info.keys, info.frames, info.text_lens))
        if infos:
            write_index(d / folder, FolderIndex(layout, next(iter(dims), None), dtype, infos))
        frames = sum(i.num_frames for i in infos)
        summary[folder or "."] = {
            "utterances": sum(i.num_utts for i in infos),
            "frames": frames,
            "hours": round(hours(frames), 4),
            "shards": len(infos),
        }
    for r in results:
        report.merge(r.report)
    report.groups = summary
    report.write(d / REPORT_NAME)
    return report


def remove_partial(d_out: str | os.PathLike) -> None:
    """After a failed pack: remove hidden worker shards so nothing partial is mistaken for output."""
    d = Path(d_out)
    for p in [*d.glob(".w*"), *d.glob("*/.w*")]:
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


def run_and_finalize(work: Callable, items: list, d_out: Path, *, nj: int, desc: str, progress: bool | None,
                     fmt: str, layout: str, dtype: str, groups: Groups | None, report: Report,
                     strict: bool) -> Report:
    """Run ``work`` over ``items`` in ``nj`` processes, then name shards and write index and report."""
    try:
        results = run_chunks(work, items, nj, desc=desc, progress=progress)
        report = finalize(d_out, results, fmt=fmt, layout=layout, dtype=dtype, groups=groups, report=report)
    except BaseException:
        remove_partial(d_out)
        raise
    print(report.summary(f"{desc}: wrote {d_out}"))
    if strict and (report.num_dropped or report.num_flagged):
        raise StrictError(f"{desc}: {report.counts()} (strict); see {d_out / 'pack_report.json'}")
    return report
