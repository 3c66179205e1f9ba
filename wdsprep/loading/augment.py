"""Augmentation the plan knows: the options, every draw as a pure function, and the transforms.

Every draw is a function of (the corpus's seed, the corpus epoch, the utterance's row in its
corpus), from seeded numpy generators, never global state; so a batch and its augmented features
are the same for any world size and worker count, and after a resume:

- **speed** (audio shards): a factor per utterance, drawn by the plan (:func:`speed_choices`, one
  generator per corpus epoch, a uniform per row); the corpus plans with the perturbed frame count
  (:func:`perturbed_frames`), so ``max_frames`` and ``max_cost`` hold for the audio the reader
  makes, which resamples by exactly that factor (:func:`speed_resample`, ``scipy.signal.resample_poly``)
  and names the utterance ``sp0.9-ID`` as Kaldi's speed-perturbed copies are named;
- **noise** and **reverb** (audio shards) and **specaugment** (any shards): drawn per utterance
  from a Philox generator keyed by (seed, corpus epoch) at a counter set by its row
  (:class:`Draws`): random access to any utterance's draws, no state carried from one to the next.

Options come as a dict (``{"speed": {"factors": [0.9, 1.0, 1.1]}, "noise": {"dir": D, "snr":
[10, 20]}, "reverb": {"dir": D}, "specaugment": {"freq_masks": 2, "time_masks": 2}}``), its JSON
(text or a file), or the dataclasses below (:func:`parse_augment`).  numpy only: no torch here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from wdsprep.units import fbank_frames

# Generators of one corpus epoch are independent per purpose.
_SPEED, _UTTERANCE, _DITHER = 11, 12, 13
# Where each transform's uniforms sit in an utterance's draws (fixed, whatever else is on).
_NOISE_U, _REVERB_U, _SPEC_U = slice(0, 4), slice(4, 6), 6


def _numbers(value: Any, what: str) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value):
        raise ValueError(f"augment {what} must be a list of numbers, got {value!r}")
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class Speed:
    """Speed perturbation: each utterance plays at one of ``factors`` (0.9: slower, 1/0.9 as long,
    lower pitch, as ``sox speed``), drawn with ``probs`` (default: equal).  Audio shards only."""

    factors: tuple[float, ...] = (0.9, 1.0, 1.1)
    probs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        factors = _numbers(self.factors, "speed factors")
        probs = _numbers(self.probs, "speed probs") if self.probs is not None else (1.0,) * len(factors)
        if len(probs) != len(factors):
            raise ValueError(f"augment speed: {len(factors)} factors but {len(probs)} probs")
        if any(p < 0 for p in probs) or not sum(probs) > 0:
            raise ValueError(f"augment speed probs must be >= 0 with a positive sum, got {list(probs)}")
        for f in factors:
            if not 0.5 <= f <= 2.0 or abs(float(Fraction(f).limit_denominator(100)) - f) > 1e-9:
                raise ValueError(f"augment speed factor {f} must be in [0.5, 2] with at most two decimals "
                                 f"(a ratio of small integers the resampler can use)")
        if len(set(factors)) != len(factors):
            raise ValueError(f"augment speed factors {list(factors)} repeat one")
        object.__setattr__(self, "factors", factors)
        object.__setattr__(self, "probs", tuple(p / sum(probs) for p in probs))

    def ratio(self, k: int) -> tuple[int, int]:
        """Factor ``k`` as resampling (up, down): ``n`` samples become ``ceil(n * up / down)``."""
        f = Fraction(self.factors[k]).limit_denominator(100)
        return f.denominator, f.numerator


@dataclass(frozen=True)
class Noise:
    """Additive noise: a recording of ``dir`` (WAV, FLAC, ... at any rate; channel 0), a random
    stretch of it (looped when shorter than the utterance), at an SNR drawn uniformly from ``snr``
    (dB, speech power over noise power), with probability ``prob``.  Audio shards only."""

    dir: str
    snr: tuple[float, float] = (10.0, 20.0)
    prob: float = 1.0

    def __post_init__(self) -> None:
        snr = _numbers(self.snr, "noise snr")
        if len(snr) == 1:
            snr = (snr[0], snr[0])
        if len(snr) != 2 or snr[0] > snr[1]:
            raise ValueError(f"augment noise snr must be [low, high] in dB, got {list(snr)}")
        object.__setattr__(self, "snr", snr)
        object.__setattr__(self, "dir", os.fspath(self.dir))
        _check_prob(self.prob, "noise")


@dataclass(frozen=True)
class Reverb:
    """Reverberation: the utterance convolved with an impulse response of ``dir`` (drawn per
    utterance), aligned at its direct path and scaled back to the utterance's power, with
    probability ``prob``.  Audio shards only."""

    dir: str
    prob: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", os.fspath(self.dir))
        _check_prob(self.prob, "reverb")


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment on the features (Park et al. 2019): ``freq_masks`` bands of up to ``freq_width``
    mel bins and ``time_masks`` stretches of up to ``time_width`` frames (and at most
    ``max_time_ratio`` of the utterance each) set to ``fill`` (``"mean"``: the utterance's mean
    value, ``"zero"``); ``time_warp`` > 0 first moves a point of the utterance by up to that many
    frames, stretching the two sides.  Feature and audio shards."""

    freq_masks: int = 2
    freq_width: int = 27
    time_masks: int = 2
    time_width: int = 40
    max_time_ratio: float = 0.2
    time_warp: int = 0
    fill: str = "mean"

    def __post_init__(self) -> None:
        for name in ("freq_masks", "freq_width", "time_masks", "time_width", "time_warp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10_000:
                raise ValueError(f"augment specaugment {name} must be a whole number in [0, 10000], got {v!r}")
        if not 0 <= self.max_time_ratio <= 1:
            raise ValueError(f"augment specaugment max_time_ratio must be in [0, 1], got {self.max_time_ratio!r}")
        if self.fill not in ("mean", "zero"):
            raise ValueError(f"augment specaugment fill must be 'mean' or 'zero', got {self.fill!r}")

    @property
    def num_draws(self) -> int:
        return 2 * (self.freq_masks + self.time_masks + 1)


def _check_prob(p: Any, what: str) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"augment {what} prob must be in [0, 1], got {p!r}")


@dataclass(frozen=True)
class Augment:
    """What to augment with; each part None when off.  ``speed`` changes the plan (it is part of
    :class:`~wdsprep.loading.plan.PlanOptions`); the rest changes only the features."""

    speed: Speed | None = None
    noise: Noise | None = None
    reverb: Reverb | None = None
    specaugment: SpecAugment | None = None

    @property
    def on_audio(self) -> bool:
        """Whether a part acts on the waveform (audio shards only)."""
        return self.speed is not None or self.noise is not None or self.reverb is not None

    def to_json(self) -> dict[str, Any]:
        """The options as plain JSON (what the loader's fingerprint and hyper-p.json hold)."""
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if v is not None}))

    def features_part(self) -> Augment | None:
        """What acts on the features of planned batches (all but the speed the plan draws); None when nothing."""
        rest = Augment(None, self.noise, self.reverb, self.specaugment)
        return rest if (rest.noise or rest.reverb or rest.specaugment) else None


_PARTS: dict[str, type] = {"speed": Speed, "noise": Noise, "reverb": Reverb, "specaugment": SpecAugment}


def parse_augment(spec: Augment | Mapping[str, Any] | str | os.PathLike | None) -> Augment | None:
    """An :class:`Augment` from itself, a dict of parts (each a dict or its dataclass), JSON text,
    or the path of a JSON file; None for None or ``{}``.  ValueError naming what is wrong."""
    if spec is None or isinstance(spec, Augment):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        text = str(spec)
        if not text.lstrip().startswith("{"):
            try:
                text = Path(spec).read_text(encoding="utf-8")
            except OSError as e:
                raise ValueError(f"augment: {spec!r} is neither JSON nor a readable file ({e.strerror})") from None
        try:
            spec = json.loads(text)
        except ValueError as e:
            raise ValueError(f"augment: not valid JSON ({e})") from None
    if not isinstance(spec, Mapping):
        raise ValueError(f"augment must be a dict such as {{\"speed\": {{\"factors\": [0.9, 1.0, 1.1]}}}}, "
                         f"got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(_PARTS))
    if unknown:
        raise ValueError(f"augment has {unknown}; it takes {sorted(_PARTS)}")
    parts: dict[str, Any] = {}
    for name, value in spec.items():
        kind = _PARTS[name]
        if value is None or isinstance(value, kind):
            parts[name] = value
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"augment {name} must be an object of options, got {value!r}")
        known = {f.name for f in fields(kind)}
        extra = sorted(set(value) - known)
        if extra:
            raise ValueError(f"augment {name} has {extra}; it takes {sorted(known)}")
        try:
            parts[name] = kind(**value)
        except TypeError as e:  # a required option missing
            raise ValueError(f"augment {name}: {e}") from None
    augment = Augment(**parts)
    return augment if any(getattr(augment, n) is not None for n in _PARTS) else None


# -- draws -----------------------------------------------------------------------------------------

def speed_choices(speed: Speed, seed: int, epoch: int, n: int) -> np.ndarray:
    """Each of ``n`` rows' factor (an index into ``speed.factors``, uint8) in a corpus epoch.

    Row ``i`` takes the ``i``-th uniform of one generator: the same for any ``n`` above ``i``.
    """
    u = np.random.default_rng([seed, epoch, _SPEED]).random(n)
    return np.searchsorted(np.cumsum(speed.probs)[:-1], u, side="right").astype(np.uint8)


def perturbed_samples(samples: np.ndarray, choice: np.ndarray, speed: Speed) -> np.ndarray:
    """The sample counts after each row's factor: ``ceil(n * up / down)``, what resample_poly returns."""
    out = np.asarray(samples, np.int64).copy()
    for k in range(len(speed.factors)):
        up, down = speed.ratio(k)
        at = choice == k
        out[at] = -(-out[at] * up // down)
    return out


def perturbed_frames(samples: np.ndarray, choice: np.ndarray, speed: Speed, sample_rate: int) -> np.ndarray:
    """Each row's fbank frames after its speed factor (int32): what the plan cuts batches by."""
    return fbank_frames(perturbed_samples(samples, choice, speed), sample_rate).astype(np.int32)


def speed_resample(wave: np.ndarray, speed: Speed, k: int) -> np.ndarray:
    """``wave`` played at factor ``k``: resampled by its ratio (the length :func:`perturbed_samples` says)."""
    up, down = speed.ratio(k)
    if up == down:
        return wave
    from scipy.signal import resample_poly

    return resample_poly(wave, up, down).astype(np.float32, copy=False)


def speed_prefix(factor: float) -> str:
    """Kaldi's name prefix of a speed-perturbed copy: ``sp0.9-``."""
    return f"sp{factor:g}-"


@dataclass
class Draws:
    """The per-utterance draws of one corpus epoch: a Philox generator keyed by (seed, epoch) and
    set, for row ``r``, to counter ``(0, r, purpose, 0)`` (2^64 blocks per row before any overlap)."""

    seed: int
    epoch: int
    key: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.key = np.random.SeedSequence([self.seed, self.epoch, _UTTERANCE]).generate_state(2, np.uint64)

    def generator(self, row: int, purpose: int = 0) -> np.random.Generator:
        return np.random.Generator(np.random.Philox(key=self.key, counter=[0, int(row), purpose, 0]))

    def uniforms(self, row: int, n: int) -> np.ndarray:
        """Row ``row``'s first ``n`` uniforms in [0, 1); the transforms read fixed slots of them."""
        return self.generator(row).random(n)

    def dither(self, row: int) -> np.random.Generator:
        """A generator of row ``row``'s own for the fbank's dither."""
        return self.generator(row, _DITHER)


def utterance_draws(augment: Augment) -> int:
    """How many uniforms each utterance's transforms read."""
    return _SPEC_U + (augment.specaugment.num_draws if augment.specaugment is not None else 0)


# -- transforms (pure: a waveform or features and the utterance's uniforms in, the result out) ----

def add_noise(wave: np.ndarray, bank: list[np.ndarray], opts: Noise, u: np.ndarray) -> tuple[np.ndarray, float | None]:
    """``wave`` plus a stretch of a noise recording of ``bank`` at the drawn SNR; (result, SNR in dB,
    or None when the draw said no or the utterance is silent)."""
    u = u[_NOISE_U]
    if u[3] >= opts.prob or not bank:
        return wave, None
    noise = bank[min(int(u[0] * len(bank)), len(bank) - 1)]
    n, m = len(wave), len(noise)
    if m >= n:
        start = min(int(u[1] * (m - n + 1)), m - n)
        piece = noise[start:start + n]
    else:  # loop a short recording
        piece = np.take(noise, (int(u[1] * m) + np.arange(n)) % m)
    speech = float(np.mean(np.square(wave, dtype=np.float64)))
    power = float(np.mean(np.square(piece, dtype=np.float64)))
    if speech <= 0 or power <= 0:
        return wave, None
    snr = opts.snr[0] + float(u[2]) * (opts.snr[1] - opts.snr[0])
    gain = math.sqrt(speech / (power * 10.0 ** (snr / 10.0)))
    return (wave + gain * piece).astype(np.float32), snr


def add_reverb(wave: np.ndarray, bank: list[np.ndarray], opts: Reverb, u: np.ndarray) -> np.ndarray:
    """``wave`` convolved with a drawn impulse response, shifted so its direct path (the response's
    peak) stays in place, cut to the utterance's length and scaled back to its power."""
    u = u[_REVERB_U]
    if u[1] >= opts.prob or not bank:
        return wave
    from scipy.signal import fftconvolve

    rir = bank[min(int(u[0] * len(bank)), len(bank) - 1)]
    peak = int(np.argmax(np.abs(rir)))
    out = fftconvolve(wave.astype(np.float64), rir)[peak:peak + len(wave)]
    before, after = float(np.mean(np.square(wave, dtype=np.float64))), float(np.mean(np.square(out)))
    if after > 0:
        out *= math.sqrt(before / after)
    return out.astype(np.float32)


def spec_augment(feats: np.ndarray, opts: SpecAugment, u: np.ndarray) -> np.ndarray:
    """``feats`` (frames x bins) time-warped and masked as the utterance's uniforms ``u`` say (a new array)."""
    u = u[_SPEC_U:]
    out = np.array(feats, np.float32)
    t, d = out.shape
    w = opts.time_warp
    if w and t > 2 * w + 1:
        center = w + min(int(u[0] * (t - 2 * w)), t - 2 * w - 1)
        moved = center + min(int(u[1] * (2 * w + 1)), 2 * w) - w
        if moved != center:
            out = _warp(out, center, moved)
    fill = float(out.mean()) if opts.fill == "mean" else 0.0
    k = 2
    for _ in range(opts.freq_masks):
        width = min(int(u[k] * (opts.freq_width + 1)), opts.freq_width, d)
        start = min(int(u[k + 1] * (d - width + 1)), d - width)
        out[:, start:start + width] = fill
        k += 2
    most = min(opts.time_width, int(opts.max_time_ratio * t))
    for _ in range(opts.time_masks):
        width = min(int(u[k] * (most + 1)), most)
        start = min(int(u[k + 1] * (t - width + 1)), t - width)
        out[start:start + width] = fill
        k += 2
    return out


def _warp(feats: np.ndarray, center: int, moved: int) -> np.ndarray:
    """Frames ``[0, center)`` stretched onto ``[0, moved)`` and the rest onto ``[moved, t)``, by linear
    interpolation between neighbouring frames."""
    t = len(feats)
    pos = np.arange(t, dtype=np.float64)
    src = np.where(pos < moved, pos * (center / max(moved, 1)),
                   center + (pos - moved) * ((t - 1 - center) / max(t - 1 - moved, 1)))
    lo = np.clip(np.floor(src).astype(np.int64), 0, t - 1)
    hi = np.minimum(lo + 1, t - 1)
    frac = (src - lo)[:, None]
    return ((1 - frac) * feats[lo] + frac * feats[hi]).astype(np.float32)
