"""One corpus read alone: its epochs dealt to ranks and readers, the same batches on every topology.

Every epoch is the corpus's own plan (``corpus.py``, ``streams.py``), its canonical streams dealt by
``assign.py``: every rank yields ``total // world_size`` batches, at most one batch per rank is
left over, and every batch any rank yields on any world size or worker count is a batch of the
plan.  Where an epoch stands is its runs so far (:class:`CorpusPosition`), so a resume on another
topology deals what is left anew.  Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from wdsprep.format.index import Speakers
from wdsprep.plan.assign import INTERLEAVE, Assignment, epoch_assignment, next_turn, rank_order
from wdsprep.plan.corpus import LRU, Corpus, FixedShards
from wdsprep.plan.quality import plan_quality, ranks_quality
from wdsprep.plan.state import (
    MAX_RUNS,
    MAX_WORKERS,
    MAX_WORLD_SIZE,
    SavedState,
    StateError,
    agree,
    ints,
    need_list,
)
from wdsprep.plan.stats import LoaderStats
from wdsprep.plan.streams import BatchId, Planned, Window

Run = tuple[int, int, int]  # (world size, workers per rank, steps)


@dataclass(frozen=True)
class CorpusPosition:
    """Where an epoch of one corpus stands: its runs so far, each ``(world size, workers, steps)``."""

    epoch: int
    runs: tuple[Run, ...] = ()

    @property
    def step(self) -> int:
        return sum(steps for _, _, steps in self.runs)

    def then(self, world_size: int, num_workers: int, steps: int) -> CorpusPosition:
        """This position after ``steps`` more steps on a topology."""
        return CorpusPosition(self.epoch, self.runs + ((world_size, num_workers, steps),)) if steps else self

    def to_json(self) -> dict[str, Any]:
        return {"runs": [list(r) for r in self.runs]}


class CorpusEpochs(FixedShards):
    """The epochs of one corpus on one topology (``world_size`` ranks of ``num_workers`` readers)."""

    kind = "corpus"
    mixture = None
    mix_unit = None  # what a mixture mixes ("batch", "utterance"); None: one corpus
    interleave = INTERLEAVE  # the streams a reader yields interleaved

    def __init__(self, corpus: Corpus, *, corpora: tuple[str, ...], world_size: int, num_workers: int,
                 speakers: Speakers | None = None) -> None:
        self.corpus = corpus
        self.shards = corpus.shards
        self.corpora = corpora  # the named corpora of its rows (dev mode plans their union as one)
        self.world_size, self.num_workers = world_size, num_workers
        self.speakers = speakers  # for the shuffle report
        if world_size > 1:  # a rank reads a share of the streams: no whole plan kept, its tally counts speakers
            corpus.lean = True
            corpus.count_speakers = None if speakers is None else speakers.ids
        self.anchor: CorpusPosition | None = None  # a loaded position
        self._runs: LRU[CorpusPosition, CorpusRun] = LRU(2)  # len(loader) and the iteration ask for the same one

    @property
    def num_streams(self) -> int:
        return self.corpus.num_streams

    @property
    def train(self) -> bool:
        return self.corpus.options.train

    def start(self, epoch: int) -> CorpusPosition:
        """Where an iteration of ``epoch`` starts: the loaded position in its epoch, else the epoch's start."""
        return self.anchor if self.anchor is not None and self.anchor.epoch == epoch else CorpusPosition(epoch)

    def resume(self, at: CorpusPosition) -> None:
        self.anchor = at

    def continue_from(self, old: CorpusEpochs, epoch: int) -> None:
        """Go on after ``old`` (its shards grown since): nothing to carry, each epoch is planned alone."""

    def run(self, at: CorpusPosition) -> CorpusRun:
        return self._runs.get(at, lambda: CorpusRun(self, at))

    def global_step(self, at: CorpusPosition) -> int | None:
        return None  # no schedule runs across a single corpus's epochs

    def progress(self, at: CorpusPosition) -> list[float] | None:
        """How far each named corpus is through epochs of its own: none but the loader's."""
        return None

    def rows(self, bid: BatchId) -> np.ndarray:
        _, epoch, stream, batch = bid
        return self.corpus.rows(epoch, stream, batch)

    def corpus_of(self, c: int) -> Corpus:
        """The corpus planned (its seed, rows and speed draws); ``c`` is always 0 here."""
        return self.corpus

    def planned_frames(self, bid: BatchId) -> np.ndarray:
        """The frames a planned batch's rows were planned with (after speed perturbation)."""
        _, epoch, stream, batch = bid
        return self.corpus.batch_frames(epoch, stream, batch)

    def origins(self, bid: BatchId) -> tuple[np.ndarray | None, np.ndarray]:
        """Per row of a planned batch: its corpus, as ``batch.corpus`` says it (None: the shard's, as
        read), and that corpus's epoch (what its augmentation is drawn by)."""
        return None, np.full(len(self.rows(bid)), bid[1], np.int64)

    def assignment(self, at: CorpusPosition, world_size: int | None = None,
                   num_workers: int | None = None) -> Assignment:
        """Who yields what is left of the epoch after ``at`` (on this topology, or the one given)."""
        w = self.world_size if world_size is None else world_size
        nw = self.num_workers if num_workers is None else num_workers
        return epoch_assignment(self.corpus.counts(at.epoch), list(at.runs), w, nw, equal=self.train,
                                interleave=self.interleave)

    def complete(self, at: CorpusPosition) -> bool:
        """Whether the last run ended the epoch on its topology (what another topology would still
        find left, the discarded tail, is not for it)."""
        if not at.runs:
            return False
        w, nw, steps = at.runs[-1]
        return self.assignment(CorpusPosition(at.epoch, at.runs[:-1]), w, nw).steps[0] <= steps

    # -- the resume state -------------------------------------------------------------------------

    def position(self, saved: SavedState) -> CorpusPosition:
        """The saved position, checked against the plan: every run's topology and steps possible."""
        at = CorpusPosition(saved.epoch)
        total = int(self.corpus.counts(saved.epoch).sum())
        # Training refuses more ranks than batches; dev mode deals whatever there is.
        most = max(1, total) if self.train else MAX_WORLD_SIZE
        for k, raw in enumerate(need_list(saved.position, "runs", most=MAX_RUNS, where="position.")):
            w, nw, steps = ints(raw, 3, where=f"position.runs[{k}]")
            if not 1 <= w <= most or nw > MAX_WORKERS:
                raise StateError(f"the loader state's position.runs[{k}] is a run on {w} ranks with {nw} workers; "
                                 f"epoch {saved.epoch} has {total} batches, so 1 to {most} ranks and at most "
                                 f"{MAX_WORKERS} workers are possible: the state is damaged or was edited")
            left = self.assignment(at, w, nw).steps[0]
            if steps > left:
                raise StateError(f"the loader state says step {steps} of epoch {saved.epoch} on world size {w} with "
                                 f"{nw} workers, but that run of the epoch has {left} steps: the state is not from "
                                 f"these shards and options, or was edited")
            at = at.then(w, nw, steps)
        agree(saved, epoch=at.epoch, step=at.step, complete=self.complete(at))
        return at

    def position_json(self, at: CorpusPosition) -> dict[str, Any]:
        return at.to_json()

    # -- what the readers are told ----------------------------------------------------------------

    def reader_start(self, at: CorpusPosition) -> dict[str, Any]:
        """What a reader needs to deal the epoch as the main process does, without planning it whole."""
        return {"epoch": at.epoch, "runs": [list(r) for r in at.runs],
                "counts": self.corpus.counts(at.epoch).tolist()}

    def from_reader_start(self, doc: Mapping[str, Any]) -> CorpusPosition:
        self.corpus.know_counts(doc["epoch"], np.array(doc["counts"], np.int64))
        return CorpusPosition(doc["epoch"], tuple(tuple(r) for r in doc["runs"]))  # type: ignore[misc]


class CorpusRun:
    """The rest of an epoch of one corpus, from ``at``, on the source's topology."""

    def __init__(self, source: CorpusEpochs, at: CorpusPosition) -> None:
        self.source, self.at = source, at
        self.complete = source.complete(at)
        self.assignment = source.assignment(at)

    def steps(self, rank: int) -> int:
        """Batches ``rank`` yields (the same on every rank in training)."""
        return 0 if self.complete else self.assignment.steps[rank]

    def _first_turn(self, rank: int) -> int:
        s = self.source
        return next_turn(s.corpus.counts(self.at.epoch), list(self.at.runs), s.world_size, s.num_workers, rank,
                         equal=s.train, interleave=s.interleave)

    def windows(self, rank: int) -> Iterator[Window]:
        """The batches ``rank`` yields, in order (its readers in turn, as torch's DataLoader takes
        them), as one window: with what the plan put in them, and what it leaves out (counted once,
        by the rank each stream was dealt to, in an epoch's first run; rank 0 counts a stream the
        plan left without batches)."""
        if self.complete:
            return
        s, a, e = self.source, self.assignment, self.at.epoch
        refs: list[BatchId] = [(0, e, st, j) for st, j in rank_order(a, rank, self._first_turn(rank))]
        sizes = s.corpus.sizes(e)
        dropped: Counter[str] = Counter()
        if not self.at.runs:
            for stream, owner in enumerate(a.owners):
                if owner == rank or (owner < 0 and rank == 0):
                    dropped += s.corpus.dropped(e, stream)
        yield Window(refs, sum(int(sizes[st][j]) for _, _, st, j in refs), dropped)

    def reader_batches(self, rank: int, worker: int) -> tuple[bool, Iterator[list[Planned]]]:
        """(whether the reader hands out a placeholder first, its planned batches in order, as one window).

        Resumed on the topology it stopped on, readers whose turn of the round had come already
        hand out a placeholder first, so the batches come in the order the stopped run's would.
        """
        if self.complete:
            return False, iter(())
        e, corpus = self.at.epoch, self.source.corpus
        lead = bool(self.assignment.tasks(rank, worker)) and worker < self._first_turn(rank)
        order = self.assignment.reader_order(rank, worker)
        return lead, iter([[((0, e, s, j), corpus.rows(e, s, j)) for s, j in order]])

    def after(self, rank: int, steps: int) -> CorpusPosition:
        """Where the epoch stands after this run's first ``steps`` steps."""
        s = self.source
        return self.at.then(s.world_size, s.num_workers, steps)

    def planned_stats(self, rank: int) -> LoaderStats:
        """The epoch's figures known at its start: its steps, the discarded tail, the shuffle report."""
        s, a, e = self.source, self.assignment, self.at.epoch
        sizes = s.corpus.sizes(e)
        st = LoaderStats(epoch=e, steps=self.at.step, planned_steps=self.steps(rank))
        total = sum(int(n.sum()) for n in sizes)
        st.discarded = sum(int(sizes[t.stream][t.start:t.stop].sum()) for t in a.discarded)
        st.discarded_fraction = st.discarded / total if total else 0.0
        if s.speakers is not None:  # from the plan and the index: no feature read
            self.report_shuffle(st, rank)
        return st

    def report_shuffle(self, st: LoaderStats, rank: int) -> None:
        """The shuffle report of ``rank``'s batches, into ``st`` (a lean corpus plans only the
        streams they are of, its tally having counted the population)."""
        s = self.source
        assert s.speakers is not None
        e, corpus = self.at.epoch, s.corpus
        counts = corpus.speaker_counts(e) if corpus.lean else None
        if counts is None:
            q = plan_quality(corpus.plan(e), self.assignment, s.speakers.ids, corpus.frames(e), ranks=[rank],
                             source=s.speakers.source)
        else:
            q = ranks_quality(lambda stream, j: corpus.stream(e, stream).batch(j), self.assignment, counts,
                              s.speakers.ids, corpus.frames(e), ranks=[rank], source=s.speakers.source)
        st.shuffle = q.to_dict()

    def discarded(self) -> list[BatchId]:
        """The epoch's tail no rank yields (fewer batches than ranks)."""
        e = self.at.epoch
        return [(0, e, t.stream, j) for t in self.assignment.discarded for j in range(t.start, t.stop)]

    def idle_warning(self, rank: int) -> str | None:
        """Why some of ``rank``'s workers get no batches, when more streams would have kept them busy."""
        s = self.source
        idle = sum(not tasks for tasks in self.assignment.workers[rank])
        if not (idle and s.num_workers > 1):
            return None
        readers = s.world_size * s.num_workers
        utts = s.corpus.shards.num_utts
        # A stream is batched from its own pools: below its layout's size (2,000 utterances, more where
        # the fit counts tokens), more streams pad more.
        least = s.corpus.layout.stream_utts
        small = (f"; streams of fewer than {least:,} utterances pad more ({utts:,} utterances in "
                 f"{readers} streams: ~{utts // readers:,} each)" if utts < least * readers else "")
        return (f"rank {rank}: {idle} of {s.num_workers} DataLoader workers get no batches this epoch: the plan has "
                f"{s.corpus.num_streams} streams for {s.world_size} ranks x {s.num_workers} workers; use at most "
                f"{max(1, s.corpus.num_streams // s.world_size)} workers, or pass streams= at least {readers}{small}")
