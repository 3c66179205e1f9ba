"""``pack``: Kaldi ``feats.scp`` + ``text`` -> length-grouped tar shards with an index and a report.

Two passes over the arks, so that every shard's utterances are chosen before any is written
(:mod:`wdsprep.pack.plan`):

1. headers: each matrix's header (a few bytes at its offset, read in ``feats.scp`` order) gives
   its frames and dims; so before a shard is written the pack knows every utterance's length
   group, fails on mixed dimensions, and drops what it cannot pack (unreadable headers, other
   dims, outside every group) without reading its features.  A pipe or a text matrix, which has
   no header to read, is read whole here and again when written.
2. shards: each length group's utterances in a seeded random order (``shuffle``, the default) or
   in input order, cut into shards; each worker writes whole shards, and they are named in plan
   order, so ``nj`` changes nothing in the output.  With ``shuffle``
   each utterance is read at its own offset (a seek per utterance); the cost is measured in
   ``docs/shuffle.md``.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wdsprep.pack.groups import Groups
from wdsprep.pack.plan import deal, plan_shards
from wdsprep.pack.sink import (
    DimTally,
    GroupedSink,
    PathOrPaths,
    SinkResult,
    as_list,
    check_dims,
    check_dtype,
    check_fmt,
    feature_problem,
    finish_pack,
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
        progress: tqdm bar; ``None`` shows it on a terminal only.

    Returns:
        The report, also written to ``d_out/pack_report.json``.
    """
    check_fmt(fmt)
    check_dims(dims)
    check_dtype(dtype, layout)
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be >= 1")
    groups = Groups(filter_group) if filter_group else None
    feats = read_feats_scp(as_list(f_scps))
    labels = read_text(as_list(f_labels))
    speakers = read_utt2spk(as_list(utt2spk)) if utt2spk is not None else None
    d = prepare_output(d_out, overwrite)

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
    options = dict(groups=groups, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype, dims=dims,
                   shuffle=shuffle, seed=seed, nj=nj, progress=progress)
    return finish_pack(lambda: pack_arks(items, d, report, desc="pack", **options), d, desc="pack", fmt=fmt,
                       layout=layout, dtype=dtype, groups=groups, report=report, strict=strict, dims=dims,
                       utt2spk=speakers)


def pack_arks(items: Sequence[Item], d_out: Path, report: Report, *, desc: str, groups: Groups | None,
              utts_per_shard: int, layout: str, dtype: str, dims: int | None, shuffle: bool, seed: int, nj: int,
              progress: bool | None) -> list[SinkResult]:
    """Both passes over ``items``: headers, the shard plan, then the shards (see the module's doc).

    What cannot be packed goes to ``report``; the workers' results are returned for ``finalize``.
    """
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
    planned = plan_shards([u for u, _, _ in items], folders, frames, order, utts_per_shard=utts_per_shard,
                          shuffle=shuffle, seed=seed)
    # A bundle of whole shards per worker; references to the items, not copies (10M is a lot of tuples).
    bundles = [[(i, planned[i].folder, [items[j] for j in planned[i].items.tolist()], frames[planned[i].items])
                for i in shard_ids] for shard_ids in deal([p.frames for p in planned], nj) if shard_ids]
    work = partial(_write_shards, d_out=d_out, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype, dims=dims)
    results = run_chunks(work, bundles, max(1, len(bundles)), desc=desc, progress=progress,
                         total=sum(len(p.items) for p in planned))
    return [in_plan_order(results)]


def in_plan_order(results: Sequence[SinkResult]) -> SinkResult:
    """The workers' results as one, each folder's shards in plan order (finalize names them in order)."""
    out = SinkResult()
    written: dict[str, list[tuple[int, object]]] = {}
    for r in results:
        out.report.merge(r.report)
        out.dims = r.dims if r.dims is not None else out.dims
        out.dims_found.merge(r.dims_found)
        for folder, infos in r.shards.items():
            written.setdefault(folder, []).extend(zip(r.planned[folder], infos))
    for folder, pairs in written.items():
        out.shards[folder] = [info for _, info in sorted(pairs, key=lambda x: x[0])]
    return out


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


def _write_shards(chunk: Sequence[list[tuple[int, str, list[Item], np.ndarray]]], worker: int,
                  tick: Callable[[int], None], *, d_out: Path, utts_per_shard: int, layout: str, dtype: str,
                  dims: int | None) -> SinkResult:
    """Write one bundle of planned shards: (plan index, folder, its items in order, their frames as
    measured) each; ``result.planned`` says which planned shard each written one is."""
    sink = GroupedSink(d_out, None, worker=worker, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype,
                       dims=dims)
    arks = ArkReader()
    try:
        for index, folder, utts, measured in (shard for bundle in chunk for shard in bundle):
            before = len(sink.result.shards[folder])
            for (uttid, rxfile, text), frames in zip(utts, measured.tolist()):
                try:
                    feats = arks.load(rxfile)
                    if isinstance(feats, np.ndarray) and feats.ndim == 2 and feats.shape[0] != frames:
                        sink.drop("bad_features", uttid, f"{feats.shape[0]} frames, {frames} when the pack measured "
                                                         f"it: {rxfile} changed during the pack; pack again")
                    else:
                        sink.add(uttid, feats, text, folder=folder)
                except ArkError as e:
                    sink.drop("bad_features", uttid, str(e))
                tick(1)
            sink.end_shard(folder)  # a planned shard ends here, however many of its utterances made it
            if len(sink.result.shards[folder]) > before:  # none, when every utterance of it failed
                sink.result.planned[folder].append(index)
        return sink.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        arks.close()
