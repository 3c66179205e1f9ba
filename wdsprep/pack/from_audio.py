"""``pack-audio``: ``wav.scp`` [+ ``segments``] + ``text`` -> shards, computing fbank on the way.

The fused form of ``fbank`` followed by ``pack``: shards and index match what the two steps give
(the report names the audio reasons instead of ``missing_features``).  No ark is written: each
shard's features are computed when that shard is written.

1. headers: each recording's header (soundfile's ``info``; a pipe is run and decoded) gives its
   samples and rate, so every utterance's frames follow before any audio is decoded: the segment's
   samples after resampling, cut as Kaldi's ``extract-segments`` cuts, then ``1 + (n - window) //
   shift`` frames (snip_edges).  Utterances that cannot be packed (unreadable audio, bad segments,
   too short, outside every group) are dropped here.
2. shards: the plan of ``pack`` (:func:`wdsprep.pack.plan.plan_shards`), written shard by shard
   by ``nj`` workers and published as they are done (:mod:`wdsprep.pack.publish`).  A worker reads
   each utterance's audio when it writes its shard (:class:`~wdsprep.prep.audio.WaveSource`: a
   segment of a PCM or FLAC file is read alone, so a long recording is not decoded once per
   segment), computes its fbank, and checks its frames against the plan.

Peak memory and disk stay flat in corpus size: a worker holds one utterance's audio and features
(and its bounded cache of decoded recordings), and the disk holds the shards.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from wdsprep.format.index import AudioIndex
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
from wdsprep.pack.sink import PathOrPaths, as_list, check_dtype, check_fmt, prepare_output
from wdsprep.prep.audio import (
    AudioProblem,
    AudioReadError,
    Recording,
    Utterance,
    WaveSource,
    planned_samples,
    probe_recording,
    read_utterances,
)
from wdsprep.prep.fbank import Fbank, FbankOptions, one_torch_thread, resolve_backend
from wdsprep.prep.kaldi import read_text, read_utt2spk
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report
from wdsprep.units import fbank_frames, frame_samples

# What pack-audio stores: fbank features, or the audio itself (its features made while training).
STORES = ("features", "flac", "wav")


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
    resume: bool = False,
    store: str = "features",
    progress: bool | None = None,
) -> Report:
    """Compute fbank features and pack them with their transcripts into length-grouped shards; or,
    with ``store`` ``"flac"`` or ``"wav"``, pack the audio itself (16-bit, at ``sample_rate``) for
    the loader to compute the features while training (docs/audio.md).

    Audio arguments are those of :func:`wdsprep.compute_fbank`; ``f_labels``, ``d_out``, ``fmt``,
    ``filter_group`` and the packing options (``resume`` too) those of :func:`wdsprep.pack_data`.
    The shards are those of ``fbank`` + ``pack``, whatever ``nj``, and are published one by one as
    they are written (``make_loader(..., growing=True)`` trains on them meanwhile); no ark of the
    corpus is written.  With ``dither`` > 0 the features are random, so a resumed pack is not
    byte-identical to an uninterrupted one.  Audio shards (``store``) hold the audio in place of the
    features and the shards are grouped and planned by the same frames; their index records the
    fbank options given here (``backend`` ``"auto"``: the loader's ``numpy`` backend), which the
    loader computes the features with.

    Returns:
        The report, also written to ``d_out/pack_report.json``: utterances not packed by reason
        (``bad_audio``, ``bad_segment``, ``too_short``, ``missing_recording``, ``missing_audio``,
        ``missing_label``, ``outside_groups``, ...).
    """
    check_fmt(fmt)
    if store not in STORES:
        raise ValueError(f"store must be one of {', '.join(STORES)}, got {store!r}")
    audio = None
    if store == "features":
        check_dtype(dtype, layout)
    else:
        # What the loader computes features with: the options given, the backend a concrete one.
        audio = AudioIndex(store, sample_rate, num_mel_bins, dither, "numpy" if backend == "auto" else backend)
        layout, dtype = store, "float32"
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be >= 1")
    opts = FbankOptions(num_mel_bins, sample_rate, dither, backend, channel)
    opts = replace(opts, backend=resolve_backend(backend))  # fail early, in this process, with the reason
    groups = Groups(filter_group) if filter_group else None
    texts = as_list(f_labels)
    spk_files = as_list(utt2spk) if utt2spk is not None else []
    report = Report()
    utts = read_utterances(wav_scp, segments, report)
    labels = read_text(texts)
    speakers = read_utt2spk(spk_files) if utt2spk is not None else None
    out = prepare_output(d_out, overwrite, resume)
    d, prior = out.d, out.prior
    try:
        options = {"fmt": fmt, "filter_group": None if groups is None else [str(g) for g in groups],
                   "utts_per_shard": utts_per_shard, "layout": layout, "dtype": dtype, "shuffle": shuffle, "seed": seed,
                   "num_mel_bins": num_mel_bins, "sample_rate": sample_rate, "dither": dither, "backend": opts.backend,
                   "channel": channel, **({"store": store} if audio is not None else {})}
        inputs = {"wav.scp": file_digests([wav_scp]), "segments": file_digests([segments] if segments else []),
                  "text": file_digests(texts), "utt2spk": file_digests(spk_files),
                  "audio": stat_digest([u.rxfile for u in utts if not u.rxfile.rstrip().endswith("|")])}
        if prior is not None:
            check_same(d, prior, "pack-audio", inputs, options)
            done = resume_complete(d, prior, "pack-audio", inputs, options)
            if done is not None:
                return done

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

        def plan(report: Report) -> Planned:
            return plan_audio(items, d, report, opts=opts, groups=groups, utts_per_shard=utts_per_shard, layout=layout,
                              dtype=dtype, shuffle=shuffle, seed=seed, nj=nj, progress=progress,
                              store_audio=audio is not None)

        return pack_planned(d, plan, report, command="pack-audio", inputs=inputs, options=options, prior=prior, fmt=fmt,
                            layout=layout, dtype=dtype, nj=nj, progress=progress, strict=strict, utt2spk=speakers,
                            audio=audio)
    finally:
        out.release()


def plan_audio(items: Sequence[tuple[Utterance, str]], d_out: Path, report: Report, *, opts: FbankOptions,
               groups: Groups | None, utts_per_shard: int, layout: str, dtype: str, shuffle: bool, seed: int,
               nj: int, progress: bool | None, store_audio: bool = False) -> Planned:
    """The headers pass and the shard plan (see the module's doc); what cannot be packed goes to ``report``."""
    recordings = list(dict.fromkeys(u.rxfile for u, _ in items))
    probed = run_chunks(_probe_chunk, recordings, nj, desc="pack-audio: headers", progress=progress)
    headers = dict(zip(recordings, (r for chunk in probed for r in chunk)))
    window, _ = frame_samples(opts.sample_rate)
    frames = np.full(len(items), -1, np.int64)
    folders: list[str | None] = []
    for k, (u, _) in enumerate(items):
        n = planned_samples(u, headers[u.rxfile], sample_rate=opts.sample_rate, channel=opts.channel,
                            min_samples=window)
        folder = None
        if isinstance(n, AudioProblem):
            report.drop(n.reason, u.uttid, n.detail)
        else:
            frames[k] = fbank_frames(n, opts.sample_rate)
            group = None if groups is None else groups.find(int(frames[k]))
            if groups is None:
                folder = ""
            elif group is None:
                report.drop("outside_groups", u.uttid, f"{frames[k]} frames")
            else:
                folder = group.folder
        folders.append(folder)
    order = [""] if groups is None else [g.folder for g in groups]
    uttids = [u.uttid for u, _ in items]
    planned = plan_shards(uttids, folders, frames, order, utts_per_shard=utts_per_shard, shuffle=shuffle, seed=seed)
    recs = {rx: h for rx, h in headers.items() if isinstance(h, Recording)}
    job = AudioJob(d_out, items, planned, frames, recs, opts=opts, layout=layout, dtype=dtype, store_audio=store_audio)
    return Planned(planned, uttids, frames, order, job)


def _probe_chunk(chunk: Sequence[str], worker: int, tick: Callable[[int], None]) -> list[Recording | AudioReadError]:
    out: list[Recording | AudioReadError] = []
    for rxfile in chunk:
        try:
            out.append(probe_recording(rxfile))
        except AudioReadError as e:
            out.append(e)
        tick(1)
    return out


class AudioJob:
    """Writes planned shards from audio, in a worker: each utterance's waveform, its fbank, checked
    against the planned frames."""

    def __init__(self, d_out: Path, items: Sequence[tuple[Utterance, str]], shards: Sequence[PlannedShard],
                 frames: np.ndarray, recordings: dict[str, Recording], *, opts: FbankOptions, layout: str,
                 dtype: str, store_audio: bool = False) -> None:
        self.d_out, self.items, self.shards, self.frames, self.recordings = d_out, items, shards, frames, recordings
        self.opts, self.layout, self.dtype, self.store_audio = opts, layout, dtype, store_audio
        self._stack: ExitStack | None = None
        self.fbank: Fbank | None = None
        self.source: WaveSource | None = None

    def open(self) -> None:
        self.fbank = Fbank(self.opts)  # imports the backend (and torch) before one_torch_thread
        self._stack = ExitStack()
        self._stack.enter_context(one_torch_thread())
        self.source = WaveSource(sample_rate=self.opts.sample_rate, channel=self.opts.channel,
                                 min_samples=self.fbank.window_samples)

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        self.fbank = self.source = None

    def write(self, shard: int, tick: Callable[[int], None]) -> Written:
        s = self.shards[shard]
        fbank, source = self.fbank, self.source
        assert fbank is not None and source is not None
        sink = sink_for(self.d_out, shard, layout=self.layout, dtype=self.dtype, dims=None,
                        sample_rate=self.opts.sample_rate if self.store_audio else None)
        try:
            for i, planned in zip(s.items.tolist(), self.frames[s.items].tolist()):
                u, text = self.items[i]
                wave = source.waveform(u, self.recordings[u.rxfile])
                if isinstance(wave, AudioProblem):
                    sink.drop(wave.reason, u.uttid, wave.detail)
                elif self.store_audio:  # the audio itself, 16-bit: the loader makes the features
                    pcm = np.clip(np.rint(wave), -32768, 32767).astype(np.int16)
                    if fbank_frames(len(pcm), self.opts.sample_rate) != planned:
                        sink.drop("bad_audio", u.uttid, f"recording {u.recid!r}: {len(pcm)} samples, its header "
                                                        f"promised {planned} frames' worth ({u.rxfile} changed "
                                                        f"during the pack: pack again)")
                    else:
                        sink.add_audio(u.uttid, pcm, text, folder=s.folder)
                else:
                    feats = fbank(wave)
                    if feats.shape[0] != planned:
                        sink.drop("bad_audio", u.uttid, f"recording {u.recid!r}: {feats.shape[0]} frames, its header "
                                                        f"promised {planned} ({u.rxfile} changed during the pack, or "
                                                        f"its header is wrong: re-encode it)")
                    else:
                        sink.add(u.uttid, feats, text, folder=s.folder)
                tick(1)
            return written(sink, shard, s.folder)
        except BaseException:
            sink.abort()
            raise
