"""Where every batch of every epoch comes from: one epoch source for one corpus and for many.

An epoch source is pure (no I/O, no torch; it reads only the index): for any epoch and any
position in it, it says how many steps each rank takes, which planned batches each rank and
each of its readers yields in which order, where the epoch stands after ``k`` steps, and how a
saved position is read back.  :func:`epoch_source` builds it from the shard set, the one
composition ``make_loader`` and ``dry-run --plan`` both call; it alone decides whether corpora
are mixed:

- one corpus (or, in dev mode, named corpora read once each): ``epochs.CorpusEpochs``, its own
  plan every epoch dealt to ranks and readers: the same batches on every topology;
- named corpora in training: ``mix.epochs.MixedEpochs``, each corpus with epochs of its own, a
  corpus drawn per step by the mixture.

Both are made of :class:`~wdsprep.loading.corpus.Corpus` units and name every planned batch the
same way, ``(corpus, corpus epoch, stream, batch)``.
"""

from __future__ import annotations

import os
import zlib
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from wdsprep.format.shardlist import expand_shards
from wdsprep.loading.corpus import Corpus
from wdsprep.loading.epochs import CorpusEpochs
from wdsprep.loading.growing import View, published_shards
from wdsprep.loading.mix.epochs import MixedEpochs
from wdsprep.loading.mix.weights import Mixture, SchedulePoints, make_mixture
from wdsprep.loading.plan import BatchId, Planned, PlanOptions, TooFewBatches, Window
from wdsprep.loading.shardset import ShardSet, indexed_shards, shard_set, union
from wdsprep.loading.state import SavedState
from wdsprep.loading.stats import LoaderStats
from wdsprep.loading.tokens import LabelTokens
from wdsprep.remote.fetch import RetryPolicy
from wdsprep.remote.listing import lister
from wdsprep.tokenizer import Tokenizer, derive_seed
from wdsprep.units import hours

Trset = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike | Sequence[str]]


class Position(Protocol):
    """Where an epoch stands: a few numbers (JSON-able through the source)."""

    epoch: int

    @property
    def step(self) -> int: ...


class EpochRun(Protocol):
    """The rest of an epoch (or its next steps) from a position, on the source's topology."""

    complete: bool

    def steps(self, rank: int) -> int:
        """Batches ``rank`` yields: ``len(loader)``."""

    def windows(self, rank: int) -> Iterator[Window]:
        """The batches ``rank`` yields, in the order the trainer gets them, a window at a time (with
        what the plan put in them and left out), dealt as they are asked for."""

    def reader_batches(self, rank: int, worker: int) -> tuple[bool, Iterator[list[Planned]]]:
        """(whether the reader hands out a placeholder first, its batches with their rows in order,
        a window at a time)."""

    def after(self, rank: int, steps: int) -> Any:
        """Where the epoch stands after this run's first ``steps`` steps."""

    def planned_stats(self, rank: int) -> LoaderStats:
        """The figures known at the run's start: steps, the discarded tail, the shuffle report."""

    def discarded(self) -> list[BatchId]:
        """The planned batches no rank yields (the tail when ranks do not divide them)."""

    def idle_warning(self, rank: int) -> str | None:
        """Why some of ``rank``'s workers get nothing, when more streams would keep them busy."""


class EpochSource(Protocol):
    """Every batch of every epoch on one topology; see the module's docstring."""

    kind: str  # what the resume state says it is: "corpus" or "mixture"
    corpora: tuple[str, ...]  # the named corpora (``("",)`` for one unnamed): ``batch.corpus`` indexes them
    shards: ShardSet
    mixture: Mixture | None
    world_size: int
    num_workers: int
    num_streams: int  # canonical streams of every corpus, summed

    def start(self, epoch: int) -> Any:
        """Where an iteration of ``epoch`` starts: a loaded position in it, else the epoch's start."""

    def resume(self, at: Any) -> None:
        """Start from ``at`` (a loaded position)."""

    def continue_from(self, old: Any, epoch: int) -> None:
        """Go on where ``old`` (the same source over fewer shards: a growing loader's previous epoch's)
        stands at the start of ``epoch``."""

    def run(self, at: Any) -> EpochRun: ...

    def rows(self, bid: BatchId) -> np.ndarray:
        """A planned batch's rows in the shard set."""

    def unit(self, c: int) -> Corpus:
        """The corpus ``c`` of a batch id is planned by: its seed, first row and speed draws (what
        the augmentation of its utterances is drawn from)."""

    def planned_frames(self, bid: BatchId) -> np.ndarray:
        """The frames of a planned batch's rows as planned (after speed perturbation)."""

    def complete(self, at: Any) -> bool:
        """Whether the epoch was run to its end (on the topology that ran it)."""

    def global_step(self, at: Any) -> int | None:
        """Steps since training began, where a schedule needs them (None: no schedule clock)."""

    def progress(self, at: Any) -> list[float] | None:
        """How far each corpus is through epochs of its own (None: they are the loader's)."""

    def position(self, saved: SavedState) -> Any:
        """A saved position, checked against the plan (StateError naming what is wrong)."""

    def position_json(self, at: Any) -> dict[str, Any]: ...

    def note(self, at: Any) -> dict[str, Any]:
        """What a reader process is told to start an iteration from ``at`` (JSON-able)."""

    def from_note(self, note: Mapping[str, Any]) -> Any: ...


def load_shards(trset: Trset, *, policy: RetryPolicy | None = None, derive_speakers: bool = False,
                tokenizer: Tokenizer | None = None, view: View | None = None, view_wait: float = 0.0) -> ShardSet:
    """The shard set of ``trset``: a pattern or list of them, or named corpora ``{name: pattern(s)}``;
    with ``tokenizer``, every label's length in its tokens comes with it (``loading/tokens.py``).
    ``view``: folders a pack is still writing are followed, as far as the view says they were
    published (``loading/growing.py``; ``view_wait``: seconds to wait to see them, for a view taken
    by another rank); without it such a folder is refused."""
    tokens = None if tokenizer is None else LabelTokens(tokenizer, policy=policy)
    kw = {"policy": policy, "derive_speakers": derive_speakers, "tokens": tokens}

    def one(patterns: Any) -> ShardSet:
        if view is None:
            return indexed_shards(patterns, **kw)
        listed = expand_shards(patterns, growing=True, list_glob=lister(policy or RetryPolicy()))
        urls, indexes = published_shards(listed, view, wait=view_wait)
        return shard_set(urls, indexes=indexes, **kw)

    if isinstance(trset, Mapping):
        return union({str(name): one(patterns) for name, patterns in trset.items()})
    return one(trset)


def mixture_for(shards: ShardSet, *, weights: Mapping[str, float] | None = None, temperature: float | None = None,
                schedule: SchedulePoints | None = None) -> Mixture:
    """The mixture of the named corpora of ``shards`` given one way (their own sizes when none)."""
    parts = [shards.part(c) for c in range(len(shards.corpora))]
    return make_mixture(shards.corpora, weights=weights, temperature=temperature, schedule=schedule,
                        hours=[hours(int(p.frames.sum())) for p in parts], utts=[p.num_utts for p in parts])


def epoch_source(shards: ShardSet, options: PlanOptions, *, seed: int, world_size: int, num_workers: int,
                 named: bool = False, weights: Mapping[str, float] | None = None, temperature: float | None = None,
                 schedule: SchedulePoints | None = None, steps_per_epoch: int | None = None) -> EpochSource:
    """The epoch source of ``shards`` on ``world_size`` ranks of ``num_workers`` readers each.

    ``named``: the corpora were given by name; in training several of them, or one with mixing
    options, are mixed.  ``shards.speakers`` (when known) feeds the shuffle report, and the plan
    itself under ``options.max_utts_per_speaker``.
    """
    mixing = {"weights": weights, "temperature": temperature, "schedule": schedule, "steps_per_epoch": steps_per_epoch}
    given = [k for k, v in mixing.items() if v is not None]
    if given and not (named and options.train):
        why = ("a dev loader (train=False) reads every corpus once, unmixed" if named
               else "give trset as {name: pattern, ...}")
        raise ValueError(f"{', '.join(given)}: only named corpora are mixed, in training; {why}")
    if options.max_utts_per_speaker is not None and shards.speakers is None:
        raise ValueError("max_utts_per_speaker needs every utterance's speaker, from the shards' index; these shards "
                         "are in no index: run wdsprep index on a local copy, or leave the option out")
    planned = None if options.max_utts_per_speaker is None or shards.speakers is None else shards.speakers.ids
    if named and options.train and (len(shards.corpora) > 1 or given):
        corpora = []
        for c, name in enumerate(shards.corpora):
            part = shards.part(c)
            row0 = int(shards.starts[shards.shards_of(c).start])
            corpora.append(Corpus(part, options, seed=derive_seed(seed, zlib.crc32(name.encode())), row0=row0,
                                  speakers=None if planned is None else planned[row0:row0 + part.num_utts]))
        mixture = mixture_for(shards, weights=weights, temperature=temperature, schedule=schedule)
        return MixedEpochs(shards, corpora, seed=seed, mixture=mixture, steps_per_epoch=steps_per_epoch,
                           world_size=world_size, num_workers=num_workers, speakers=shards.speakers)
    source = CorpusEpochs(Corpus(shards, options, seed=seed, speakers=planned), corpora=shards.corpora,
                          world_size=world_size, num_workers=num_workers, speakers=shards.speakers)
    batches = int(source.corpus.counts(0).sum())
    if options.train and batches < world_size:
        raise TooFewBatches(f"{batches} batches in an epoch for {world_size} ranks: every rank needs at "
                         f"least one (fewer ranks, a smaller max_frames, or more data)")
    return source
