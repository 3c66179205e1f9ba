"""``inspect``: what is in a set of shards, per length group and per shard, at a glance.

For each shard: utterances, hours, frames min/median/max, transcript length min/median/max and
layout; over all of them, the hours of each language where the shards carry one (``pack
--utt2lang``).  Where a folder has an ``index.json`` the numbers come from it and the tars are never
opened, so inspecting 100,000 hours takes seconds.  Shards without an index (e.g. written by CAT)
and shards their folder's index does not list are read: the frame count comes from the ``.npy``
header alone (the matrix is skipped), the transcript length from the text member.  Shards on S3
or a web server are inspected from the index beside them; only those it does not list are downloaded.

The padding-efficiency curve answers "how much of a batch is padding at this ``max_frames``?"
by running the loader's own ``bucket_batches`` over the (shuffled) lengths.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.check.plot import thousands
from wdsprep.files import naming, write_text
from wdsprep.format.commit import pending_folder
from wdsprep.format.index import INDEX_NAME, ShardInfo, read_index, read_index_at
from wdsprep.format.keys import LANG
from wdsprep.format.reindex import scan_shard
from wdsprep.format.shardlist import expand_shards, index_place, is_url, refuse_commands
from wdsprep.plan.options import FetchOptions
from wdsprep.plan.shardset import fetched_shard
from wdsprep.remote.fetch import FetchError, RetryPolicy, fetch_file
from wdsprep.remote.listing import lister
from wdsprep.remote.urls import redact
from wdsprep.units import hours

# The padding-efficiency curve's max_frames, in units of the corpus's 95th-percentile utterance:
# from a few long utterances per batch to tens (a fixed 5k-80k range showed only noise on a corpus
# of short utterances, and nothing of one of long ones).
CURVE_BUDGETS = (2, 4, 8, 16, 32)


def curve_budgets(frames: np.ndarray) -> list[int]:
    """max_frames values for the padding-efficiency curve of a corpus of these lengths (two
    significant digits each)."""
    if not len(frames):
        return []
    p95 = float(np.quantile(frames, 0.95))
    out = []
    for k in CURVE_BUDGETS:
        v = max(1.0, k * p95)
        scale = 10 ** max(0, int(np.floor(np.log10(v))) - 1)
        out.append(int(round(v / scale) * scale))
    return sorted(set(out))
# bucket_batches is pure Python; beyond this many utterances the curve is computed on a seeded
# random subset, which changes the efficiency only in the third decimal.
MAX_CURVE_UTTS = 100_000
ALL = "all"  # name of the curve over every selected shard together (what one loader sees)

def _min_med_max(x: np.ndarray) -> tuple[float, float, float] | None:
    return (int(x.min()), float(np.median(x)), int(x.max())) if len(x) else None


@dataclass
class ShardStats:
    """Numbers for one shard; ``source`` says whether they came from the index or from the tar."""

    path: str
    group: str
    layout: str
    source: str  # "index" or "tar"
    frames: np.ndarray = field(repr=False)
    text_lens: np.ndarray = field(repr=False)
    langs: list[str] | None = field(default=None, repr=False)  # each utterance's language, where known

    @property
    def utts(self) -> int:
        return len(self.frames)

    @property
    def hours(self) -> float:
        return hours(self.frames.sum())

    def to_json(self) -> dict:
        return {"path": self.path, "group": self.group, "layout": self.layout, "source": self.source,
                **_length_json(self.frames, self.text_lens)}


@dataclass
class GroupStats:
    """One length group: the shards of one folder."""

    name: str
    folder: str
    shards: list[ShardStats]

    @property
    def frames(self) -> np.ndarray:
        return np.concatenate([s.frames for s in self.shards]) if self.shards else np.zeros(0, np.int64)

    @property
    def text_lens(self) -> np.ndarray:
        return np.concatenate([s.text_lens for s in self.shards]) if self.shards else np.zeros(0, np.int64)

    @property
    def utts(self) -> int:
        return sum(s.utts for s in self.shards)

    @property
    def hours(self) -> float:
        return sum(s.hours for s in self.shards)

    @property
    def layout(self) -> str:
        return "+".join(sorted({s.layout for s in self.shards}))

    @property
    def source(self) -> str:
        return "+".join(sorted({s.source for s in self.shards}))

    def to_json(self) -> dict:
        return {"name": self.name, "folder": self.folder, "num_shards": len(self.shards), "layout": self.layout,
                "source": self.source, **_length_json(self.frames, self.text_lens),
                "shards": [s.to_json() for s in self.shards]}


def _length_json(frames: np.ndarray, text_lens: np.ndarray) -> dict:
    f, t = _min_med_max(frames), _min_med_max(text_lens)
    return {"utterances": int(len(frames)), "frames": int(frames.sum()),
            "hours": round(hours(frames.sum()), 4),
            "frames_min_median_max": list(f) if f else None, "text_len_min_median_max": list(t) if t else None}


@dataclass
class InspectResult:
    """Per-group and per-shard numbers, the padding-efficiency curves and anything that could not be read."""

    groups: list[GroupStats]
    efficiency: dict[str, dict[int, float]]  # curve name (group or "all") -> max_frames -> real/padded frames
    problems: list[str] = field(default_factory=list)
    plot: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. folders still being packed

    @property
    def shards(self) -> list[ShardStats]:
        return [s for g in self.groups for s in g.shards]

    @property
    def utts(self) -> int:
        return sum(g.utts for g in self.groups)

    @property
    def hours(self) -> float:
        return sum(g.hours for g in self.groups)

    @property
    def ok(self) -> bool:
        return not self.problems

    def languages(self) -> dict[str, tuple[int, float]]:
        """Each language's (utterances, hours), most hours first: over the shards whose samples carry
        one ("?" for those that do not, when some do); empty when none does."""
        shards = self.shards
        if not any(s.langs is not None for s in shards):
            return {}
        out: dict[str, tuple[int, float]] = {}
        for s in shards:
            names = s.langs if s.langs is not None else ["?"] * s.utts
            for lang, frames in zip(names, s.frames.tolist()):
                n, h = out.get(lang, (0, 0.0))
                out[lang] = (n + 1, h + hours(frames))
        return dict(sorted(out.items(), key=lambda kv: (-kv[1][1], kv[0])))

    def to_json(self) -> dict:
        return {"utterances": self.utts, "hours": round(self.hours, 4), "groups": [g.to_json() for g in self.groups],
                "languages": {k: {"utterances": n, "hours": round(h, 4)} for k, (n, h) in self.languages().items()},
                "padding_efficiency": {k: {str(mf): v for mf, v in c.items()} for k, c in self.efficiency.items()},
                "problems": self.problems, "plot": self.plot, "notes": self.notes}

    def format(self, per_shard: bool = True) -> str:
        """The table a person reads: one line per group, its shards indented below it."""
        head = f"{'group / shard':<28} {'utts':>9} {'hours':>9}  {'frames min/median/max':>23}  " \
               f"{'text min/median/max':>20}  layout  from"
        lines = [head, "-" * len(head)]

        def row(name: str, utts: int, hours: float, frames: np.ndarray, text: np.ndarray, layout: str,
                source: str) -> str:
            return (f"{name:<28} {utts:>9,} {hours:>9.2f}  {_fmt3(_min_med_max(frames)):>23}  "
                    f"{_fmt3(_min_med_max(text)):>20}  {layout:<6}  {source}")

        for g in self.groups:
            lines.append(row(f"{g.name} ({len(g.shards)} shards)", g.utts, g.hours, g.frames, g.text_lens,
                             g.layout, g.source))
            if per_shard:
                for s in g.shards:
                    lines.append(row("  " + os.path.basename(s.path), s.utts, s.hours, s.frames, s.text_lens,
                                     s.layout, s.source))
        lines.append("-" * len(head))
        lines.append(f"{'total':<28} {self.utts:>9,} {self.hours:>9.2f}")
        languages = self.languages()
        if languages:
            lines.append("")
            lines.append(f"{'language':<28} {'utts':>9} {'hours':>9}  {'share of hours':>14}")
            for lang, (n, h) in languages.items():
                lines.append(f"{lang:<28} {n:>9,} {h:>9.2f}  {h / max(self.hours, 1e-12):>14.1%}")
        if self.efficiency:
            mfs = sorted({mf for c in self.efficiency.values() for mf in c})
            lines.append("")
            lines.append("padding efficiency (real / padded frames) of the loader's batches at max_frames:")
            lines.append(f"  {'':<26}" + "".join(f"{thousands(mf):>8}" for mf in mfs))
            for name, curve in self.efficiency.items():
                lines.append(f"  {name:<26}" + "".join(f"{curve.get(mf, math.nan):>8.3f}" for mf in mfs))
        lines.extend(f"note: {n}" for n in self.notes)
        if self.plot:
            lines.append(f"\nplot: {self.plot}")
        if self.problems:
            lines.append(f"\n{len(self.problems)} problem(s); the numbers above leave out what could not be read "
                         f"(run `wdsprep verify` for a full check):")
            lines.extend("  " + p for p in self.problems)
        return "\n".join(lines)


def _fmt3(t: tuple[float, float, float] | None) -> str:
    return "-" if t is None else f"{t[0]} / {t[1]:g} / {t[2]}"


def inspect_shards(
    patterns: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    plot: str | os.PathLike | None = None,
    max_frames_list: Sequence[int] | None = None,
    seed: int = 0,
    retries: int = FetchOptions.retries,
    retry_backoff: float = FetchOptions.retry_backoff,
    min_rate: float = FetchOptions.min_rate,
) -> InspectResult:
    """Statistics of the shards a pattern names, per length group (parent folder) and per shard.

    Args:
        patterns: shard pattern(s), e.g. ``DIR/{10_1000,1000_2000}/data-*.tar`` (see ``expand_shards``).
        plot: write a PNG with a length histogram per group and the padding-efficiency curve.
        max_frames_list: ``max_frames`` values for the padding-efficiency curve (default: from the
            corpus's lengths, :func:`curve_budgets`); empty to skip it.
        seed: seeds the shuffle of lengths (and subset) the curve is computed on.
        retries, retry_backoff, min_rate: as the loader's, for the index files and shards on S3 or a web server.

    Shards whose folder has an ``index.json`` listing them are not opened; on S3 or a web server
    that index is fetched from beside them, and only shards it does not list are downloaded.
    Unreadable shards or samples do not stop the run: they are left out of the numbers and listed
    in ``problems``.
    """
    policy = RetryPolicy(retries=retries, backoff=retry_backoff, min_rate=min_rate)
    # A folder a pack is writing: its published shards.
    paths = expand_shards(patterns, list_glob=lister(policy), growing=True)
    refuse_commands(paths, "inspect")

    by_folder: dict[str, list[str]] = {}
    for p in paths:
        by_folder.setdefault(index_place(p)[0], []).append(p)
    shown = {f: redact(f) for f in by_folder}  # what names a folder in the report: no password or token
    display = _group_names(list(dict.fromkeys(shown.values())))
    names = {f: display[shown[f]] for f in by_folder}

    problems: list[str] = []
    notes: list[str] = []
    groups = []
    for folder, shard_paths in by_folder.items():
        remote = is_url(folder)
        g = None if remote else pending_folder(folder)
        try:
            index = read_index_at(folder, partial(fetch_file, policy=policy)) if remote else read_index(folder)
        except (ValueError, OSError) as e:  # DataError is a ValueError, FetchError an OSError
            problems.append(f"{e}; its shards were {'downloaded and ' if remote else ''}read instead")
            index = None
        stats = []
        for p in shard_paths:
            i = None if index is None else index.position(index_place(p)[1])
            if i is not None:
                a, b = index.starts[i], index.starts[i + 1]
                lang = index.columns.get(LANG)
                stats.append(ShardStats(redact(p), names[folder], index.layout, "index",
                                        np.asarray(index.frames[a:b], np.int64),
                                        np.asarray(index.text_lens[a:b], np.int64),
                                        None if lang is None else lang.values(slice(a, b))))
                continue
            if g is not None:
                continue  # written, not published yet
            if index is not None:
                where = f"{redact(folder)}/{INDEX_NAME}" if remote else Path(folder) / INDEX_NAME
                problems.append(f"{redact(p)}: not listed in {where} (stale index?); read from the tar")
            try:
                with naming(p):  # a read error (EIO) says which shard
                    scan = scan_shard(redact(p), source=fetched_shard(p, policy=policy)) if remote else scan_shard(p)
            except FetchError as e:
                problems.append(f"{e}; left out of the numbers")
                continue
            problems.extend(scan.problems)
            layout = "+".join(sorted(scan.layouts)) or "-"
            stats.append(_stats(redact(p), names[folder], layout, "tar", scan.info))
        groups.append(GroupStats(names[folder], redact(folder), stats))
        if g is not None:
            planned = g.planned
            utts = sum(s.utts for s in stats)
            of = "" if planned is None else f" of {planned.shards:,}"
            share = "" if planned is None else f" ({utts:,} of {planned.utts:,} utterances)"
            notes.append(f"{names[folder]}: still being packed, {len(stats):,}{of} shards published{share}; the "
                         f"numbers are theirs")
    groups.sort(key=_group_order)

    if max_frames_list is None:
        frames = [g.frames for g in groups if g.utts]
        max_frames_list = curve_budgets(np.concatenate(frames) if frames else np.zeros(0, np.int64))
    result = InspectResult(groups, padding_curves(groups, max_frames_list, seed), problems, notes=notes)
    if plot is not None:
        from wdsprep.check.plot import plot_inspect  # matplotlib only when a plot is asked for

        result.plot = str(plot)
        plot_inspect(plot, [(g.name, g.frames) for g in groups], result.efficiency,
                     f"{len(result.shards)} shards, {result.utts:,} utterances, {result.hours:.2f} hours", overall=ALL)
    return result


def _stats(path: str, group: str, layout: str, source: str, info: ShardInfo) -> ShardStats:
    return ShardStats(path, group, layout, source, np.asarray(info.frames, dtype=np.int64),
                      np.asarray(info.text_lens, dtype=np.int64), info.values.get(LANG))


def _group_order(g: GroupStats) -> tuple:
    """Length groups by their lower bound (``60_150`` before ``150_inf``), other folders by name after them."""
    lo, sep, hi = os.path.basename(g.folder).partition("_")
    if sep and lo.isdigit() and (hi.isdigit() or hi == "inf"):
        return (0, int(lo), g.name)
    return (1, 0, g.name)


def _group_names(folders: list[str]) -> dict[str, str]:
    """Folder -> short display name: its own name (``10_1000``) unless two folders share it."""
    base = [os.path.basename(f) or f for f in folders]
    if len(set(base)) == len(base):
        return dict(zip(folders, base))
    common = os.path.commonpath(folders)
    return {f: os.path.relpath(f, os.path.dirname(common)) for f in folders}


def padding_curves(groups: Sequence[GroupStats], max_frames_list: Sequence[int],
                   seed: int = 0) -> dict[str, dict[int, float]]:
    """Padding efficiency ``bucket_batches`` reaches per group and over all groups, at each ``max_frames``.

    Lengths are shuffled first with a seeded generator, since the loader sees them shuffled; the
    packing order (by length group and source file) would flatter the batcher.
    """
    if not max_frames_list:
        return {}
    curves: dict[str, np.ndarray] = {g.name: g.frames for g in groups if g.utts}
    if len(curves) > 1:
        curves[ALL] = np.concatenate(list(curves.values()))
    return {name: padding_curve(lengths, max_frames_list, np.random.default_rng([seed, i]))
            for i, (name, lengths) in enumerate(curves.items())}


def padding_curve(lengths: np.ndarray, max_frames_list: Sequence[int], rng: np.random.Generator) -> dict[int, float]:
    """``{max_frames: real / padded frames}`` of ``bucket_batches`` over ``lengths`` shuffled by ``rng``."""
    from wdsprep.plan.batching import bucket_batches  # the loader's batcher, not a re-implementation
    from wdsprep.plan.stats import padding_efficiency

    lengths = np.asarray(lengths)
    if len(lengths) > MAX_CURVE_UTTS:
        lengths = rng.choice(lengths, MAX_CURVE_UTTS, replace=False)
    order = rng.permutation(lengths).tolist()
    return {int(mf): padding_efficiency(bucket_batches(order, max_frames=int(mf), rng=rng, length=int))
            for mf in sorted(max_frames_list)}


def write_json(result: InspectResult, path: str | os.PathLike) -> None:
    """``result.to_json()`` to ``path``, atomically."""
    write_text(path, json.dumps(result.to_json(), indent=1, ensure_ascii=False))
