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
   by ``nj`` workers and published as they are done (:mod:`wdsprep.pack.output`).  A worker reads
   each utterance's audio when it writes its shard (:class:`~wdsprep.prep.audio.WaveSource`: a
   segment of a PCM or FLAC file is read alone, so a long recording is not decoded once per
   segment), computes its fbank, and checks its frames against the plan.

Peak memory and disk stay flat in corpus size: a worker holds one utterance's audio and features
(and its bounded cache of decoded recordings), and the disk holds the shards.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from concurrent.futures import Executor
from contextlib import ExitStack
from functools import partial
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from wdsprep.format.audio import MAX_CHANNELS
from wdsprep.format.commit import read_plan
from wdsprep.options import documented
from wdsprep.pack.driver import Headers, Item, PackSource, kaldi_labels, run_pack
from wdsprep.pack.fields import field_files
from wdsprep.pack.options import AudioOptions, Engine, OutputOptions, PackInputs, PackOptions, Part, PathOrPaths, Spread
from wdsprep.pack.sink import ShardSink
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
from wdsprep.prep.fbank import Fbank, one_torch_thread
from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report
from wdsprep.units import fbank_frames, frame_samples


@runtime_checkable
class AudioInput(Protocol):
    """Utterances named other than by a ``wav.scp``: a :class:`~wdsprep.pack.sources.Manifest` (``--from``)."""

    def audio_source(self, audio: AudioOptions) -> PackSource:
        """The pack source of its utterances (its labels with it)."""


@documented(FbankOptions, AudioInputs, AudioOptions, PackOptions, PackInputs, JobOptions, OutputOptions, Spread, Engine,
            skip=("layout", "dtype"))
def pack_audio(
    wav_scp: str | os.PathLike | AudioInput,
    f_labels: PathOrPaths | None,
    d_out: str | os.PathLike,
    fmt: str = PackOptions.fmt,
    filter_group: Sequence[str] | None = PackOptions.filter_group,
    *,
    segments: str | os.PathLike | None = AudioInputs.segments,
    num_mel_bins: int = FbankOptions.num_mel_bins,
    sample_rate: int = FbankOptions.sample_rate,
    dither: float = FbankOptions.dither,
    backend: str = FbankOptions.backend,
    channel: int | None = FbankOptions.channel,
    utt2spk: PathOrPaths | None = PackInputs.utt2spk,
    utt2lang: PathOrPaths | None = PackInputs.utt2lang,
    fields: Mapping[str, PathOrPaths] | None = PackInputs.fields,
    index_fields: Sequence[str] = PackOptions.index_fields,
    utts_per_shard: int = PackOptions.utts_per_shard,
    layout: str | None = None,
    dtype: str | None = None,
    shuffle: bool = PackOptions.shuffle,
    seed: int = PackOptions.seed,
    nj: int = JobOptions.nj,
    strict: bool = JobOptions.strict,
    max_lost: float = OutputOptions.max_lost,
    overwrite: bool = OutputOptions.overwrite,
    resume: bool = OutputOptions.resume,
    plan_only: bool = Spread.plan_only,
    part: Part | str | tuple[int, int] | None = Spread.part,
    executor: Executor | None = Engine.executor,
    dask: str | None = Engine.dask,
    store: str = AudioOptions.store,
    bitrate: int | None = AudioOptions.bitrate,
    progress: bool | None = JobOptions.progress,
) -> Report:
    """Compute fbank features and pack them with their transcripts into length-grouped shards; or,
    with ``store`` ``"flac"``, ``"wav"`` or ``"opus"``, pack the audio itself (16-bit, at
    ``sample_rate``) for the loader to compute the features while training (docs/audio.md); the
    index records each utterance's decoded sample count, so the plan stays exact.

    ``wav_scp`` is a Kaldi ``wav.scp`` (with ``f_labels``, and ``segments`` and ``utt2spk`` if any),
    or a :class:`~wdsprep.Manifest` of another project's format (``--from KIND PATH``: Lhotse, NeMo,
    Hugging Face, WeNet; docs/import.md), which names the transcripts, speakers and languages itself
    (``f_labels``, ``segments`` and ``utt2spk`` None).  ``f_labels`` and ``d_out`` are those of
    :func:`wdsprep.pack_data`.

    The shards are those of ``fbank`` + ``pack``, whatever ``nj``, and are published one by one as
    they are written (``make_loader(..., growing=True)`` trains on them meanwhile); no ark of the
    corpus is written.  With ``dither`` > 0 the features are random, so a resumed pack is not
    byte-identical to an uninterrupted one.  Audio shards (``store``) hold the audio in place of the
    features and the shards are grouped and planned by the same frames; their index records the
    fbank options given here (``backend`` ``"auto"``: the loader's ``numpy`` backend), which the
    loader computes the features with.  ``layout`` and ``dtype`` (default: ``pack_data``'s) are
    the features' and are refused with an audio ``store``.

    Returns:
        The report, also written to ``d_out/pack_report.json``: utterances not packed by reason
        (``bad_audio``, ``bad_segment``, ``too_short``, ``missing_recording``, ``missing_audio``,
        ``missing_label``, ``outside_groups``, ...).
    """
    if resume and channel is None:
        channel = _recorded_channel(d_out)
    audio = AudioOptions(FbankOptions(num_mel_bins, sample_rate, dither, backend, channel), store, bitrate)
    if audio.stores_audio:
        clash = [f"{name} {value!r} (--{name})" for name, value in (("layout", layout), ("dtype", dtype))
                 if value is not None]
        if clash:
            raise ValueError(f"store {store!r} (--store) keeps the audio itself: {' and '.join(clash)} "
                             f"{'is' if len(clash) == 1 else 'are'} for features; give one or the other")
        layout, dtype = store, "float32"
    options = PackOptions(fmt, filter_group, utts_per_shard, layout or PackOptions.layout, dtype or PackOptions.dtype,
                          None, shuffle, seed, audio, index_fields=index_fields)
    job, output, spread = JobOptions(nj, strict, progress), OutputOptions(max_lost, overwrite, resume), \
        Spread(plan_only, part)
    if isinstance(wav_scp, AudioInput):
        kaldi = [k for k, v in (("f_labels", f_labels), ("segments", segments), ("utt2spk", utt2spk)) if v is not None]
        if kaldi:
            raise ValueError(f"{kaldi[0]}: the manifest names its utterances' transcripts, segments and speakers; give "
                             f"it alone")
        source: PackSource = wav_scp.audio_source(audio)
        assert source.labels is not None
        labels = source.labels
    else:
        if f_labels is None:
            raise ValueError("a wav.scp needs its transcripts: give f_labels (--text)")
        source, labels = AudioSource(wav_scp, segments, audio), kaldi_labels(f_labels, utt2spk)
    return run_pack(source, labels, d_out, options, job, output, fields=field_files(utt2lang, fields), spread=spread,
                    engine=Engine(dask, executor))


def _recorded_channel(d_out: str | os.PathLike) -> int | None:
    """The channel a pack made before the mean of the channels was the default (``channel`` 0 then,
    recorded as such) goes on with when resumed without ``--channel``: it finishes as it began."""
    plan = read_plan(d_out) if os.path.isdir(d_out) else None
    recorded = None if plan is None else plan.options.get("channel")
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None


class AudioSource(PackSource):
    """Utterances from a Kaldi ``wav.scp`` (and ``segments``); the headers pass reads each
    recording's header."""

    command = "pack-audio"

    def __init__(self, wav_scp: str | os.PathLike, segments: str | os.PathLike | None, audio: AudioOptions) -> None:
        self.audio = audio
        self.report = Report()
        self.utts = read_utterances(wav_scp, segments, self.report)
        unknown_recording = self.report.dropped.get("missing_recording", [])
        self.known = {u.uttid for u in self.utts} | {x["uttid"] for x in unknown_recording}
        self.missing = ("missing_audio", f"not in {segments} (segments)" if segments is not None else
                        f"not in {wav_scp}")
        self.files = {"wav.scp": [wav_scp], "segments": [segments] if segments else []}
        self.data = ("audio", [u.rxfile for u in self.utts if not u.rxfile.rstrip().endswith("|")])

    def entries(self) -> list[tuple[str, str, Any]]:
        return [(u.uttid, u.where, u) for u in self.utts]

    def headers(self, items: list[Item], report: Report, *, nj: int, progress: bool | None) -> Headers:
        """Each utterance's frames from its recording's header (see the module's doc)."""
        fbank = self.audio.resolved
        recordings = list(dict.fromkeys(u.rxfile for _, u, _ in items))
        probed = run_chunks(partial(_probe_chunk, self.probe), recordings, nj, desc=f"{self.command}: headers",
                            progress=progress)
        headers = dict(zip(recordings, (r for chunk in probed for r in chunk)))
        window, _ = frame_samples(fbank.sample_rate)
        frames = np.full(len(items), -1, np.int64)
        unpackable: dict[int, tuple[str, str]] = {}
        for k, (_, u, _) in enumerate(items):
            n = planned_samples(u, headers[u.rxfile], sample_rate=fbank.sample_rate, channel=fbank.channel,
                                min_samples=window)
            if isinstance(n, AudioProblem):
                unpackable[k] = (n.reason, n.detail)
            else:
                frames[k] = fbank_frames(n, fbank.sample_rate)
        recs = {rx: h for rx, h in headers.items() if isinstance(h, Recording)}
        report.inputs = input_counts(list(recs.values()), fbank.sample_rate, fbank.channel,
                                     stores_audio=self.audio.stores_audio)
        return Headers(frames, unpackable, self.job(items, recs, fbank))

    # A recording's header, given its ``wav.scp`` value (a picklable callable: it runs in workers).
    probe: Callable[[str], Recording] = staticmethod(probe_recording)

    def job(self, items: list[Item], recordings: dict[str, Recording], fbank: FbankOptions) -> AudioJob:
        """The job that writes ``items`` (their recordings' headers as probed)."""
        return AudioJob(items, recordings, fbank, store_audio=self.audio.stores_audio)


def input_counts(recordings: Sequence[Recording], sample_rate: int, channel: int | None, *,
                 stores_audio: bool) -> dict[str, Any]:
    """What the report says of the recordings read: how many have several channels (by count) and
    what was done with them, and how many were resampled to ``sample_rate`` (by their rate)."""
    several = Counter(str(r.channels) for r in recordings if r.channels > 1)
    rates = Counter(str(r.rate) for r in sorted(recordings, key=lambda r: r.rate) if r.rate != sample_rate)
    if not several and not rates:
        return {}
    mixed = (f"channel {channel}" if channel is not None else "every channel kept, the loader takes their mean"
             if stores_audio else "features from the mean of the channels")
    return {"recordings": len(recordings), "multichannel": dict(several), "channels": mixed,
            "resampled": dict(rates), "sample_rate": sample_rate}


def _probe_chunk(probe: Callable[[str], Recording], chunk: Sequence[str], worker: int,
                 tick: Callable[[int], None]) -> list[Recording | AudioReadError]:
    out: list[Recording | AudioReadError] = []
    for rxfile in chunk:
        try:
            out.append(probe(rxfile))
        except AudioReadError as e:
            out.append(e)
        tick(1)
    return out


class AudioJob:
    """Writes utterances from their audio, in a worker: each utterance's waveform, and its fbank (or,
    ``store_audio``, the audio itself), checked against the planned frames."""

    def __init__(self, items: Sequence[Item], recordings: dict[str, Recording], fbank: FbankOptions, *,
                 store_audio: bool = False) -> None:
        self.items, self.recordings, self.opts, self.store_audio = items, recordings, fbank, store_audio
        self._stack: ExitStack | None = None
        self.fbank: Fbank | None = None
        self.source: WaveSource | None = None

    def narrowed(self, items: Sequence[int]) -> AudioJob:
        """The job of ``items`` alone, with their recordings' headers only."""
        job = copy.copy(self)
        job.items = [self.items[i] for i in items]
        job.recordings = {u.rxfile: self.recordings[u.rxfile] for _, u, _ in job.items if u.rxfile in self.recordings}
        return job

    def open(self) -> None:
        self.fbank = Fbank(self.opts)  # imports the backend (and torch) before one_torch_thread
        self._stack = ExitStack()
        self._stack.enter_context(one_torch_thread())
        self.source = WaveSource(sample_rate=self.opts.sample_rate, channel=self.opts.channel,
                                 min_samples=self.fbank.window_samples, mix=not self.store_audio)

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        self.fbank = self.source = None

    def waveform(self, u: Utterance) -> np.ndarray | AudioProblem:
        """An utterance's samples at the target rate, or why there are none."""
        assert self.source is not None
        return self.source.waveform(u, self.recordings[u.rxfile])

    def add(self, sink: ShardSink, item: int, frames: int) -> None:
        uttid, u, text = self.items[item]
        assert self.fbank is not None
        wave = self.waveform(u)
        if isinstance(wave, AudioProblem):
            sink.drop(wave.reason, uttid, wave.detail)
        elif self.store_audio:  # the audio itself, 16-bit, every channel: the loader makes the features
            pcm = np.clip(np.rint(wave), -32768, 32767).astype(np.int16)
            if pcm.ndim == 2 and pcm.shape[1] > MAX_CHANNELS:
                sink.drop("bad_audio", uttid, f"recording {u.recid!r}: {pcm.shape[1]} channels, more than an audio "
                                              f"shard holds ({MAX_CHANNELS}); pick one with --channel N")
            elif fbank_frames(len(pcm), self.opts.sample_rate) != frames:
                sink.drop("bad_audio", uttid, f"recording {u.recid!r}: {len(pcm)} samples, its header promised "
                                              f"{frames} frames' worth ({u.rxfile} changed during the pack: pack "
                                              f"again)")
            else:
                sink.add_audio(uttid, pcm, text)
        else:
            feats = self.fbank(wave)
            if feats.shape[0] != frames:
                sink.drop("bad_audio", uttid, f"recording {u.recid!r}: {feats.shape[0]} frames, its header promised "
                                              f"{frames} ({u.rxfile} changed during the pack, or its header is "
                                              f"wrong: re-encode it)")
            else:
                sink.add(uttid, feats, text)
