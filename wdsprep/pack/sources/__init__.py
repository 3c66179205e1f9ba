"""Packs from the data people already have: ``pack-audio --from KIND PATH`` and ``pack --from KIND PATH``.

A :class:`Manifest` names the input (``Manifest("nemo", "train.json")``); :func:`wdsprep.pack_audio`
and :func:`wdsprep.pack_data` take one in place of Kaldi files.  Each kind has one reader, chosen by
name from a registry (:data:`AUDIO_KINDS`, :data:`FEATURE_KINDS`: the CLI's ``--from`` choices come
from them), and all of them share one pack source (``items.py``), so a pack from a manifest is
planned, published and resumed as a pack from a ``wav.scp`` is:

- ``from_lhotse``: Lhotse ``CutSet`` manifests, Shar directories, and cuts with features (lhotse);
- ``from_nemo``: NeMo manifests and tarred audio datasets (plain JSON and tar);
- ``from_hf``: Hugging Face datasets (``datasets`` and ``pyarrow``);
- ``from_wenet``: WeNet's ``data.list`` and shard lists (plain JSON and tar).

Every manifest is input from strangers: ``untrusted`` holds the rules each reader applies to it
(paths resolved and bounded, values typed and finite, ids and speakers held to the index's rules).

A kind whose library is an optional extra (``pip install 'wdsprep[lhotse]'``, ``[hf]``) says so
in one line when the library is missing.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from wdsprep.errors import need_packages
from wdsprep.options import Kind as Spelling
from wdsprep.options import option, options_of
from wdsprep.pack.driver import PackSource
from wdsprep.pack.options import AudioOptions


@dataclass(frozen=True)
class Kind:
    """One kind of input: where its reader is, what it needs installed, and a line of help."""

    module: str  # under wdsprep.pack.sources
    reader: str  # audio: a function (PATH, **columns) -> Imported; features: a PackSource (PATH, dims)
    help: str
    packages: tuple[str, ...] = ()  # imported by the reader
    extra: str | None = None  # wdsprep's extra that installs them
    options: tuple[str, ...] = ()  # the Manifest options the reader takes (keyword arguments)


_COLUMNS = ("audio_column", "text_column", "lang_column", "id_column", "speaker_column")


AUDIO_KINDS: dict[str, Kind] = {
    "lhotse": Kind("from_lhotse", "read_cuts", "a Lhotse CutSet manifest (.jsonl[.gz]), or a RecordingSet one with "
                   "its SupervisionSet beside it", ("lhotse",), "lhotse"),
    "lhotse-shar": Kind("from_lhotse", "read_shar", "a Lhotse Shar directory with a recording field",
                        ("lhotse",), "lhotse"),
    "nemo": Kind("from_nemo", "read_manifest", "a NeMo manifest (JSON lines: audio_filepath, duration, text, "
                 "[offset, lang, speaker])", options=("text_root",)),
    "nemo-tarred": Kind("from_nemo", "read_tarred", "a NeMo tarred audio dataset: its folder, or its "
                        "tarred_audio_manifest.json with audio_N.tar beside it", options=("text_root",)),
    "hf": Kind("from_hf", "read_dataset", "a Hugging Face dataset save_to_disk wrote, or its parquet files",
               ("datasets", "pyarrow"), "hf", options=_COLUMNS),
    "wenet": Kind("from_wenet", "read_list", "a WeNet data.list (JSON lines: key, wav, txt) or shard list"),
}
FEATURE_KINDS: dict[str, Kind] = {
    "lhotse": Kind("from_lhotse", "FeatureCutsSource", "Lhotse cuts with features (compute_and_store_features)",
                   ("lhotse",), "lhotse"),
}

_COLUMN = Spelling("NAME", str, str)
_FOLDER = Spelling("DIR", str, str)


@dataclass(frozen=True)
class Manifest:
    """What ``--from KIND PATH`` names: the input of a pack in another project's format (see the
    module's doc for the kinds).  The column options are for ``hf`` alone."""

    kind: str
    path: str | os.PathLike
    audio_column: str | None = option(None, "--from hf: the column of the audio (default: the Audio column)",
                                      kind=_COLUMN, ld=False)
    text_column: str | None = option(None, "--from hf: the column of the transcripts (default: text, sentence, "
                                     "transcription, ...)", kind=_COLUMN, ld=False)
    lang_column: str | None = option(None, "--from hf: the column of the languages (default: language, lang or "
                                     "locale, if there is one)", kind=_COLUMN, ld=False)
    id_column: str | None = option(None, "--from hf: the column of the utterance ids (default: id, segment_id, "
                                   "utt_id or key; else the audio's file name)", kind=_COLUMN, ld=False)
    speaker_column: str | None = option(None, "--from hf: the column of the speakers (default: speaker_id, speaker "
                                        "or client_id, if there is one)", kind=_COLUMN, ld=False)
    text_root: str | None = option(None, "--from nemo: a folder besides the manifest's whose files text_filepath "
                                   "may name (a manifest's text files are read there only)", kind=_FOLDER, ld=False)

    def __post_init__(self) -> None:
        if self.kind not in AUDIO_KINDS and self.kind not in FEATURE_KINDS:
            raise ValueError(f"--from {self.kind}: choose one of {', '.join(AUDIO_KINDS)}")
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"--from {self.kind} {self.path}: no such file or directory")
        kind = AUDIO_KINDS.get(self.kind, FEATURE_KINDS.get(self.kind))
        assert kind is not None
        for f, _ in options_of(Manifest):
            if getattr(self, f.name) is not None and f.name not in kind.options:
                takers = [k for k, v in {**FEATURE_KINDS, **AUDIO_KINDS}.items() if f.name in v.options]
                raise ValueError(f"--{f.name.replace('_', '-')} is for --from {' or '.join(takers)}, not --from "
                                 f"{self.kind}")
        if self.text_root is not None and not os.path.isdir(self.text_root):
            raise NotADirectoryError(f"--text-root {self.text_root}: no such folder")

    def options(self, kind: Kind) -> dict[str, str | None]:
        """The options ``kind``'s reader takes, as given."""
        return {name: getattr(self, name) for name in kind.options}

    def audio_source(self, audio: AudioOptions) -> PackSource:
        """The pack source of the utterances, for ``pack-audio``."""
        from wdsprep.pack.sources.items import ItemsSource

        kind = _kind(self.kind, AUDIO_KINDS, "pack-audio", FEATURE_KINDS, "pack")
        read = _load(self.kind, kind)
        imported = read(str(self.path), **self.options(kind))
        return ItemsSource(imported, audio)

    def features_source(self, dims: int | None) -> PackSource:
        """The pack source of the utterances' precomputed features, for ``pack``."""
        kind = _kind(self.kind, FEATURE_KINDS, "pack", AUDIO_KINDS, "pack-audio")
        return _load(self.kind, kind)(str(self.path), dims)


def _kind(name: str, kinds: dict[str, Kind], command: str, others: dict[str, Kind], other: str) -> Kind:
    kind = kinds.get(name)
    if kind is None:
        elsewhere = f" (wdsprep {other} --from {name} packs it)" if name in others else ""
        raise ValueError(f"wdsprep {command} --from {name}: choose one of {', '.join(kinds)}{elsewhere}")
    return kind


def _load(name: str, kind: Kind) -> Any:
    """The kind's reader, once its packages import."""
    need_packages(kind.packages, kind.extra, f"--from {name}")
    return getattr(importlib.import_module(f"{__name__}.{kind.module}"), kind.reader)
