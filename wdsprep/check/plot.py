"""Plots of ``inspect`` and ``dry-run``: what a person would rather look at than read.

Plain data in (arrays, dicts, names), a PNG out: this module knows no result class of the
commands that draw with it, so it imports none of them (and none imports it back at load time).
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from wdsprep.files import atomic_path
from wdsprep.units import FRAMES_PER_SECOND, hours


def thousands(n: int) -> str:
    """A count as a short label (the plots' ticks, inspect's table): ``20000`` -> ``20k``; one that
    is no whole thousand as it is."""
    return f"{n // 1000}k" if n and n % 1000 == 0 else str(n)


def plot_inspect(path: str | os.PathLike, groups: Sequence[tuple[str, np.ndarray]],
                 efficiency: Mapping[str, Mapping[int, float]], title: str, *, overall: str | None = None) -> None:
    """One PNG: a frame-length histogram per group (``(name, frames of each utterance)``, empty
    ones left out) and the padding-efficiency curves (``{curve: {max_frames: efficiency}}``, the
    one named ``overall`` drawn bold), under ``title``; written atomically."""
    # The object API with the Agg canvas: no pyplot, so a caller's interactive backend is left alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups = [(name, np.asarray(frames)) for name, frames in groups if len(frames)]
    panels = len(groups) + (1 if efficiency else 0)
    if panels == 0:
        raise ValueError("nothing to plot: the shards hold no readable utterances")
    ncols = min(3, panels)
    nrows = -(-panels // ncols)
    fig = Figure(figsize=(5.2 * ncols, 3.9 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (name, frames) in zip(axes, groups):
        ax.hist(frames, bins=min(50, max(5, int(np.sqrt(len(frames))))), color="tab:blue", edgecolor="white")
        ax.set_title(f"{name}: {len(frames):,} utts, {hours(frames.sum()):.2f} h", fontsize=10)
        ax.set_xlabel("frames (10 ms)")
        ax.set_ylabel("utterances")
        sec = ax.secondary_xaxis("top", functions=(lambda f: f / FRAMES_PER_SECOND, lambda s: s * FRAMES_PER_SECOND))
        sec.set_xlabel("seconds", fontsize=9)
    if efficiency:
        ax = axes[len(groups)]
        for name, curve in efficiency.items():
            mfs = sorted(curve)
            ax.plot(mfs, [curve[m] for m in mfs], marker="o", label=name,
                    linewidth=2.5 if name == overall else 1.2, color="black" if name == overall else None)
        ax.set_xscale("log")
        mfs = sorted({m for c in efficiency.values() for m in c})
        ax.set_xticks(mfs, [thousands(m) for m in mfs])
        ax.minorticks_off()
        ax.set_ylim(top=1.005)
        ax.grid(True, alpha=0.3)
        ax.set_title("padding efficiency of the loader's batches", fontsize=10)
        ax.set_xlabel("max_frames (padded frames per batch)")
        ax.set_ylabel("real / padded frames")
        ax.legend(fontsize=8, loc="best")
    for ax in axes[panels:]:
        ax.set_visible(False)
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def plot_mixture(utts: np.ndarray, scheduled: np.ndarray, names: tuple[str, ...] | list[str],
                 path: str | os.PathLike, *, first_step: int = 0, window: int = 50, what: str = "realized") -> None:
    """One PNG: each corpus's share of the utterances, ``what`` (realized, or planned: ``utts``
    [steps, corpora], summed over ranks, in a window of ``window`` steps around each step) against
    the schedule (``scheduled`` [steps, corpora]); written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    utts = np.asarray(utts, np.float64)
    if not len(utts):
        raise ValueError("nothing to plot: no steps")
    steps = first_step + np.arange(len(utts))
    kernel = np.ones(min(window, len(utts)))
    per = np.stack([np.convolve(utts[:, c], kernel, mode="same") for c in range(utts.shape[1])], axis=1)
    total = per.sum(axis=1, keepdims=True)
    realized = np.divide(per, total, out=np.full_like(per, np.nan), where=total > 0)
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for c, name in enumerate(names):
        color = f"C{c}"
        ax.plot(steps, scheduled[:, c], color=color, linestyle="--", linewidth=1.5, label=f"{name}: scheduled")
        ax.plot(steps, realized[:, c], color=color, linewidth=1.2,
                label=f"{name}: {what} ({len(kernel)}-step window)")
    ax.set_xlabel("global step")
    ax.set_ylabel("share of the utterances")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=2, loc="upper center")
    ax.set_title(f"mixture over {len(utts):,} steps", fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
