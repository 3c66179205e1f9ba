"""Frames and hours: every count of audio in wdsprep is in feature frames of 10 ms (Kaldi's shift)."""

FRAME_SHIFT_MS = 10.0
FRAMES_PER_SECOND = 100
FRAMES_PER_HOUR = FRAMES_PER_SECOND * 3600


def hours(frames: int | float) -> float:
    """Hours of audio in ``frames`` frames."""
    return float(frames) / FRAMES_PER_HOUR
