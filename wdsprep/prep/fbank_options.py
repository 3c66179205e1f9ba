"""What fbank features depend on besides the audio: the options every backend, the pack and the loader share.

Torch-free, so the plan (``dry-run --plan``) can say what features audio shards will give without
importing a backend.
"""

from __future__ import annotations

from dataclasses import dataclass


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
