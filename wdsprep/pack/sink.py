"""Writing planned shards, in worker processes: each shard through a :class:`ShardSink`.

A worker of the local pool is given a :class:`ShardWork` once (where the shards go, the plan's
shards and frames, and the source's :class:`ShardJob`), then shard ids; a task on an engine's
worker (``executor``) gets the work of its one shard (:meth:`ShardWork.for_shard`: its utterances
alone, however large the pack).  For each it opens a sink, lets the job add
the shard's utterances in plan order, and hands back a :class:`WrittenShard`: the shard under a
hidden name (``.wSSS-00000.tar``, SSS its place in the plan: invisible to ``data-*.tar`` globs),
complete and synced, with every utterance it could not pack and why.  The main process publishes it
(:mod:`wdsprep.pack.output`).  A pack into a bucket (``stage_url``) writes each shard in a temporary
folder of the worker and *stages* it in the bucket (``FOLDER/.pack.staged/J.tar``, then its record
``J.json``: :func:`staged_record`), so workers on machines that share nothing but the bucket hand
their shards over there; the main process publishes them by a copy within the bucket.
"""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from wdsprep.files import naming, sync
from wdsprep.format.index import ShardInfo
from wdsprep.format.writer import ShardWriter
from wdsprep.pack.plan import PlannedShard
from wdsprep.prep.parallel import imap_executor, imap_ordered
from wdsprep.report import Report


@dataclass
class WrittenShard:
    """One planned shard as a worker wrote it: under a hidden name, or nothing when none of its
    utterances could be packed (``report`` says why)."""

    shard: int  # its place in the plan
    folder: str
    info: ShardInfo | None  # named by its hidden file
    dims: int | None  # of the features written
    report: Report
    size: int | None = None  # bytes, and when written (ns): a shard staged in a bucket, where no stat tells
    mtime_ns: int | None = None


STAGED_DIR = ".pack.staged"  # per shard folder, shards written but not published yet (a spread pack's, a bucket's)


def staged_name(shard: int) -> str:
    """Planned shard ``shard``'s staged file, within its folder (its record: ``.json`` for ``.tar``)."""
    return f"{STAGED_DIR}/{shard:08d}.tar"


def staged_record(w: WrittenShard, size: int | None, mtime_ns: int | None) -> bytes:
    """The record of a staged shard (what it holds, what it dropped): JSON, written after the shard."""
    info = None
    if w.info is not None:
        info = {"keys": w.info.keys, "frames": w.info.frames, "text_lens": w.info.text_lens,
                "sha256": w.info.sha256, "samples": w.info.samples, "size": size, "mtime_ns": mtime_ns}
    return json.dumps({"plan_shard": w.shard, "dims": w.dims, "report": w.report.fragment(), "info": info},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class ShardSink:
    """Writes one planned shard: each utterance checked and written, or dropped with the reason.

    The shard file is made with its first utterance, so a shard none of whose utterances can be
    packed leaves no file.  Used as a context manager, it removes the partial shard on an error.
    ``fields``: the fields of the utterance the job adds next (its language, ...), set by
    :meth:`ShardWork.write` before each: written as members beside whatever the job adds.
    """

    def __init__(self, d_out: Path, shard: int, folder: str, *, layout: str, dtype: str,
                 sample_rate: int | None = None, bitrate: int | None = None):
        self.shard, self.folder, self.where = shard, folder, d_out / folder
        self.path = self.where / f".w{shard:03d}-00000.tar"
        self.layout, self.dtype = layout, np.dtype(dtype)
        self.sample_rate = sample_rate  # an audio layout's: the rate of the samples add_audio takes
        self.bitrate = bitrate  # a lossy audio layout's, bit/s
        self.report = Report()
        self.dims: int | None = None
        self.fields: Mapping[str, str] | None = None
        self._writer: ShardWriter | None = None

    def __enter__(self) -> ShardSink:
        return self

    def __exit__(self, kind, error, tb) -> None:
        if error is not None:
            self.abort()

    def add(self, uttid: str, feats: np.ndarray, text: str) -> None:
        """Write one utterance's features, or record why they cannot be packed."""
        problem = feature_problem(feats)
        if problem is None and self.dtype != feats.dtype:
            feats = feats.astype(self.dtype)
            if not np.isfinite(feats).all():
                problem = f"values do not fit {self.dtype}"
        if problem is not None:
            self.report.drop("bad_features", uttid, problem)
            return
        self.dims = feats.shape[1]
        writer = self._open(uttid, text)
        with naming(writer.tmp_path):  # a full disk fails a write() that names no file
            writer.write(uttid, feats, text, self.fields)

    def add_audio(self, uttid: str, pcm: np.ndarray, text: str) -> None:
        """Write one utterance's audio (an audio layout: 1-D int16 samples at the sink's rate)."""
        writer = self._open(uttid, text)
        with naming(writer.tmp_path):  # a full disk fails a write() that names no file
            writer.write_audio(uttid, pcm, text, self.fields)

    def drop(self, reason: str, uttid: str, detail: str | None = None) -> None:
        self.report.drop(reason, uttid, detail)

    def _open(self, uttid: str, text: str) -> ShardWriter:
        """The shard's writer, made with its first utterance; an empty transcript is flagged."""
        if not text:
            self.report.note("empty_text", uttid)
        if self._writer is None:
            self.where.mkdir(parents=True, exist_ok=True)
            # mtime 0: the same input gives byte-identical shards.
            self._writer = ShardWriter(self.path, self.layout, mtime=0, sample_rate=self.sample_rate,
                                       bitrate=self.bitrate)
        return self._writer

    def close(self) -> WrittenShard:
        """Finish the shard and get its bytes onto the disk before the pack may declare itself
        complete (here, in the worker, the syncs of many shards overlap with packing)."""
        info = None
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                with naming(writer.tmp_path):
                    info = writer.close()
            except BaseException:
                _abort(writer)  # the partial file goes; closing it again may fail as the first close did
                raise
            sync(writer.path)
        return WrittenShard(self.shard, self.folder, info, self.dims, self.report)

    def abort(self) -> None:
        """Drop the partial shard; quietly, so the error that brought us here is the one reported."""
        writer, self._writer = self._writer, None
        if writer is not None:
            _abort(writer)


def _abort(writer: ShardWriter) -> None:
    try:
        writer.abort()
    except OSError:  # on a full disk, closing a shard fails again
        pass


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


class ShardJob(Protocol):
    """How a source's utterances go into shards, in a worker process (``pack``'s from arks,
    ``pack-audio``'s from audio): pickled to each worker once, opened there, then asked to add
    utterances one by one."""

    def open(self) -> None:
        """Take the worker's resources (open arks, an fbank backend)."""

    def add(self, sink: ShardSink, item: int, frames: int) -> None:
        """Add item ``item`` (its place in the pack's item list) to ``sink``, or drop it there with the
        reason; ``frames``: its frames as planned, which what is written must have."""

    def close(self) -> None: ...

    def narrowed(self, items: Sequence[int]) -> ShardJob:
        """The job of ``items`` alone, renumbered 0, 1, ... in that order: what one task on an
        engine's worker is sent (a job without it is sent whole)."""


@dataclass
class ShardWork:
    """Everything a worker needs to write planned shards."""

    d_out: Path
    layout: str
    dtype: str
    sample_rate: int | None  # an audio layout's
    shards: Sequence[PlannedShard] | Mapping[int, PlannedShard]
    frames: np.ndarray  # per item, as planned
    job: ShardJob
    fields: Sequence[Mapping[str, str]] | None = None  # per item, its fields' values (None: the pack has none)
    bitrate: int | None = None  # a lossy audio layout's, bit/s
    stage_url: str | None = None  # a bucket's pack: each shard is staged there (d_out unused)

    def write(self, shard: int, tick: Callable[[int], None]) -> WrittenShard:
        """Write planned shard ``shard`` under its hidden name (synced), or stage it in the bucket;
        ``tick`` per utterance."""
        if self.stage_url is not None:
            with tempfile.TemporaryDirectory(prefix="wdsprep-shard-") as tmp:
                return self._stage(self._write(Path(tmp), shard, tick), Path(tmp))
        return self._write(self.d_out, shard, tick)

    def _write(self, d_out: Path, shard: int, tick: Callable[[int], None]) -> WrittenShard:
        s = self.shards[shard]
        with ShardSink(d_out, shard, s.folder, layout=self.layout, dtype=self.dtype,
                       sample_rate=self.sample_rate, bitrate=self.bitrate) as sink:
            for i, frames in zip(s.items.tolist(), self.frames[s.items].tolist()):
                if self.fields is not None:
                    sink.fields = self.fields[i]
                self.job.add(sink, i, frames)
                tick(1)
            return sink.close()

    def _stage(self, w: WrittenShard, tmp: Path) -> WrittenShard:
        """Upload a written shard, then its record, to the bucket's staging place (each write whole or
        not at all): the shard is staged once its record is there."""
        from wdsprep.remote.stores import store_for

        assert self.stage_url is not None
        store = store_for(self.stage_url)
        assert store is not None
        name = staged_name(w.shard)
        url = f"{self.stage_url}/{w.folder}/{name}" if w.folder else f"{self.stage_url}/{name}"
        size = mtime = None
        if w.info is not None:
            path = tmp / w.folder / w.info.name
            st = os.stat(path)
            size, mtime = st.st_size, st.st_mtime_ns
            store.put(url, str(path), timeout=60.0, metadata={"sha256": w.info.sha256 or ""})
            w.info.name = name
        store.put(url[:-len(".tar")] + ".json", staged_record(w, size, mtime), timeout=60.0)
        return replace(w, size=size, mtime_ns=mtime)

    def for_shard(self, shard: int) -> ShardWork:
        """The work of planned shard ``shard`` alone: its utterances renumbered, the job narrowed to
        them (:meth:`ShardJob.narrowed`), so a task carries one shard's worth, not the pack's."""
        s = self.shards[shard]
        narrowed = getattr(self.job, "narrowed", None)
        if narrowed is None:
            return replace(self, shards={shard: s})
        items = s.items.tolist()
        return replace(self, shards={shard: replace(s, items=np.arange(len(items)))}, frames=self.frames[s.items],
                       job=narrowed(items), fields=None if self.fields is None else [self.fields[i] for i in items])


def write_shards(work: ShardWork, tasks: Sequence[int], *, nj: int, desc: str, progress: bool | None,
                 executor: Executor | None = None) -> Iterator[WrittenShard]:
    """Planned shards ``tasks`` written by ``nj`` local workers, or each as a task on ``executor``'s
    workers, each handed back in task order."""
    sizes = [len(work.shards[j].items) for j in tasks]
    if executor is not None:
        return imap_executor(_write_alone, ((work.for_shard(j), j) for j in tasks), executor, desc, progress,
                             sizes=sizes)
    return imap_ordered(_write, tasks, nj, desc, progress, init=_open_work, init_args=(work,), done=_close_work,
                        total=sum(sizes))


def _write_alone(task: tuple[ShardWork, int]) -> WrittenShard:
    """One task on an engine's worker: its shard's job opened, the shard written, the job closed."""
    work, shard = task
    work.job.open()
    try:
        return work.write(shard, lambda n: None)
    finally:
        work.job.close()


# The work of this worker process (set by _open_work in each worker, or in the main process with nj=1).
_work: ShardWork | None = None


def _open_work(work: ShardWork) -> None:
    global _work
    _work = work
    work.job.open()


def _close_work() -> None:
    global _work
    if _work is not None:
        _work.job.close()
        _work = None


def _write(shard: int, tick: Callable[[int], None]) -> WrittenShard:
    assert _work is not None
    return _work.write(shard, tick)
