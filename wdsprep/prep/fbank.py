"""``fbank``: Kaldi-compatible log-mel filterbank features from ``wav.scp`` [+ ``segments``].

Two backends compute the same features (``compute-fbank-feats`` defaults: 25 ms povey windows
every 10 ms, snip_edges, pre-emphasis 0.97, DC removal, power spectrum, mel bins from 20 Hz to
Nyquist, log floored at float epsilon, energy_floor 0):

* ``torchaudio``: ``torchaudio.compliance.kaldi.fbank``, imported only when this backend is used;
  on machines where ``import torchaudio`` fails (e.g. a CUDA-linked wheel on CPU) it is
  unavailable, with a message saying so.  It computes in float64 and rounds to float32.
* ``kaldi-native-fbank``: the C++ port of Kaldi's code, in float32.

They agree to 0.015 max abs; the largest differences are float32 rounding in the lowest mel bins
(docs/fbank.md).

``auto`` takes torchaudio when it imports (faster), else kaldi-native-fbank. Dither defaults to 0
(Kaldi's default is 1.0) so that the same input always gives the same features.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from wdsprep.files import TMP_SUFFIX, make_dir, naming, temp_path, write_text
from wdsprep.prep.audio import AudioProblem, Utterance, iter_waveforms, read_utterances
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report, StrictError
from wdsprep.units import FRAME_SHIFT_MS, hours

BACKENDS = ("torchaudio", "kaldi-native-fbank")
FRAME_LENGTH_MS = 25.0
REPORT_NAME = "fbank_report.json"


class BackendUnavailable(RuntimeError):
    """The requested fbank backend cannot be imported here; the message says what to do."""


def _torchaudio_kaldi():
    try:
        import torchaudio.compliance.kaldi as ta_kaldi
    except Exception as e:  # OSError for a CUDA-linked wheel, ImportError when missing, ...
        raise BackendUnavailable(
            f"fbank backend 'torchaudio' is unavailable: import torchaudio failed ({type(e).__name__}: {e}). "
            f"Use --backend kaldi-native-fbank (same features), or see docs/fbank.md for making torchaudio's "
            f"pure-Python part importable on a CPU-only machine"
        ) from e
    return ta_kaldi


def _knf():
    try:
        import kaldi_native_fbank as knf
    except Exception as e:
        raise BackendUnavailable(
            f"fbank backend 'kaldi-native-fbank' is unavailable: {type(e).__name__}: {e}; "
            f"pip install kaldi-native-fbank"
        ) from e
    return knf


def resolve_backend(backend: str = "auto") -> str:
    """The backend name ``auto`` stands for here, or a check that the named one imports."""
    if backend == "auto":
        try:
            _torchaudio_kaldi()
            return "torchaudio"
        except BackendUnavailable as e:
            try:
                _knf()
            except BackendUnavailable as e2:
                raise BackendUnavailable(f"no fbank backend is available: {e}; {e2}") from None
            return "kaldi-native-fbank"
    if backend == "torchaudio":
        _torchaudio_kaldi()
    elif backend == "kaldi-native-fbank":
        _knf()
    else:
        raise ValueError(f"unknown fbank backend {backend!r}; choose auto or one of {BACKENDS}")
    return backend


@dataclass(frozen=True)
class FbankOptions:
    """What the features depend on (besides the audio)."""

    num_mel_bins: int = 80
    sample_rate: int = 16000
    dither: float = 0.0
    backend: str = "auto"
    channel: int = 0

    def __post_init__(self) -> None:
        if self.num_mel_bins < 1:
            raise ValueError(f"num_mel_bins must be >= 1, got {self.num_mel_bins}")
        if self.sample_rate < 1000:
            raise ValueError(f"sample_rate {self.sample_rate} Hz is not a speech sample rate")
        if self.dither < 0:
            raise ValueError(f"dither must be >= 0, got {self.dither}")
        if self.channel < 0:
            raise ValueError(f"channel must be >= 0, got {self.channel}")


def window_samples(opts: FbankOptions) -> int:
    """Samples in one analysis window (25 ms)."""
    return int(opts.sample_rate * FRAME_LENGTH_MS / 1000)


def frames_of(num_samples: int, opts: FbankOptions) -> int:
    """Frames Kaldi's fbank gives for ``num_samples`` (snip_edges): ``1 + (n - window) // shift``, 0
    for fewer samples than a window.  What ``pack-audio`` plans with, before any audio is decoded."""
    window = window_samples(opts)
    shift = int(opts.sample_rate * FRAME_SHIFT_MS / 1000)
    return 0 if num_samples < window else 1 + (num_samples - window) // shift


class Fbank:
    """Kaldi fbank of one waveform (1-D, int16-range float32) with the chosen backend."""

    def __init__(self, opts: FbankOptions = FbankOptions()):
        self.opts = opts
        self.backend = resolve_backend(opts.backend)
        self.window_samples = window_samples(opts)
        self._fn: Callable[[np.ndarray], np.ndarray]
        if self.backend == "torchaudio":
            import torch

            ta_kaldi = _torchaudio_kaldi()

            def fn(wave: np.ndarray) -> np.ndarray:
                # In float64, then rounded to float32.  Pre-emphasis and DC removal leave the lowest
                # mel bins (below ~100 Hz) as little as 1e-12 of a frame's energy, under float32's
                # rounding noise in the FFT: there each backend in float32 is up to 0.014 off the
                # exact log energy, and the two differed by up to 0.02.  kaldi-native-fbank runs in
                # float32 (as Kaldi does); torchaudio in float64 halves the difference (docs/fbank.md).
                x = torch.from_numpy(np.asarray(wave, dtype=np.float64)).unsqueeze(0)
                return ta_kaldi.fbank(
                    x, num_mel_bins=opts.num_mel_bins, sample_frequency=float(opts.sample_rate),
                    frame_length=FRAME_LENGTH_MS, frame_shift=FRAME_SHIFT_MS, dither=opts.dither,
                    energy_floor=0.0, window_type="povey", snip_edges=True,
                ).numpy().astype(np.float32)
        else:
            knf = _knf()
            ko = knf.FbankOptions()
            ko.frame_opts.samp_freq = float(opts.sample_rate)
            ko.frame_opts.frame_length_ms = FRAME_LENGTH_MS
            ko.frame_opts.frame_shift_ms = FRAME_SHIFT_MS
            ko.frame_opts.dither = opts.dither  # knf's own default is 3e-5, not Kaldi's 1.0 nor our 0
            ko.frame_opts.window_type = "povey"
            ko.frame_opts.snip_edges = True
            ko.mel_opts.num_bins = opts.num_mel_bins
            ko.energy_floor = 0.0

            def fn(wave: np.ndarray) -> np.ndarray:
                f = knf.OnlineFbank(ko)
                f.accept_waveform(float(opts.sample_rate), wave.tolist())  # a list binds ~1.4x faster than numpy
                f.input_finished()
                n = f.num_frames_ready
                # one np.array over all rows: ~10x faster than assigning rows one by one
                rows = [f.get_frame(i) for i in range(n)]
                return np.array(rows, dtype=np.float32).reshape(n, opts.num_mel_bins)

        self._fn = fn

    def num_frames(self, num_samples: int) -> int:
        """Frames Kaldi gives for ``num_samples`` with snip_edges: 1 + (n - window) // shift."""
        return frames_of(num_samples, self.opts)

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        return self._fn(wave)


def iter_features(utts: Sequence[Utterance], fbank: Fbank) -> Iterator[tuple[Utterance, np.ndarray | AudioProblem]]:
    """(utterance, frames x bins float32 features or the problem) for each utterance, in order."""
    opts = fbank.opts
    for u, wave in iter_waveforms(utts, sample_rate=opts.sample_rate, channel=opts.channel,
                                  min_samples=fbank.window_samples):
        yield u, wave if isinstance(wave, AudioProblem) else fbank(wave)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch ops on one intra-op thread inside a job, restoring the setting after.

    Fbank of one utterance is too small to split across threads: measured on 2 busy cores,
    torchaudio's fbank took 13x longer with 2 threads than with 1. Parallelism comes from ``nj``.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class ArkResult:
    """What one worker wrote: its ark (under a temporary name) and what it could not compute."""

    tmp_path: Path
    final_path: Path
    entries: list[tuple[str, int, int]] = field(default_factory=list)  # (uttid, byte offset, frames)
    report: Report = field(default_factory=Report)


def compute_fbank(
    wav_scp: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    segments: str | os.PathLike | None = None,
    num_mel_bins: int = 80,
    sample_rate: int = 16000,
    dither: float = 0.0,
    backend: str = "auto",
    channel: int = 0,
    nj: int = 1,
    strict: bool = False,
    progress: bool | None = None,
) -> Report:
    """Compute Kaldi fbank features for a data dir into ``out_dir/feats.scp`` + arks.

    Args:
        wav_scp: Kaldi ``wav.scp``: ``recid path`` (WAV/FLAC/OGG/MP3...) or ``recid command |``.
        out_dir: gets ``feats.N.ark`` (one per worker), ``feats.scp`` (absolute ark paths,
            processing order, see :func:`wdsprep.prep.audio.read_utterances`), ``utt2num_frames`` and
            ``fbank_report.json``. Earlier output of this function there is replaced; other
            files (e.g. the data dir's own ``wav.scp``) are left alone.
        segments: Kaldi ``segments`` (``uttid recid start end [channel]``, end -1 = to the end).
        num_mel_bins, sample_rate, dither: as ``compute-fbank-feats``; audio at another rate is
            resampled; ``dither=0`` (the default here, Kaldi's is 1.0) makes output reproducible.
        backend: ``auto``, ``torchaudio`` or ``kaldi-native-fbank``.
        channel: channel of multi-channel audio unless the segments line names one.
        nj: worker processes.
        strict: raise :class:`StrictError` (after writing everything) if any utterance was skipped.
        progress: tqdm bar; ``None`` shows it on a terminal only.

    Returns:
        The report (every skipped utterance by reason), also in ``out_dir/fbank_report.json``.
    """
    opts = FbankOptions(num_mel_bins, sample_rate, dither, backend, channel)
    opts = replace(opts, backend=resolve_backend(backend))  # fail early, in this process, with the reason
    d = Path(out_dir).absolute()
    if d.exists() and not d.is_dir():
        raise FileExistsError(f"{d} exists and is not a directory")
    report = Report()
    utts = read_utterances(wav_scp, segments, report)
    make_dir(d)

    work = partial(fbank_chunk, d_out=d, opts=opts)
    results: list[ArkResult] = []
    try:
        results = run_chunks(work, utts, nj, desc="fbank", progress=progress)
        written = _finalize(d, results, report)
    except BaseException:
        for p in d.glob(f".feats.*.ark{TMP_SUFFIX}"):
            p.unlink(missing_ok=True)
        raise
    frames = sum(f for r in results for _, _, f in r.entries)
    report.groups = {"feats.scp": {"utterances": written, "frames": frames,
                                   "hours": round(hours(frames), 4)}}
    report.write(d / REPORT_NAME)
    print(report.summary(f"fbank ({opts.backend}): wrote {d / 'feats.scp'}"))
    if strict and report.num_dropped:
        raise StrictError(f"fbank: {report.counts()} (strict); see {d / REPORT_NAME}")
    return report


def fbank_chunk(chunk: Sequence[Utterance], worker: int, tick: Callable[[int], None], *, d_out: Path,
                opts: FbankOptions) -> ArkResult:
    """One worker's utterances into ``d_out/feats.{worker + 1}.ark``, under its temporary name until
    :func:`_finalize` renames it."""
    import kaldiio

    fbank = Fbank(opts)  # imports the backend, and torch with torchaudio, before one_torch_thread
    final = d_out / f"feats.{worker + 1}.ark"
    res = ArkResult(temp_path(final), final)
    with one_torch_thread(), naming(res.tmp_path), open(res.tmp_path, "wb") as f:  # ENOSPC names the ark
        for u, feats in iter_features(chunk, fbank):
            if isinstance(feats, AudioProblem):
                res.report.drop(feats.reason, u.uttid, feats.detail)
            else:
                # kaldiio writes "uttid " then the matrix; the scp offset points just past the key.
                offset = f.tell() + len((u.uttid + " ").encode("utf-8"))
                kaldiio.save_ark(f, {u.uttid: feats})
                res.entries.append((u.uttid, offset, feats.shape[0]))
            tick(1)
    return res


def _finalize(d: Path, results: list[ArkResult], report: Report) -> int:
    """Give arks their final names, write ``feats.scp`` and ``utt2num_frames``; returns utterances written."""
    scp, num_frames = [], []
    for r in results:
        report.merge(r.report)
        for uttid, offset, frames in r.entries:
            scp.append(f"{uttid} {r.final_path}:{offset}\n")
            num_frames.append(f"{uttid} {frames}\n")
    # feats.scp is what makes the arks usable, so it goes first and comes back last: a job stopped
    # in between must not leave the old one, whose offsets point into the new arks (other utterances).
    for name in ("feats.scp", "utt2num_frames"):
        (d / name).unlink(missing_ok=True)
    keep = set()
    for r in results:
        if r.entries:
            os.replace(r.tmp_path, r.final_path)
            keep.add(r.final_path.name)
        else:
            r.tmp_path.unlink(missing_ok=True)
    write_text(d / "utt2num_frames", "".join(num_frames))
    write_text(d / "feats.scp", "".join(scp))
    # Arks of an earlier run with more workers would linger unreferenced: remove them.
    for p in d.glob("feats.*.ark"):
        if p.name not in keep and p.name.split(".")[1].isdigit():
            p.unlink()
    return len(scp)
