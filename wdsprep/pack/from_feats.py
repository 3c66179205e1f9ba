"""``pack``: Kaldi ``feats.scp`` + ``text`` -> length-grouped tar shards with an index and a report.

A source for the steps every pack takes (:func:`wdsprep.pack.driver.run_pack`): two passes over
the arks, so that every shard's utterances are chosen before any is written
(:mod:`wdsprep.pack.plan`), and the shards can be published one by one as they are written
(:mod:`wdsprep.pack.output`):

1. headers: each matrix's header (a few bytes at its offset, read in ``feats.scp`` order) gives
   its frames and dims; so before a shard is written the pack knows every utterance's length
   group, fails on mixed dimensions, and drops what it cannot pack (unreadable headers, other
   dims, outside every group) without reading its features.  A pipe or a text matrix, which has
   no header to read, is read whole here and again when written.
2. shards: each length group's utterances in a seeded random order (``shuffle``, the default) or
   in input order, cut into shards; workers write whole shards, and they are published in plan
   order, so ``nj`` changes nothing in the output.  With ``shuffle`` each utterance is read at its
   own offset (a seek per utterance); the cost is measured in ``docs/shuffle.md``.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from wdsprep.errors import DataError
from wdsprep.options import documented
from wdsprep.pack.driver import Headers, Item, PackSource, kaldi_labels, run_pack
from wdsprep.pack.fields import field_files
from wdsprep.pack.options import Engine, OutputOptions, PackInputs, PackOptions, Part, PathOrPaths, Spread, as_list
from wdsprep.pack.sink import ShardSink, feature_problem
from wdsprep.prep.ark import ArkError, ArkReader
from wdsprep.prep.kaldi import read_feats_scp
from wdsprep.prep.options import JobOptions
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report


@runtime_checkable
class FeaturesInput(Protocol):
    """Features named other than by a ``feats.scp``: a :class:`~wdsprep.pack.sources.Manifest` (``--from``)."""

    def features_source(self, dims: int | None) -> PackSource:
        """The pack source of its utterances' features (its labels with it)."""


@documented(PackOptions, PackInputs, JobOptions, OutputOptions, Spread, Engine)
def pack_data(
    f_scps: PathOrPaths | FeaturesInput,
    f_labels: PathOrPaths | None,
    d_out: str | os.PathLike,
    fmt: str = PackOptions.fmt,
    filter_group: Sequence[str] | None = PackOptions.filter_group,
    *,
    utts_per_shard: int = PackOptions.utts_per_shard,
    layout: str = PackOptions.layout,
    dtype: str = PackOptions.dtype,
    dims: int | None = PackOptions.dims,
    shuffle: bool = PackOptions.shuffle,
    seed: int = PackOptions.seed,
    utt2spk: PathOrPaths | None = PackInputs.utt2spk,
    utt2lang: PathOrPaths | None = PackInputs.utt2lang,
    fields: Mapping[str, PathOrPaths] | None = PackInputs.fields,
    index_fields: Sequence[str] = PackOptions.index_fields,
    nj: int = JobOptions.nj,
    strict: bool = JobOptions.strict,
    max_lost: float = OutputOptions.max_lost,
    overwrite: bool = OutputOptions.overwrite,
    resume: bool = OutputOptions.resume,
    plan_only: bool = Spread.plan_only,
    part: Part | str | tuple[int, int] | None = Spread.part,
    executor: Executor | None = Engine.executor,
    dask: str | None = Engine.dask,
    progress: bool | None = JobOptions.progress,
) -> Report:
    """Pack Kaldi features and transcripts into tar shards, one folder per length group.

    Args:
        f_scps: one or more ``feats.scp`` (arks may hold Kaldi compressed matrices), or a
            :class:`~wdsprep.Manifest` naming features another project computed (``--from lhotse``:
            cuts with features), whose transcripts and speakers it names too (docs/import.md).
        f_labels: one or more Kaldi ``text`` files; transcripts are stored as raw UTF-8 (None with a
            Manifest).
        d_out: output directory; shards go to ``d_out/LO_HI/`` per group, or ``d_out`` without groups.

    Shards are published one by one while the pack runs (``make_loader(..., growing=True)`` trains
    on them); ``d_out/PACK_INCOMPLETE`` says the pack has not finished, ``d_out/pack_plan.json``
    what it will hold.  The shards depend on the inputs and the options alone, not on ``nj``,
    timing or interruptions.

    Returns:
        The report, also written to ``d_out/pack_report.json``.
    """
    options = PackOptions(fmt, filter_group, utts_per_shard, layout, dtype, dims, shuffle, seed,
                          index_fields=index_fields)
    job, output, spread = JobOptions(nj, strict, progress), OutputOptions(max_lost, overwrite, resume), \
        Spread(plan_only, part)
    if isinstance(f_scps, FeaturesInput):
        if f_labels is not None or utt2spk is not None:
            raise ValueError(f"{'f_labels' if f_labels is not None else 'utt2spk'}: the manifest names its utterances' "
                             f"transcripts and speakers; give it alone")
        source: PackSource = f_scps.features_source(options.dims)
        assert source.labels is not None
        labels = source.labels
    else:
        if f_labels is None:
            raise ValueError("a feats.scp needs its transcripts: give f_labels (--text)")
        source, labels = FeatsSource(as_list(f_scps), options.dims), kaldi_labels(f_labels, utt2spk)
    return run_pack(source, labels, d_out, options, job, output, fields=field_files(utt2lang, fields), spread=spread,
                    engine=Engine(dask, executor))


class FeatsSource(PackSource):
    """Utterances from Kaldi ``feats.scp`` files; the headers pass reads each matrix's header."""

    command = "pack"
    missing = ("missing_features", "in no feats.scp")

    def __init__(self, scps: list[str], dims: int | None) -> None:
        self.feats = read_feats_scp(scps)
        self.dims = dims
        self.report = Report()
        self.known = self.feats.keys()
        self.files = {"feats.scp": scps}
        self.data = ("arks", [p for e in self.feats.values() if (p := ark_path(e.value))])

    def entries(self) -> list[tuple[str, str, Any]]:
        return [(uttid, e.where, e.value) for uttid, e in self.feats.items()]

    def headers(self, items: list[Item], report: Report, *, nj: int, progress: bool | None) -> Headers:
        """Each matrix's frames and dims from its header (see the module's doc); features of several
        dimensions fail the pack here, before a shard is written, unless ``dims`` picks one."""
        measured = run_chunks(_measure_chunk, [(u, rx) for u, rx, _ in items], nj, desc=f"{self.command}: headers",
                              progress=progress)
        frames = np.concatenate([m[0] for m in measured]) if measured else np.zeros(0, np.int64)
        cols = np.concatenate([m[1] for m in measured]) if measured else np.zeros(0, np.int64)
        for m in measured:
            report.merge(m[2])
        uttids = [u for u, _, _ in items]
        if self.dims is None:
            check_one_dimension(uttids, cols)
        unpackable = {i: ("other_dims", f"{c} feature dims; only {self.dims}-dim features are packed (dims)")
                      for i, (n, c) in enumerate(zip(frames.tolist(), cols.tolist()))
                      if n >= 0 and self.dims is not None and c != self.dims}
        return Headers(frames, unpackable, ArkJob(items, cols))


def check_one_dimension(uttids: Sequence[str], cols: np.ndarray) -> None:
    """A pack without ``dims`` (``--dims``) fails on features of several dimensions, naming each with
    its count and first utterance (``cols``: each item's, <= 0 for one not measured)."""
    measured = np.flatnonzero(cols > 0)
    dims, first, counts = np.unique(cols[measured], return_index=True, return_counts=True)
    if len(dims) < 2:
        return
    found = {d: (n, uttids[measured[f]]) for d, f, n in zip(dims.tolist(), first.tolist(), counts.tolist())}
    ranked = sorted(found, key=lambda d: (-found[d][0], d))
    listed = "; ".join(f"{d} dims in {found[d][0]:,} utterance(s), the first {found[d][1]}" for d in ranked)
    raise DataError(f"the features have different dimensions ({listed}); nothing was packed. Pack each "
                    f"dimension into a directory of its own, or pass --dims {ranked[0]} (dims={ranked[0]}) to "
                    f"pack the {ranked[0]}-dim features and report the others as other_dims")


def ark_path(rxfile: str) -> str | None:
    """The file of a ``feats.scp`` value (``path:offset``), None for a pipe."""
    if rxfile.rstrip().endswith("|"):
        return None
    path, sep, offset = rxfile.rpartition(":")
    return path if sep and offset.isdigit() else rxfile


class ArkJob:
    """Writes utterances from their arks, in a worker (each ark kept open while it is read), each
    checked against the shape the headers pass found."""

    def __init__(self, items: Sequence[Item], cols: np.ndarray) -> None:
        self.items, self.cols = items, cols
        self.arks: ArkReader | None = None

    def open(self) -> None:
        self.arks = ArkReader()

    def narrowed(self, items: Sequence[int]) -> ArkJob:
        return ArkJob([self.items[i] for i in items], self.cols[np.asarray(items, np.int64)])

    def close(self) -> None:
        if self.arks is not None:
            self.arks.close()
            self.arks = None

    def add(self, sink: ShardSink, item: int, frames: int) -> None:
        uttid, rxfile, text = self.items[item]
        assert self.arks is not None
        try:
            feats = self.arks.load(rxfile)
        except ArkError as e:
            sink.drop("bad_features", uttid, str(e))
            return
        changed = _changed(feats, frames, int(self.cols[item]))
        if changed is not None:
            sink.drop("bad_features", uttid, f"{changed} when the pack measured it: {rxfile} changed during the "
                                             f"pack; pack again")
        else:
            sink.add(uttid, feats, text)


def _changed(feats: Any, frames: int, dims: int) -> str | None:
    """How a matrix differs from the shape its header gave (None: it does not)."""
    if not isinstance(feats, np.ndarray) or feats.ndim != 2:
        return None  # not a matrix: the sink says why it cannot be packed
    if feats.shape[0] != frames:
        return f"{feats.shape[0]} frames, {frames}"
    if feats.shape[1] != dims:
        return f"{feats.shape[1]} feature dims, {dims}"
    return None


def _measure_chunk(chunk: Sequence[tuple[str, str]], worker: int,
                   tick: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray, Report]:
    """(frames, dims) of each matrix, -1 for one that cannot be packed (and why, in the report)."""
    frames = np.full(len(chunk), -1, np.int64)
    cols = np.full(len(chunk), -1, np.int64)
    report = Report()
    arks = ArkReader()  # keeps each ark open: the headers are read in ark order
    try:
        for k, (uttid, rxfile) in enumerate(chunk):
            try:
                header = arks.header(rxfile)
                if header is not None and header.cols is not None and header.rows > 0 and header.cols > 0:
                    frames[k], cols[k] = header.rows, header.cols
                else:  # a pipe or text matrix (no header), a vector, an empty matrix: read it to say
                    feats = arks.load(rxfile)
                    problem = feature_problem(feats)
                    if problem is None:
                        frames[k], cols[k] = feats.shape
                    else:
                        report.drop("bad_features", uttid, problem)
            except ArkError as e:  # the message says where and why
                report.drop("bad_features", uttid, str(e))
            tick(1)
    finally:
        arks.close()
    return frames, cols, report
