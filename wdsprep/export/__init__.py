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
    returns how many.  ``out`` is refused when it exists, unless ``overwrite``."""
    spec = EXPORTS.get(kind)
    if spec is None:
        raise ValueError(f"export {kind}: choose one of {', '.join(EXPORTS)}")
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite (overwrite=True) to replace it")
    need_packages(spec.packages, spec.extra, f"export {kind}")
    from wdsprep.export.utterances import utterances

    write = getattr(importlib.import_module(f"{__name__}.{spec.module}"), spec.writer)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return write(utterances(trset), str(out))
