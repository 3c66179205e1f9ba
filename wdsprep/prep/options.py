"""The options of the Kaldi-input steps, each in its one home: what fbank features depend on besides
the audio (:class:`FbankOptions`: every backend, the pack and the loader share them), the audio's
segments (:class:`AudioInputs`) and how a job runs (:class:`JobOptions`).

Torch-free, so the plan (``dry-run --plan``) can say what features audio shards will give without
importing a backend.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from wdsprep.format.audio import FBANK_BACKENDS, MAX_MEL_BINS
from wdsprep.options import NUMBER, PATH, SWITCH, TOGGLE, choice, option
from wdsprep.prep.parallel import check_nj

# The largest dither that means anything: the 16-bit full scale the samples are read at.
MAX_DITHER = 32768.0
# A header rate above this is no recording's (the loader and pack refuse it before resampling).
MAX_SAMPLE_RATE = 768_000


@dataclass(frozen=True)
class FbankOptions:
    """What the features depend on (besides the audio): ``compute-fbank-feats``'s options, the one
    home of ``fbank``'s and ``pack-audio``'s flags and of their Python arguments."""

    num_mel_bins: int = option(80, "mel bins of the fbank features", ld=False, plan=True)
    sample_rate: int = option(16000, "the features' sample rate: audio at another rate is resampled", ld=False,
                              plan=True)
    dither: float = option(0.0, "Kaldi's default is 1.0; 0 makes features reproducible", kind=NUMBER, ld=False,
                           plan=True)
    backend: str = option("auto", "auto: torchaudio if it imports, else kaldi-native-fbank", ld=False, plan=True,
                          kind=choice("auto", *FBANK_BACKENDS))
    channel: int | None = option(None, "the one channel of multichannel audio to use, unless the segments line names "
                                       "one (default: every channel: features from their mean, as the loader "
                                       "downmixes; audio shards keep them all)", ld=False, plan=True, when_set=True)

    def __post_init__(self) -> None:
        for name in ("num_mel_bins", "sample_rate", "channel"):
            v = getattr(self, name)
            if v is None and name == "channel":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"fbank {name} must be a whole number, got {v!r}")
        if not 1 <= self.num_mel_bins <= MAX_MEL_BINS:  # each bin costs memory per frame of every batch
            raise ValueError(f"fbank num_mel_bins must be in [1, {MAX_MEL_BINS:,}] (80 is usual), got "
                             f"{self.num_mel_bins:,}")
        if not 1000 <= self.sample_rate <= MAX_SAMPLE_RATE:
            raise ValueError(f"sample_rate {self.sample_rate} Hz is not a speech sample rate")
        d = self.dither
        if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0 <= d <= MAX_DITHER:
            # NaN or 1e300 would turn every utterance's features into NaN/Inf, each then dropped
            raise ValueError(f"fbank dither must be a number in [0, {MAX_DITHER:g}] (in 16-bit sample units; "
                             f"Kaldi's default 1.0, 0 for reproducible features), got {d!r}")
        if not isinstance(self.backend, str) or self.backend not in ("auto", *FBANK_BACKENDS):
            raise ValueError(f"unknown fbank backend {self.backend!r}; choose auto or one of {list(FBANK_BACKENDS)}")
        if self.channel is not None and self.channel < 0:
            raise ValueError(f"fbank channel must be >= 0 (or None: the mean of the channels), got {self.channel}")


@dataclass(frozen=True)
class AudioInputs:
    """What a job reading a ``wav.scp`` reads beside it."""

    segments: str | None = option(None, "Kaldi segments: 'uttid recid start end [channel]', end -1 = to the end",
                                  kind=PATH, metavar="SEGMENTS", ld=False)


@dataclass(frozen=True)
class JobOptions:
    """How a job (``fbank``, a pack) runs: its output does not depend on them."""

    nj: int = option(1, "worker processes", ld=False)
    strict: bool = option(False, "exit 1 if any utterance is not written or is flagged (after writing the report, "
                                 "which names each)", kind=SWITCH, ld=False,
                          doc="raise StrictError (exit 1), after writing the report, if any utterance was not "
                              "written, has an empty transcript or no speaker in utt2spk")
    progress: bool | None = option(None, "progress bar (default: only on a terminal)", kind=TOGGLE, ld=False)

    def __post_init__(self) -> None:
        check_nj(self.nj)
