"""What fbank features depend on besides the audio: the options every backend, the pack and the loader share.

Torch-free, so the plan (``dry-run --plan``) can say what features audio shards will give without
importing a backend.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from wdsprep.format.audio import FBANK_BACKENDS, MAX_MEL_BINS

# The largest dither that means anything: the 16-bit full scale the samples are read at.
MAX_DITHER = 32768.0
# A header rate above this is no recording's (the loader and pack refuse it before resampling).
MAX_SAMPLE_RATE = 768_000


@dataclass(frozen=True)
class FbankOptions:
    """What the features depend on (besides the audio)."""

    num_mel_bins: int = 80
    sample_rate: int = 16000
    dither: float = 0.0
    backend: str = "auto"
    channel: int = 0

    def __post_init__(self) -> None:
        for name in ("num_mel_bins", "sample_rate", "channel"):
            v = getattr(self, name)
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
        if self.channel < 0:
            raise ValueError(f"fbank channel must be >= 0, got {self.channel}")
