"""Frames and hours: every count of audio in wdsprep is in feature frames of 10 ms (Kaldi's shift)."""

FRAME_SHIFT_MS = 10.0
FRAMES_PER_SECOND = 100
FRAMES_PER_HOUR = FRAMES_PER_SECOND * 3600


def hours(frames: int | float) -> float:
    """Hours of audio in ``frames`` frames."""
    return float(frames) / FRAMES_PER_HOUR


def thousands(n: int) -> str:
    """A count as a short label: ``20000`` -> ``20k``; one that is no whole thousand as it is."""
    return f"{n // 1000}k" if n and n % 1000 == 0 else str(n)
