"""``pack``: Kaldi ``feats.scp`` + ``text`` -> length-grouped tar shards with an index and a report."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from wdsprep.pack.groups import Groups
from wdsprep.pack.sink import (
    GroupedSink,
    PathOrPaths,
    SinkResult,
    as_list,
    check_dims,
    check_dtype,
    check_fmt,
    prepare_output,
    run_and_finalize,
)
from wdsprep.prep.ark import ArkError, ArkReader
from wdsprep.prep.kaldi import read_feats_scp, read_text
from wdsprep.report import Report


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
        nj: worker processes.
        strict: raise :class:`StrictError` (after writing the report) if any utterance was not
            packed or has an empty transcript.
        overwrite: replace an earlier pack's output in ``d_out`` instead of refusing.
        progress: tqdm bar; ``None`` shows it on a terminal only.

    Returns:
        The report, also written to ``d_out/pack_report.json``.
    """
    check_fmt(fmt)
    check_dims(dims)
    check_dtype(dtype, layout)
    groups = Groups(filter_group) if filter_group else None
    feats = read_feats_scp(as_list(f_scps))
    labels = read_text(as_list(f_labels))
    d = prepare_output(d_out, overwrite)

    report = Report()
    for uttid in labels.keys() - feats.keys():
        report.drop("missing_features", uttid, f"in {labels[uttid].where}, in no feats.scp")
    items = []
    for uttid, e in feats.items():
        label = labels.get(uttid)
        if label is None:
            report.drop("missing_label", uttid, f"in {e.where}, in no text file")
        else:
            items.append((uttid, e.value, label.value))

    work = partial(_pack_chunk, d_out=d, groups=groups, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype,
                   dims=dims)
    return run_and_finalize(work, items, d, nj=nj, desc="pack", progress=progress, fmt=fmt, layout=layout,
                            dtype=dtype, groups=groups, report=report, strict=strict, dims=dims)


def _pack_chunk(chunk: Sequence[tuple[str, str, str]], worker: int, tick: Callable[[int], None], *,
                d_out: Path, groups: Groups | None, utts_per_shard: int, layout: str, dtype: str,
                dims: int | None) -> SinkResult:
    sink = GroupedSink(d_out, groups, worker=worker, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype,
                       dims=dims)
    arks = ArkReader()  # keeps each ark open, so a chunk reads its arks sequentially
    try:
        for uttid, rxfile, text in chunk:
            try:
                # Once the pack is bound to fail on mixed dimensions, the headers alone tell the rest.
                header = arks.header(rxfile) if sink.counting_only else None
                if header is not None and header.cols is not None:
                    sink.count(uttid, header.cols)
                else:
                    sink.add(uttid, arks.load(rxfile), text)
            except ArkError as e:  # this utterance's matrix is unreadable; the message says where and why
                sink.drop("bad_features", uttid, str(e))
            tick(1)
        return sink.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        arks.close()
