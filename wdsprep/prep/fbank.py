"""``fbank``: Kaldi-compatible log-mel filterbank features from ``wav.scp`` [+ ``segments``].

Two backends compute the same features (``compute-fbank-feats`` defaults: 25 ms povey windows
every 10 ms, snip_edges, pre-emphasis 0.97, DC removal, power spectrum, mel bins from 20 Hz to
Nyquist, log floored at float epsilon, energy_floor 0):

* ``torchaudio``: ``torchaudio.compliance.kaldi.fbank``, imported only when this backend is used;
  on machines where ``import torchaudio`` fails (e.g. a CUDA-linked wheel on CPU) it is
  unavailable, with a message saying so.  It computes in float64 and rounds to float32.
* ``kaldi-native-fbank``: the C++ port of Kaldi's code, in float32.
* ``numpy``: Kaldi's computation written over whole utterances in numpy (every frame at once,
  float64, the mel banks as a sparse matrix), rounded to float32: always available and the fastest
  here (about 3x kaldi-native-fbank per core), which is why the loader's on-the-fly features for
  audio shards default to it.  Its dither, unlike the others', draws from a generator it is given.

They agree to 0.015 max abs; the largest differences are float32 rounding in the lowest mel bins
(docs/fbank.md).

``auto`` takes torchaudio when it imports (faster), else kaldi-native-fbank. Dither defaults to 0
(Kaldi's default is 1.0) so that the same input always gives the same features.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from wdsprep.errors import StrictError, Unavailable
from wdsprep.files import TMP_SUFFIX, make_dir, naming, open_new, temp_path, write_text
from wdsprep.format.audio import FBANK_BACKENDS as BACKENDS
from wdsprep.options import documented
from wdsprep.prep.audio import AudioProblem, Utterance, iter_waveforms, read_utterances
from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions
from wdsprep.prep.parallel import run_chunks
from wdsprep.report import Report
from wdsprep.units import FRAME_LENGTH_MS, FRAME_SHIFT_MS, fbank_frames, frame_samples, hours

REPORT_NAME = "fbank_report.json"


class BackendUnavailable(Unavailable):
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
    elif backend != "numpy":
        raise ValueError(f"unknown fbank backend {backend!r}; choose auto or one of {BACKENDS}")
    return backend


def resolve_options(opts: FbankOptions) -> FbankOptions:
    """``opts`` with the backend that computes the features here (``auto`` resolved; a named one
    checked to import): call it in the main process, so a missing backend fails early, with the reason."""
    return replace(opts, backend=resolve_backend(opts.backend))


def mel_banks(num_bins: int, sample_rate: int, padded: int) -> np.ndarray:
    """Kaldi's triangular mel filters (``MelBanks``, 20 Hz to Nyquist, no VTLN) over the power
    spectrum of a ``padded``-point FFT: float64 [num_bins, padded // 2 + 1]; the Nyquist bin has no
    weight, as in Kaldi."""
    def mel(f: np.ndarray | float) -> np.ndarray | float:
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    low, high = mel(20.0), mel(sample_rate / 2)
    delta = (high - low) / (num_bins + 1)
    fft_mel = mel(np.arange(padded // 2) * sample_rate / padded)
    banks = np.zeros((num_bins, padded // 2 + 1))
    for b in range(num_bins):
        left, center, right = low + b * delta, low + (b + 1) * delta, low + (b + 2) * delta
        inside = (fft_mel > left) & (fft_mel < right)
        rising = (fft_mel - left) / (center - left)
        banks[b, :padded // 2] = np.where(inside, np.where(fft_mel <= center, rising, (right - fft_mel) /
                                                           (right - center)), 0.0)
    return banks


def _numpy_fbank(opts: FbankOptions) -> Callable[[np.ndarray, "np.random.Generator | None"], np.ndarray]:
    """The ``numpy`` backend: Kaldi's fbank of every frame at once (see the module docstring)."""
    from numpy.lib.stride_tricks import sliding_window_view
    from scipy.sparse import csr_matrix

    window, shift = frame_samples(opts.sample_rate)
    padded = 1 << (window - 1).bit_length()  # Kaldi rounds the window up to a power of two
    povey = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(window) / (window - 1))) ** 0.85
    # Sparse: each FFT bin feeds at most two mel bins, and a dense product would go through BLAS,
    # whose threads cost ~5x the work itself on a busy machine (measured: 0.96 s against 0.2 s of
    # CPU for 61 s of speech with OpenBLAS's default threads).
    banks = csr_matrix(mel_banks(opts.num_mel_bins, opts.sample_rate, padded))
    floor = float(np.finfo(np.float32).eps)  # Kaldi floors the mel energies at float epsilon
    block = math.gcd(window, shift)  # frames start and end on blocks of this many samples

    def fn(wave: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        n = fbank_frames(len(wave), opts.sample_rate)
        if not n:
            return np.zeros((0, opts.num_mel_bins), np.float32)
        s = np.asarray(wave, np.float64)
        if opts.dither:
            if rng is None:
                raise ValueError("dither > 0 with the numpy backend needs a generator to draw from")
            x = _dithered_frames(s, n, window, shift, opts.dither, rng) * povey
        else:
            # Kaldi's per-frame DC removal and pre-emphasis, on the whole signal at once: pre-emphasis
            # is the same within a frame (its first sample differs, but the povey window weighs it 0),
            # and of (frame - c) it is that of the frame less 0.03 c at every sample.  Per frame, the
            # pre-emphasis of strided columns cost 5x the FFT (measured).
            e = np.empty_like(s)
            e[0] = 0.0
            np.subtract(s[1:], 0.97 * s[:-1], out=e[1:])
            dc = (1.0 - 0.97) / window * frame_sums(s, n)
            x = np.subtract(sliding_window_view(e, window)[::shift][:n], dc[:, None])
            x *= povey
        spec = np.fft.rfft(x, padded)
        power = spec.real ** 2
        power += spec.imag ** 2
        mel = banks @ power.T  # [bins, frames]
        np.log(np.maximum(mel, floor, out=mel), out=mel)
        return mel.T.astype(np.float32, order="C")

    def frame_sums(s: np.ndarray, n: int) -> np.ndarray:
        """Each frame's sum of samples, from running sums of blocks of gcd(window, shift) samples."""
        sums = np.concatenate(([0.0], np.cumsum(s[:len(s) // block * block].reshape(-1, block).sum(axis=1))))
        first = np.arange(n) * (shift // block)
        return sums[first + window // block] - sums[first]

    return fn


def _dithered_frames(s: np.ndarray, n: int, window: int, shift: int, dither: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Frames with Kaldi's dither (Gaussian noise per sample of each frame: overlapping frames get
    noise of their own), DC removal and pre-emphasis, one frame at a time as Kaldi does."""
    from numpy.lib.stride_tricks import sliding_window_view

    x = sliding_window_view(s, window)[::shift][:n] + dither * rng.standard_normal((n, window))
    x -= x.mean(axis=1, keepdims=True)
    x[:, 1:] -= 0.97 * x[:, :-1]  # numpy computes the right side first: each sample minus its predecessor
    x[:, 0] *= 1.0 - 0.97
    return x


class Fbank:
    """Kaldi fbank of one waveform (1-D, int16-range float32) with the chosen backend."""

    def __init__(self, opts: FbankOptions = FbankOptions()):
        self.opts = opts
        self.backend = resolve_backend(opts.backend)
        self.window_samples = frame_samples(opts.sample_rate)[0]
        self._fn: Callable[..., np.ndarray]
        if self.backend == "numpy":
            self._fn = _numpy_fbank(opts)
            return
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
        return int(fbank_frames(num_samples, self.opts.sample_rate))

    def __call__(self, wave: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """The features of ``wave``; ``rng``: what the numpy backend's dither draws from (the
        others draw their dither from generators of their own, which cannot be seeded)."""
        return self._fn(wave, rng) if self.backend == "numpy" else self._fn(wave)


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


@documented(FbankOptions, AudioInputs, JobOptions)
def compute_fbank(
    wav_scp: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    segments: str | os.PathLike | None = AudioInputs.segments,
    num_mel_bins: int = FbankOptions.num_mel_bins,
    sample_rate: int = FbankOptions.sample_rate,
    dither: float = FbankOptions.dither,
    backend: str = FbankOptions.backend,
    channel: int | None = FbankOptions.channel,
    nj: int = JobOptions.nj,
    strict: bool = JobOptions.strict,
    progress: bool | None = JobOptions.progress,
) -> Report:
    """Compute Kaldi fbank features for a data dir into ``out_dir/feats.scp`` + arks.

    Args:
        wav_scp: Kaldi ``wav.scp``: ``recid path`` (WAV/FLAC/OGG/MP3...) or ``recid command |``.
        out_dir: gets ``feats.N.ark`` (one per worker), ``feats.scp`` (absolute ark paths,
            processing order, see :func:`wdsprep.prep.audio.read_utterances`), ``utt2num_frames`` and
            ``fbank_report.json``. Earlier output of this function there is replaced; other
            files (e.g. the data dir's own ``wav.scp``) are left alone.

    The features are ``compute-fbank-feats``'s; ``dither=0`` (the default here, Kaldi's is 1.0)
    makes them reproducible.

    Returns:
        The report (every skipped utterance by reason), also in ``out_dir/fbank_report.json``.
    """
    JobOptions(nj, strict, progress)  # checked when given, before anything is read
    opts = resolve_options(FbankOptions(num_mel_bins, sample_rate, dither, backend, channel))
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
    print(report.summary(f"fbank ({opts.backend}): wrote {written:,} utterances ({hours(frames):.2f} h) to "
                         f"{Path(out_dir) / 'feats.scp'}", table=False))
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
    with one_torch_thread(), naming(res.tmp_path), open_new(res.tmp_path) as f:  # ENOSPC names the ark
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
