"""``pack-audio``: ``wav.scp`` [+ ``segments``] + ``text`` -> shards, computing fbank on the way (no ark).

The fused form of ``fbank`` followed by ``pack``: the same utterances in the same order meet the
same :class:`~wdsprep.pack.sink.GroupedSink`, so shards, index and report match what the two steps
give (the report names the audio reasons instead of ``missing_features``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from wdsprep.pack.groups import Groups
from wdsprep.pack.sink import (
    GroupedSink,
    PathOrPaths,
    SinkResult,
    as_list,
    check_dtype,
    check_fmt,
    prepare_output,
    run_and_finalize,
)
from wdsprep.prep.audio import AudioProblem, Utterance, read_utterances
from wdsprep.prep.fbank import (
    Fbank,
    FbankOptions,
    iter_features,
    one_torch_thread,
    resolve_backend,
)
from wdsprep.prep.kaldi import read_text
from wdsprep.report import Report


def pack_audio(
    wav_scp: str | os.PathLike,
    f_labels: PathOrPaths,
    d_out: str | os.PathLike,
    fmt: str = "data-%05d.tar",
    filter_group: Sequence[str] | None = None,
    *,
    segments: str | os.PathLike | None = None,
    num_mel_bins: int = 80,
    sample_rate: int = 16000,
    dither: float = 0.0,
    backend: str = "auto",
    channel: int = 0,
    utts_per_shard: int = 2000,
    layout: str = "cat",
    dtype: str = "float32",
    nj: int = 1,
    strict: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Report:
    """Compute fbank features and pack them with their transcripts into length-grouped shards.

    Audio arguments are those of :func:`wdsprep.compute_fbank`; ``f_labels``, ``d_out``, ``fmt``,
    ``filter_group`` and the packing options those of :func:`wdsprep.pack_data`.

    Returns:
        The report, also written to ``d_out/pack_report.json``: utterances not packed by reason
        (``bad_audio``, ``bad_segment``, ``too_short``, ``missing_recording``, ``missing_audio``,
        ``missing_label``, ``outside_groups``, ...).
    """
    check_fmt(fmt)
    check_dtype(dtype, layout)
    opts = FbankOptions(num_mel_bins, sample_rate, dither, backend, channel)
    opts = replace(opts, backend=resolve_backend(backend))  # fail early, in this process, with the reason
    groups = Groups(filter_group) if filter_group else None
    report = Report()
    utts = read_utterances(wav_scp, segments, report)
    labels = read_text(as_list(f_labels))
    d = prepare_output(d_out, overwrite)

    known = {u.uttid for u in utts} | {x["uttid"] for x in report.dropped.get("missing_recording", [])}
    where_audio = f"{segments} (segments)" if segments is not None else f"{wav_scp}"
    for uttid in labels.keys() - known:
        report.drop("missing_audio", uttid, f"in {labels[uttid].where}, not in {where_audio}")
    items = []
    for u in utts:
        label = labels.get(u.uttid)
        if label is None:
            report.drop("missing_label", u.uttid, f"in {u.where}, in no text file")
        else:
            items.append((u, label.value))

    work = partial(_pack_audio_chunk, d_out=d, groups=groups, utts_per_shard=utts_per_shard, layout=layout,
                   dtype=dtype, opts=opts)
    return run_and_finalize(work, items, d, nj=nj, desc="pack-audio", progress=progress, fmt=fmt, layout=layout,
                            dtype=dtype, groups=groups, report=report, strict=strict)


def _pack_audio_chunk(chunk: Sequence[tuple[Utterance, str]], worker: int, tick: Callable[[int], None], *,
                      d_out: Path, groups: Groups | None, utts_per_shard: int, layout: str, dtype: str,
                      opts: FbankOptions) -> SinkResult:
    fbank = Fbank(opts)
    sink = GroupedSink(d_out, groups, worker=worker, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype)
    try:
        texts = [text for _, text in chunk]
        with one_torch_thread():
            for (u, feats), text in zip(iter_features([u for u, _ in chunk], fbank), texts):
                if isinstance(feats, AudioProblem):
                    sink.drop(feats.reason, u.uttid, feats.detail)
                else:
                    sink.add(u.uttid, feats, text)
                tick(1)
        return sink.close()
    except BaseException:
        sink.abort()
        raise
