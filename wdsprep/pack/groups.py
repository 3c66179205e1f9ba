"""Length groups: ``LO:HI`` keeps utterances with ``LO <= frames < HI``, one folder per group.

Each end is frames or seconds (``5s:15s`` is ``500:1500``, :func:`wdsprep.units.seconds_to_frames`);
a group is kept, named and recorded in frames, so both spellings are the same group.

Folder names are ``LO_HI``; an open lower end is written ``0`` (frames are never negative, so
``:10`` and ``0:10`` are the same group) and an open upper end ``inf`` (``1000:`` -> ``1000_inf``).
:func:`assign_folders` puts each utterance of a pack in its group's folder.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from wdsprep.report import Report
from wdsprep.units import seconds_to_frames


@dataclass(frozen=True)
class Group:
    lo: int
    hi: float  # math.inf when open

    @property
    def folder(self) -> str:
        return f"{self.lo}_{'inf' if math.isinf(self.hi) else int(self.hi)}"

    def __str__(self) -> str:
        return f"{self.lo}:{'' if math.isinf(self.hi) else int(self.hi)}"


def _edge(text: str, spec: str) -> int:
    """One end of a group: frames, or seconds with an ``s`` (``5s``: 500 frames; a fraction of a
    frame rounds up, so ``frames < HI`` and ``LO <= frames`` hold in seconds as written)."""
    text = text.strip()
    if text.endswith("s"):
        return seconds_to_frames(float(text[:-1]), what=f"length group {spec!r}", bound="lower")
    return int(text)


def parse_group(spec: str) -> Group:
    """``'10:1000'``, ``':10'``, ``'1000:'`` (frames) or ``':5s'``, ``'5s:15s'`` (seconds) -> Group;
    a clear error otherwise."""
    lo_s, sep, hi_s = spec.strip().partition(":")
    try:
        if not sep:
            raise ValueError
        lo = _edge(lo_s, spec) if lo_s.strip() else 0
        hi = float(_edge(hi_s, spec)) if hi_s.strip() else math.inf
    except ValueError:
        raise ValueError(f"length group {spec!r}: expected LO:HI in frames or in seconds, e.g. 10:1000, :10, 1000:, "
                         f":5s or 5s:15s") from None
    if lo < 0 or hi <= lo:
        raise ValueError(f"length group {spec!r}: need 0 <= LO < HI")
    return Group(lo, hi)


class Groups:
    """A set of non-overlapping groups; ``find(frames)`` gives the group an utterance belongs to."""

    def __init__(self, specs: Sequence[str]):
        groups = sorted((parse_group(s) for s in specs), key=lambda g: g.lo)
        for a, b in zip(groups, groups[1:]):
            if b.lo < a.hi:
                raise ValueError(f"length groups {a} and {b} overlap; an utterance must fall in one group only")
        self.groups = groups
        self._los = [g.lo for g in groups]

    def find(self, frames: int) -> Group | None:
        i = bisect.bisect_right(self._los, frames) - 1
        if i >= 0 and frames < self.groups[i].hi:
            return self.groups[i]
        return None

    def __iter__(self):
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)


def assign_folders(uttids: Sequence[str], frames: np.ndarray, groups: Groups | None, report: Report,
                   unpackable: Mapping[int, tuple[str, str]]) -> list[str | None]:
    """Each utterance's shard folder: its length group's (``""`` without groups), None for one not packed.

    ``frames[i] < 0``: item ``i`` was dropped already (its reason is in ``report``);
    ``unpackable[i]``: why item ``i`` cannot be packed, reported here as ``(reason, detail)``.  The
    rest are measured; one outside every group is reported as ``outside_groups``.  Reports are made
    in input order.
    """
    folders: list[str | None] = []
    for i, (uttid, n) in enumerate(zip(uttids, frames.tolist())):
        folder = None
        if i in unpackable:
            reason, detail = unpackable[i]
            report.drop(reason, uttid, detail)
        elif n < 0:
            pass  # dropped already
        elif groups is None:
            folder = ""
        else:
            group = groups.find(n)
            if group is None:
                report.drop("outside_groups", uttid, f"{n} frames")
            else:
                folder = group.folder
        folders.append(folder)
    return folders
