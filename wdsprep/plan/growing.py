"""Following shard folders a pack is still writing: ``make_loader(..., growing=True)``.

A pack publishes its shards one by one, in plan order within each folder
(:mod:`wdsprep.format.commit`), so a growing folder's published shards are a prefix of its final
ones and where it stands is one number.  A :class:`View` is that number for every growing folder
a trset names.  Every epoch is planned over the shards of the view taken when it starts (rank 0's,
shared with every rank), and the loader's resume state records the view, so a resume plans the
same epoch on any topology even if more shards were published since.  Complete folders are read
whole, as without ``growing``; once every folder is complete an epoch is exactly the one an
ordinary loader plans.  Local shards only: a remote folder is read once its pack is complete
and uploaded.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from braceexpand import braceexpand

from wdsprep.errors import DataError
from wdsprep.format.commit import pending, pending_folder, read_plan
from wdsprep.format.index import FolderIndex, read_index
from wdsprep.format.shardlist import expand_shards, index_place, is_url
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.streams import TooFewBatches
from wdsprep.units import hours

# How long a rank waits to see shards rank 0 saw published (a network file system may show them late).
VISIBLE_WITHIN = 30.0
# How often a wait for shards says again what it waits for.
REMIND_EVERY = 60.0


@dataclass(frozen=True)
class View:
    """Shards published per growing folder (absolute path) when an epoch was planned."""

    published: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, int]:
        return dict(sorted(self.published.items()))

    @classmethod
    def from_json(cls, doc: Mapping[str, int]) -> View:
        return cls(dict(doc))


def patterns_of(trset: Any) -> list[str]:
    """Every shard pattern of a trset (a pattern, a list, or named corpora of either)."""
    parts = trset.values() if isinstance(trset, Mapping) else [trset]
    out: list[str] = []
    for p in parts:
        out.extend([str(p)] if isinstance(p, (str, os.PathLike)) else [str(x) for x in p])
    return out


def observe(trset: Any) -> View:
    """Where every growing folder the trset's patterns name stands now (a folder of a growing pack's
    plan with nothing published yet too, at 0)."""
    patterns = patterns_of(trset)
    folders = [index_place(url)[0] for url in expand_shards(patterns, growing=True) if not is_url(url)]
    folders += planned_folders(patterns)
    published: dict[str, int] = {}
    for folder in dict.fromkeys(folders):
        if pending_folder(folder) is not None:
            index = read_index(folder)  # a growing folder's: its published shards
            published[folder] = 0 if index is None else len(index.names)
    return View(published)


def planned_folders(patterns: Sequence[str]) -> list[str]:
    """The folders of growing packs' plans that local ``patterns`` name, whether they exist yet or not."""
    out = []
    for pattern in patterns:
        for p in braceexpand(pattern):
            if is_url(p):
                continue
            where = os.path.dirname(os.path.abspath(p))
            for d in (where, os.path.dirname(where)):
                m = None if glob.has_magic(d) else pending(d)
                if m is None:
                    continue
                plan = read_plan(m.parent)
                for name in plan.folders if plan is not None else []:
                    folder = os.path.join(str(m.parent), name) if name else str(m.parent)
                    if fnmatch.fnmatchcase(os.path.normpath(folder), where):
                        out.append(os.path.normpath(folder))
                break
    return out


def packs_without_shards(patterns: Sequence[str]) -> list[str]:
    """The pack folders local ``patterns`` name whose pack plans no shard, or has ended without one
    (committed, nothing published): a loader waiting on them would wait for nothing."""
    out = []
    for pattern in patterns:
        for p in braceexpand(pattern):
            where = os.path.dirname(os.path.abspath(p))
            for d in (where, os.path.dirname(where)):
                if is_url(p) or glob.has_magic(d):
                    continue
                plan = read_plan(d)
                if plan is None:
                    continue
                shards = glob.glob(os.path.join(glob.escape(d), "**", "*.tar"), recursive=True)
                if plan.shards == 0 or (pending(d) is None and not shards):
                    out.append(d)
                    break
    return list(dict.fromkeys(out))


def published_shards(urls: Sequence[str], view: View, *,
                     wait: float = 0.0) -> tuple[list[str], dict[str, FolderIndex]]:
    """The shards of ``urls`` the view counts as published, and the indexes of the folders it holds
    (as they stood then: their first ``n`` shards).  A folder growing now that the view does not
    hold was not there when it was taken: none of its shards are.  ``wait``: seconds to wait for
    shards the view counts to be seen here (another rank's view: a network file system may show
    them late)."""
    kept: list[str] = []
    indexes: dict[str, FolderIndex] = {}
    complete: set[str] = set()
    for url in urls:
        if is_url(url):
            kept.append(url)
            continue
        folder, name = index_place(url)
        if folder not in indexes and folder not in complete:
            n = view.published.get(folder)
            if n is None and pending_folder(folder) is None:
                complete.add(folder)
            else:
                indexes[folder] = _first(folder, n or 0, wait)
        if folder in indexes and indexes[folder].position(name) is None:
            continue
        kept.append(url)
    return kept, indexes


def _first(folder: str, n: int, wait: float) -> FolderIndex:
    """The index of ``folder``'s first ``n`` published shards, once they can be seen."""
    deadline = time.monotonic() + wait
    while True:
        index = read_index(folder)
        have = 0 if index is None else len(index.names)
        if have >= n:
            assert index is not None or n == 0
            return index.head(n) if index is not None else _empty(folder)
        if time.monotonic() > deadline:
            raise DataError(f"{folder}: {n:,} shards were published when this epoch was planned (by rank 0, or as the "
                            f"loader state records), only {have:,} are now: was the pack started again with "
                            f"--overwrite? Resume from a state saved after that, or start the training anew")
        time.sleep(0.2)


def _empty(folder: str) -> FolderIndex:
    return FolderIndex("cat", None, "float32", [], np.zeros(0, np.int64), np.zeros(0, np.int32),
                       np.zeros(0, np.int32), folder=folder, keys=[])


def coverage(shards: ShardSet, view: View) -> dict[str, Any]:
    """How much of the final corpus ``shards`` (planned over ``view``) holds: shards, utterances and
    hours now and once every pack is complete (None where a pack has not said yet)."""
    folders: dict[str, list[int]] = {}
    for k, url in enumerate(shards.urls):
        folder = url if is_url(url) else index_place(url)[0]
        rows = folders.setdefault(folder, [0, 0, 0])
        rows[0] += 1
        rows[1] += int(shards.utts[k])
        rows[2] += int(shards.frames[shards.starts[k]:shards.starts[k + 1]].sum(dtype=np.int64))
    seen = list(dict.fromkeys([*folders, *view.published]))
    # No folder seen yet (a pack that has not recorded its plan): the final size is not known.
    final: list[int | None] = [0, 0, 0] if seen else [None, None, None]
    growing = 0
    for folder in seen:
        now = folders.get(folder, [0, 0, 0])
        g = None if is_url(folder) else pending_folder(folder)
        if g is None:
            planned: list[int] | None = now
        else:
            growing += 1
            p = g.planned
            planned = None if p is None else [p.shards, p.utts, p.frames]
        for i in range(3):
            final[i] = None if final[i] is None or planned is None else final[i] + planned[i]  # type: ignore[operator]
    now_total = [sum(r[i] for r in folders.values()) for i in range(3)]
    return {"complete": growing == 0, "growing_folders": growing,
            "shards": now_total[0], "shards_final": final[0],
            "utterances": now_total[1], "utterances_final": final[1],
            "hours": round(hours(now_total[2]), 4),
            "hours_final": None if final[2] is None else round(hours(final[2]), 4),
            "fraction": (now_total[1] / final[1]) if final[1] else None}


def describe(c: Mapping[str, Any]) -> str:
    """One line of :func:`coverage`, for people."""
    if c["complete"]:
        return f"complete: {c['shards']:,} shards, {c['utterances']:,} utterances, {c['hours']:.2f} h"
    of = lambda k: "" if c[f"{k}_final"] is None else f" of {c[f'{k}_final']:,}"  # noqa: E731
    share = "" if c["fraction"] is None else f" ({c['fraction']:.1%} of the final corpus)"
    hours_of = "" if c["hours_final"] is None else f" of {c['hours_final']:.2f}"
    return (f"growing ({c['growing_folders']} folder(s) still being packed): {c['shards']:,}{of('shards')} shards, "
            f"{c['utterances']:,}{of('utterances')} utterances{share}, {c['hours']:.2f}{hours_of} h published")


def _refuse_beyond_plans(c: Mapping[str, Any], patterns: Sequence[str], want_shards: int,
                        min_hours: float | None) -> None:
    """A wait the packs' plans say can never end (they will publish fewer shards or hours in all)
    is refused at once, rather than after the whole wait_timeout."""
    final, final_hours = c["shards_final"], c["hours_final"]
    if final is not None and final < want_shards:
        raise DataError(f"growing loader: the packs of {patterns} will publish {final:,} shards in all (their "
                        f"pack_plan.json), fewer than min_shards={want_shards:,}: it would wait in vain; lower "
                        f"min_shards")
    if min_hours is not None and final_hours is not None and final_hours < min_hours:
        raise DataError(f"growing loader: the packs of {patterns} will publish {final_hours:.2f} h in all (their "
                        f"pack_plan.json), less than min_hours={min_hours:g}: it would wait in vain; lower min_hours")


def wait_for(trset: Any, load: Callable[[View], ShardSet], *, min_shards: int | None, min_hours: float | None,
             timeout: float, check: Callable[[ShardSet], object] | None = None, poll: float = 0.2,
             remind: float = REMIND_EVERY) -> View:
    """Wait until the trset's published shards reach ``min_shards`` and ``min_hours`` (at least one
    shard either way) and ``check`` (planning the epoch) does not find too few batches for the ranks,
    checking every ``poll`` s (a look at each growing folder's index: cheap, and the first epoch then
    starts within a fraction of a second of its shards); a TimeoutError after ``timeout`` s saying how
    far they got and what to do.  What it waits for is said on stderr when it begins, and again every
    ``remind`` s (``still waiting``): a log then shows a wait that goes on."""
    want_shards = max(1, min_shards or 0)
    patterns = patterns_of(trset)  # for the messages
    start = time.monotonic()
    said = start - remind  # the first wait is said at once

    def say(what: str) -> None:
        nonlocal said
        now = time.monotonic()
        if now - said >= remind:
            again = f"still waiting after {now - start:.0f} s" if now > start + remind / 2 else "waiting"
            print(f"wdsprep loader: {again} for {what}; at most {timeout:g} s (wait_timeout)", file=sys.stderr,
                  flush=True)
            said = now
    while True:
        try:
            view = observe(trset)
            shards = load(view)
        except FileNotFoundError as e:  # nothing there yet: the pack may not have begun
            empty = packs_without_shards(patterns)
            if empty:
                raise DataError(f"growing loader: the pack of {empty[0]} has ended with no shards, so {patterns} will "
                                f"never have one: see why in {os.path.join(empty[0], 'pack_report.json')}") from None
            if time.monotonic() - start >= timeout:
                raise TimeoutError(f"growing loader: after {timeout:g} s there are still no shards: {e}. Is the "
                                   f"pack running, into the folder the pattern names?") from None
            say(f"a pack to begin publishing {patterns} ({e})")
            time.sleep(poll)
            continue
        have_hours = hours(int(shards.frames.sum(dtype=np.int64)))
        want = f"{want_shards:,} shard(s)" + ("" if min_hours is None else f" and {min_hours:g} h")
        _refuse_beyond_plans(coverage(shards, view), patterns, want_shards, min_hours)
        if len(shards) >= want_shards and (min_hours is None or have_hours >= min_hours):
            try:
                if check is not None:
                    check(shards)
                return view
            except TooFewBatches as e:
                want += f" and enough batches for every rank (now: {e})"
        if not any(pending_folder(f) is not None for f in view.published) and len(shards):
            raise DataError(f"growing loader: {patterns} is complete with {len(shards):,} shards "
                            f"({have_hours:.2f} h), too few: it waits for {want}")
        waited = time.monotonic() - start
        if waited >= timeout:
            raise TimeoutError(
                f"growing loader: after {waited:.0f} s {len(shards):,} shards ({have_hours:.2f} h) of "
                f"{patterns} are published, and it waits for {want} (min_shards/min_hours). Is the pack "
                f"running? A stopped one finishes with the same pack command and --resume; to wait longer, raise "
                f"wait_timeout (--wait-timeout)")
        say(f"{want} of {patterns} to be published ({len(shards):,} shards, {have_hours:.2f} h so far)")
        time.sleep(min(poll, max(0.0, timeout - waited)))
