"""Augmentation the plan knows: the effects, every draw as a pure function, and the transforms.

Every draw is a function of (the corpus's seed, the corpus epoch, the utterance's row in its
corpus), from seeded numpy generators, never global state; so a batch and its augmented features
are the same for any world size and worker count, and after a resume:

- **speed** (audio shards): a factor per utterance, drawn by the plan (:func:`speed_choices`, one
  generator per corpus epoch, a uniform per row); the corpus plans with the perturbed frame count
  (:func:`perturbed_frames`), so ``max_frames`` and ``max_cost`` hold for the audio the reader
  makes, which resamples by exactly that factor (:func:`speed_resample`, ``scipy.signal.resample_poly``)
  and names the utterance ``sp0.9-ID`` as Kaldi's speed-perturbed copies are named;
- **noise**, **reverb**, **clip**, **lowpass** and **codec** (audio shards) and **specaugment**
  (any shards): uniforms drawn per
  utterance from a Philox generator keyed by (seed, corpus epoch) at a counter set by its row
  (:class:`Draws`): random access to any utterance's draws, no state carried from one to the next.
  Each effect reads its own slots of them (:meth:`Augment.layout`).

Each effect is an :class:`Effect`: a frozen dataclass of its options that declares its name, whether it
acts on audio, how many uniforms it reads, its folder of recordings and its transform.
:data:`EFFECTS` lists them; the reader applies them (``loading/features.py``) and the loader checks
the shards (:meth:`Augment.check_shards`) from that list alone.

Options come as a dict (``{"speed": {"factors": [0.9, 1.0, 1.1]}, "noise": {"dir": D, "snr":
[10, 20]}, "reverb": {"dir": D}, "specaugment": {"freq_masks": 2, "time_masks": 2}, "codec":
{"formats": ["opus", "mulaw"], "prob": 0.3}}``), its JSON (text or a file), or the dataclasses
below (:func:`parse_augment`).  numpy (and scipy, soundfile) only: no torch here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from typing import Any, ClassVar, TypeVar

import numpy as np

from wdsprep.files import read_small
from wdsprep.units import fbank_frames

SPEC_LIMIT = 1 << 20  # bytes of an augment spec's JSON file: a few options
# The SNRs (dB) noise may be added at: far past any recording's, and 10 ** (snr / 10) stays finite.
MAX_SNR = 120.0
# Generators of one corpus epoch are independent per purpose.
_SPEED, _UTTERANCE, _DITHER = 11, 12, 13
# An utterance's uniforms of stream s > 0 come from purpose _STREAM + s (stream 0's from purpose 0).
_STREAM = 100


def _numbers(value: Any, what: str) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value):
        raise ValueError(f"augment {what} must be a list of numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _check_prob(p: Any, what: str) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"augment {what} prob must be in [0, 1], got {p!r}")


@dataclass(frozen=True)
class Draw:
    """What an effect's transform reads for one utterance."""

    u: np.ndarray  # its uniforms in [0, 1): its own slots of the utterance's draws
    bank: Sequence[np.ndarray] = ()  # the recordings of its folder, at the shards' sample rate
    choice: int | None = None  # an effect the plan draws (speed): the row's choice
    rate: int | None = None  # the waveform's sample rate (a waveform effect's; what a filter's Hz refer to)

    def sample_rate(self, what: str) -> int:
        if self.rate is None:
            raise ValueError(f"augment {what} needs the waveform's sample rate (Draw.rate)")
        return self.rate


class Effect:
    """One augmentation: a frozen dataclass of its options (what ``augment`` gives under
    :attr:`name`) and the transform the reader applies to each utterance.

    A new effect is a subclass here, appended to :data:`EFFECTS`, and exported from ``wdsprep``: the
    reader, the loader's checks, the fingerprint and ``augment``'s parsing follow from this list.
    """

    name: ClassVar[str]  # its key in the augment options
    on_audio: ClassVar[bool]  # acts on the waveform (audio shards only); else on the features
    # Its place in the chain: lower first.  Waveform effects run before the fbank, feature effects after it.
    order: ClassVar[int]
    # Uniforms it reads per utterance; None: as many as its options say (:meth:`num_uniforms`).
    uniforms: ClassVar[int | None] = 0
    planned: ClassVar[bool] = False  # drawn by the plan (it changes lengths): its apply reads Draw.choice

    def num_uniforms(self) -> int:
        """How many uniforms it reads per utterance with these options."""
        assert self.uniforms is not None, f"{type(self).__name__} reads a number of uniforms its options set"
        return self.uniforms

    @property
    def bank(self) -> str | None:
        """The folder of recordings it draws from (loaded once per reader), or None."""
        return None

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        """``x`` (a waveform, or frames x bins features) transformed as ``draw`` says (a new array or ``x``)."""
        raise NotImplementedError

    def prefix(self, draw: Draw) -> str:
        """What it puts before the utterance's name (Kaldi's ``sp0.9-``); empty when it leaves the name."""
        return ""


@dataclass(frozen=True)
class Speed(Effect):
    """Speed perturbation: each utterance plays at one of ``factors`` (0.9: slower, 1/0.9 as long,
    lower pitch, as ``sox speed``), drawn with ``probs`` (default: equal).  Audio shards only."""

    name: ClassVar[str] = "speed"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 0  # first: the plan cut the batches with the lengths it makes
    planned: ClassVar[bool] = True

    factors: tuple[float, ...] = (0.9, 1.0, 1.1)
    probs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        factors = _numbers(self.factors, "speed factors")
        probs = _numbers(self.probs, "speed probs") if self.probs is not None else (1.0,) * len(factors)
        if len(probs) != len(factors):
            raise ValueError(f"augment speed: {len(factors)} factors but {len(probs)} probs")
        if any(p < 0 for p in probs) or not 0 < sum(probs) < math.inf:
            # a sum past the largest float made every prob 0: every utterance went to the last factor
            raise ValueError(f"augment speed probs must be >= 0 with a positive, finite sum, got {list(probs)}")
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

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        assert draw.choice is not None, "speed is drawn by the plan: the row's choice is needed"
        return speed_resample(x, self, draw.choice)

    def prefix(self, draw: Draw) -> str:
        assert draw.choice is not None
        factor = self.factors[draw.choice]
        return speed_prefix(factor) if factor != 1.0 else ""


@dataclass(frozen=True)
class Noise(Effect):
    """Additive noise: a recording of ``dir`` (WAV, FLAC, ... at any rate; channel 0), a random
    stretch of it (looped when shorter than the utterance), at an SNR drawn uniformly from ``snr``
    (dB, speech power over noise power), with probability ``prob``.  Audio shards only."""

    name: ClassVar[str] = "noise"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 20  # after reverb: the noise is not reverberated
    uniforms: ClassVar[int | None] = 4  # recording, start, SNR, whether

    dir: str
    snr: tuple[float, float] = (10.0, 20.0)
    prob: float = 1.0

    def __post_init__(self) -> None:
        snr = _numbers(self.snr, "noise snr")
        if len(snr) == 1:
            snr = (snr[0], snr[0])
        if len(snr) != 2 or snr[0] > snr[1] or not -MAX_SNR <= snr[0] <= snr[1] <= MAX_SNR:
            # beyond it 10 ** (snr / 10) overflows, or the noise's gain underflows to nothing
            raise ValueError(f"augment noise snr must be [low, high] in dB within [-{MAX_SNR:g}, {MAX_SNR:g}], got "
                             f"{list(snr)}")
        object.__setattr__(self, "snr", snr)
        object.__setattr__(self, "dir", os.fspath(self.dir))
        _check_prob(self.prob, "noise")

    @property
    def bank(self) -> str | None:
        return self.dir

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return add_noise(x, draw.bank, self, draw.u)[0]


@dataclass(frozen=True)
class Reverb(Effect):
    """Reverberation: the utterance convolved with an impulse response of ``dir`` (drawn per
    utterance), aligned at its direct path and scaled back to the utterance's power, with
    probability ``prob``.  Audio shards only."""

    name: ClassVar[str] = "reverb"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 10
    uniforms: ClassVar[int | None] = 2  # response, whether

    dir: str
    prob: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", os.fspath(self.dir))
        _check_prob(self.prob, "reverb")

    @property
    def bank(self) -> str | None:
        return self.dir

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return add_reverb(x, draw.bank, self, draw.u)


@dataclass(frozen=True)
class SpecAugment(Effect):
    """SpecAugment on the features (Park et al. 2019): ``freq_masks`` bands of up to ``freq_width``
    mel bins and ``time_masks`` stretches of up to ``time_width`` frames (and at most
    ``max_time_ratio`` of the utterance each) set to ``fill`` (``"mean"``: the utterance's mean
    value, ``"zero"``); ``time_warp`` > 0 first moves a point of the utterance by up to that many
    frames, stretching the two sides.  Feature and audio shards."""

    name: ClassVar[str] = "specaugment"
    on_audio: ClassVar[bool] = False
    order: ClassVar[int] = 30
    uniforms: ClassVar[int | None] = None  # two per mask and two for the warp

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

    def num_uniforms(self) -> int:
        return 2 * (self.freq_masks + self.time_masks + 1)

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return spec_augment(x, self, draw.u)


def _range(value: Any, what: str, low: float, high: float) -> tuple[float, float]:
    """``[lo, hi]`` (one number: both) within ``[low, high]``."""
    r = _numbers(value, what)
    if len(r) == 1:
        r = (r[0], r[0])
    if len(r) != 2 or r[0] > r[1] or r[0] < low or r[1] > high:
        raise ValueError(f"augment {what} must be [lo, hi] with {low:g} <= lo <= hi <= {high:g}, got {list(r)}")
    return r


@dataclass(frozen=True)
class Lowpass(Effect):
    """Band limiting: a Butterworth low-pass of order ``order`` at a cutoff drawn uniformly from
    ``cutoff`` (Hz), applied forward and backward (zero phase: nothing moves in time), with
    probability ``prob``; a cutoff at or above the Nyquist frequency leaves the audio as it is.
    Telephone speech is cut near 3.4 kHz.  Audio shards only."""

    name: ClassVar[str] = "lowpass"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 50  # after noise and clipping: the channel limits what the microphone took
    uniforms: ClassVar[int | None] = 2  # cutoff, whether

    cutoff: tuple[float, float] = (2000.0, 4000.0)
    filter_order: int = 8
    prob: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "cutoff", _range(self.cutoff, "lowpass cutoff (Hz)", 50.0, 96000.0))
        if isinstance(self.filter_order, bool) or not isinstance(self.filter_order, int) \
                or not 1 <= self.filter_order <= 20:
            raise ValueError(f"augment lowpass filter_order must be a whole number in [1, 20], "
                             f"got {self.filter_order!r}")
        _check_prob(self.prob, "lowpass")

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return lowpass(x, draw.sample_rate(self.name), self, draw.u)


@dataclass(frozen=True)
class Clip(Effect):
    """Clipping, as a recording made too loud: the waveform amplified by a gain drawn uniformly
    from ``gain`` (dB), then cut at 16-bit full scale, with probability ``prob`` (the gain stays:
    the features are those of the louder, clipped audio).  Audio shards only."""

    name: ClassVar[str] = "clip"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 40  # after noise: the converter clips what reached it
    uniforms: ClassVar[int | None] = 2  # gain, whether

    gain: tuple[float, float] = (0.0, 20.0)
    prob: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gain", _range(self.gain, "clip gain (dB)", -60.0, 60.0))
        _check_prob(self.prob, "clip")

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return clip(x, self, draw.u)


CODECS = ("mulaw", "opus", "mp3")  # what the codec effect codes with: 8-bit mu-law (G.711), Ogg Opus, MP3


@dataclass(frozen=True)
class Codec(Effect):
    """Lossy coding: the waveform encoded and decoded again with one of ``formats`` (drawn with
    equal chance), with probability ``prob``: ``mulaw`` (8-bit G.711 mu-law, as telephone
    networks), ``opus`` (at a bitrate drawn from ``bitrate``, bit/s; audio at 8, 12, 16, 24 or 48
    kHz) and ``mp3`` (libsndfile's default bitrate), through soundfile, in memory.  The length is
    kept.  Audio shards only."""

    name: ClassVar[str] = "codec"
    on_audio: ClassVar[bool] = True
    order: ClassVar[int] = 60  # last: what the model hears went through the channel's codec
    uniforms: ClassVar[int | None] = 3  # whether, which format, bitrate

    formats: tuple[str, ...] = ("mulaw", "opus")
    prob: float = 1.0
    bitrate: tuple[float, float] = (8000.0, 32000.0)

    def __post_init__(self) -> None:
        formats = (self.formats,) if isinstance(self.formats, str) else self.formats
        if not isinstance(formats, (list, tuple)) or not formats or any(f not in CODECS for f in formats) \
                or len(set(formats)) != len(formats):
            raise ValueError(f"augment codec formats must be some of {list(CODECS)}, each once, got {self.formats!r}")
        object.__setattr__(self, "formats", tuple(formats))
        object.__setattr__(self, "bitrate", _range(self.bitrate, "codec bitrate (bit/s)", 6000.0, 256000.0))
        _check_prob(self.prob, "codec")

    def apply(self, x: np.ndarray, draw: Draw) -> np.ndarray:
        return codec(x, draw.sample_rate(self.name), self, draw.u)


# Every effect, in the order their uniforms are laid out (Augment.layout).  Append only: an effect
# placed before another moves that one's draws, and every batch it augments changes.
EFFECTS: tuple[type[Effect], ...] = (Speed, Noise, Reverb, SpecAugment, Lowpass, Clip, Codec)

P = TypeVar("P", bound=Effect)


def _kinds() -> dict[str, type[Effect]]:
    return {kind.name: kind for kind in EFFECTS}


@dataclass(frozen=True)
class Slots:
    """Where an effect's uniforms sit in an utterance's draws: ``[start, stop)`` of stream ``stream``."""

    stream: int
    start: int
    stop: int


@dataclass(frozen=True, init=False)
class Augment:
    """What to augment with: at most one effect of each kind, kept in :data:`EFFECTS` order.
    ``Augment(Speed(), SpecAugment())``, or by name: ``Augment(speed=Speed(), noise=None)``.
    The plan draws the speed effect (:attr:`speed`); the reader applies the rest as it draws them."""

    effects: tuple[Effect, ...]

    def __init__(self, *effects: Effect, **named: Effect | None) -> None:
        kinds = _kinds()
        for name, effect in named.items():
            if name not in kinds:
                raise TypeError(f"Augment has no effect {name!r}; its effects are {list(kinds)}")
            if effect is not None and not isinstance(effect, kinds[name]):
                raise TypeError(f"Augment {name}= takes a {kinds[name].__name__}, got {type(effect).__name__}")
        given = [*effects, *(p for p in named.values() if p is not None)]
        for effect in given:
            if type(effect) not in EFFECTS:
                raise TypeError(f"Augment takes effects of {[k.__name__ for k in EFFECTS]}, got "
                                f"{type(effect).__name__}")
        names = [p.name for p in given]
        if len(set(names)) != len(names):
            raise ValueError(f"augment gives {sorted(n for n in set(names) if names.count(n) > 1)} twice")
        object.__setattr__(self, "effects", tuple(sorted(given, key=lambda p: EFFECTS.index(type(p)))))

    def get(self, kind: type[P]) -> P | None:
        """The effect of that kind, or None when it is off."""
        return next((p for p in self.effects if type(p) is kind), None)

    @property
    def speed(self) -> Speed | None:
        """The effect the plan draws (it is :class:`~wdsprep.plan.streams.PlanOptions`'s ``speed``)."""
        return self.get(Speed)

    @property
    def on_audio(self) -> bool:
        """Whether an effect acts on the waveform (audio shards only)."""
        return any(p.on_audio for p in self.effects)

    def chain(self, on_audio: bool) -> tuple[Effect, ...]:
        """The effects acting on the waveform (``on_audio``) or on the features, in the order they apply."""
        return tuple(sorted((p for p in self.effects if p.on_audio == on_audio), key=lambda p: p.order))

    def to_json(self) -> dict[str, Any]:
        """The options as plain JSON (what the loader's fingerprint and hyper-p.json hold)."""
        return json.loads(json.dumps({p.name: asdict(p) for p in self.effects}))

    def feature_effects(self) -> Augment | None:
        """What acts on the features of planned batches (all but what the plan draws); None when nothing."""
        rest = [p for p in self.effects if not p.planned]
        return Augment(*rest) if rest else None

    def check_shards(self, audio: bool) -> None:
        """ValueError when an effect acts on audio and the shards hold features (``audio`` False)."""
        on_audio = [p.name for p in self.effects if p.on_audio]
        if on_audio and not audio:
            features = " or ".join(k.name for k in EFFECTS if not k.on_audio)
            raise ValueError(f"augment {', '.join(on_audio)} act on audio: these shards hold features computed at "
                             f"pack time; pack the audio (layout flac or wav) or augment with {features} only")

    def layout(self) -> dict[str, Slots]:
        """Each effect's uniforms, laid out in :data:`EFFECTS` order.  An effect of a fixed count keeps
        its slots whether on or off, so no effect's draws move when another is turned on; an effect
        whose options set its count (SpecAugment) ends its stream, so the effects after it start
        the next stream and keep their draws whatever those options are."""
        out: dict[str, Slots] = {}
        stream = start = 0
        for kind in EFFECTS:
            effect = self.get(kind)
            width = kind.uniforms if kind.uniforms is not None else (0 if effect is None else effect.num_uniforms())
            if effect is not None:
                out[kind.name] = Slots(stream, start, start + width)
            start += width
            if kind.uniforms is None:
                stream, start = stream + 1, 0
        return out


def parse_augment(spec: Augment | Mapping[str, Any] | str | os.PathLike | None) -> Augment | None:
    """An :class:`Augment` from itself, a dict of effects (each a dict or its dataclass), JSON text,
    or the path of a JSON file; None for None or ``{}``.  ValueError naming what is wrong."""
    if spec is None or isinstance(spec, Augment):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        text = str(spec)
        if not text.lstrip().startswith("{"):
            try:
                text = read_small(spec, SPEC_LIMIT, "an augment spec").decode("utf-8")
            except OSError as e:
                raise ValueError(f"augment: {spec!r} is neither JSON nor a readable file ({e.strerror})") from None
            except ValueError as e:  # a FIFO, a device, a huge file; or not UTF-8
                raise ValueError(f"augment: {e}") from None
        try:
            spec = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"augment: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(spec, Mapping):
        raise ValueError(f"augment must be a dict such as {{\"speed\": {{\"factors\": [0.9, 1.0, 1.1]}}}}, "
                         f"got {type(spec).__name__}")
    kinds = _kinds()
    unknown = sorted(set(spec) - set(kinds))
    if unknown:
        raise ValueError(f"augment has {unknown}; it takes {sorted(kinds)}")
    effects: list[Effect] = []
    for name, value in spec.items():
        kind = kinds[name]
        if value is None:
            continue
        if isinstance(value, kind):
            effects.append(value)
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"augment {name} must be an object of options, got {value!r}")
        known = {f.name for f in fields(kind)}
        extra = sorted(set(value) - known)
        if extra:
            raise ValueError(f"augment {name} has {extra}; it takes {sorted(known)}")
        try:
            effects.append(kind(**value))
        except TypeError as e:  # a required option missing
            raise ValueError(f"augment {name}: {e}") from None
    return Augment(*effects) if effects else None


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


NO_UNIFORMS = np.zeros(0)  # the uniforms of an effect that reads none


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

    def uniforms(self, row: int, n: int, stream: int = 0) -> np.ndarray:
        """Row ``row``'s first ``n`` uniforms of ``stream``, in [0, 1)."""
        return self.generator(row, 0 if stream == 0 else _STREAM + stream).random(n)

    def read(self, row: int, layout: Mapping[str, Slots]) -> dict[str, np.ndarray]:
        """Row ``row``'s uniforms of each effect of ``layout`` (:meth:`Augment.layout`)."""
        widths: dict[int, int] = {}
        for s in layout.values():
            widths[s.stream] = max(widths.get(s.stream, 0), s.stop)
        u = {stream: self.uniforms(row, n, stream) for stream, n in widths.items() if n}
        return {name: u[s.stream][s.start:s.stop] if s.stop > s.start else NO_UNIFORMS for name, s in layout.items()}

    def dither(self, row: int) -> np.random.Generator:
        """A generator of row ``row``'s own for the fbank's dither."""
        return self.generator(row, _DITHER)


# -- transforms (pure: a waveform or features and the effect's uniforms in, the result out) ---------

def add_noise(wave: np.ndarray, bank: Sequence[np.ndarray], opts: Noise,
              u: np.ndarray) -> tuple[np.ndarray, float | None]:
    """``wave`` plus a stretch of a noise recording of ``bank`` at the drawn SNR; (result, SNR in dB,
    or None when the draw said no or the utterance is silent).  ``u``: the effect's 4 uniforms."""
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


def add_reverb(wave: np.ndarray, bank: Sequence[np.ndarray], opts: Reverb, u: np.ndarray) -> np.ndarray:
    """``wave`` convolved with a drawn impulse response, shifted so its direct path (the response's
    peak) stays in place, cut to the utterance's length and scaled back to its power.  ``u``: the
    effect's 2 uniforms."""
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
    """``feats`` (frames x bins) time-warped and masked as the effect's uniforms ``u`` say (a new array)."""
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


def lowpass(wave: np.ndarray, rate: int, opts: Lowpass, u: np.ndarray) -> np.ndarray:
    """``wave`` low-passed at the drawn cutoff (zero phase, the same length).  ``u``: the effect's 2 uniforms."""
    if u[1] >= opts.prob:
        return wave
    cutoff = opts.cutoff[0] + float(u[0]) * (opts.cutoff[1] - opts.cutoff[0])
    if cutoff >= rate / 2:
        return wave
    from scipy.signal import butter, sosfiltfilt

    sos = butter(opts.filter_order, cutoff, btype="low", fs=rate, output="sos")
    if len(wave) <= 3 * (2 * len(sos) + 1):  # sosfiltfilt's padding needs more samples than an utterance this short
        return wave
    return sosfiltfilt(sos, wave.astype(np.float64)).astype(np.float32)


FULL_SCALE = 32767.0  # of the 16-bit samples the waveforms are in


def clip(wave: np.ndarray, opts: Clip, u: np.ndarray) -> np.ndarray:
    """``wave`` times the drawn gain, cut at 16-bit full scale.  ``u``: the effect's 2 uniforms."""
    if u[1] >= opts.prob:
        return wave
    db = opts.gain[0] + float(u[0]) * (opts.gain[1] - opts.gain[0])
    return np.clip(wave * np.float32(10.0 ** (db / 20.0)), -FULL_SCALE, FULL_SCALE).astype(np.float32)


_MU = 255.0


def mulaw(wave: np.ndarray) -> np.ndarray:
    """``wave`` (16-bit units) through 8-bit mu-law (G.711's companding, mu = 255) and back."""
    x = np.clip(wave.astype(np.float64) / 32768.0, -1.0, 1.0)
    y = np.sign(x) * np.log1p(_MU * np.abs(x)) / math.log1p(_MU)
    code = np.rint((y + 1.0) * 127.5)  # 0 .. 255: the 8 bits
    y = code / 127.5 - 1.0
    return (np.sign(y) * np.expm1(np.abs(y) * math.log1p(_MU)) / _MU * 32768.0).astype(np.float32)


def codec(wave: np.ndarray, rate: int, opts: Codec, u: np.ndarray) -> np.ndarray:
    """``wave`` coded with the drawn format and decoded again, at its length.  ``u``: the effect's 3 uniforms."""
    if u[0] >= opts.prob or not len(wave):
        return wave
    fmt = opts.formats[min(int(u[1] * len(opts.formats)), len(opts.formats) - 1)]
    if fmt == "mulaw":
        return mulaw(wave)
    import io

    import soundfile as sf

    from wdsprep.format.audio import OPUS_RATES, audio_header, decode_audio, encode_audio

    pcm = np.clip(np.rint(wave), -32768, 32767).astype(np.int16)
    if fmt == "opus":
        if rate not in OPUS_RATES:
            raise ValueError(f"augment codec opus codes audio at {', '.join(map(str, OPUS_RATES))} Hz, not {rate}: "
                             f"leave opus out of its formats for this corpus")
        bitrate = int(round(opts.bitrate[0] + float(u[2]) * (opts.bitrate[1] - opts.bitrate[0])))
        data, _ = encode_audio(pcm, rate, "opus", bitrate=bitrate)
        out = decode_audio(data, audio_header("opus", data, len(data)))
    else:
        buf = io.BytesIO()
        sf.write(buf, pcm, rate, format="MP3", subtype="MPEG_LAYER_III")
        buf.seek(0)
        out, _ = sf.read(buf, dtype="int16")
        out = out if out.ndim == 1 else out[:, 0]
    out = out[:len(wave)]
    if len(out) < len(wave):  # the plan counted the utterance's length: keep it
        out = np.concatenate([out, np.zeros(len(wave) - len(out), out.dtype)])
    return out.astype(np.float32)
