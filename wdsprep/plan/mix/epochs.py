"""Named corpora mixed, every loader epoch planned like one corpus's: the same batches on any topology.

Each corpus (a named one, or a subset ``mix_by`` made of one) is planned on its own (``corpus.py``,
its own seed, so adding a corpus leaves the others' plans as they were) and goes through epochs of
its own.  A loader epoch is laid out from the counts alone (``portions.py``):

1. where it starts: every corpus's :class:`~wdsprep.plan.mix.portions.Cursor` and the schedule's
   clock (:class:`EpochStart`), the previous epoch's end;
2. how much of each: the epoch's items (one pass of every corpus by default) apportioned by the
   mixture's shares at its clock (:func:`apportion`; a weight is a share of utterances, so with
   ``mix_unit="batch"`` a corpus of smaller batches gives more of them);
3. which: each corpus's next items in progress order, its portion cut into the epoch's ``M``
   canonical streams, each stream's corpora merged by progress;
4. with ``mix_unit="batch"`` (the default) a mixed stream's items are its corpora's planned batches,
   each of one corpus; with ``"utterance"`` they are utterances, cut into batches by the loader's
   pools, so a batch holds several corpora.

:class:`MixedPlan` answers what :class:`~wdsprep.plan.epochs.CorpusEpochs` asks of a corpus (its
streams' batch counts, rows and what they left out), so a mixture is dealt to ranks and readers,
counted and resumed as one corpus is: equal steps, at most one batch per rank left over, the same
batches on any world size and worker count, an elastic resume.  Only a schedule's clock (its global
steps) and ``steps_per_epoch`` follow the world size.  Pure: no I/O, no torch.
"""

from __future__ import annotations

import warnings
import zlib
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from wdsprep.format.index import Speakers
from wdsprep.plan.assign import rank_order
from wdsprep.plan.corpus import LRU, Corpus, EpochBatches
from wdsprep.plan.epochs import CorpusEpochs, CorpusPosition, CorpusRun
from wdsprep.plan.mix.portions import Cursor, Segment, cut, merge_order, take
from wdsprep.plan.mix.weights import Mixture, draw_probabilities
from wdsprep.plan.quality import corpus_quality
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.state import MAX_EPOCH, SavedState, StateError, ints, need, need_int, need_list
from wdsprep.plan.stats import CorpusStats, LoaderStats
from wdsprep.plan.streams import (
    EpochPlan,
    Layout,
    PlanOptions,
    StreamPlan,
    TooFewBatches,
    cut_batches,
    filtered_out,
    layout,
)
from wdsprep.tokenizer import derive_seed

MIX_UNITS = ("batch", "utterance")
# A loader epoch of more steps than this is refused: the epoch is how often set_epoch runs and a
# state is saved, and a schedule runs on the global step across epochs anyway.
MAX_STEPS_PER_EPOCH = 1_000_000
# A saved epoch may take at most this many passes' worth of every corpus (a state asking more was
# edited: planning it would take that long).
MAX_ONE_PASSES = 1024
# The shuffle report of a mixed epoch looks at this many of each rank's first batches.
REPORTED_BATCHES = 1 << 14
# Generator purpose of a mixed stream's pools, beside streams.py's.
_MIXED = 4


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` items split in proportion to ``weights``: the floors, then one more for the largest
    remainders (ties: the lower index), so they add up to ``total`` exactly."""
    w = np.asarray(weights, np.float64)
    exact = w / w.sum() * total if w.sum() > 0 else np.zeros_like(w)
    out = np.floor(exact).astype(np.int64)
    extra = total - int(out.sum())
    if extra > 0:
        out[np.lexsort((np.arange(len(w)), -(exact - out)))[:extra]] += 1
    return out


@dataclass(frozen=True)
class EpochStart:
    """Where a mixed loader epoch starts: its number, the schedule's clock (the global step) and
    every corpus's cursor; ``takes``: the items each corpus gives it, once known (a state records
    them, so a resume on another world size plans the same epoch whatever its clock says)."""

    epoch: int
    global_step: int
    cursors: tuple[Cursor, ...]
    takes: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "global_step": self.global_step, "cursors": [c.to_json() for c in self.cursors],
                "takes": None if self.takes is None else list(self.takes)}


@dataclass
class MixedStream(StreamPlan):
    """A stream of a mixed loader epoch: its batches' rows (of the loader's shard set) and, per row,
    its corpus (the mixed one: ``loader.corpora``'s index), that corpus's epoch and its planned frames."""

    units: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    epochs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def origins(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.starts[j], self.starts[j + 1]
        return self.units[a:b], self.epochs[a:b]


class MixedPlan:
    """Every loader epoch of corpora mixed (see the module's docstring), as a corpus's plan is asked
    for: batches per stream, rows, sizes, what each stream leaves out; epochs from ``anchor`` on.

    ``options``: the loader's plan options (a mixture of utterances is batched by its fit and pools);
    ``world_size`` decides only a schedule's clock and ``steps_per_epoch``'s batches.
    """

    def __init__(self, shards: ShardSet, units: Sequence[Corpus], mixture: Mixture, options: PlanOptions, *,
                 seed: int, mix_unit: str, steps_per_epoch: int | None, world_size: int,
                 speakers: np.ndarray | None = None) -> None:
        if mix_unit not in MIX_UNITS:
            raise ValueError(f"mix_unit must be one of {list(MIX_UNITS)}, got {mix_unit!r}")
        if steps_per_epoch is not None and not 1 <= steps_per_epoch <= MAX_STEPS_PER_EPOCH:
            raise ValueError(f"steps_per_epoch must be in [1, {MAX_STEPS_PER_EPOCH:,}], got {steps_per_epoch:,}: a "
                             f"loader epoch is how often set_epoch runs and a checkpoint is taken, and a schedule "
                             f"follows the global step across epochs")
        self.shards, self.units, self.mixture, self.options = shards, list(units), mixture, options
        self.seed, self.mix_unit, self.world_size = seed, mix_unit, world_size
        self.speakers = speakers if options.max_utts_per_speaker is not None else None
        first = [u.plan(0) for u in self.units]
        for name, plan, unit in zip(mixture.names, first, self.units):
            if not plan.num_batches:
                raise TooFewBatches(f"corpus {name!r} has no batches" + (filtered_out(plan, unit.options) or
                                                                         ": it has no utterance"))
        # Mean utterances per batch: what turns a corpus's share of utterances into its share of batches.
        self.utts_per_batch = np.array([sum(int(s.starts[-1]) for s in p.streams) / p.num_batches for p in first])
        self.by_batch = mix_unit == "batch"
        one_pass = [p.num_batches if self.by_batch else sum(int(s.starts[-1]) for s in p.streams) for p in first]
        self.one_pass = max(1, int(sum(one_pass)))
        if steps_per_epoch is None:
            self.epoch_items = self.one_pass
        elif self.by_batch:
            self.epoch_items = steps_per_epoch * world_size
        else:  # about that many steps' worth of utterances, at the mixture's mean batch
            shares = mixture.at([0])[0]
            self.epoch_items = max(1, round(steps_per_epoch * world_size * float(shares @ self.utts_per_batch)))
        utts = np.concatenate([u.shards.utts for u in self.units])
        frames = np.concatenate([u.shards.frames for u in self.units])
        tokens = None if not options.fit.uses_tokens else np.concatenate([u.tokens for u in self.units])
        # The epoch's streams and pools as one corpus of them all would have.
        self.layout: Layout = layout(options, utts, frames, tokens)
        self.anchor = self.fixed(EpochStart(0, 0, tuple(Cursor() for _ in self.units)))
        self._starts: LRU[int, EpochStart] = LRU(4)  # loader epoch -> where it starts, from the anchor
        self._layouts: LRU[EpochStart, tuple[list[list[tuple[int, list[Segment]]]], tuple[Cursor, ...]]] = LRU(4)
        self._streams: LRU[tuple[EpochStart, int], MixedStream] = LRU(256)
        self._plans: LRU[EpochStart, EpochPlan] = LRU(1)
        self._tallies: LRU[EpochStart, EpochBatches] = LRU(4)

    # -- what a loader epoch holds -------------------------------------------------------------------

    @property
    def num_streams(self) -> int:
        return self.layout.streams

    @property
    def train(self) -> bool:
        return self.options.train

    def start(self, epoch: int) -> EpochStart:
        """Where loader epoch ``epoch`` starts: the anchor, or forward from it epoch by epoch."""
        if epoch < self.anchor.epoch:
            raise ValueError(f"this loader resumed in epoch {self.anchor.epoch}; epoch {epoch} is before it")
        known = epoch  # the latest epoch at or before it whose start is at hand
        while self.known(known) is None:
            known -= 1
        at = self.known(known)
        assert at is not None
        for e in range(known + 1, epoch + 1):
            steps = int(self._tally(at).counts.sum()) // self.world_size
            at = self.fixed(EpochStart(e, at.global_step + steps, self._end(at)))
            self._starts.put(e, at)
        return at

    def known(self, epoch: int) -> EpochStart | None:
        """Where ``epoch`` starts, if this plan has worked it out already (else None)."""
        return self.anchor if epoch == self.anchor.epoch else self._starts.peek(epoch)

    @contextmanager
    def anchored(self, at: EpochStart) -> Iterator[None]:
        """Plan from ``at`` for a while (a saved state checked before it is taken), then as before."""
        old, starts = self.anchor, self._starts
        self.anchor, self._starts = self.fixed(at), LRU(4)
        try:
            yield
        finally:
            self.anchor, self._starts = old, starts

    def resume(self, at: EpochStart) -> None:
        self.anchor, self._starts = self.fixed(at), LRU(4)

    def fixed(self, at: EpochStart) -> EpochStart:
        """``at`` with the items each corpus gives its epoch (:meth:`takes`), fixed once worked out."""
        return at if at.takes is not None else replace(at, takes=self.takes(at))

    def takes(self, at: EpochStart) -> tuple[int, ...]:
        """The items each corpus gives the epoch starting ``at``: the epoch's apportioned by the
        mixture's shares over its steps (constant ones: the same every epoch)."""
        if at.takes is not None:
            return at.takes
        clock = np.array([at.global_step])
        if len(self.mixture.steps) > 1:  # a schedule: its mean over the epoch's (estimated) steps
            batches = self.epoch_items if self.by_batch else \
                self.epoch_items / float(self.mixture.at(clock)[0] @ self.utts_per_batch)
            clock = at.global_step + np.arange(max(1, round(batches / self.world_size)))
        shares = self.mixture.at(clock).mean(axis=0, keepdims=True)
        weights = draw_probabilities(shares, self.utts_per_batch)[0] if self.by_batch else shares[0]
        return tuple(apportion(weights, self.epoch_items).tolist())

    def _items(self, unit: int, epoch: int) -> np.ndarray:
        u = self.units[unit]
        return u.counts(epoch) if self.by_batch else u.kept(epoch)

    def pieces(self, at: EpochStart) -> list[list[tuple[int, list[Segment]]]]:
        """Per stream of the epoch starting ``at``: each corpus's piece of it, ``(corpus, segments)``."""
        return self._lay_out(at)[0]

    def _end(self, at: EpochStart) -> tuple[Cursor, ...]:
        """Where every corpus stands once the epoch starting ``at`` has taken its items."""
        return self._lay_out(at)[1]

    def _lay_out(self, at: EpochStart) -> tuple[list[list[tuple[int, list[Segment]]]], tuple[Cursor, ...]]:
        def lay_out() -> tuple[list[list[tuple[int, list[Segment]]]], tuple[Cursor, ...]]:
            streams: list[list[tuple[int, list[Segment]]]] = [[] for _ in range(self.num_streams)]
            ends = []
            for c, (n, cursor) in enumerate(zip(self.takes(at), at.cursors)):
                segments, end = take(lambda e, c=c: self._items(c, e), cursor, n)
                ends.append(end)
                for m, piece in enumerate(cut(segments, self.num_streams)):
                    if piece:
                        streams[m].append((c, piece))
            return streams, tuple(ends)

        return self._layouts.get(at, lay_out)

    def stream_at(self, at: EpochStart, m: int) -> MixedStream:
        """Stream ``m`` of the epoch starting ``at``."""
        whole = self._plans.peek(at)
        if whole is not None:
            return whole.streams[m]  # type: ignore[return-value]
        return self._streams.get((at, m), lambda: self._mixed_stream(at, m))

    def _mixed_stream(self, at: EpochStart, m: int) -> MixedStream:
        pieces = self.pieces(at)[m]
        dropped: Counter[str] = Counter()
        for c, segments in pieces:
            for seg in segments:
                if seg.start == 0:  # what a corpus epoch's stream leaves out, counted with its first items
                    dropped += self.units[c].left_out(seg.epoch, seg.stream)
        return (self._batch_stream if self.by_batch else self._utterance_stream)(at, m, pieces, dropped)

    def _batch_stream(self, at: EpochStart, m: int, pieces: list[tuple[int, list[Segment]]],
                      dropped: Counter[str]) -> MixedStream:
        """The corpora's batches of stream ``m``, merged by progress."""
        rows, units, epochs, frames, sizes = [], [], [], [], []
        for c, segments in pieces:  # each corpus's piece: its batches in order, as rows and batch sizes
            u = self.units[c]
            for seg in segments:
                sp = u.stream(seg.epoch, seg.stream)
                local = sp.rows[sp.starts[seg.start]:sp.starts[seg.stop]]
                rows.append(u.to_global(local))
                frames.append(u.frames(seg.epoch)[local])
                units.append(np.full(len(local), c, np.int16))
                epochs.append(np.full(len(local), seg.epoch, np.int64))
                sizes.append(np.diff(sp.starts[seg.start:seg.stop + 1]))
        per_piece = [sum(len(seg) for seg in segments) for _, segments in pieces]
        which, index = merge_order(per_piece)
        size = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        first = np.concatenate([[0], np.cumsum(size)])[:-1]  # each batch's first row, pieces one after another
        batch = np.concatenate([[0], np.cumsum(per_piece)])[:-1][which] + index  # merged place -> batch
        counts = size[batch]
        take = np.repeat(first[batch] - np.concatenate([[0], np.cumsum(counts)])[:-1], counts) + \
            np.arange(int(counts.sum()))
        return _stream(m, [np.concatenate(rows)[take]] if rows else [], [np.concatenate(units)[take]] if rows else [],
                       [np.concatenate(epochs)[take]] if rows else [], [np.concatenate(frames)[take]] if rows else [],
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), dropped)

    def _utterance_stream(self, at: EpochStart, m: int, pieces: list[tuple[int, list[Segment]]],
                          dropped: Counter[str]) -> MixedStream:
        """The corpora's utterances of stream ``m``, merged by progress, cut into batches by the loader's pools."""
        local, units, epochs = [], [], []
        for c, segments in pieces:
            u = self.units[c]
            rows = [u.stream_rows(seg.epoch, seg.stream).rows[seg.start:seg.stop] for seg in segments]
            local.append(np.concatenate(rows))
            units.append(np.full(len(local[-1]), c, np.int16))
            epochs.append(np.concatenate([np.full(len(seg), seg.epoch, np.int64) for seg in segments]))
        which, index = merge_order([len(x) for x in local])
        starts = np.concatenate([[0], np.cumsum([len(x) for x in local], dtype=np.int64)])
        flat = starts[which] + index  # place in the corpora's pieces, one after another
        unit, epoch, own = np.concatenate(units)[flat], np.concatenate(epochs)[flat], np.concatenate(local)[flat]
        frames = np.empty(len(flat), np.int64)
        glob = np.empty(len(flat), np.int64)
        tokens = np.empty(len(flat), np.int64) if self.options.fit.uses_tokens else None
        for c in np.unique(unit).tolist():
            u = self.units[c]
            for e in np.unique(epoch[unit == c]).tolist():
                mine = (unit == c) & (epoch == e)
                frames[mine] = u.frames(e)[own[mine]]
                if tokens is not None:
                    tokens[mine] = u.tokens[own[mine]]
            glob[unit == c] = u.to_global(own[unit == c])
        order, batch_starts = cut_batches(np.arange(len(flat)), frames,
                                          np.random.default_rng([self.seed, at.epoch, m, _MIXED]),
                                          options=self.options, pool=self.layout.pool,
                                          speakers=None if self.speakers is None else self.speakers[glob],
                                          tokens=tokens)
        return MixedStream(m, np.zeros(0, np.int64), glob[order], batch_starts, dict(dropped),
                           unit[order], epoch[order], frames[order].astype(np.int32))

    def plan_at(self, at: EpochStart) -> EpochPlan:
        return self._plans.get(at, lambda: EpochPlan(at.epoch, [self.stream_at(at, m)
                                                                for m in range(self.num_streams)]))

    def _tally(self, at: EpochStart, *, sizes: bool = False) -> EpochBatches:
        got = self._tallies.peek(at)
        if got is None or (sizes and got.sizes is None):
            if self.by_batch and not sizes:  # a stream's batches are its pieces' batches: nothing to merge
                counts = np.array([sum(len(seg) for _, segments in stream for seg in segments)
                                   for stream in self.pieces(at)], np.int64)
                got = EpochBatches(counts)
            else:
                plan = self.plan_at(at)
                got = EpochBatches(plan.counts, [np.diff(s.starts) for s in plan.streams])
            self._tallies.put(at, got)
        return got

    # -- a corpus's plan, as CorpusEpochs asks for it ------------------------------------------------

    def plan(self, epoch: int) -> EpochPlan:
        return self.plan_at(self.start(epoch))

    def counts(self, epoch: int) -> np.ndarray:
        return self._tally(self.start(epoch)).counts

    def sizes(self, epoch: int) -> list[np.ndarray]:
        sizes = self._tally(self.start(epoch), sizes=True).sizes
        assert sizes is not None
        return sizes

    def know_counts(self, epoch: int, counts: np.ndarray) -> None:
        at = self.start(epoch)
        if self._tallies.peek(at) is None:
            self._tallies.put(at, EpochBatches(np.asarray(counts, np.int64)))

    def stream(self, epoch: int, m: int) -> MixedStream:
        return self.stream_at(self.start(epoch), m)

    def rows(self, epoch: int, m: int, j: int) -> np.ndarray:
        return self.stream(epoch, m).batch(j)

    def batch_frames(self, epoch: int, m: int, j: int) -> np.ndarray:
        s = self.stream(epoch, m)
        return s.frames[s.starts[j]:s.starts[j + 1]]

    def origins(self, epoch: int, m: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        return self.stream(epoch, m).origins(j)

    def dropped(self, epoch: int, m: int) -> Counter[str]:
        return Counter(self.stream(epoch, m).dropped)

    def frames(self, epoch: int) -> np.ndarray:
        """The index's frames of every row, for the shuffle report's lengths (a row taken twice in a
        loop of a small corpus may have two speeds: the report does not tell them apart)."""
        return self.shards.frames

    def progress(self, epoch: int, done: float) -> list[float]:
        """How far each corpus is through epochs of its own, ``done`` of the way through loader ``epoch``."""
        at = self.start(epoch)
        out = []
        for c, (n, cursor) in enumerate(zip(self.takes(at), at.cursors)):
            e, k = cursor.epoch, cursor.done + n * done
            total = int(self._items(c, e).sum())
            while k >= total > 0:
                k, e = k - total, e + 1
                total = int(self._items(c, e).sum())
            out.append(e + (k / total if total else 0.0))
        return out


def _stream(m: int, rows: list[np.ndarray], units: list[np.ndarray], epochs: list[np.ndarray],
            frames: list[np.ndarray], starts: np.ndarray, dropped: Counter[str]) -> MixedStream:
    def joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    return MixedStream(m, np.zeros(0, np.int64), joined(rows, np.int64), starts, dict(dropped),
                       joined(units, np.int16), joined(epochs, np.int64), joined(frames, np.int32))


@dataclass(frozen=True)
class MixPosition(CorpusPosition):
    """Where a mixed epoch stands: its runs so far, and where the epoch started (what plans it)."""

    start: EpochStart | None = None

    def then(self, world_size: int, num_workers: int, steps: int) -> MixPosition:
        return replace(self, runs=self.runs + ((world_size, num_workers, steps),)) if steps else self

    def to_json(self) -> dict[str, Any]:
        assert self.start is not None
        return {"runs": [list(r) for r in self.runs], "start": self.start.to_json()}


class MixedEpochs(CorpusEpochs):
    """The epochs of corpora mixed (:class:`MixedPlan`), dealt as one corpus's are."""

    kind = "mixture"

    def __init__(self, shards: ShardSet, units: Sequence[Corpus], *, seed: int, mixture: Mixture,
                 options: PlanOptions, mix_unit: str = "batch", steps_per_epoch: int | None, world_size: int,
                 num_workers: int, speakers: Speakers | None = None, names: Sequence[str] | None = None) -> None:
        names = tuple(names) if names is not None else shards.corpora
        if mixture.names != names:
            raise ValueError(f"the mixture names {list(mixture.names)}, the corpora {list(names)}")
        self.mixture, self.units = mixture, list(units)
        self.planner = MixedPlan(shards, units, mixture, options, seed=seed, mix_unit=mix_unit,
                                 steps_per_epoch=steps_per_epoch, world_size=world_size,
                                 speakers=None if speakers is None else speakers.ids)
        super().__init__(self.planner, corpora=names, world_size=world_size,  # type: ignore[arg-type]
                         num_workers=num_workers, speakers=speakers)
        self.shards = shards
        self.mix_unit = mix_unit
        self.interleave = 1  # a mixed stream interleaves its corpora already: one at a time per reader

    def corpus_of(self, c: int) -> Corpus:
        """Corpus ``c`` (its seed, rows and speed draws)."""
        return self.units[c]

    def start(self, epoch: int) -> MixPosition:
        if isinstance(self.anchor, MixPosition) and self.anchor.epoch == epoch:
            return self.anchor
        return MixPosition(epoch, (), self.planner.start(epoch))

    def resume(self, at: MixPosition) -> None:  # type: ignore[override]
        assert at.start is not None
        self.planner.resume(at.start)
        super().resume(at)

    def continue_from(self, old: MixedEpochs, epoch: int) -> None:  # type: ignore[override]
        """Go on where ``old`` (the same corpora, some of them grown since: ``growing=True``) stands at
        the start of loader ``epoch``: the schedule's clock and every unchanged corpus where they were;
        a corpus whose shards changed begins an epoch of its own over them (the next one, if it had
        begun its current one: that one's plan was over the shards it had then)."""
        start = old.planner.start(epoch)
        cursors = tuple(cursor if new.shards.fingerprint() == was.shards.fingerprint()
                        else Cursor(cursor.epoch + 1 if cursor.done else cursor.epoch)
                        for cursor, new, was in zip(start.cursors, self.units, old.units))
        self.planner.resume(EpochStart(epoch, start.global_step, cursors))

    def run(self, at: MixPosition) -> MixedRun:  # type: ignore[override]
        return self._runs.get(at, lambda: MixedRun(self, at))  # type: ignore[return-value]

    def rows(self, bid: tuple[int, int, int, int]) -> np.ndarray:
        _, epoch, stream, batch = bid
        return self.planner.rows(epoch, stream, batch)

    def origins(self, bid: tuple[int, int, int, int]) -> tuple[np.ndarray | None, np.ndarray]:
        _, epoch, stream, batch = bid
        return self.planner.origins(epoch, stream, batch)

    def global_step(self, at: MixPosition) -> int:  # type: ignore[override]
        return self.planner.start(at.epoch).global_step + at.step

    def progress(self, at: MixPosition) -> list[float]:  # type: ignore[override]
        steps = self.run(self.start(at.epoch)).steps(0)
        done = 1.0 if self.complete(at) else min(1.0, at.step / steps) if steps else 0.0
        return self.planner.progress(at.epoch, done)

    # -- the resume state ---------------------------------------------------------------------------

    def position(self, saved: SavedState) -> MixPosition:
        """The saved position: where its epoch started (checked against the mixture's corpora), then
        its runs, checked against that epoch's plan."""
        start = self._saved_start(saved)
        with self.planner.anchored(start):
            at = super().position(saved)
        if saved.mixture is not None:
            try:
                changed = self.mixture.changes_from(Mixture.from_json(saved.mixture))
            except (KeyError, TypeError, ValueError) as e:
                raise StateError(f"the loader state's mixture is not readable ({type(e).__name__}): was it edited?") \
                    from None
            if changed:
                warnings.warn(f"the mixture differs from the one the loader state was saved with: {changed}; the new "
                              f"one applies from the next epoch on", UserWarning, stacklevel=3)
        return MixPosition(at.epoch, at.runs, self.planner.fixed(start))

    def _saved_start(self, saved: SavedState) -> EpochStart:
        doc = saved.position
        if not isinstance(doc, Mapping) or "start" not in doc:
            raise StateError("the loader state is of a mixture planned per step by an older wdsprep (its position has "
                             "no start): this wdsprep plans mixtures alike on every topology, with other batches, "
                             "so it cannot resume that epoch; start the next epoch from the model's checkpoint")
        s = need(doc, "start", where="position.")
        where = "position.start."
        epoch = need_int(s, "epoch", hi=MAX_EPOCH, where=where)
        if epoch != saved.epoch:
            raise StateError(f"the loader state's {where}epoch is {epoch}, its epoch {saved.epoch}: the state was "
                             f"edited")
        raw = need_list(s, "cursors", most=len(self.units), where=where)
        if len(raw) != len(self.units):
            raise StateError(f"the loader state's position has {len(raw)} corpora, this loader {len(self.units)} "
                             f"({', '.join(self.corpora)}): resume with the corpora it was saved with")
        cursors = tuple(Cursor(*ints(c, 2, where=f"{where}cursors[{k}]")) for k, c in enumerate(raw))
        for k, (c, cursor) in enumerate(zip(self.corpora, cursors)):
            items = int(self.planner._items(k, cursor.epoch).sum())
            if cursor.epoch > MAX_EPOCH or cursor.done >= max(1, items):
                raise StateError(f"the loader state's {where}cursors[{k}] says item {cursor.done} of corpus {c!r}'s "
                                 f"epoch {cursor.epoch}, which has {items}: the state is not from these shards and "
                                 f"options, or was edited")
        takes = None
        if need(s, "takes", where=where) is not None:
            takes = tuple(ints(s["takes"], len(self.units), where=f"{where}takes"))
            most = MAX_ONE_PASSES * self.planner.one_pass
            if sum(takes) > most:
                raise StateError(f"the loader state's {where}takes ask {sum(takes):,} items of one epoch, more than "
                                 f"{MAX_ONE_PASSES} passes of every corpus ({most:,}): the state was edited")
        return EpochStart(epoch, need_int(s, "global_step", where=where), cursors, takes)

    def position_json(self, at: MixPosition) -> dict[str, Any]:  # type: ignore[override]
        return at.to_json()

    # -- what the readers are told ------------------------------------------------------------------

    def reader_start(self, at: MixPosition) -> dict[str, Any]:  # type: ignore[override]
        return {**super().reader_start(at), "start": self.position_json(at)["start"]}

    def from_reader_start(self, doc: Mapping[str, Any]) -> MixPosition:  # type: ignore[override]
        s = doc["start"]
        start = EpochStart(int(s["epoch"]), int(s["global_step"]), tuple(Cursor(*c) for c in s["cursors"]),
                           tuple(s["takes"]))
        if self.planner.known(start.epoch) != start:  # a reader process: plan from the main process's start
            self.planner.resume(start)
        at = super().from_reader_start(doc)
        return MixPosition(at.epoch, at.runs, start)


class MixedRun(CorpusRun):
    """The rest of a mixed epoch from a position, on the source's topology: a corpus's run, with each
    corpus's shuffle report."""

    source: MixedEpochs

    def planned_stats(self, rank: int) -> LoaderStats:
        st = super().planned_stats(rank)
        st.corpora = {name: st.corpora.get(name, CorpusStats()) for name in self.source.corpora}
        return st

    def report_shuffle(self, st: LoaderStats, rank: int) -> None:
        """Each corpus's shuffle report of ``rank``'s batches, into ``st``."""
        for name, q in self.shuffle(ranks=[rank]).items():
            st.corpora.setdefault(name, CorpusStats()).shuffle = q

    def shuffle(self, *, ranks: Sequence[int]) -> dict[str, dict[str, Any]]:
        """Each corpus's shuffle report (``plan/quality.py``) over the first :data:`REPORTED_BATCHES`
        batches ``ranks`` get: a batch counts for each corpus it holds, with that corpus's utterances."""
        s = self.source
        assert s.speakers is not None
        sequences = []
        for r in ranks:
            seq = []
            for stream, j in rank_order(self.assignment, r)[:REPORTED_BATCHES]:
                st = s.planner.stream(self.at.epoch, stream)
                rows, (units, _) = st.batch(j), st.origins(j)
                seq.extend((int(c), rows[units == c]) for c in np.unique(units).tolist())
            sequences.append(seq)
        qs = corpus_quality(sequences, [c.global_rows() for c in s.units], s.speakers.ids, s.shards.frames,
                            source=s.speakers.source)
        return {name: q.to_dict() for name, q in zip(s.corpora, qs)}


def mixed_seed(seed: int, name: str) -> int:
    """A mixed corpus's seed: of the loader's and its name, so adding a corpus leaves the others' plans."""
    return derive_seed(seed, zlib.crc32(name.encode()))


