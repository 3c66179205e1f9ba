"""Named corpora mixed: every corpus planned on its own, a corpus drawn per step by the mixture.

:class:`MixedEpochs` is the epoch source of several :class:`~wdsprep.loading.corpus.Corpus`
(each with a seed of its own, so adding a corpus leaves the others' batches as they were), dealt
step by step as ``deal.py`` says, by the weights ``weights.py`` resolves.  Pure: no I/O, no torch.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from wdsprep.format.index import Speakers
from wdsprep.loading.corpus import LRU, Corpus, FixedShards
from wdsprep.loading.mix.deal import (
    MixCorpusPosition,
    MixPosition,
    MixRun,
    corpus_progress,
    mix_run,
    next_epoch,
    start_position,
)
from wdsprep.loading.mix.weights import Mixture, draw_probabilities
from wdsprep.loading.plan import BatchId, Planned, TooFewBatches, Window, filtered_out
from wdsprep.loading.quality import corpus_quality
from wdsprep.loading.shardset import ShardSet
from wdsprep.loading.state import (
    MAX_EPOCH,
    MAX_WORKERS,
    MAX_WORLD_SIZE,
    SavedState,
    StateError,
    agree,
    ints,
    need,
    need_int,
    need_list,
)
from wdsprep.loading.stats import CorpusStats, LoaderStats

# Batches (over all ranks) dealt at once: a window of a long mixed epoch (see MixedRun).
WINDOW_BATCHES = 1 << 14
# A loader epoch of more steps than this is refused: the epoch is how often set_epoch runs and a
# state is saved, and a schedule runs on the global step across epochs anyway.
MAX_STEPS_PER_EPOCH = 10_000_000


class MixedEpochs(FixedShards):
    """The mixed epochs of named corpora on one topology.

    ``anchor`` is where the plan starts from: training's start, or a loaded position; every
    loader epoch's start is computed forward from it, alike in every process.
    """

    kind = "mixture"

    def __init__(self, shards: ShardSet, corpora: Sequence[Corpus], *, seed: int, mixture: Mixture,
                 steps_per_epoch: int | None, world_size: int, num_workers: int,
                 speakers: Speakers | None = None, names: Sequence[str] | None = None) -> None:
        # The corpora mixed: the named ones, or (``names``) the parts mix_by made of them.
        names = tuple(names) if names is not None else shards.corpora
        if mixture.names != names:
            raise ValueError(f"the mixture names {list(mixture.names)}, the corpora {list(names)}")
        if steps_per_epoch is not None and not 1 <= steps_per_epoch <= MAX_STEPS_PER_EPOCH:
            raise ValueError(f"steps_per_epoch must be in [1, {MAX_STEPS_PER_EPOCH:,}], got {steps_per_epoch:,}: a "
                             f"loader epoch is how often set_epoch runs and a checkpoint is taken, and a schedule "
                             f"follows the global step across epochs")
        self.shards = shards  # the corpora's union: rows are numbered in it
        self.parts = list(corpora)
        self.corpora = names
        self.seed, self.mixture, self.steps_per_epoch = seed, mixture, steps_per_epoch
        self.world_size, self.num_workers = world_size, num_workers
        self.speakers = speakers  # for the shuffle report
        first = [c.plan(0) for c in self.parts]
        for name, plan, part in zip(self.corpora, first, self.parts):
            if not plan.num_batches:
                raise TooFewBatches(f"corpus {name!r} has no batches" + (filtered_out(plan, part.options) or
                                                                         ": it has no utterance"))
        # Mean utterances per batch: what turns a corpus's share of utterances into its chance per draw.
        self.utts_per_batch = [sum(int(s.starts[-1]) for s in p.streams) / p.num_batches for p in first]
        # A reader takes about a shard's worth of a corpus's batches at a time.
        self.chunks = [max(1, round(p.num_batches / max(1, len(c.shards)))) for p, c in zip(first, self.parts)]
        self.one_pass = sum(p.num_batches for p in first)
        self.anchor = start_position(len(self.parts), self.epoch_batches(), world_size, num_workers)
        self._starts: LRU[int, MixPosition] = LRU(3)  # loader epoch -> where it starts, from the anchor
        self._runs: LRU[str, MixedRun] = LRU(3)

    @property
    def num_streams(self) -> int:
        return sum(c.num_streams for c in self.parts)

    def epoch_batches(self, world_size: int | None = None) -> int:
        """Batches (over all ranks) in a loader epoch: ``steps_per_epoch`` steps of every rank, or
        one pass's worth of every corpus's batches."""
        w = self.world_size if world_size is None else world_size
        return self.steps_per_epoch * w if self.steps_per_epoch else self.one_pass

    def probabilities(self, steps: np.ndarray) -> np.ndarray:
        """Per (global) step, the chance each corpus is drawn."""
        return draw_probabilities(self.mixture.at(steps), self.utts_per_batch)

    def complete(self, at: MixPosition) -> bool:
        return at.batches_left == 0

    def global_step(self, at: MixPosition) -> int:
        return at.global_step

    def progress(self, at: MixPosition) -> list[float]:
        """How far each corpus is through its own epochs at ``at``."""
        return [corpus_progress(p, self.parts[c].counts(p.epoch)) for c, p in enumerate(at.corpora)]

    def rows(self, bid: BatchId) -> np.ndarray:
        c, e, s, j = bid
        return self.parts[c].rows(e, s, j)

    def corpus_of(self, c: int) -> Corpus:
        """Corpus ``c`` (its seed, rows and speed draws)."""
        return self.parts[c]

    def planned_frames(self, bid: BatchId) -> np.ndarray:
        """The frames a planned batch's rows were planned with (after speed perturbation)."""
        c, e, s, j = bid
        part = self.parts[c]
        return part.frames(e)[part.stream(e, s).batch(j)]

    def batch_size(self, bid: BatchId) -> int:
        c, e, s, j = bid
        return int(self.parts[c].sizes(e)[s][j])

    # -- the loader epochs -------------------------------------------------------------------------

    def start(self, epoch: int) -> MixPosition:
        """Where loader epoch ``epoch`` starts: the anchor, or forward from it epoch by epoch."""
        if epoch < self.anchor.epoch:
            raise ValueError(f"this loader resumed in epoch {self.anchor.epoch}; epoch {epoch} is before it")
        known = epoch  # the latest epoch at or before it whose start is at hand
        while known > self.anchor.epoch and self._starts.peek(known) is None:
            known -= 1
        at = self._starts.peek(known) if known > self.anchor.epoch else self.anchor
        assert at is not None
        for e in range(known + 1, epoch + 1):
            at = next_epoch(self.run(at).end, self.epoch_batches())
            self._starts.put(e, at)
        return at

    def resume(self, at: MixPosition) -> None:
        self.anchor = at
        self._starts = LRU(3)

    def continue_from(self, old: MixedEpochs, epoch: int) -> None:
        """Go on where ``old`` (the same corpora, some of them grown since: ``growing=True``) stands
        at the start of loader ``epoch``: the schedule's clock and every unchanged corpus where they
        were; a corpus whose shards changed begins an epoch of its own over them (the next one, if
        it had begun its current one: that one's plan was over the shards it had then)."""
        start = old.start(epoch)
        corpora = []
        for pos, new, was in zip(start.corpora, self.parts, old.parts):
            if new.shards.fingerprint() == was.shards.fingerprint():
                corpora.append(pos)
            else:
                begun = pos.free is not None or bool(pos.held) or bool(pos.leftover)
                corpora.append(MixCorpusPosition(pos.epoch + 1 if begun else pos.epoch))
        self.resume(MixPosition(start.epoch, 0, start.global_step, self.epoch_batches(), start.world_size,
                                start.num_workers, start.phase, corpora))

    def run(self, at: MixPosition) -> MixedRun:
        """The rest of ``at``'s loader epoch on this topology (dealt window by window as it is asked for)."""
        # len(loader), the iteration and the next epoch's start ask for the same runs.
        return self._runs.get(json.dumps(at.to_json()), lambda: MixedRun(self, at))

    def deal(self, at: MixPosition, steps: int) -> MixRun:
        """The next ``steps`` steps from ``at``: which corpus each rank draws, which batch each reader yields."""
        return mix_run(at, self.world_size, self.num_workers, seed=self.seed, probabilities=self.probabilities,
                       counts=self._counts, chunks=self.chunks, steps=steps)

    def _counts(self, corpus: int, epoch: int) -> np.ndarray:
        return self.parts[corpus].counts(epoch)

    # -- the resume state -------------------------------------------------------------------------

    def position(self, saved: SavedState) -> MixPosition:
        """The saved position, every number checked against the plan before anything is sized by it:
        no batch handed out twice, none outside its corpus epoch."""
        doc = saved.position
        w = need_int(doc, "world_size", lo=1, hi=MAX_WORLD_SIZE, where="position.")
        nw = need_int(doc, "num_workers", hi=MAX_WORKERS, where="position.")
        readers = w * max(1, nw)
        epoch = need_int(doc, "epoch", hi=MAX_EPOCH, where="position.")
        step = need_int(doc, "step", where="position.")
        left = need_int(doc, "batches_left", hi=self.epoch_batches(w), where="position.")
        pos = MixPosition(epoch, step, need_int(doc, "global_step", lo=step, where="position."), left, w, nw,
                          need_int(doc, "phase", hi=max(1, nw) - 1, where="position."), [])
        entries = need_list(doc, "corpora", most=len(self.parts), where="position.")
        if len(entries) != len(self.parts):
            raise StateError(f"the loader state's position has {len(entries)} corpora, this loader "
                             f"{len(self.parts)} ({', '.join(self.corpora)}): resume with the corpora it was saved "
                             f"with")
        for c, entry in enumerate(entries):
            pos.corpora.append(self._corpus_position(c, entry, readers))
        agree(saved, epoch=pos.epoch, step=pos.step, complete=pos.batches_left == 0, global_step=pos.global_step)
        if saved.mixture is not None:
            try:
                changed = self.mixture.changes_from(Mixture.from_json(saved.mixture))
            except (KeyError, TypeError, ValueError) as e:
                raise StateError(f"the loader state's mixture is not readable ({type(e).__name__}): was it edited?") \
                    from None
            if changed:
                warnings.warn(f"the mixture differs from the one the loader state was saved with: {changed}; the new "
                              f"one applies from global step {pos.global_step} on", UserWarning, stacklevel=3)
        return pos

    def _corpus_position(self, c: int, doc: Any, readers: int) -> MixCorpusPosition:
        name = self.corpora[c]
        where = f"position.corpora[{c}]."
        saved_name = doc.get("name", name) if isinstance(doc, Mapping) else name  # version 2 states name none
        if saved_name != name:
            raise StateError(f"the loader state's {where}name is {saved_name!r}, this loader's corpus {c} is {name!r}: "
                             f"resume with the corpora in the order they were saved")
        corpus = self.parts[c]
        epoch = need_int(doc, "epoch", hi=MAX_EPOCH, where=where)
        counts = corpus.counts(epoch)
        taken: list[tuple[int, int, int, int, str]] = []  # (corpus epoch, stream, start, stop, field)

        def batches(e: int, s: int, a: int, b: int, field: str, *, empty: bool = False) -> list[int]:
            """Batches a..b of stream s in corpus epoch e, checked against that epoch's plan."""
            if e > epoch:
                raise StateError(f"the loader state's {where}{field} is of corpus epoch {e}, past the corpus's "
                                 f"epoch {epoch}: the state was edited")
            n = counts if e == epoch else corpus.counts(e)
            if s >= len(n) or not a <= b <= n[s] or (a == b and not empty):
                raise StateError(f"the loader state's {where}{field} names batches {a}..{b} of stream {s} in corpus "
                                 f"epoch {e} of {name!r}, which has {len(n)} streams of {n.tolist()[:8]}"
                                 f"{'...' if len(n) > 8 else ''} batches: the state was edited")
            taken.append((e, s, a, b, field))
            return [e, s, a, b]

        free = None
        if need(doc, "free", where=where) is not None:
            streams = need_list(doc, "free", most=len(counts), where=where)
            if len(streams) != len(counts):
                raise StateError(f"the loader state's {where}free lists {len(streams)} streams, corpus epoch {epoch} "
                                 f"of {name!r} has {len(counts)}: the state was edited")
            free = []
            for s, runs in enumerate(streams):
                if not isinstance(runs, list) or len(runs) > int(counts[s]):
                    raise StateError(f"the loader state's {where}free[{s}] must be a list of at most {counts[s]} "
                                     f"runs: the state was edited")
                spans = [batches(epoch, s, *ints(r, 2, where=f"{where}free[{s}]"), f"free[{s}]")[2:] for r in runs]
                if spans != sorted(spans):
                    raise StateError(f"the loader state's {where}free[{s}] runs are out of order: the state was edited")
                free.append(spans)
        own: dict[int, int] = {}
        for raw in need_list(doc, "own", most=readers, where=where):
            r, s = ints(raw, 2, where=where + "own")
            if r >= readers or s >= len(counts) or r in own:
                raise StateError(f"the loader state's {where}own names reader {r} and stream {s}; there are "
                                 f"{readers} readers and {len(counts)} streams, each reader once: the state was edited")
            own[r] = s
        held: dict[int, list[int]] = {}
        for raw in need_list(doc, "held", most=readers, where=where):
            r, e, s, a, b = ints(raw, 5, where=where + "held")
            if r >= readers or r in held:
                raise StateError(f"the loader state's {where}held names reader {r}; there are {readers} readers, "
                                 f"each once: the state was edited")
            held[r] = batches(e, s, a, b, "held", empty=True)
        leftover = [batches(*ints(raw, 4, where=where + "leftover"), "leftover")
                    for raw in need_list(doc, "leftover", most=1 << 20, where=where)]
        _no_overlap(taken, where, name)
        return MixCorpusPosition(epoch, free, own, held, leftover)

    def position_json(self, at: MixPosition) -> dict[str, Any]:
        doc = at.to_json()
        for name, entry in zip(self.corpora, doc["corpora"]):
            entry["name"] = name
        return doc

    # -- what the readers are told ----------------------------------------------------------------

    def reader_start(self, at: MixPosition) -> dict[str, Any]:
        return at.to_json()

    def from_reader_start(self, doc: Mapping[str, Any]) -> MixPosition:
        return MixPosition.from_json(doc)


def _no_overlap(taken: list[tuple[int, int, int, int, str]], where: str, name: str) -> None:
    """Refuse batches a position says are in two places at once (free and held, held twice...):
    they would be yielded twice."""
    reach: dict[tuple[int, int], tuple[int, str]] = {}  # (epoch, stream) -> furthest stop so far, and its field
    for e, s, a, b, field in sorted(taken):
        if a == b:
            continue
        stop, other = reach.get((e, s), (0, ""))
        if a < stop:
            raise StateError(f"the loader state's {where}{other} and {where}{field} both hold batches "
                             f"{a}..{min(b, stop)} of stream {s}, corpus epoch {e} of {name!r}: they would be "
                             f"yielded twice; the state was edited")
        if b > stop:
            reach[(e, s)] = (b, field)


class MixedRun:
    """The rest of a mixed loader epoch on the source's topology, from ``at``, dealt in windows of
    ``window`` steps as they are asked for: an epoch of a million steps costs a window's time and
    memory before its first batch, and each window's afterwards (the deal of a window continues
    the one before exactly: the same batches as one deal of the whole epoch)."""

    def __init__(self, source: MixedEpochs, at: MixPosition, window: int | None = None) -> None:
        self.source, self.at = source, at
        self.complete = source.complete(at)
        self.total = at.steps_left(source.world_size)
        self.window = window or max(1, WINDOW_BATCHES // source.world_size)
        self._starts: list[MixPosition] = [at]  # where each window dealt so far starts
        self._dealt: LRU[int, MixRun] = LRU(2)

    def steps(self, rank: int) -> int:
        return self.total

    def _part(self, k: int) -> MixRun:
        """Window ``k`` (steps ``k * window ..``), dealt from where window ``k - 1`` ended."""
        while len(self._starts) <= k:
            self._starts.append(self._part(len(self._starts) - 1).end)
        first = k * self.window
        return self._dealt.get(k, lambda: self.source.deal(self._starts[k], min(self.window, self.total - first)))

    def _parts(self) -> Iterator[MixRun]:
        for k in range(-(-self.total // self.window)):
            yield self._part(k)

    def windows(self, rank: int) -> Iterator[Window]:
        """``rank``'s batches, window by window, with what the plan put in them and left out
        (what a stream's plan leaves out is counted with its first batch: once per corpus epoch)."""
        s = self.source
        for part in self._parts():
            refs = part.rank_order(rank)
            dropped: Counter[str] = Counter()
            for c, e, stream, j in refs:
                if j == 0:
                    dropped += s.parts[c].dropped(e, stream)
            yield Window(refs, sum(s.batch_size(r) for r in refs), dropped)

    def reader_batches(self, rank: int, worker: int) -> tuple[bool, Iterator[list[Planned]]]:
        parts = (part.reader_refs(rank, worker) for part in self._parts())
        first = self._part(0) if self.total else None
        lead = first is not None and bool(first.reader_refs(rank, worker)) and first.lead(worker)
        return lead, ([(ref, self.source.rows(ref)) for ref in refs] for refs in parts)

    def after(self, rank: int, steps: int) -> MixPosition:
        """Where the mixed run stands after its first ``steps`` steps."""
        if not self.total or not steps:
            return self.at
        k = min(steps // self.window, (self.total - 1) // self.window)
        part = self._part(k)
        return part.end if steps >= k * self.window + part.steps else self.source.deal(self._starts[k],
                                                                                       steps - k * self.window).end

    @property
    def end(self) -> MixPosition:
        return self.after(0, self.total)

    def planned_stats(self, rank: int) -> LoaderStats:
        """The epoch's figures known at its start; the shuffle report over its first window."""
        s = self.source
        st = LoaderStats(epoch=self.at.epoch, steps=self.at.step, planned_steps=self.total)
        st.corpora = {name: CorpusStats() for name in s.corpora}
        if s.speakers is not None and self.total:  # from the plan and the index: no feature read
            for name, q in self.shuffle(ranks=[rank]).items():
                st.corpora[name].shuffle = q
        return st

    def shuffle(self, *, ranks: Sequence[int]) -> dict[str, dict[str, Any]]:
        """Each corpus's shuffle report (``loading/quality.py``) over the batches ``ranks`` get in
        the first window (the whole epoch, unless it is longer than a window)."""
        s = self.source
        assert s.speakers is not None
        part = self._part(0)
        sequences = [[(ref[0], s.rows(ref)) for ref in part.rank_order(r)] for r in ranks]
        corpus_rows = [c.global_rows() for c in s.parts]
        qs = corpus_quality(sequences, corpus_rows, s.speakers.ids, s.shards.frames, source=s.speakers.source)
        return {name: q.to_dict() for name, q in zip(s.corpora, qs)}

    def discarded(self) -> list[BatchId]:
        return []  # every rank takes the same steps; nothing is left over

    def idle_warning(self, rank: int) -> str | None:
        return None  # readers take chunks as their turns need them
