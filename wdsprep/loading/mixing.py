"""Several named corpora in one training loader, mixed by weight, temperature or schedule.

:class:`MixedPlan` is the mixed epochs from the index alone (no I/O, no torch): every corpus
planned on its own (``plan.py``) with a seed of its own, so adding a corpus leaves the others'
batches as they were, and dealt step by step as ``mixplan.py`` says.  :class:`MixedStream` is
the :class:`~wdsprep.loading.stream.ShardStream` that reads it: the same run-time stages (read,
label, filter, collate), fed by the mixed plan instead of one epoch plan.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from wdsprep.loading.mixplan import BatchRef, MixPosition, MixRun, corpus_progress, mix_run, next_epoch, start_position
from wdsprep.loading.mixture import Mixture, SchedulePoints, draw_probabilities, make_mixture
from wdsprep.loading.plan import EpochPlan, PlanOptions, StreamPlan, plan_epoch
from wdsprep.loading.quality import Speakers, corpus_quality
from wdsprep.loading.shardset import ShardSet
from wdsprep.loading.stages import Planned
from wdsprep.loading.stream import LoaderConfig, ShardStream
from wdsprep.loading.transport import WorkerControl
from wdsprep.tokenizer import Tokenizer, derive_seed
from wdsprep.units import hours


def mixture_for(shards: ShardSet, *, weights: Mapping[str, float] | None = None, temperature: float | None = None,
                schedule: SchedulePoints | None = None) -> Mixture:
    """The mixture of the named corpora of ``shards`` given one way (their own sizes when none)."""
    parts = [shards.part(c) for c in range(len(shards.corpora))]
    return make_mixture(shards.corpora, weights=weights, temperature=temperature, schedule=schedule,
                        hours=[hours(int(p.frames.sum())) for p in parts], utts=[p.num_utts for p in parts])


class MixedPlan:
    """The mixed epochs of named corpora (``shards``: their union, ``shardset.union``) on one topology.

    ``anchor`` is where the plan starts from: training's start, or a loaded resume position;
    every loader epoch's start is computed forward from it, alike in every process.
    """

    def __init__(self, shards: ShardSet, options: PlanOptions, *, seed: int, mixture: Mixture,
                 steps_per_epoch: int | None, world_size: int, num_workers: int,
                 speakers: np.ndarray | None = None) -> None:
        if mixture.names != shards.corpora:
            raise ValueError(f"the mixture names {list(mixture.names)}, the shards {list(shards.corpora)}")
        self.shards, self.options, self.seed, self.mixture = shards, options, seed, mixture
        self.steps_per_epoch = steps_per_epoch
        self.world_size, self.num_workers = world_size, num_workers
        self.parts = [shards.part(c) for c in range(len(shards.corpora))]
        self._row0 = [int(shards.starts[shards.shards_of(c).start]) for c in range(len(self.parts))]
        # Each corpus's rows of the speaker column (max_utts_per_speaker plans with it).
        self._speakers = [None if speakers is None else speakers[r0:r0 + p.num_utts]
                          for r0, p in zip(self._row0, self.parts)]
        self._seeds = [derive_seed(seed, zlib.crc32(name.encode())) for name in shards.corpora]
        self._counts: dict[tuple[int, int], np.ndarray] = {}  # (corpus, corpus epoch) -> batches per stream
        self._sizes: dict[tuple[int, int], list[np.ndarray]] = {}  # -> per stream, utterances per batch
        self._dropped: dict[tuple[int, int], list[Counter[str]]] = {}  # -> per stream, what its plan left out
        self._streams: dict[tuple[int, int, int], StreamPlan] = {}  # (corpus, epoch, stream) -> its plan
        first = [self.corpus_plan(c, 0) for c in range(len(self.parts))]
        for name, plan in zip(shards.corpora, first):
            if not plan.num_batches:
                raise ValueError(f"corpus {name!r} has no batches: every utterance is outside "
                                 f"min_frames/max_utt_frames")
        # Mean utterances per batch: what turns a corpus's share of utterances into its chance per draw.
        self.utts_per_batch = [sum(int(s.starts[-1]) for s in p.streams) / p.num_batches for p in first]
        # A reader takes about a shard's worth of a corpus's batches at a time.
        self.chunks = [max(1, round(p.num_batches / max(1, len(part)))) for p, part in zip(first, self.parts)]
        self.one_pass = sum(p.num_batches for p in first)
        self.anchor = start_position(len(self.parts), self.epoch_batches(), world_size, num_workers)
        self._starts: dict[int, MixPosition] = {}  # loader epoch -> where it starts (forward from the anchor)
        self._runs: dict[tuple[int, str], MixRun] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return self.shards.corpora

    def epoch_batches(self) -> int:
        """Batches (over all ranks) in a loader epoch: ``steps_per_epoch`` steps of every rank, or
        one pass's worth of every corpus's batches."""
        return self.steps_per_epoch * self.world_size if self.steps_per_epoch else self.one_pass

    # -- each corpus's own epochs ------------------------------------------------------------------

    def corpus_plan(self, corpus: int, epoch: int, streams: list[int] | None = None) -> EpochPlan:
        part = self.parts[corpus]
        plan = plan_epoch(part.utts, part.frames, self.options, seed=self._seeds[corpus], epoch=epoch, streams=streams,
                          speakers=self._speakers[corpus])
        if streams is None:
            key = (corpus, epoch)
            self._counts[key] = plan.counts
            self._sizes[key] = [np.diff(s.starts) for s in plan.streams]
            self._dropped[key] = [Counter(s.dropped) + Counter({"unreadable": int(part.lost[s.shards].sum())})
                                  for s in plan.streams]
        return plan

    def counts(self, corpus: int, epoch: int) -> np.ndarray:
        """Batches per stream of a corpus epoch (planned once per process; two kept per corpus)."""
        if (corpus, epoch) not in self._counts:
            keep = [k for k in self._counts if k[0] != corpus or k[1] >= epoch - 1]
            self._counts, self._sizes, self._dropped = ({k: d[k] for k in keep}
                                                        for d in (self._counts, self._sizes, self._dropped))
            self.corpus_plan(corpus, epoch)
        return self._counts[(corpus, epoch)]

    def rows_of(self, ref: BatchRef) -> np.ndarray:
        """The rows (in the union) of a planned batch of a corpus."""
        c, e, s, j = ref
        key = (c, e, s)
        if key not in self._streams:
            self._streams = {k: v for k, v in self._streams.items() if k[0] != c or k[1] >= e - 1}
            self._streams[key] = self.corpus_plan(c, e, streams=[s]).streams[s]
        return self._streams[key].batch(j) + self._row0[c]

    def corpus_rows(self, corpus: int) -> range:
        """A corpus's rows in the union."""
        return range(self._row0[corpus], self._row0[corpus] + self.parts[corpus].num_utts)

    def shuffle_quality(self, run: MixRun, speakers: Speakers, *, ranks: Sequence[int]) -> dict[str, dict[str, Any]]:
        """Each corpus's shuffle report (``loading/quality.py``) over the batches ``ranks`` get in ``run``."""
        sequences = [[(ref[0], self.rows_of(ref)) for ref in run.rank_order(r)] for r in ranks]
        corpus_rows = [self.corpus_rows(c) for c in range(len(self.parts))]
        qs = corpus_quality(sequences, corpus_rows, speakers.ids, self.shards.frames, source=speakers.source)
        return {name: q.to_dict() for name, q in zip(self.names, qs)}

    def batch_size(self, ref: BatchRef) -> int:
        """Utterances the plan put in a batch."""
        c, e, s, j = ref
        self.counts(c, e)
        return int(self._sizes[(c, e)][s][j])

    def plan_dropped(self, ref: BatchRef) -> Counter[str]:
        """What the plan of the batch's stream left out, counted with the stream's first batch
        (yielded once in a corpus epoch, by one rank)."""
        c, e, s, j = ref
        self.counts(c, e)
        return self._dropped[(c, e)][s] if j == 0 else Counter()

    def progress(self, position: MixPosition) -> list[float]:
        """How far each corpus is through its epochs at ``position``."""
        return [corpus_progress(p, self.counts(c, p.epoch)) for c, p in enumerate(position.corpora)]

    # -- the loader epochs -------------------------------------------------------------------------

    def probabilities(self, steps: np.ndarray) -> np.ndarray:
        return draw_probabilities(self.mixture.at(steps), self.utts_per_batch)

    def run_from(self, start: MixPosition, steps: int | None = None) -> MixRun:
        return mix_run(start, self.world_size, self.num_workers, seed=self.seed, probabilities=self.probabilities,
                       counts=self.counts, chunks=self.chunks, steps=steps)

    def epoch_start(self, epoch: int) -> MixPosition:
        """Where loader epoch ``epoch`` starts: the anchor, or forward from it epoch by epoch."""
        if epoch < self.anchor.epoch:
            raise ValueError(f"this loader resumed in epoch {self.anchor.epoch}; epoch {epoch} is before it")
        if epoch == self.anchor.epoch:
            return self.anchor
        if epoch not in self._starts:
            before = self.epoch_start(epoch - 1)
            self._starts = {e: p for e, p in self._starts.items() if e >= epoch - 2}
            self._starts[epoch] = next_epoch(self.run(epoch - 1, before).end, self.epoch_batches())
        return self._starts[epoch]

    def run(self, epoch: int, start: MixPosition | None = None) -> MixRun:
        """The rest of loader epoch ``epoch`` on this topology, from its start (or ``start``)."""
        start = self.epoch_start(epoch) if start is None else start
        key = (epoch, repr(start.to_json()))
        if key not in self._runs:
            self._runs = {k: v for k, v in self._runs.items() if k[0] >= epoch - 1}
            self._runs[key] = self.run_from(start)
        return self._runs[key]

    def set_anchor(self, position: MixPosition) -> None:
        self.anchor = position
        self._starts, self._runs = {}, {}


class MixedStream(ShardStream):
    """The mixed epochs of one rank, read by its readers (the main process, or DataLoader workers)."""

    def __init__(self, shards: ShardSet, tokenizer: Tokenizer, cfg: LoaderConfig, *, mixture: Mixture,
                 steps_per_epoch: int | None, rank: int, world_size: int, num_workers: int,
                 control: WorkerControl, speakers: Speakers | None = None) -> None:
        super().__init__(shards, tokenizer, cfg, rank=rank, world_size=world_size, num_workers=num_workers,
                         control=control, speakers=speakers)
        self.mix = MixedPlan(shards, cfg.plan, seed=cfg.seed, mixture=mixture, steps_per_epoch=steps_per_epoch,
                             world_size=world_size, num_workers=num_workers, speakers=self._planned_speakers())

    def reader_batches(self, worker: int) -> tuple[int, bool, list[Planned]]:
        epoch = self.control.read()[0]
        run = self.mix.run(epoch)
        refs = run.reader_refs(self.rank, worker)
        return epoch, bool(refs) and run.lead(worker), [(ref, self.mix.rows_of(ref)) for ref in refs]
