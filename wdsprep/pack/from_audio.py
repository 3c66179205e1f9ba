"""``pack-audio``: ``wav.scp`` [+ ``segments``] + ``text`` -> shards, computing fbank on the way.

The fused form of ``fbank`` followed by ``pack``: shards and index match what the two steps give
(the report names the audio reasons instead of ``missing_features``).

- ``shuffle`` (the default): audio is read in input order (each recording once, however many
  segments it has) and the features go to a temporary ark under ``OUT/.features``; then ``pack``'s
  two passes (:func:`wdsprep.pack.from_feats.pack_arks`) shuffle them into shards, and the ark is
  removed.  A global shuffle needs the features of the whole corpus before the first shard is
  complete: reading audio in random order would decode a long recording once per segment.  So
  this needs free space for the features (float32) while it runs.
- ``shuffle=False``: no ark at all; features stream into shards in input order.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from wdsprep.files import make_dir
from wdsprep.pack.from_feats import Item, pack_arks
from wdsprep.pack.groups import Groups
from wdsprep.pack.sink import (
    SPILL_DIR,
    GroupedSink,
    PathOrPaths,
    SinkResult,
    as_list,
    check_dtype,
    check_fmt,
    finish_pack,
    prepare_output,
    run_and_finalize,
)
from wdsprep.prep.audio import AudioProblem, Utterance, read_utterances
from wdsprep.prep.fbank import (
    Fbank,
    FbankOptions,
    fbank_chunk,
    iter_features,
    one_torch_thread,
    resolve_backend,
)
from wdsprep.prep.kaldi import read_text, read_utt2spk
from wdsprep.prep.parallel import run_chunks
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
    shuffle: bool = True,
    seed: int = 0,
    utt2spk: PathOrPaths | None = None,
    nj: int = 1,
    strict: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> Report:
    """Compute fbank features and pack them with their transcripts into length-grouped shards.

    Audio arguments are those of :func:`wdsprep.compute_fbank`; ``f_labels``, ``d_out``, ``fmt``,
    ``filter_group`` and the packing options those of :func:`wdsprep.pack_data`.  With ``shuffle``
    (the default) the features pass through a temporary ark under ``d_out/.features``, removed at
    the end: the shards are then those of ``fbank`` + ``pack``, whatever ``nj``.  Without it no ark
    is written and utterances go to shards in input order.

    Returns:
        The report, also written to ``d_out/pack_report.json``: utterances not packed by reason
        (``bad_audio``, ``bad_segment``, ``too_short``, ``missing_recording``, ``missing_audio``,
        ``missing_label``, ``outside_groups``, ...).
    """
    check_fmt(fmt)
    check_dtype(dtype, layout)
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be >= 1")
    opts = FbankOptions(num_mel_bins, sample_rate, dither, backend, channel)
    opts = replace(opts, backend=resolve_backend(backend))  # fail early, in this process, with the reason
    groups = Groups(filter_group) if filter_group else None
    report = Report()
    utts = read_utterances(wav_scp, segments, report)
    labels = read_text(as_list(f_labels))
    speakers = read_utt2spk(as_list(utt2spk)) if utt2spk is not None else None
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

    if shuffle:
        options = dict(groups=groups, utts_per_shard=utts_per_shard, layout=layout, dtype=dtype, dims=None,
                       shuffle=True, seed=seed)
        return finish_pack(lambda: _through_ark(items, d, report, opts=opts, nj=nj, progress=progress, **options),
                           d, desc="pack-audio", fmt=fmt, layout=layout, dtype=dtype, groups=groups, report=report,
                           strict=strict, utt2spk=speakers)
    work = partial(_pack_audio_chunk, d_out=d, groups=groups, utts_per_shard=utts_per_shard, layout=layout,
                   dtype=dtype, opts=opts)
    return run_and_finalize(work, items, d, nj=nj, desc="pack-audio", progress=progress, fmt=fmt, layout=layout,
                            dtype=dtype, groups=groups, report=report, strict=strict, utt2spk=speakers)


def _through_ark(items: Sequence[tuple[Utterance, str]], d_out: Path, report: Report, *, opts: FbankOptions, nj: int,
                 progress: bool | None, **pack_options) -> list[SinkResult]:
    """Features into a temporary ark (audio in input order), then :func:`pack_arks`; the ark goes either way."""
    spill = d_out / SPILL_DIR
    make_dir(spill)
    try:
        results = run_chunks(partial(fbank_chunk, d_out=spill, opts=opts), [u for u, _ in items], nj,
                             desc="pack-audio: fbank", progress=progress)
        texts = {u.uttid: text for u, text in items}
        arks: list[Item] = []
        for r in results:
            report.merge(r.report)
            arks += [(uttid, f"{r.tmp_path}:{offset}", texts[uttid]) for uttid, offset, _ in r.entries]
        return pack_arks(arks, d_out, report, desc="pack-audio", nj=nj, progress=progress, **pack_options)
    finally:
        shutil.rmtree(spill, ignore_errors=True)


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
