"""What an epoch did, as typed counts that add up across workers and ranks.

:class:`BatchTally` is the one place real ÷ padded frames (and label tokens) is computed;
:class:`WorkerTally` is what a worker sends the main process with each item (counts since its
previous item); :class:`LoaderStats` is one rank's epoch, as ``loader.stats``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable, Sequence

import numpy as np

from wdsprep.units import hours


@dataclass
class BatchTally:
    """Batches' utterances, frames and, where known, label tokens."""

    batches: int = 0
    utterances: int = 0
    real_frames: int = 0
    padded_frames: int = 0  # B x longest, summed over batches
    oversize_batches: int = 0  # a single utterance longer than max_frames
    real_tokens: int = 0  # labels' tokens, in the batches given with their tokens
    padded_tokens: int = 0  # B x longest label, summed over those batches

    def add(self, frames: np.ndarray | Sequence[int], max_frames: int | None = None,
            tokens: np.ndarray | Sequence[int] | None = None) -> None:
        """One batch, by its utterances' frame counts (and its labels' lengths in tokens, when known)."""
        if not len(frames):
            return
        longest = int(max(frames))
        self.batches += 1
        self.utterances += len(frames)
        self.real_frames += int(sum(frames))
        self.padded_frames += len(frames) * longest
        self.oversize_batches += int(max_frames is not None and longest > max_frames)
        if tokens is not None and len(tokens):
            self.real_tokens += int(sum(tokens))
            self.padded_tokens += len(tokens) * int(max(tokens))

    def merge(self, other: BatchTally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def padding_efficiency(self) -> float:
        """Real / padded frames (NaN before any frames)."""
        return efficiency(self.real_frames, self.padded_frames)

    @property
    def label_padding_efficiency(self) -> float:
        """Real / padded label tokens (NaN before any batch given with its tokens)."""
        return efficiency(self.real_tokens, self.padded_tokens)


def efficiency(real: int, padded: int) -> float:
    """Real / padded frames (or tokens); NaN when nothing was padded (no batch yet)."""
    return real / padded if padded else math.nan


def padding_efficiency(batches: Iterable[Sequence[int]]) -> float:
    """Real / padded frames over batches given as their utterances' frame counts; NaN for none."""
    t = BatchTally()
    for b in batches:
        t.add(b)
    return t.padding_efficiency


@dataclass
class WorkerTally:
    """Counts a worker sends with an item, since its previous item; the main process adds them up."""

    read: int = 0  # samples decoded from shards
    corrupt_shards: int = 0
    stale_shards: int = 0  # changed after they were indexed: refused
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> planned utterances not in their batch
    retries: int = 0  # fetches of remote shards tried again (a dropped connection, 5xx, a cut-off body)
    unreachable_shards: int = 0  # remote shards still not fetched when the retries were spent: skipped
    fetched_bytes: int = 0  # bytes of remote shards brought here (downloads; cache hits excluded)

    def take(self) -> WorkerTally:
        """These counts, leaving this tally at zero."""
        out = WorkerTally(self.read, self.corrupt_shards, self.stale_shards, self.dropped, self.retries,
                          self.unreachable_shards, self.fetched_bytes)
        self.read = self.corrupt_shards = self.stale_shards = 0
        self.retries = self.unreachable_shards = self.fetched_bytes = 0
        self.dropped = Counter()
        return out


@dataclass
class CorpusStats:
    """One corpus's part of what a rank yielded; ``epochs``: how far the corpus is through its
    epochs (3.25: three handed out whole and a quarter of the fourth), for a mixed loader."""

    utterances: int = 0
    frames: int = 0
    epochs: float | None = None
    shuffle: dict[str, Any] | None = None  # its batches' shuffle report (plan/quality.py), None without speakers

    @property
    def hours(self) -> float:
        return hours(self.frames)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hours": self.hours}


@dataclass
class LoaderStats:
    """What one epoch of this rank did so far; ``dropped`` holds every sample not in a batch, by reason."""

    epoch: int = 0
    steps: int = 0  # batches yielded in the epoch (a resumed epoch counts the runs before it)
    planned_steps: int = 0  # batches this iteration yields: len(loader)
    utterances: int = 0  # in the batches this iteration yielded
    assigned: int = 0  # utterances the plan put in this iteration's batches of this rank
    read: int = 0  # samples decoded from shards (a shard shared to even out ranks is read whole)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> planned utterances not delivered
    corrupt_shards: int = 0
    stale_shards: int = 0
    retries: int = 0  # remote fetches tried again; each one is a fetch, never a batch, repeated
    unreachable_shards: int = 0  # remote shards skipped after the retries (on_error="warn"), utterances in dropped
    fetched_bytes: int = 0  # remote shard bytes downloaded by this rank's readers
    real_frames: int = 0
    padded_frames: int = 0
    oversize_batches: int = 0
    real_tokens: int = 0  # labels' tokens in the batches yielded
    padded_tokens: int = 0  # B x longest label, summed over the batches yielded
    # Utterances of the epoch's discarded tail: the planned batches left over when the world size
    # does not divide them (fewer than one per rank); the same on every rank.
    discarded: int = 0
    discarded_fraction: float = 0.0
    seconds: float = 0.0
    # How random this rank's planned batches are (plan/quality.py: speakers per batch against a
    # random draw, speaker recurrence, lag-1 length correlation); None when the index has no speakers.
    shuffle: dict[str, Any] | None = None
    corpora: dict[str, CorpusStats] = field(default_factory=dict)  # named corpora: what each gave
    # Following growing folders: how much of the final corpus the epoch is planned over (shards,
    # utterances and hours published against the pack's plan: plan/growing.coverage); else None.
    growing: dict[str, Any] | None = None

    def add_batches(self, t: BatchTally) -> None:
        """Batches this rank yielded."""
        self.steps += t.batches
        self.utterances += t.utterances
        self.real_frames += t.real_frames
        self.padded_frames += t.padded_frames
        self.oversize_batches += t.oversize_batches
        self.real_tokens += t.real_tokens
        self.padded_tokens += t.padded_tokens

    def add_corpora(self, names: Sequence[str], corpus: np.ndarray, frames: np.ndarray) -> None:
        """A batch's utterances, by corpus (``corpus[i]`` indexes ``names``)."""
        for c in np.unique(corpus).tolist():
            mine = corpus == c
            got = self.corpora.setdefault(names[c], CorpusStats())
            got.utterances += int(mine.sum())
            got.frames += int(frames[mine].sum())

    def add_worker(self, t: WorkerTally) -> None:
        self.read += t.read
        self.corrupt_shards += t.corrupt_shards
        self.stale_shards += t.stale_shards
        self.retries += t.retries
        self.unreachable_shards += t.unreachable_shards
        self.fetched_bytes += t.fetched_bytes
        if t.dropped:
            self.dropped = dict(Counter(self.dropped) + t.dropped)

    @property
    def padding_efficiency(self) -> float:
        """Real / padded frames over the batches yielded (NaN before the first)."""
        return efficiency(self.real_frames, self.padded_frames)

    @property
    def label_padding_efficiency(self) -> float:
        """Real / padded label tokens over the batches yielded (NaN before the first)."""
        return efficiency(self.real_tokens, self.padded_tokens)

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "padding_efficiency": self.padding_efficiency,
                "label_padding_efficiency": self.label_padding_efficiency,
                "corpora": {name: c.to_dict() for name, c in self.corpora.items()}}


@dataclass
class StepCosts:
    """What each rank's batch costs at each step (``costs[rank, step]``; NaN: no batch), and how
    evenly: the figures DDP steps are judged by, since every step waits for its slowest rank."""

    costs: np.ndarray  # float64 [world size, steps]
    model: str  # what the costs are: "padded frames (B x longest)" or the cost model

    @property
    def step_wait(self) -> float:
        """Time every step waits for its slowest rank, as a share of the time it works:
        sum over steps of the slowest rank's cost / sum of the ranks' mean cost, minus 1."""
        full = self.costs[:, ~np.isnan(self.costs).any(axis=0)]  # steps every rank takes (all, in training)
        mean = float(full.mean(axis=0).sum()) if full.size else 0.0
        return float(full.max(axis=0).sum()) / mean - 1 if mean else math.nan

    @property
    def largest_over_median(self) -> float:
        """The costliest batch against the median one: what memory is sized for, against the typical."""
        c = self.costs[~np.isnan(self.costs)]
        median = float(np.median(c)) if c.size else 0.0
        return float(c.max()) / median if median else math.nan

    def to_dict(self) -> dict[str, Any]:
        c = self.costs[~np.isnan(self.costs)]
        return {"model": self.model, "step_wait": self.step_wait, "largest_over_median": self.largest_over_median,
                "largest": float(c.max()) if c.size else math.nan,
                "median": float(np.median(c)) if c.size else math.nan}
