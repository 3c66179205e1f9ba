"""``pack``: Kaldi ``feats.scp`` + ``text`` -> length-grouped tar shards with an index and a report.

Two passes over the arks, so that every shard's utterances are chosen before any is written
(:mod:`wdsprep.pack.plan`), and the shards can be published one by one as they are written
(:mod:`wdsprep.pack.publish`):

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
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wdsprep.pack.groups import Groups
from wdsprep.pack.plan import PlannedShard, plan_shards
from wdsprep.pack.publish import (
    Planned,
    Written,
    check_same,
    file_digests,
    pack_planned,
    resume_complete,
    sink_for,
    stat_digest,
    written,
)
from wdsprep.pack.sink import (
    DimTally,
    PathOrPaths,
    as_list,
    check_dims,
    check_dtype,
    check_fmt,
    feature_problem,
    prepare_output,
)
from wdsprep.prep.ark import ArkError, ArkReader
from wdsprep.prep.kaldi import read_feats_scp, read_text, read_utt2spk
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report

Item = tuple[str, str, str]  # (uttid, ark rxfilename, transcript)


def pack_data(
    f_scps: PathOrPaths,
    f_labels: PathOrPaths,
    d_out: str | os.PathLike,
    fmt: str = "data-%05d.tar",
    filter_group: Sequence[str] | None = None,
    *,
    utts_per_shard: int = 2000,
    layout: str = "cat",
    dtype: str = "float32",
    dims: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    utt2spk: PathOrPaths | None = None,
    nj: int = 1,
    strict: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
) -> Report:
    """Pack Kaldi features and transcripts into tar shards, one folder per length group.

    Args:
        f_scps: one or more ``feats.scp`` (arks may hold Kaldi compressed matrices).
        f_labels: one or more Kaldi ``text`` files; transcripts are stored as raw UTF-8.
        d_out: output directory; shards go to ``d_out/LO_HI/`` per group, or ``d_out`` without groups.
        fmt: shard file name, ``fmt % i``.
        filter_group: length groups ``"LO:HI"`` in frames (``LO <= frames < HI``; open ends allowed).
        utts_per_shard: utterances per shard at most.
        layout: ``"cat"`` (``.npy``/``.txt``) or ``"cat-v3"`` (``.mat.npy``/``.label.txt``).
        dtype: ``"float32"`` or ``"float16"`` (half the bytes; readers return float32).
        dims: pack only features of this many dimensions and report the others as ``other_dims``.
            Without it, features of more than one dimension fail the pack, naming each dimension,
            how many utterances have it and the first of them.
        shuffle: each length group's utterances go to shards in a seeded random order, so every
            shard holds utterances of all speakers and recordings (False: input order, which
            Kaldi sorts by speaker).  The shards depend on ``seed`` only, not on ``nj``.
        seed: the shuffle's seed.
        utt2spk: Kaldi ``utt2spk`` file(s); the speakers go into the index, for the loader's
            shuffle report and ``max_utts_per_speaker``.  Without it the index holds the speaker
            each id names (up to its first ``-``, see :func:`wdsprep.format.keys.speaker_of`).
        nj: worker processes.
        strict: raise :class:`StrictError` (after writing the report) if any utterance was not
            packed, has an empty transcript or no speaker in ``utt2spk``.
        overwrite: replace an earlier pack's output in ``d_out`` instead of refusing.
        resume: finish the pack that was stopped in ``d_out`` (killed, out of disk, Ctrl-C): the
            shards it published are checked and kept, the rest is written; the result is the one
            an uninterrupted pack gives.  Refused, naming what differs, unless the inputs and
            options are those it started with.  A complete pack is only reported.
        progress: tqdm bar; ``None`` shows it on a terminal only.

    Shards are published one by one while the pack runs (``make_loader(..., growing=True)`` trains
    on them); ``d_out/PACK_INCOMPLETE`` says the pack has not finished, ``d_out/pack_plan.json``
    what it will hold.

    Returns:
        The report, also written to ``d_out/pack_report.json``.
    """
    check_fmt(fmt)
    check_dims(dims)
    check_dtype(dtype, layout)
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be >= 1")
    groups = Groups(filter_group) if filter_group else None
    scps, texts = as_list(f_scps), as_list(f_labels)
    spk_files = as_list(utt2spk) if utt2spk is not None else []
    feats = read_feats_scp(scps)
    labels = read_text(texts)
    speakers = read_utt2spk(spk_files) if utt2spk is not None else None
    out = prepare_output(d_out, overwrite, resume)
    d, prior = out.d, out.prior
    try:
        options = {"fmt": fmt, "filter_group": None if groups is None else [str(g) for g in groups],
                   "utts_per_shard": utts_per_shard, "layout": layout, "dtype": dtype, "dims": dims, "shuffle": shuffle,
                   "seed": seed}
        inputs = {"feats.scp": file_digests(scps), "text": file_digests(texts), "utt2spk": file_digests(spk_files),
                  "arks": stat_digest([ark_path(e.value) for e in feats.values() if ark_path(e.value)])}
        if prior is not None:
            check_same(d, prior, "pack", inputs, options)
            done = resume_complete(d, prior, "pack", inputs, options)
            if done is not None:
                return done

        report = Report()
        for uttid in labels.keys() - feats.keys():
            report.drop("missing_features", uttid, f"in {labels[uttid].where}, in no feats.scp")
        items: list[Item] = []
        for uttid, e in feats.items():
            label = labels.get(uttid)
            if label is None:
                report.drop("missing_label", uttid, f"in {e.where}, in no text file")
            else:
                items.append((uttid, e.value, label.value))

        def plan(report: Report) -> Planned:
            return plan_arks(items, d, report, desc="pack", groups=groups, utts_per_shard=utts_per_shard, layout=layout,
                             dtype=dtype, dims=dims, shuffle=shuffle, seed=seed, nj=nj, progress=progress)

        return pack_planned(d, plan, report, command="pack", inputs=inputs, options=options, prior=prior, fmt=fmt,
                            layout=layout, dtype=dtype, nj=nj, progress=progress, strict=strict, utt2spk=speakers)
    finally:
        out.release()


def ark_path(rxfile: str) -> str | None:
    """The file of a ``feats.scp`` value (``path:offset``), None for a pipe."""
    if rxfile.rstrip().endswith("|"):
        return None
    path, sep, offset = rxfile.rpartition(":")
    return path if sep and offset.isdigit() else rxfile


def plan_arks(items: Sequence[Item], d_out: Path, report: Report, *, desc: str, groups: Groups | None,
              utts_per_shard: int, layout: str, dtype: str, dims: int | None, shuffle: bool, seed: int, nj: int,
              progress: bool | None) -> Planned:
    """The headers pass and the shard plan (see the module's doc); what cannot be packed goes to ``report``."""
    measured = run_chunks(_measure_chunk, [(u, rx) for u, rx, _ in items], nj, desc=f"{desc}: headers",
                          progress=progress)
    frames = np.concatenate([m[0] for m in measured]) if measured else np.zeros(0, np.int64)
    cols = np.concatenate([m[1] for m in measured]) if measured else np.zeros(0, np.int64)
    for m in measured:
        report.merge(m[2])
    found = DimTally()
    for (uttid, _, _), c in zip(items, cols.tolist()):
        if c > 0:
            found.add(c, uttid)
    found.check(dims)  # before a single shard is written
    folders: list[str | None] = []
    for (uttid, _, _), n, c in zip(items, frames.tolist(), cols.tolist()):
        folder = None
        if n < 0:
            pass  # dropped while measuring
        elif dims is not None and c != dims:
            report.drop("other_dims", uttid, f"{c} feature dims; only {dims}-dim features are packed (dims)")
        elif groups is None:
            folder = ""
        else:
            group = groups.find(n)
            if group is None:
                report.drop("outside_groups", uttid, f"{n} frames")
            else:
                folder = group.folder
        folders.append(folder)
    order = [""] if groups is None else [g.folder for g in groups]
    uttids = [u for u, _, _ in items]
    planned = plan_shards(uttids, folders, frames, order, utts_per_shard=utts_per_shard, shuffle=shuffle, seed=seed)
    job = ArkJob(d_out, items, planned, frames, layout=layout, dtype=dtype, dims=dims)
    return Planned(planned, uttids, frames, order, job)


class ArkJob:
    """Writes planned shards from arks, in a worker (each ark kept open while it is read)."""

    def __init__(self, d_out: Path, items: Sequence[Item], shards: Sequence[PlannedShard], frames: np.ndarray, *,
                 layout: str, dtype: str, dims: int | None) -> None:
        self.d_out, self.items, self.shards, self.frames = d_out, items, shards, frames
        self.layout, self.dtype, self.dims = layout, dtype, dims
        self.arks: ArkReader | None = None

    def open(self) -> None:
        self.arks = ArkReader()

    def close(self) -> None:
        if self.arks is not None:
            self.arks.close()
            self.arks = None

    def write(self, shard: int, tick: Callable[[int], None]) -> Written:
        s = self.shards[shard]
        arks = self.arks
        assert arks is not None
        sink = sink_for(self.d_out, shard, layout=self.layout, dtype=self.dtype, dims=self.dims)
        try:
            for i, frames in zip(s.items.tolist(), self.frames[s.items].tolist()):
                uttid, rxfile, text = self.items[i]
                try:
                    feats = arks.load(rxfile)
                    if isinstance(feats, np.ndarray) and feats.ndim == 2 and feats.shape[0] != frames:
                        sink.drop("bad_features", uttid, f"{feats.shape[0]} frames, {frames} when the pack measured "
                                                         f"it: {rxfile} changed during the pack; pack again")
                    else:
                        sink.add(uttid, feats, text, folder=s.folder)
                except ArkError as e:
                    sink.drop("bad_features", uttid, str(e))
                tick(1)
            return written(sink, shard, s.folder)
        except BaseException:
            sink.abort()
            raise
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
