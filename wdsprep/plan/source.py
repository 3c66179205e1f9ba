"""Where every batch of every epoch comes from: one epoch source for one corpus and for many.

An epoch source is pure (no I/O, no torch; it reads only the index): for any epoch and any
position in it, it says how many steps each rank takes, which planned batches each rank and
each of its readers yields in which order, where the epoch stands after ``k`` steps, and how a
saved position is read back.  :func:`epoch_source` builds it from the shard set (in the
composition ``make_loader`` and ``dry-run --plan`` call, ``compose.py``); it alone decides whether
corpora are mixed:

- one corpus (or, in dev mode, named corpora read once each): ``epochs.CorpusEpochs``, its own
  plan every epoch dealt to ranks and readers: the same batches on every topology;
- named corpora in training: ``mix.epochs.MixedEpochs``, each corpus with epochs of its own, a
  corpus drawn per step by the mixture; with ``mix_by`` (an index column, e.g. ``lang``) each
  corpus is first split into subsets by its value, and the subsets are what is mixed
  (:func:`split_by`), a temperature applied per level: across corpora, then across each one's subsets.

Both are made of :class:`~wdsprep.plan.corpus.Corpus` units and name every planned batch the
same way, ``(corpus, corpus epoch, stream, batch)``.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from wdsprep.plan.corpus import Corpus
from wdsprep.plan.epochs import CorpusEpochs
from wdsprep.plan.mix.epochs import MixedEpochs, mixed_seed
from wdsprep.plan.mix.weights import Mixture, level_mixture, make_mixture
from wdsprep.plan.options import MixOptions
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.state import SavedState
from wdsprep.plan.stats import LoaderStats
from wdsprep.plan.streams import BatchId, Planned, PlanOptions, TooFewBatches, Window, filtered_out
from wdsprep.units import hours

Trset = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike | Sequence[str]]


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
    mix_unit: str | None  # what a mixture mixes, "batch" or "utterance" (None: no mixture)
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

    def origins(self, bid: BatchId) -> tuple[np.ndarray | None, np.ndarray]:
        """Per row of a planned batch: its corpus as ``batch.corpus`` says it (None: its shard's, as
        read), and that corpus's epoch (what its augmentation is drawn by)."""

    def corpus_of(self, c: int) -> Corpus:
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

    def reader_start(self, at: Any) -> dict[str, Any]:
        """What a reader process is told to start an iteration from ``at`` (JSON-able)."""

    def from_reader_start(self, doc: Mapping[str, Any]) -> Any: ...

    # What a loader asks of every source besides the plan: whether the shard set it plans over
    # changes (``corpus.FixedShards``: never; ``follow.GrowingSource``: as a pack publishes shards).

    revision: int  # how many times the shard set changed: readers forked before plan an old one

    def follow(self, epoch: int) -> bool:
        """Plan ``epoch`` over the shards there are now (where they may change); whether they changed."""

    def begin(self, epoch: int) -> None:
        """``epoch`` is being iterated."""

    def saved(self) -> dict[str, Any]:
        """What a resume state records beyond the position."""

    def restored(self, state: Any) -> EpochSource:
        """The source as ``state`` says it was, this one unchanged (StateError naming what is wrong)."""

    def annotate(self, stats: LoaderStats) -> None:
        """What the source knows of the epoch beyond the plan, into ``stats``."""


def mixture_for(shards: ShardSet, mix: MixOptions) -> Mixture:
    """The mixture of the named corpora of ``shards`` that ``mix`` gives (their own sizes when none)."""
    each = [shards.of_corpus(c) for c in range(len(shards.corpora))]
    return make_mixture(shards.corpora, mix, hours=[hours(int(s.frames.sum())) for s in each],
                        utts=[s.num_utts for s in each])


def split_by(shards: ShardSet, column: str, plans: Sequence[PlanOptions], *, seed: int,
             planned: np.ndarray | None) -> tuple[list[str], list[Corpus], list[list[float]]]:
    """Each corpus of ``shards`` split by its rows' values of index column ``column``: (the subsets'
    names, ``VALUE`` for one unnamed corpus, else ``CORPUS/VALUE``; their :class:`Corpus` units,
    each planned over its own rows, with a seed of its name; per corpus, each subset's hours).  A
    shard's unreadable samples count once, with the first subset that reads it."""
    values = shards.columns.get(column)
    if values is None:
        how = "--utt2lang" if column == "lang" else f"--field {column}=FILE --index-field {column}"
        again = "" if column == "lang" else f" --index-field {column}"
        raise ValueError(f"mix_by {column!r}: the shards' index has no {column} column (pack with {how}; shards that "
                         f"carry it: wdsprep index --force{again})")
    names, units, hours_of = [], [], []
    counted: set[int] = set()
    ids = np.asarray(values.ids)
    for c, corpus in enumerate(shards.corpora):
        if shards.lacks(column, c):
            raise ValueError(f"mix_by {column!r}: corpus {corpus!r} has utterances without a {column} in its index; "
                             f"every corpus mixed by {column} needs one")
    for c, corpus in enumerate(shards.corpora):
        sl = shards.shards_of(c)
        a, b = int(shards.starts[sl.start]), int(shards.starts[sl.stop])
        mine, first = np.unique(ids[a:b], return_index=True)
        hours_of.append([])
        for v in mine[np.argsort(first)].tolist():  # in order of first appearance
            rows = a + np.flatnonzero(ids[a:b] == v)
            name = values.names[v] if shards.corpora == ("",) else f"{corpus}/{values.names[v]}"
            subset = shards.subset(rows)
            used = np.unique(shards.shard_of(rows))
            subset.lost = np.where(np.isin(used, list(counted)), 0, shards.lost[used])
            counted.update(used.tolist())
            names.append(name)
            hours_of[-1].append(hours(int(subset.frames.sum())))
            units.append(Corpus(subset, plans[c], seed=mixed_seed(seed, name), rowmap=rows,
                                parent=c, speakers=None if planned is None else planned[rows]))
    return names, units, hours_of


def epoch_source(shards: ShardSet, options: PlanOptions, *, seed: int, world_size: int, num_workers: int,
                 named: bool = False, mix: MixOptions = MixOptions(),
                 plans: Sequence[PlanOptions] | None = None) -> EpochSource:
    """The epoch source of ``shards`` on ``world_size`` ranks of ``num_workers`` readers each.

    ``named``: the corpora were given by name; in training several of them, or one with mixing
    options (``mix``), are mixed.  ``mix.mix_by``: each corpus (named or not) split by that index
    column into subsets, mixed as named corpora are (:func:`split_by`).  ``plans``: each named
    corpus's plan options, where they differ from ``options`` (their augmentation's speed).
    ``shards.speakers`` (when known) feeds the shuffle report, and the plan itself under
    ``options.max_utts_per_speaker``.
    """
    given = list(mix.given())
    if given and not ((named or mix.mix_by is not None) and options.train):
        why = ("a dev loader (train=False) reads every corpus once, unmixed" if named or mix.mix_by is not None
               else "give trset as {name: pattern, ...}, or mix_by")
        raise ValueError(f"{', '.join(given)}: only named corpora are mixed (or their subsets, with mix_by), in "
                         f"training; {why}")
    if options.max_utts_per_speaker is not None and shards.speakers is None:
        raise ValueError("max_utts_per_speaker needs every utterance's speaker, from the shards' index; these shards "
                         "are in no index: run wdsprep index on a local copy, or leave the option out")
    planned = None if options.max_utts_per_speaker is None or shards.speakers is None else shards.speakers.ids
    each = list(plans) if plans is not None else [options] * len(shards.corpora)
    if mix.mix_by is not None:
        names, units, subset_hours = split_by(shards, mix.mix_by, each, seed=seed, planned=planned)
        if mix.temperature is not None:
            t = mix.temperature
            mixture = level_mixture(names, subset_hours, t if isinstance(t, tuple) else (t, t), by=mix.mix_by)
        else:
            mixture = make_mixture(names, mix, utts=[u.shards.num_utts for u in units])
        return MixedEpochs(shards, units, seed=seed, mixture=mixture, options=options, mix_unit=mix.mix_unit,
                           steps_per_epoch=mix.steps_per_epoch, world_size=world_size, num_workers=num_workers,
                           speakers=shards.speakers, names=names)
    if named and options.train and (len(shards.corpora) > 1 or given):
        corpora = []
        for c, name in enumerate(shards.corpora):
            own = shards.of_corpus(c)
            row0 = int(shards.starts[shards.shards_of(c).start])
            corpora.append(Corpus(own, each[c], seed=mixed_seed(seed, name), row0=row0,
                                  speakers=None if planned is None else planned[row0:row0 + own.num_utts], parent=c))
        mixture = mixture_for(shards, mix)
        return MixedEpochs(shards, corpora, seed=seed, mixture=mixture, options=options, mix_unit=mix.mix_unit,
                           steps_per_epoch=mix.steps_per_epoch, world_size=world_size, num_workers=num_workers,
                           speakers=shards.speakers)
    source = CorpusEpochs(Corpus(shards, each[0] if options.train else options, seed=seed, speakers=planned),
                          corpora=shards.corpora, world_size=world_size, num_workers=num_workers,
                          speakers=shards.speakers)
    batches = int(source.corpus.counts(0).sum())
    if options.train and batches < world_size:
        why = filtered_out(source.corpus.plan(0), source.corpus.options)
        raise TooFewBatches(f"{batches} batches in an epoch for {world_size} ranks: every rank needs at "
                            f"least one" + (why or " (fewer ranks, a smaller max_frames, or more data)"))
    return source
