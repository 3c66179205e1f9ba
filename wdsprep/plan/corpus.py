"""One corpus planned on its own: the unit every epoch source is made of.

A :class:`Corpus` is a shard set planned as one (a corpus; in dev mode the named corpora's union;
with ``mix_by``, the rows of one value of a column in one corpus) with its own seed: its epochs'
plans (``streams.py``), what each leaves out, and where its rows sit in the loader's shard set.
One corpus read alone is ``epochs.CorpusEpochs``; several mixed are ``mix.epochs.MixedEpochs``.  Pure: no I/O, no torch.

Plans are kept in three small most-recently-used tables, one idiom: whole plans (the main
process's stats and shuffle report), single streams (a reader plans only the streams it reads)
and each epoch's batch counts and sizes (what dealing batches to readers needs).

With speed perturbation (``options.speed``) every utterance's factor is drawn per corpus epoch
(``augment.speed_choices``: from the corpus's seed, the epoch and its row) and the epoch is
planned with the perturbed frame counts (:meth:`Corpus.frames`): batches are cut by the lengths
the reader will deliver, which applies the same factors (:meth:`Corpus.speeds`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

from wdsprep.plan.augment import perturbed_frames, speed_choices
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.state import read_published
from wdsprep.plan.stats import LoaderStats
from wdsprep.plan.streams import (
    EpochPlan,
    Layout,
    PlanOptions,
    StreamPlan,
    StreamRows,
    layout,
    plan_epoch,
    plan_streams,
    stream_rows,
    stream_shards,
)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """The ``size`` values last used, by key; older ones are forgotten."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def peek(self, key: K) -> V | None:
        return self._items.get(key)


@dataclass(frozen=True)
class EpochBatches:
    """An epoch's batches per stream, and (in the main process) utterances per batch; tallied
    stream by stream (:attr:`Corpus.lean`), also what each stream left out and, where asked for,
    the epoch's utterances per speaker (the shuffle report's population)."""

    counts: np.ndarray  # int64 [streams]
    sizes: list[np.ndarray] | None = None  # per stream: utterances in each batch; None where only counts are known
    dropped: list[dict[str, int]] | None = None  # per stream: reason -> utterances the plan left out
    speakers: np.ndarray | None = None  # int64 [speaker ids]: the epoch's utterances of each


class FixedShards:
    """What a loader asks of every epoch source besides the plan, for one planned over a fixed shard
    set (every source but ``follow.GrowingSource``, which replans as a pack publishes shards)."""

    revision = 0  # how many times the plan's shard set changed: readers forked before plan an old one

    def follow(self, epoch: int) -> bool:
        """Plan ``epoch`` over the shards there are now; whether the shard set changed: never here."""
        return False

    def begin(self, epoch: int) -> None:
        """``epoch`` is being iterated."""

    def saved(self) -> dict[str, Any]:
        """What a resume state records beyond the position: nothing here."""
        return {}

    def restored(self, state: Any) -> FixedShards:
        """This source as ``state`` says it was: the same (its ``published``, if any, is checked)."""
        read_published(state)
        return self

    def annotate(self, stats: LoaderStats) -> None:
        """What the source knows of the epoch beyond the plan, into ``stats``: nothing here."""


class Corpus:
    """A shard set planned as one, with its own seed; its rows start at ``row0`` of the loader's shard set.

    ``speakers`` (one id per row of this corpus) is kept only when the plan depends on it
    (``options.max_utts_per_speaker``).  ``rowmap``: a corpus whose rows are not contiguous in the
    loader's shard set (a subset ``mix_by`` made) gives each of its rows' place there, ascending;
    ``parent``: the named corpus it is (a subset of): its transforms are that one's.
    """

    def __init__(self, shards: ShardSet, options: PlanOptions, *, seed: int, row0: int = 0,
                 speakers: np.ndarray | None = None, rowmap: np.ndarray | None = None, parent: int = 0) -> None:
        self.shards = shards
        self.options = options
        self.seed = seed
        self.row0 = row0
        self.rowmap = rowmap
        self.parent = parent
        self.speakers = speakers if options.max_utts_per_speaker is not None else None
        if options.max_utts_per_speaker is not None and speakers is None:
            raise ValueError("max_utts_per_speaker needs every utterance's speaker, from the shards' index")
        self.tokens = shards.tokens if options.needs_tokens else None  # each label's length: the cost, the filters
        if options.speed is not None and (shards.samples is None or shards.audio is None):
            raise ValueError("speed perturbation resamples audio: these shards hold features; pack the audio "
                             "(layout flac or wav) or leave speed out of augment")
        # From the index's frames, so every epoch has the same streams whatever its speed draws.
        self.layout: Layout = layout(options, shards.utts, shards.frames, self.tokens)
        self._speeds: LRU[int, tuple[np.ndarray, np.ndarray]] = LRU(2)  # epoch -> (choices, frames)
        self._plans: LRU[int, EpochPlan] = LRU(1)
        self._streams: LRU[tuple[int, int], StreamPlan] = LRU(256)
        self._tallies: LRU[int, EpochBatches] = LRU(4)
        self._dealt: LRU[int, list[np.ndarray]] = LRU(2)  # epoch -> each stream's shards
        self._rows: LRU[tuple[int, int], StreamRows] = LRU(256)  # (epoch, stream) -> its rows before batches
        # Tally an epoch stream by stream and keep no whole plan: a rank of many needs the batch counts
        # of every stream but the rows of few (at 36 M utterances the whole plan is 144 MB a rank).
        self.lean = False
        # Each row's speaker id, for tallies to count the epoch's utterances per speaker (None: not counted).
        self.count_speakers: np.ndarray | None = None

    @property
    def num_streams(self) -> int:
        return self.layout.streams

    def _epoch(self, epoch: int) -> int:
        return epoch if self.options.train else 0  # dev mode: the same batches every epoch

    def _plan(self, epoch: int, streams: list[int] | None = None) -> EpochPlan:
        return plan_epoch(self.shards.utts, self.frames(epoch), self.options, seed=self.seed, epoch=epoch,
                          streams=streams, speakers=self.speakers, tokens=self.tokens, laid_out=self.layout)

    def _speed(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        speed, shards = self.options.speed, self.shards
        assert speed is not None and shards.samples is not None and shards.audio is not None

        epoch = self._epoch(epoch)

        def draw() -> tuple[np.ndarray, np.ndarray]:
            choices = speed_choices(speed, self.seed, epoch, shards.num_utts)
            return choices, perturbed_frames(shards.samples, choices, speed, shards.audio.sample_rate)

        return self._speeds.get(epoch, draw)

    def frames(self, epoch: int) -> np.ndarray:
        """Every row's frames as ``epoch`` is planned: the index's, or after its speed factor."""
        return self.shards.frames if self.options.speed is None else self._speed(epoch)[1]

    def speeds(self, epoch: int) -> np.ndarray | None:
        """Every row's speed factor in ``epoch`` (an index into ``options.speed.factors``); None without speed."""
        return None if self.options.speed is None else self._speed(epoch)[0]

    def plan(self, epoch: int) -> EpochPlan:
        """Every stream's plan of ``epoch`` (the last one asked for is kept)."""
        epoch = self._epoch(epoch)
        return self._plans.get(epoch, lambda: self._plan(epoch))

    def stream(self, epoch: int, stream: int) -> StreamPlan:
        """One stream's plan: from the whole plan when it is at hand, else planned alone."""
        epoch = self._epoch(epoch)
        whole = self._plans.peek(epoch)
        if whole is not None:
            return whole.streams[stream]
        return self._streams.get((epoch, stream), lambda: self._plan(epoch, [stream]).streams[stream])

    def counts(self, epoch: int) -> np.ndarray:
        """Batches per stream of ``epoch``."""
        return self._tally(epoch, sizes=False).counts

    def sizes(self, epoch: int) -> list[np.ndarray]:
        """Per stream, the utterances of each batch of ``epoch``."""
        sizes = self._tally(epoch, sizes=True).sizes
        assert sizes is not None
        return sizes

    def know_counts(self, epoch: int, counts: np.ndarray) -> None:
        """Take the batch counts of ``epoch`` as given (a reader told by the main process), so
        dealing the epoch does not plan every stream again."""
        epoch = self._epoch(epoch)
        if self._tallies.peek(epoch) is None:
            self._tallies.put(epoch, EpochBatches(np.asarray(counts, np.int64)))

    def _tally(self, epoch: int, *, sizes: bool) -> EpochBatches:
        epoch = self._epoch(epoch)
        got = self._tallies.peek(epoch)
        if got is None or (sizes and got.sizes is None):
            if self.lean:
                got = self._lean_tally(epoch)
            else:
                plan = self.plan(epoch)  # kept: the batches of the epoch dealt now are read next
                got = EpochBatches(plan.counts, [np.diff(s.starts) for s in plan.streams])
            self._tallies.put(epoch, got)
        return got

    def _lean_tally(self, epoch: int) -> EpochBatches:
        """The tally of ``epoch`` from its streams planned one at a time, each let go once counted."""
        counts, sizes, dropped = [], [], []
        ids = self.count_speakers
        speakers = None if ids is None else np.zeros(int(ids.max(initial=-1)) + 1, np.int64)
        for plan in plan_streams(self.shards.utts, self.frames(epoch), self.options, seed=self.seed, epoch=epoch,
                                 speakers=self.speakers, tokens=self.tokens, laid_out=self.layout):
            counts.append(plan.num_batches)
            sizes.append(np.diff(plan.starts))
            dropped.append(dict(plan.dropped))
            if speakers is not None and ids is not None:
                speakers += np.bincount(ids[plan.rows], minlength=len(speakers))
        return EpochBatches(np.array(counts, np.int64), sizes, dropped, speakers)

    def speaker_counts(self, epoch: int) -> np.ndarray | None:
        """The epoch's utterances per speaker id, where a lean tally counted them (else None)."""
        return self._tally(epoch, sizes=True).speakers

    def dropped(self, epoch: int, stream: int) -> Counter[str]:
        """What the plan of a stream leaves out of ``epoch``: its length filters, and the samples
        of its shards the index says cannot be read."""
        tally = self._tallies.peek(self._epoch(epoch))
        if tally is not None and tally.dropped is not None:
            left, shards = tally.dropped[stream], self._stream_shards(self._epoch(epoch))[stream]
        else:
            s = self.stream(epoch, stream)
            left, shards = s.dropped, s.shards
        unreadable = int(self.shards.lost[shards].sum()) if len(shards) else 0
        return Counter(left) + Counter({"unreadable": unreadable})  # zero counts drop out

    def rows(self, epoch: int, stream: int, batch: int) -> np.ndarray:
        """A planned batch's rows in the loader's shard set."""
        return self.to_global(self.stream(epoch, stream).batch(batch))

    def batch_frames(self, epoch: int, stream: int, batch: int) -> np.ndarray:
        """The frames a planned batch's rows were planned with (after speed perturbation)."""
        return self.frames(epoch)[self.stream(epoch, stream).batch(batch)]

    def to_global(self, local: np.ndarray) -> np.ndarray:
        """This corpus's rows as rows of the loader's shard set."""
        # int64 first: a plan's rows are int32 (streams.compact_rows), the loader's shard set may have more.
        return np.asarray(local, np.int64) + self.row0 if self.rowmap is None else self.rowmap[local]

    def stream_rows(self, epoch: int, stream: int) -> StreamRows:
        """A stream's rows of ``epoch`` before they are batched (its own rows, in the order its
        shuffle buffer gives them, those the filters keep): what a mixture of utterances takes."""
        epoch = self._epoch(epoch)
        return self._rows.get((epoch, stream), lambda: stream_rows(
            self.shards.starts, self.frames(epoch), self._stream_shards(epoch)[stream], stream, seed=self.seed,
            epoch=epoch, options=self.options, tokens=self.tokens))

    def _stream_shards(self, epoch: int) -> list[np.ndarray]:
        return self._dealt.get(epoch, lambda: stream_shards(self.shards.utts, self.frames(epoch), self.layout.streams,
                                                            seed=self.seed, epoch=epoch, shuffle=self.options.train))

    def kept(self, epoch: int) -> np.ndarray:
        """Per stream, the utterances of ``epoch`` the filters keep."""
        return np.array([len(self.stream_rows(epoch, s).rows) for s in range(self.num_streams)], np.int64)

    def left_out(self, epoch: int, stream: int) -> Counter[str]:
        """:meth:`dropped`, from the stream's rows alone (no batch is cut)."""
        shards = self._stream_shards(self._epoch(epoch))[stream]
        unreadable = int(self.shards.lost[shards].sum()) if len(shards) else 0
        return Counter(self.stream_rows(epoch, stream).dropped) + Counter({"unreadable": unreadable})

    def local(self, rows: np.ndarray) -> np.ndarray:
        """Rows of the loader's shard set as this corpus's own rows (what its draws are keyed by)."""
        return rows - self.row0 if self.rowmap is None else np.searchsorted(self.rowmap, rows)

    def global_rows(self) -> range | np.ndarray:
        """This corpus's rows in the loader's shard set."""
        return range(self.row0, self.row0 + self.shards.num_utts) if self.rowmap is None else self.rowmap
