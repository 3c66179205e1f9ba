"""Frames and hours: every count of audio in wdsprep is in feature frames of 10 ms (Kaldi's shift).

Where a person gives a length in seconds (``max_duration``, ``--filter-group :5s``),
:func:`seconds_to_frames` turns it into these frames exactly: ``s`` seconds are ``s x 100`` frames.
"""

from __future__ import annotations

import math

import numpy as np

FRAME_SHIFT_MS = 10.0
FRAME_LENGTH_MS = 25.0  # Kaldi's analysis window
FRAMES_PER_SECOND = 100
FRAMES_PER_HOUR = FRAMES_PER_SECOND * 3600


def frame_samples(sample_rate: int) -> tuple[int, int]:
    """(window, shift) in samples at ``sample_rate``: Kaldi's 25 ms and 10 ms, truncated as Kaldi does."""
    return int(sample_rate * FRAME_LENGTH_MS / 1000), int(sample_rate * FRAME_SHIFT_MS / 1000)


def fbank_frames(num_samples: int | np.ndarray, sample_rate: int) -> int | np.ndarray:
    """Frames Kaldi's fbank gives for ``num_samples`` samples (snip_edges): ``1 + (n - window) // shift``,
    0 below one window.  Element-wise for an array: what an audio shard's index plans with."""
    window, shift = frame_samples(sample_rate)
    if isinstance(num_samples, np.ndarray):
        n = num_samples.astype(np.int64, copy=False)
        return np.where(n < window, 0, 1 + (n - window) // shift)
    return 0 if num_samples < window else 1 + (int(num_samples) - window) // shift


# Below this a product of seconds and 100 is taken as the whole number it is meant to be
# (0.29 * 100 == 28.999999999999996 in binary floating point).
_ROUNDING = 1e-6


def seconds_to_frames(seconds: float, *, what: str, bound: str = "upper") -> int:
    """``seconds`` in 10 ms frames (:data:`FRAMES_PER_SECOND` a second), exactly where the seconds
    are a whole number of frames.  Otherwise ``bound`` says which way: ``"upper"`` (a batch's budget:
    the most frames within the seconds, rounded down) or ``"lower"`` (a group's edge, ``LO <= frames``:
    the fewest frames at or above them, rounded up).  ValueError naming ``what`` for anything but a
    finite number of seconds >= 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {seconds!r}")
    frames = seconds * FRAMES_PER_SECOND
    near = round(frames)
    if abs(frames - near) < _ROUNDING:
        return int(near)
    return math.floor(frames) if bound == "upper" else math.ceil(frames)


def hours(frames: int | float) -> float:
    """Hours of audio in ``frames`` frames."""
    return float(frames) / FRAMES_PER_HOUR


def resampled_lengths(samples: np.ndarray, rates: np.ndarray, sample_rate: int) -> np.ndarray:
    """Samples each row has after exact rational resampling (scipy's ``resample_poly``, what the
    readers and ``prep.audio.resample`` use) from its rate to ``sample_rate``: ``ceil(n * up / down)``
    with up/down the reduced ratio, in integers (int64 [N])."""
    n = np.asarray(samples, np.int64)
    orig = np.asarray(rates, np.int64)
    g = np.gcd(orig, sample_rate)
    up, down = sample_rate // g, orig // g
    return -(-n * up // down)
