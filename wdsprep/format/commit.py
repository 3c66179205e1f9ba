"""Whether a pack's output is complete: one marker file is the point of truth.

``pack`` writes :data:`MARKER_NAME` into its output directory before it changes anything there,
and removes it as the very last step, once every shard has its final name and every
``index.json`` and ``pack_report.json`` is written and synced to disk.  A directory that still
holds the marker was left by a pack that was killed, ran out of disk or failed half-way: its
shards may be a part of the corpus only, and nothing else tells (a folder without an index looks
like shards CAT wrote).  :func:`check_committed` is called by ``expand_shards`` for every folder
of local shards, so the loader and ``inspect`` refuse such a folder and ``verify`` reports it.

Shards live in ``DIR/LO_HI/`` (or in ``DIR`` itself without length groups) and the marker in
``DIR``, so a shard folder and its parent are looked at.
"""

from __future__ import annotations

import os
from pathlib import Path

from wdsprep.errors import DataError
from wdsprep.files import sync, write_text

MARKER_NAME = "PACK_INCOMPLETE"

_MARKER_TEXT = (
    "wdsprep pack is writing this directory, or was stopped before it finished (killed, out of disk, "
    "failed).\nUntil this file is gone the shards here may be a part of the corpus only; the loader, "
    "inspect and verify refuse them.\nRe-run the pack into this directory with --overwrite (overwrite=True) "
    "to complete it.\n"
)


class UncommittedPackError(DataError):
    """Shards of a pack that did not finish; the message names the folder and says to re-run the pack."""


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


def problem(folder: str | os.PathLike) -> str | None:
    """Why the shards of ``folder`` must not be read, or None: a sentence to follow the folder's name."""
    m = pending(folder)
    if m is None:
        return None
    return (f"part of a pack that did not finish ({m} is there): its shards may be a part of the corpus "
            f"only; re-run the pack into {m.parent} with --overwrite to complete it")


def check_committed(folder: str | os.PathLike) -> None:
    """Raise :class:`UncommittedPackError` when ``folder``'s shards belong to an unfinished pack."""
    why = problem(folder)
    if why is not None:
        raise UncommittedPackError(f"shards in {folder}: {why}")


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
    """Remove the marker of a pack that failed and removed everything it wrote."""
    marker(d_out).unlink(missing_ok=True)

