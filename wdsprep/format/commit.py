"""Whether a pack's output is complete, or still growing: a marker file and the pack's plan.

``pack`` writes :data:`MARKER_NAME` into its output directory before it changes anything there,
and removes it as the very last step, once every shard and every ``index.json`` and
``pack_report.json`` is written and synced to disk.  A directory that still holds the marker is
being packed, or was left by a pack that was killed, ran out of disk or failed half-way: its
shards may be a part of the corpus only.  :func:`check_committed` is called by ``expand_shards``
for every folder of local shards, so the loader and ``inspect`` refuse such a folder (unless
asked to follow a growing one) and ``verify`` reports it.

A pack decides its whole shard plan before it writes the first shard, records it in
:data:`PLAN_NAME` beside the marker (what goes into how many shards per folder, the inputs'
digests and the options), and then *publishes* its shards one by one, in plan order within each
folder: a shard gets its final name once it is written and synced, and is published by the
atomic rename of its index entry into ``FOLDER/.index.parts/NNNNNNNN/``
(:func:`wdsprep.format.index.write_entry`).  A folder whose pack holds the marker and a plan is
*growing* (:func:`growth`): a loader may follow it (``growing=True``), and ``pack --resume``
finishes it after a kill, keeping every published shard.  The plan stays after the commit: it
says what the folder was packed from.

Shards live in ``DIR/LO_HI/`` (or in ``DIR`` itself without length groups) and the marker and
plan in ``DIR``, so a shard folder and its parent are looked at.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wdsprep.errors import DataError
from wdsprep.files import read_small, sync, write_text

MARKER_NAME = "PACK_INCOMPLETE"
PLAN_NAME = "pack_plan.json"
PLAN_VERSION = 1
PLAN_LIMIT = 64 << 20  # bytes: a plan records its inputs' digests and a few numbers per folder
# Per shard folder: one sub-folder per published shard, holding that shard's index entry.
ENTRIES_DIR = ".index.parts"
_ENTRY_RE = re.compile(r"[0-9]{8}")

_MARKER_TEXT = (
    "wdsprep pack is writing this directory, or was stopped before it finished (killed, out of disk, "
    "failed).\nUntil this file is gone the shards here may be a part of the corpus only: the loader, "
    "inspect and verify refuse them, unless the loader is told to follow a growing folder (growing=True).\n"
    "Run the same pack command with --resume to finish it (the shards already published are kept), or "
    "with --overwrite to redo it.\n"
)


class UncommittedPackError(DataError):
    """Shards of a pack that did not finish; the message names the folder and says what to do."""


def marker(d_out: str | os.PathLike) -> Path:
    return Path(d_out) / MARKER_NAME


def pending(folder: str | os.PathLike) -> Path | None:
    """The marker that makes ``folder``'s shards part of an unfinished pack, or None when there is none."""
    folder = Path(folder)
    for d in (folder, folder.parent):
        m = marker(d)
        if os.path.lexists(m):
            return m
    return None


@dataclass(frozen=True)
class PlannedFolder:
    """What a pack will have written into one shard folder when it is complete."""

    shards: int
    utts: int
    frames: int


@dataclass(frozen=True)
class PackPlan:
    """``DIR/pack_plan.json``: the pack's shard plan in short, and what it was made from.

    ``folders`` maps each shard folder's name (``LO_HI``; ``""`` for ``DIR`` itself) to what it
    will hold; ``digest`` covers every planned shard's utterances and frames; ``inputs`` and
    ``options`` are what ``--resume`` holds a new run against.
    """

    command: str
    inputs: dict[str, Any]
    options: dict[str, Any]
    digest: str
    folders: dict[str, PlannedFolder]

    def to_json(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "command": self.command, "inputs": self.inputs, "options": self.options,
                "digest": self.digest,
                "folders": {name: {"shards": f.shards, "utts": f.utts, "frames": f.frames}
                            for name, f in self.folders.items()}}

    @property
    def shards(self) -> int:
        return sum(f.shards for f in self.folders.values())


def write_plan(d_out: str | os.PathLike, plan: PackPlan) -> Path:
    """Write the plan beside the marker, atomically and synced: before the first shard is published."""
    path = write_text(Path(d_out) / PLAN_NAME, json.dumps(plan.to_json(), ensure_ascii=False, indent=1) + "\n")
    sync(path)
    sync(d_out)
    return path


def read_plan(d_out: str | os.PathLike) -> PackPlan | None:
    """The plan in ``d_out``, or None when there is none; a damaged one is a DataError naming the field."""
    path = Path(d_out) / PLAN_NAME
    try:
        data = read_small(path, PLAN_LIMIT, "a pack's plan")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror}); pack again with --overwrite") from None
    except ValueError as e:  # a FIFO, a device, a file far larger than any plan
        raise DataError(f"{e}; pack again with --overwrite") from None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}: not valid JSON ({type(e).__name__}); the pack's plan is damaged: pack again "
                        f"with --overwrite") from None

    def bad(field: str, want: str) -> DataError:
        return DataError(f"{path}: field {field!r} is not {want}; the pack's plan is damaged: pack again "
                         f"with --overwrite")

    if not isinstance(doc, dict):
        raise bad("(top level)", "a JSON object")
    if doc.get("version") != PLAN_VERSION:
        raise bad("version", f"{PLAN_VERSION} (a plan written by another wdsprep?)")
    for key, kind in (("command", str), ("inputs", dict), ("options", dict), ("digest", str), ("folders", dict)):
        if not isinstance(doc.get(key), kind):
            raise bad(key, f"a JSON {'string' if kind is str else 'object'}")
    folders = {}
    for name, f in doc["folders"].items():
        if not isinstance(f, dict) or any(type(f.get(k)) is not int or f[k] < 0 for k in ("shards", "utts", "frames")):
            raise bad(f"folders.{name}", "an object of whole numbers shards, utts and frames")
        if name in (".", "..") or "/" in name or "\0" in name:
            raise bad(f"folders.{name}", "a folder name")
        folders[name] = PlannedFolder(f["shards"], f["utts"], f["frames"])
    return PackPlan(doc["command"], doc["inputs"], doc["options"], doc["digest"], folders)


def published_count(folder: str | os.PathLike) -> int:
    """How many shards of ``folder`` are published so far: its index entries 0, 1, ... without a gap
    (a listing, nothing read: for messages and waiting; readers read the entries themselves)."""
    try:
        names = {n for n in os.listdir(Path(folder) / ENTRIES_DIR) if _ENTRY_RE.fullmatch(n)}
    except (FileNotFoundError, NotADirectoryError):
        return 0
    k = 0
    while f"{k:08d}" in names:
        k += 1
    return k


@dataclass(frozen=True)
class PendingFolder:
    """A shard folder whose pack has not committed: how far it is, and what it will hold.

    ``plan`` is None for a pack that has not planned yet, or was written by a wdsprep that did not
    publish shard by shard (such a folder cannot be followed, only packed again).
    """

    folder: Path
    marker: Path
    plan: PackPlan | None

    @property
    def name(self) -> str:
        """The folder's name in the plan: ``""`` for the pack's own directory, else ``LO_HI``."""
        return "" if self.folder == self.marker.parent else self.folder.name

    @property
    def planned(self) -> PlannedFolder | None:
        """What the folder will hold once complete (None: not known, or no folder of the plan)."""
        return None if self.plan is None else self.plan.folders.get(self.name)

    @property
    def followable(self) -> bool:
        return self.plan is not None

    def published(self) -> int:
        return published_count(self.folder)


def pending_folder(folder: str | os.PathLike) -> PendingFolder | None:
    """How ``folder`` grows, when its pack has not committed; None for a complete folder."""
    m = pending(folder)
    if m is None:
        return None
    folder = Path(folder)
    return PendingFolder(folder, m, read_plan(m.parent))


def problem(folder: str | os.PathLike) -> str | None:
    """Why the shards of ``folder`` must not be read as a complete corpus, or None: a sentence to
    follow the folder's name."""
    g = pending_folder(folder)
    if g is None:
        return _unmarked_parts(Path(folder))
    if not g.followable:
        return (f"part of a pack that did not finish ({g.marker} is there): its shards may be a part of the corpus "
                f"only; re-run the pack into {g.marker.parent} with --overwrite to complete it")
    planned = g.planned
    of = f" of {planned.shards:,}" if planned is not None else ""
    return (f"part of a pack that did not finish yet ({g.marker} is there): {g.published():,}{of} shards are "
            f"published so far. To train on them while the pack runs, pass growing=True (--growing, ld.growing); "
            f"to finish a pack that was stopped, run it again with --resume (or --overwrite to redo it)")


def _unmarked_parts(folder: Path) -> str | None:
    """Why a folder without a marker is no complete pack's: published entries and no ``index.json``
    (a pack commits only after its indexes are written, and drops the entries after that), so the
    marker of a pack that did not finish was removed by hand; None for any other folder."""
    if not os.path.isdir(folder / ENTRIES_DIR) or os.path.lexists(folder / "index.json"):  # the index's file name
        return None
    d = folder if os.path.lexists(folder / PLAN_NAME) else folder.parent
    return (f"holds the published entries of a pack ({folder / ENTRIES_DIR}) but no index.json, and no {MARKER_NAME}: "
            f"the pack did not finish and its marker was removed by hand, so its shards may be a part of the corpus "
            f"only. Put the marker back (touch {d / MARKER_NAME}) and run the pack again with --resume, or pack "
            f"again with --overwrite")


def check_committed(folder: str | os.PathLike, *, growing: bool = False) -> None:
    """Raise :class:`UncommittedPackError` when ``folder``'s shards belong to an unfinished pack;
    with ``growing``, only when it cannot be followed (no plan: nothing is published in order)."""
    if growing:
        g = pending_folder(folder)
        if g is not None and g.followable:
            return
    why = problem(folder)
    if why is not None:
        raise UncommittedPackError(f"shards in {folder}: {why}")


def pack_running(d_out: str | os.PathLike) -> bool:
    """Whether a pack holds ``d_out``'s lock now (the pack's, ``wdsprep.pack.output.lock_folder``):
    a folder still marked unfinished whose lock is free is a pack that stopped.  The probe takes a
    shared lock for an instant (a pack starting then tries its lock again before it refuses)."""
    import fcntl

    try:
        fd = os.open(d_out, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


def begin(d_out: str | os.PathLike) -> Path:
    """Mark ``d_out`` as being packed; call before anything there is changed."""
    m = write_text(marker(d_out), _MARKER_TEXT)
    sync(d_out)  # the marker must be on disk before any shard gets a final name
    return m


def commit(d_out: str | os.PathLike) -> None:
    """Declare ``d_out`` complete: the last step of a pack, after its output is synced."""
    marker(d_out).unlink()
    sync(d_out)


def abandon_marker(d_out: str | os.PathLike) -> None:
    """Remove the marker (and the plan) of a pack that failed and removed everything it wrote."""
    (Path(d_out) / PLAN_NAME).unlink(missing_ok=True)
    marker(d_out).unlink(missing_ok=True)

