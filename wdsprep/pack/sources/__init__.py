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

Which key of a manifest's line (a column of a table) holds what is ``keys``' to say: each kind's own,
the names the user gives (the key options below, ``--field NAME=KEY``), Canary's.  Every manifest
is input from strangers: ``untrusted`` holds the rules each reader applies to it (paths resolved
and bounded, values typed and finite, ids and speakers held to the index's rules).

A kind whose library is an optional extra (``pip install 'wdsprep[lhotse]'``, ``[hf]``) says so
in one line when the library is missing.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from wdsprep.errors import need_packages
from wdsprep.format.keys import check_field_name
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


_KEYS = ("audio_column", "text_column", "lang_column", "id_column", "speaker_column", "duration_column",
         "offset_column")
_WENET_KEYS = ("audio_column", "text_column", "lang_column", "id_column", "speaker_column")


AUDIO_KINDS: dict[str, Kind] = {
    "lhotse": Kind("from_lhotse", "read_cuts", "a Lhotse CutSet manifest (.jsonl[.gz]), or a RecordingSet one with "
                   "its SupervisionSet beside it", ("lhotse",), "lhotse"),
    "lhotse-shar": Kind("from_lhotse", "read_shar", "a Lhotse Shar directory with a recording field",
                        ("lhotse",), "lhotse"),
    "nemo": Kind("from_nemo", "read_manifest", "a NeMo manifest (JSON lines: audio_filepath, duration, text, "
                 "[offset, lang, speaker]; Canary's answer, source_lang, target_lang, pnc, taskname)",
                 options=(*_KEYS, "text_root")),
    "nemo-tarred": Kind("from_nemo", "read_tarred", "a NeMo tarred audio dataset: its folder (or its buckets' folder, "
                        "or sharded_manifests/ beside audio_N.tar), or its tarred_audio_manifest.json",
                        options=(*_KEYS, "text_root")),
    "hf": Kind("from_hf", "read_dataset", "a Hugging Face dataset save_to_disk wrote (or the Dataset itself, in "
               "Python), or its parquet files", ("datasets", "pyarrow"), "hf", options=_KEYS),
    "wenet": Kind("from_wenet", "read_list", "a WeNet data.list (JSON lines: key, wav, txt) or shard list",
                  options=_WENET_KEYS),
}
FEATURE_KINDS: dict[str, Kind] = {
    "lhotse": Kind("from_lhotse", "FeatureCutsSource", "Lhotse cuts with features (compute_and_store_features)",
                   ("lhotse",), "lhotse"),
}

_COLUMN = Spelling("KEY", str, str)
_FOLDER = Spelling("DIR", str, str)
_LINES = "nemo, nemo-tarred, wenet and hf"


@dataclass(frozen=True)
class Manifest:
    """What ``--from KIND PATH`` names: the input of a pack in another project's format (see the
    module's doc for the kinds).  ``path``: the manifest's path; in Python also the object itself,
    a Hugging Face ``Dataset`` (one split of a ``DatasetDict``) for ``hf`` and a Lhotse ``CutSet`` for
    ``lhotse``, packed as their saved forms are (:func:`in_memory_problem` says which are not).

    The key options name which key of a line (a column, for ``hf``) holds what, where it is not the
    kind's own (``keys.py``); ``fields``: field name -> the key carried as that field (the command
    line's ``--field NAME=KEY`` with ``--from``)."""

    kind: str
    path: str | os.PathLike | Any
    audio_column: str | None = option(None, f"--from {_LINES}: the key (hf: column) of the audio (default: NeMo's "
                                      f"audio_filepath, WeNet's wav, hf's Audio column)", kind=_COLUMN, ld=False)
    text_column: str | None = option(None, f"--from {_LINES}: the key of the transcripts (default: NeMo's text, "
                                     f"normalized_text or Canary's answer; WeNet's txt; hf's text, sentence, ...)",
                                     kind=_COLUMN, ld=False)
    lang_column: str | None = option(None, f"--from {_LINES}: the key of the languages, optional per line (default: "
                                     f"NeMo's lang or Canary's target_lang; WeNet's lang; hf's language, lang or "
                                     f"locale)", kind=_COLUMN, ld=False)
    id_column: str | None = option(None, f"--from {_LINES}: the key of the utterance ids (default: NeMo's id or "
                                   f"utt_id, WeNet's key, hf's id, segment_id, utt_id or key; else the audio's file "
                                   f"name)", kind=_COLUMN, ld=False)
    speaker_column: str | None = option(None, f"--from {_LINES}: the key of the speakers, optional per line "
                                        f"(default: NeMo's speaker, WeNet's spk, hf's speaker_id, speaker or "
                                        f"client_id)", kind=_COLUMN, ld=False)
    duration_column: str | None = option(None, "--from nemo, nemo-tarred and hf: the key of the seconds an "
                                         "utterance lasts (default: NeMo's duration; hf: none)", kind=_COLUMN,
                                         ld=False)
    offset_column: str | None = option(None, "--from nemo, nemo-tarred and hf: the key of the second a segment "
                                       "starts at (default: NeMo's offset; hf: none)", kind=_COLUMN, ld=False)
    text_root: str | None = option(None, "--from nemo: a folder besides the manifest's whose files text_filepath "
                                   "may name (a manifest's text files are read there only)", kind=_FOLDER, ld=False)
    fields: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in AUDIO_KINDS and self.kind not in FEATURE_KINDS:
            raise ValueError(f"--from {self.kind}: choose one of {', '.join(AUDIO_KINDS)}")
        if not isinstance(self.path, (str, os.PathLike)):
            problem = in_memory_problem(self.kind, self.path)
            if problem is not None:
                raise TypeError(problem)
        elif not os.path.exists(self.path):
            raise FileNotFoundError(f"--from {self.kind} {self.path}: no such file or directory")
        kind = AUDIO_KINDS.get(self.kind, FEATURE_KINDS.get(self.kind))
        assert kind is not None
        for f, _ in options_of(Manifest):
            if getattr(self, f.name) is not None and f.name not in kind.options:
                takers = [k for k, v in {**FEATURE_KINDS, **AUDIO_KINDS}.items() if f.name in v.options]
                raise ValueError(f"--{f.name.replace('_', '-')} is for --from {' or '.join(takers)}, not --from "
                                 f"{self.kind}")
        if self.fields and "audio_column" not in kind.options:
            raise ValueError(f"--field NAME=KEY (a key of the manifest's lines) is for --from {_LINES}, not --from "
                             f"{self.kind}")
        if self.fields:
            object.__setattr__(self, "fields", {check_field_name(n): k for n, k in self.fields.items()})
        if self.text_root is not None and not os.path.isdir(self.text_root):
            raise NotADirectoryError(f"--text-root {self.text_root}: no such folder")

    def options(self, kind: Kind) -> dict[str, Any]:
        """What ``kind``'s reader takes: the keys (``keys.Keys``) and ``text_root``, as given."""
        out: dict[str, Any] = {"text_root": self.text_root} if "text_root" in kind.options else {}
        if "audio_column" in kind.options:
            from wdsprep.pack.sources.keys import ROLES, Keys

            named = {role: getattr(self, option) for role, option in ROLES.items() if option in kind.options}
            out["keys"] = Keys(self.kind, named, self.fields)
        return out

    def audio_source(self, audio: AudioOptions) -> PackSource:
        """The pack source of the utterances, for ``pack-audio``."""
        from wdsprep.pack.sources.items import ItemsSource

        kind = _kind(self.kind, AUDIO_KINDS, "pack-audio", FEATURE_KINDS, "pack")
        read = _load(self.kind, kind)
        imported = read(self._path(), **self.options(kind))
        return ItemsSource(imported, audio)

    def transcripts(self) -> Iterator[tuple[str, str, str | None]]:
        """``(uttid, transcript, language)`` of each utterance the pack would take (its audio is not
        read): what ``tokenizer train --from`` trains on (``wdsprep.tokenizer.train.Transcripts``)."""
        kind = _kind(self.kind, AUDIO_KINDS, "tokenizer train", {}, "")
        imported = _load(self.kind, kind)(self._path(), **self.options(kind))
        for it in imported.items:
            yield it.uttid, it.text, it.language

    def features_source(self, dims: int | None) -> PackSource:
        """The pack source of the utterances' precomputed features, for ``pack``."""
        kind = _kind(self.kind, FEATURE_KINDS, "pack", AUDIO_KINDS, "pack-audio")
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"pack --from {self.kind}: cuts with features are read from their manifest; save them "
                            f"(cuts.to_file('cuts.jsonl.gz')) and give that file")
        return _load(self.kind, kind)(self._path(), dims)

    def _path(self) -> Any:
        return str(self.path) if isinstance(self.path, (str, os.PathLike)) else self.path


# What to do with an object that is no manifest a pack can read, by kind.
_SAVE = {"hf": "save it (dataset.save_to_disk(DIR)) and give DIR",
         "lhotse": "save it (cuts.to_file('cuts.jsonl.gz')) and give that file"}


def in_memory_problem(kind: str, obj: Any) -> str | None:
    """Why ``obj``, given in place of a path, cannot be packed as ``--from kind`` (None: it can):
    a Hugging Face ``Dataset`` whose rows are in files (``load_dataset``, ``load_from_disk``), whole
    (no indices mapping left by ``select``/``shuffle``), and a Lhotse ``CutSet`` are read as their
    saved forms; anything else is named, with how to save it."""
    cls = type(obj)
    what = f"{cls.__module__.split('.')[0]}.{cls.__name__}"
    if kind == "hf" and cls.__module__.startswith("datasets"):
        if cls.__name__ == "DatasetDict":
            splits = list(obj)
            return (f"Manifest('hf', ...): a DatasetDict (splits: {', '.join(splits)}); give one split, e.g. "
                    f"Manifest('hf', dataset[{(splits[0] if splits else 'train')!r}])")
        if cls.__name__ != "Dataset":
            return f"Manifest('hf', ...): a {what} is read as it streams, not packed; {_SAVE['hf']}"
        if getattr(obj, "_indices", None) is not None:
            return (f"Manifest('hf', ...): the Dataset keeps an indices mapping (select, shuffle, filter); pass "
                    f"dataset.flatten_indices(), or {_SAVE['hf']}")
        from wdsprep.pack.sources.from_hf import arrow_files

        if not arrow_files(obj):
            return (f"Manifest('hf', ...): a Dataset whose rows are not its Arrow files as they are (held in memory "
                    f"only, or sliced, renamed or cast since it was read); {_SAVE['hf']}")
        return None
    if kind == "lhotse" and cls.__module__.startswith("lhotse") and cls.__name__ == "CutSet":
        return None
    how = _SAVE.get(kind, "give the path of its manifest")
    return f"Manifest({kind!r}, ...): a {what} is no path of a --from {kind} manifest; {how}"


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
