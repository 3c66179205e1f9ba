"""Reading the audio of a Kaldi data dir: ``wav.scp`` entries, pipes, ``segments``, channels, resampling.

Conventions follow Kaldi so features match ``compute-fbank-feats``:

* Samples are scaled to the int16 range (a 16-bit file gives its integer sample values), which is
  what Kaldi's wave reader hands to feature extraction.
* A ``wav.scp`` value ending in ``|`` is a shell command whose stdout is a WAV (Kaldi's extended
  filename); anything else is a path soundfile reads (WAV, FLAC, OGG, MP3, ...).
* ``segments`` lines are ``uttid recid start end [channel]``; ``end`` of ``-1`` means to the end of
  the recording. Start and end become sample indices by truncation, a segment ending past its
  recording by less than :data:`MAX_OVERSHOOT` seconds is truncated, one ending further out, starting
  past the end or shorter than :data:`MIN_SEGMENT_LENGTH` is rejected, as in Kaldi's
  ``extract-segments``.
* Multi-channel audio: the channel of the segments line, else the job's ``channel``; by default
  (``channel`` None) every channel, and features are computed from their mean (:func:`downmix`):
  the one rule the loader's readers follow for an audio member of several channels, and Lhotse's,
  NeMo's and WeNet's too (Kaldi's ``compute-fbank-feats`` takes channel 0: ``--channel 0``).

Every problem becomes an :class:`AudioProblem` naming the utterance, the file (and line) and what
to do; the job records it in its report instead of stopping.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections import OrderedDict
from dataclasses import dataclass
from math import gcd
from typing import Iterator, Sequence

import numpy as np

from wdsprep.format.audio import MAX_RATE, MIN_RATE
from wdsprep.prep.kaldi import KaldiDataError, read_tables
from wdsprep.report import Report
from wdsprep.units import resampled_lengths

MAX_OVERSHOOT = 0.5  # seconds; Kaldi extract-segments --max-overshoot default
MIN_SEGMENT_LENGTH = 0.1  # seconds; Kaldi extract-segments --min-segment-length default
INT16_SCALE = 32768.0  # soundfile's float range [-1, 1) back to Kaldi's int16 sample values
_STDERR_TAIL = 300  # characters of a failing pipe's stderr kept in the report

PathLike = str | os.PathLike


@dataclass(frozen=True)
class Utterance:
    """One utterance to extract: a whole recording, or a segment of one."""

    uttid: str
    recid: str
    rxfile: str  # the wav.scp value: a path, or a command ending in '|'
    where: str  # file:line of the entry that defines the utterance (segments, else wav.scp)
    start: float = 0.0
    end: float = -1.0  # seconds; -1 means to the end of the recording
    channel: int | None = None  # from the segments line; None means the job's channel


@dataclass(frozen=True)
class AudioProblem:
    """Why an utterance has no waveform: a report reason and a sentence for the person fixing it."""

    reason: str  # bad_audio | bad_segment | too_short
    detail: str


class AudioReadError(Exception):
    """A recording cannot be read; the message says which file and why."""

    reason = "bad_audio"  # what the report counts it as


class MissingAudio(AudioReadError):
    """A recording a manifest names is not there (no such file, no such member of a tar)."""

    reason = "missing_file"


def read_utterances(wav_scp: PathLike, segments: PathLike | None, report: Report) -> list[Utterance]:
    """The utterances of a data dir, in processing order; segments naming no recording go to ``report``.

    Order: without segments, ``wav.scp`` order. With segments, grouped by recording (recordings
    in order of first appearance in ``segments``, segments in file order within one), so each
    recording is read once; for a sorted Kaldi ``segments`` file this is exactly the file order.
    """
    wavs = read_tables([wav_scp], "wav.scp")
    if segments is None:
        return [Utterance(e.uttid, e.uttid, e.value, e.where) for e in wavs.values()]
    by_rec: dict[str, list[Utterance]] = {}
    for e in read_tables([segments], "segments").values():
        fields = e.value.split()
        if len(fields) not in (3, 4):
            raise KaldiDataError(f"{e.where}: expected 'uttid recid start end [channel]', got {e.uttid} {e.value!r}")
        recid = fields[0]
        try:
            start, end = float(fields[1]), float(fields[2])
            channel = int(fields[3]) if len(fields) == 4 else None
        except ValueError:
            raise KaldiDataError(
                f"{e.where}: start and end must be seconds and channel an integer, got {e.value!r}"
            ) from None
        wav = wavs.get(recid)
        if wav is None:
            report.drop("missing_recording", e.uttid,
                        f"{e.where}: recording {recid!r} is not in {wav_scp}; add it there or remove the segment")
            continue
        by_rec.setdefault(recid, []).append(Utterance(e.uttid, recid, wav.value, e.where, start, end, channel))
    return [u for utts in by_rec.values() for u in utts]


def load_recording(rxfile: str) -> tuple[np.ndarray, int]:
    """(samples x channels float32 in the int16 range, sample rate) of a ``wav.scp`` value."""
    import soundfile as sf

    if rxfile.rstrip().endswith("|"):
        cmd = rxfile.rstrip()[:-1]
        try:
            proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)
        except OSError as e:
            raise AudioReadError(f"cannot run pipe {cmd!r}: {e}") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
            raise AudioReadError(f"pipe {cmd!r} failed (exit {proc.returncode}): {err or 'no stderr'}")
        source: object = io.BytesIO(proc.stdout)
        what = f"output of pipe {cmd!r}"
    else:
        source = rxfile
        what = repr(rxfile)
        if not os.path.isfile(rxfile):
            raise AudioReadError(f"{rxfile!r}: no such file (paths in wav.scp are relative to where you run)")
    try:
        data, rate = sf.read(source, dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, TypeError... for bad data
        raise AudioReadError(f"{what} is not readable audio: {type(e).__name__}: {e}") from None
    if data.shape[0] == 0:
        raise AudioReadError(f"{what} has no samples")
    check_rate(int(rate), what)
    data *= INT16_SCALE
    return data, int(rate)


def check_rate(rate: int, what: str) -> None:
    """:class:`AudioReadError` for a header rate no recording has: resampled to speech rates, 1 Hz
    would make 60 KB of audio 2 GB of samples (and below 100 Hz a frame shift is no sample)."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioReadError(f"{what} says {rate} Hz, which no speech recording is sampled at ({MIN_RATE:,} to "
                             f"{MAX_RATE:,} Hz): is its header damaged?")


def downmix(wave: np.ndarray) -> np.ndarray:
    """The one channel rule: samples of several channels ``[n, C]`` become their mean (float32), one
    channel stays as it is.  The pack's features and the loader's (of an audio member) both come
    from it, so a recording gives the same features whichever way it went."""
    return wave.mean(axis=1, dtype=np.float32) if wave.ndim == 2 else wave


def channels(data: np.ndarray, ch: int | None, *, mix: bool) -> np.ndarray:
    """The samples a job uses of ``data`` ``[n, C]``: channel ``ch``; with ``ch`` None every channel,
    their mean when ``mix`` (for features), else as they are (``[n, C]``, or ``[n]`` for one: for
    audio shards, which the loader downmixes)."""
    if ch is not None or data.shape[1] == 1:
        return np.ascontiguousarray(data[:, 0 if ch is None else ch])
    return downmix(data) if mix else np.ascontiguousarray(data)


def channel_problem(u: Utterance, ch: int | None, count: int) -> AudioProblem | None:
    """Why channel ``ch`` of a recording of ``count`` channels cannot be read for ``u`` (None: it can;
    ``ch`` None, every channel, always can)."""
    if ch is None or 0 <= ch < count:
        return None
    asked = f"{u.where} asks for channel {ch}" if u.channel is not None else f"--channel {ch} asks for one it lacks"
    return AudioProblem("bad_segment" if u.channel is not None else "bad_audio",
                        f"recording {u.recid!r} has {count} channel(s); {asked}")


def resample(x: np.ndarray, orig: int, new: int) -> np.ndarray:
    """Band-limited resampling of a signal (``[n]``, or ``[n, C]`` channel by channel) with scipy's
    polyphase filter (Kaiser window).

    scipy rather than ``torchaudio.functional.resample``: it works whatever backend is chosen
    (torchaudio may not import), so both backends see identical waveforms.
    """
    if orig == new:
        return x
    from scipy.signal import resample_poly

    g = gcd(orig, new)
    return resample_poly(x, new // g, orig // g, axis=0).astype(np.float32, copy=False)


def iter_waveforms(utts: Sequence[Utterance], *, sample_rate: int, channel: int | None,
                   min_samples: int = 1) -> Iterator[tuple[Utterance, np.ndarray | AudioProblem]]:
    """(utterance, 1-D float32 waveform at ``sample_rate`` or the problem) for each utterance, in order
    (``channel`` None: the mean of a recording's channels, :func:`downmix`).

    Consecutive utterances of one recording share a single read (and resampling per channel).
    ``min_samples``: shorter waveforms are reported ``too_short`` (e.g. less than one window).
    """
    cur_rec: str | None = None
    loaded: tuple[np.ndarray, int] | AudioReadError | None = None
    per_channel: dict[int | None, np.ndarray] = {}
    for u in utts:
        if u.recid != cur_rec:
            cur_rec, per_channel = u.recid, {}
            try:
                loaded = load_recording(u.rxfile)
            except AudioReadError as e:
                loaded = e
        if isinstance(loaded, AudioReadError):
            yield u, AudioProblem("bad_audio", f"recording {u.recid!r}: {loaded}")
            continue
        data, rate = loaded
        ch = channel if u.channel is None else u.channel
        problem = channel_problem(u, ch, data.shape[1])
        if problem is not None:
            yield u, problem
            continue
        wave = per_channel.get(ch)
        if wave is None:
            wave = per_channel[ch] = resample(channels(data, ch, mix=True), rate, sample_rate)
        piece = cut_segment(u, wave, sample_rate)
        if isinstance(piece, AudioProblem):
            yield u, piece
        elif len(piece) < min_samples:
            yield u, too_short(len(piece), sample_rate, min_samples)
        else:
            yield u, piece


def segment_bounds(u: Utterance, n: int, rate: int) -> tuple[int, int] | AudioProblem:
    """``[start, end)`` in samples of a segment of a recording of ``n`` samples at ``rate``, with Kaldi
    ``extract-segments``' checks and truncation; the whole recording without a segment."""
    if u.start == 0.0 and u.end == -1.0:
        return 0, n
    where = f"{u.where}: segment {u.start}..{u.end} s of recording {u.recid!r} ({n / rate:.3f} s)"
    if u.start < 0 or (u.end != -1.0 and u.end <= u.start):
        return AudioProblem("bad_segment", f"{where}: start must be >= 0 and end > start (or -1)")
    start = int(u.start * rate)  # truncation, as Kaldi converts seconds to samples
    end = n if u.end == -1.0 else int(u.end * rate)
    if start >= n:
        return AudioProblem("bad_segment", f"{where}: starts past the end of the recording")
    if end > n:
        if end >= n + int(MAX_OVERSHOOT * rate):
            return AudioProblem("bad_segment", f"{where}: ends {(end - n) / rate:.3f} s past the recording, more "
                                               f"than Kaldi's {MAX_OVERSHOOT} s tolerance; fix the segment times")
        end = n  # a small overshoot (rounding in the segmenter) is truncated, as Kaldi does
    if end <= start + int(MIN_SEGMENT_LENGTH * rate):
        return AudioProblem("bad_segment", f"{where}: shorter than Kaldi's {MIN_SEGMENT_LENGTH} s minimum "
                                           f"segment length")
    return start, end


def cut_segment(u: Utterance, wave: np.ndarray, rate: int) -> np.ndarray | AudioProblem:
    """The samples of a segment, with Kaldi ``extract-segments``' checks and truncation."""
    bounds = segment_bounds(u, len(wave), rate)
    if isinstance(bounds, AudioProblem):
        return bounds
    start, end = bounds
    return wave if (start, end) == (0, len(wave)) else wave[start:end]


def too_short(num_samples: int, rate: int, min_samples: int) -> AudioProblem:
    return AudioProblem("too_short", f"{num_samples} samples at {rate} Hz, fewer than the {min_samples} of one "
                                     f"analysis window; no frame to compute")


# Formats whose samples soundfile reads from any offset exactly as a read from the start gives them
# (PCM and FLAC: lossless, sample-addressed).  Lossy ones (MP3, Ogg) decode from the start.
SEEKABLE_FORMATS = frozenset({"WAV", "WAVEX", "FLAC", "AIFF", "AU", "W64", "RF64", "CAF", "NIST"})


@dataclass(frozen=True)
class Recording:
    """What a recording's header says: samples per channel, rate, channels, and whether a segment
    can be read alone (a file of a seekable format)."""

    samples: int
    rate: int
    channels: int
    seekable: bool


def resampled_length(n: int, orig: int, new: int) -> int:
    """Samples :func:`resample` gives for ``n`` at ``orig`` Hz (one of :func:`~wdsprep.units.resampled_lengths`)."""
    return int(resampled_lengths(np.int64(n), np.int64(orig), new))


def probe_recording(rxfile: str) -> Recording:
    """A recording's header (a pipe is run and its output decoded: it has no header to read);
    :class:`AudioReadError` saying why it cannot be read."""
    import soundfile as sf

    if rxfile.rstrip().endswith("|"):
        data, rate = load_recording(rxfile)
        return Recording(data.shape[0], rate, data.shape[1], False)
    if not os.path.isfile(rxfile):
        raise AudioReadError(f"{rxfile!r}: no such file (paths in wav.scp are relative to where you run)")
    try:
        info = sf.info(rxfile)
    except Exception as e:  # soundfile raises LibsndfileError, RuntimeError, TypeError... for bad data
        raise AudioReadError(f"{rxfile!r} is not readable audio: {type(e).__name__}: {e}") from None
    if info.frames <= 0:
        raise AudioReadError(f"{rxfile!r} has no samples")
    check_rate(int(info.samplerate), repr(rxfile))
    return Recording(int(info.frames), int(info.samplerate), int(info.channels), info.format in SEEKABLE_FORMATS)


def planned_samples(u: Utterance, rec: Recording | AudioReadError, *, sample_rate: int, channel: int | None,
                    min_samples: int) -> int | AudioProblem:
    """The samples :func:`iter_waveforms` will give for ``u``, from its recording's header alone,
    or the problem it will report."""
    if isinstance(rec, AudioReadError):
        return AudioProblem(rec.reason, f"recording {u.recid!r}: {rec}")
    problem = channel_problem(u, channel if u.channel is None else u.channel, rec.channels)
    if problem is not None:
        return problem
    bounds = segment_bounds(u, resampled_length(rec.samples, rec.rate, sample_rate), sample_rate)
    if isinstance(bounds, AudioProblem):
        return bounds
    n = bounds[1] - bounds[0]
    return too_short(n, sample_rate, min_samples) if n < min_samples else n


class WaveSource:
    """Utterances' waveforms in any order, as :func:`iter_waveforms` gives them in its order.

    A pack in shuffled order meets a long recording's segments in many shards: decoding the whole
    recording for each would cost its length per segment.  So a segment of a file that can be read
    from any offset exactly (PCM, FLAC; :data:`SEEKABLE_FORMATS`) at the target rate is read alone;
    others (lossy formats, other rates: resampling is over the whole recording, pipes) are decoded
    whole and kept in a cache of at most ``cache_bytes``, least recently used out first (measured
    in ``docs/bench.md``, "Growing packs").
    """

    def __init__(self, *, sample_rate: int, channel: int | None, min_samples: int, cache_bytes: int = 256 << 20,
                 mix: bool = True) -> None:
        self.sample_rate, self.channel, self.min_samples, self.mix = sample_rate, channel, min_samples, mix
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[tuple[str, int | None], np.ndarray | AudioReadError] = OrderedDict()
        self._held = 0
        self.decoded = 0  # whole recordings decoded (for the benchmark)

    def waveform(self, u: Utterance, rec: Recording) -> np.ndarray | AudioProblem:
        import soundfile as sf

        ch = self.channel if u.channel is None else u.channel
        if rec.seekable and rec.rate == self.sample_rate and channel_problem(u, ch, rec.channels) is None:
            bounds = segment_bounds(u, rec.samples, rec.rate)
            if isinstance(bounds, AudioProblem):
                return bounds
            try:
                data, _ = sf.read(u.rxfile, start=bounds[0], stop=bounds[1], dtype="float32", always_2d=True)
            except Exception as e:
                return AudioProblem("bad_audio", f"recording {u.recid!r}: {u.rxfile!r} is not readable audio: "
                                                 f"{type(e).__name__}: {e}")
            data *= INT16_SCALE
            wave = channels(data, ch, mix=self.mix)
        else:
            whole = self._whole(u, ch)
            if isinstance(whole, AudioProblem):
                return whole
            piece = cut_segment(u, whole, self.sample_rate)
            if isinstance(piece, AudioProblem):
                return piece
            wave = piece
        return too_short(len(wave), self.sample_rate, self.min_samples) if len(wave) < self.min_samples else wave

    def _whole(self, u: Utterance, ch: int | None) -> np.ndarray | AudioProblem:
        key = (u.rxfile, ch)
        got = self._cache.get(key)
        if got is None:
            self.decoded += 1
            try:
                data, rate = load_recording(u.rxfile)
                problem = channel_problem(u, ch, data.shape[1])
                if problem is not None:
                    return problem
                got = resample(channels(data, ch, mix=self.mix), rate, self.sample_rate)
            except AudioReadError as e:
                got = e
            self._put(key, got)
        else:
            self._cache.move_to_end(key)
        if isinstance(got, AudioReadError):
            return AudioProblem("bad_audio", f"recording {u.recid!r}: {got}")
        return got

    def _put(self, key: tuple[str, int | None], value: np.ndarray | AudioReadError) -> None:
        size = value.nbytes if isinstance(value, np.ndarray) else 0
        if size > self.cache_bytes:
            return
        self._cache[key] = value
        self._held += size
        while self._held > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._held -= old.nbytes if isinstance(old, np.ndarray) else 0
