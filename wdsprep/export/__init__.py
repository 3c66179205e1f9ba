"""Shards as other projects' manifests: ``wdsprep export KIND --trset PATTERN --out FILE``.

Each kind is a writer registered by name (:data:`EXPORTS`; the CLI's choices come from it) over the
shard set's utterances as ``utterances`` (:func:`~wdsprep.export.utterances.utterances`) reads
them: id, duration, transcript, speaker and language.

- ``lhotse`` (``to_lhotse.py``): a ``CutSet`` manifest of cuts without recordings, for Lhotse's
  statistics and splits (``lhotse.load_manifest``, ``cuts.describe()``).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from wdsprep.errors import need_packages
from wdsprep.files import atomic_named, make_dir


@dataclass(frozen=True)
class Export:
    """One kind of output: its writer (module, function), what it needs installed, a line of help."""

    module: str
    writer: str
    help: str
    packages: tuple[str, ...] = ()
    extra: str | None = None


EXPORTS: dict[str, Export] = {
    "lhotse": Export("to_lhotse", "write_cuts", "a Lhotse CutSet manifest (.jsonl.gz): ids, durations, texts, "
                     "speakers, languages", ("lhotse",), "lhotse"),
}


def export_shards(kind: str, trset: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike, *,
                  overwrite: bool = False) -> int:
    """Write the utterances of the local shards ``trset`` names as a ``kind`` manifest at ``out``;
    returns how many.  ``out`` is refused when it exists, unless ``overwrite``; it is written as a
    pack's outputs are (``files.atomic_named``): whole or not at all, replacing a link or a FIFO at
    ``out``, never writing through the one or waiting on the other."""
    spec = EXPORTS.get(kind)
    if spec is None:
        raise ValueError(f"export {kind}: choose one of {', '.join(EXPORTS)}")
    if os.path.lexists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite (overwrite=True) to replace it")
    if os.path.isdir(out) and not os.path.islink(out):
        raise IsADirectoryError(f"{out} is a folder; give the manifest file to write")
    need_packages(spec.packages, spec.extra, f"export {kind}")
    from wdsprep.export.utterances import utterances

    write = getattr(importlib.import_module(f"{__name__}.{spec.module}"), spec.writer)
    make_dir(Path(out).parent)
    with atomic_named(out) as tmp:
        return write(utterances(trset), str(tmp))
