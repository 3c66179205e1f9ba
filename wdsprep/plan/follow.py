"""Folders a pack is still writing, followed by an epoch source: ``make_loader(..., growing=True)``.

:class:`GrowingSource` is an epoch source whose shard set is not fixed: it plans each epoch over the
shards published when the epoch is set.  It holds the source an ordinary loader would plan over a
view of the folders (``growing.View``: how many shards each growing folder had published) and
builds a new one when an epoch is set and the view has changed: rank 0 observes the folders,
every rank plans over rank 0's view (:class:`Ranks`), a mixture's corpora go on where they stood,
and the resume state records the view (``published``), so a resume plans the same epoch on any
topology whatever was published since.  Everything else is the held source's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from wdsprep.format.commit import pack_running, pending_folder
from wdsprep.plan.corpus import Corpus
from wdsprep.plan.growing import View, coverage, describe, observe
from wdsprep.plan.mix.weights import Mixture
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.source import EpochRun, EpochSource
from wdsprep.plan.state import SavedState, StateError, read_published
from wdsprep.plan.stats import LoaderStats
from wdsprep.plan.streams import BatchId


def _alone(value: Any, where: str) -> Any:
    return value


@dataclass(frozen=True)
class Ranks:
    """How a growing source agrees with the other ranks: ``share`` hands every rank rank 0's value,
    ``leader`` says whether this is rank 0 (the one that looks at the folders), and ``visible_within``
    is how long to wait to see shards rank 0 saw (a network file system may show them late)."""

    share: Callable[[Any, str], Any] = _alone
    leader: bool = True
    visible_within: float = 0.0


class GrowingSource:
    """An epoch source over folders a pack is still writing (see the module's docstring).

    ``build(view, wait)`` is the source an ordinary loader plans over the shards ``view`` counts
    (``wait``: seconds to wait to see them).  The epoch a view is fixed for is the one set,
    iterated or resumed: a later :meth:`follow` of the same epoch keeps it.
    """

    def __init__(self, trset: Any, build: Callable[[View, float], EpochSource], view: View, ranks: Ranks) -> None:
        self.trset = trset
        self.build = build
        self.ranks = ranks
        self.view = view
        self.held = build(view, ranks.visible_within)
        self.coverage = coverage(self.held.shards, view)
        self.epoch: int | None = None
        self.revision = 0  # how many times the held source was replaced: readers forked before hold an old one
        self._said: set[Path] = set()  # packs said to have stopped

    # What a loader asks of any epoch source besides the plan (``source.FixedShards`` for the others).

    def follow(self, epoch: int) -> bool:
        """Plan ``epoch`` over the shards published now (rank 0's view), unless the view is fixed for
        it already; whether the plan's shard set changed."""
        if self.epoch == epoch:
            return False
        seen = observe(self.trset).to_json() if self.ranks.leader else None
        if seen is not None:
            self._say_stopped(seen)
        view = View.from_json(self.ranks.share(seen, f"set_epoch({epoch}), sharing rank 0's view of the growing "
                                                     f"shards"))
        changed = view != self.view
        if changed:
            self._hold(view, carry_to=epoch)
        self.epoch = epoch
        return changed

    def _say_stopped(self, seen: Mapping[str, int]) -> None:
        """Warn (once per pack) when a pack the loader follows has stopped: its folder is still
        unfinished but no pack holds its lock, so every epoch from now on trains on the same part."""
        for folder in seen:
            g = pending_folder(folder)
            if g is None or g.marker.parent in self._said or pack_running(g.marker.parent):
                continue
            self._said.add(g.marker.parent)
            c = coverage(self.held.shards, View.from_json(seen))
            warnings.warn(f"growing loader: no pack is writing {g.marker.parent} (it stopped, {g.marker.name} is "
                          f"still there): every epoch trains on the {describe(c).removeprefix('growing ')} until "
                          f"it goes on; finish it with the same pack command and --resume", RuntimeWarning,
                          stacklevel=4)

    def begin(self, epoch: int) -> None:
        """``epoch`` is iterated: over the shards held, if no view was fixed for an epoch yet."""
        if self.epoch is None:
            self.epoch = epoch

    def saved(self) -> dict[str, Any]:
        """What a resume state records beyond the position: the shards the epoch is planned over."""
        return {"published": self.view.to_json()}

    def restored(self, state: Any) -> GrowingSource:
        """This source as ``state`` says it was (planned over the shards it records), without changing
        this one: the loader adopts it once the whole state is checked against it."""
        published = read_published(state)
        view = View.from_json(published) if published is not None else self.view
        epoch = state.get("epoch") if isinstance(state, Mapping) else None
        out = self
        if view != self.view:
            out = object.__new__(GrowingSource)
            out.__dict__.update(self.__dict__)
            try:
                out._hold(view, carry_to=None)
            except FileNotFoundError as e:
                raise StateError(f"the loader state's published shards cannot be found ({e})") from None
        out.epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None
        return out

    def annotate(self, stats: LoaderStats) -> None:
        """How much of the final corpus the epoch's shards hold, into ``stats.growing``."""
        stats.growing = dict(self.coverage)

    def _hold(self, view: View, *, carry_to: int | None) -> None:
        """Hold the source over ``view``; ``carry_to``: it goes on where the held one stands at that
        epoch's start (a mixture's corpora; None: a loaded state says where)."""
        source = self.build(view, self.ranks.visible_within)
        if carry_to is not None:
            source.continue_from(self.held, carry_to)
        self.held, self.view = source, view
        self.coverage = coverage(source.shards, view)
        self.revision += 1

    # The held source's plan.

    @property
    def kind(self) -> str:
        return self.held.kind

    @property
    def corpora(self) -> tuple[str, ...]:
        return self.held.corpora

    @property
    def shards(self) -> ShardSet:
        return self.held.shards

    @property
    def mixture(self) -> Mixture | None:
        return self.held.mixture

    @property
    def mix_unit(self) -> str | None:
        return self.held.mix_unit

    @property
    def world_size(self) -> int:
        return self.held.world_size

    @property
    def num_workers(self) -> int:
        return self.held.num_workers

    @property
    def num_streams(self) -> int:
        return self.held.num_streams

    def start(self, epoch: int) -> Any:
        return self.held.start(epoch)

    def resume(self, at: Any) -> None:
        self.held.resume(at)

    def continue_from(self, old: Any, epoch: int) -> None:
        self.held.continue_from(old.held if isinstance(old, GrowingSource) else old, epoch)

    def run(self, at: Any) -> EpochRun:
        return self.held.run(at)

    def rows(self, bid: BatchId) -> np.ndarray:
        return self.held.rows(bid)

    def corpus_of(self, c: int) -> Corpus:
        return self.held.corpus_of(c)

    def origins(self, bid: BatchId) -> tuple[np.ndarray | None, np.ndarray]:
        return self.held.origins(bid)

    def planned_frames(self, bid: BatchId) -> np.ndarray:
        return self.held.planned_frames(bid)

    def complete(self, at: Any) -> bool:
        return self.held.complete(at)

    def global_step(self, at: Any) -> int | None:
        return self.held.global_step(at)

    def progress(self, at: Any) -> list[float] | None:
        return self.held.progress(at)

    def position(self, saved: SavedState) -> Any:
        return self.held.position(saved)

    def position_json(self, at: Any) -> dict[str, Any]:
        return self.held.position_json(at)

    def reader_start(self, at: Any) -> dict[str, Any]:
        return self.held.reader_start(at)

    def from_reader_start(self, doc: Mapping[str, Any]) -> Any:
        return self.held.from_reader_start(doc)
