"""What a pack is asked for: :class:`PackOptions`, checked when it is made, whose :meth:`~PackOptions.record`
is the resume record ``pack_plan.json`` keeps (:mod:`wdsprep.format.commit`).

The options here are those that decide the shards.  How a pack runs (``nj``, ``progress``,
``strict``, ``overwrite``, ``resume``, and :class:`Spread`: which share of a pack spread over
machines this run does) and what it reads are the caller's, not recorded.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any, Sequence

from wdsprep.format.audio import LOSSY_FORMATS, OPUS_BITRATE, OPUS_RATES, check_bitrate
from wdsprep.format.index import AudioIndex
from wdsprep.format.keys import LANG, check_field_name, layout_exts
from wdsprep.options import SWITCH, Kind, option
from wdsprep.pack.groups import Groups
from wdsprep.prep.fbank import resolve_options
from wdsprep.prep.fbank_options import FbankOptions

DTYPES = ("float32", "float16")
# What pack-audio stores: fbank features, or the audio itself (its features made while training).
STORES = ("features", "flac", "wav", "opus")

PathOrPaths = str | os.PathLike | Sequence[str | os.PathLike]


def as_list(p: PathOrPaths) -> list[str]:
    """One path or many, as a list of strings."""
    return [str(p)] if isinstance(p, (str, os.PathLike)) else [str(x) for x in p]


@dataclass(frozen=True)
class AudioOptions:
    """``pack-audio``'s: the fbank options as given, and what the shards store (``store``: the
    features, or the audio itself for the loader to compute them with these options; ``bitrate``:
    a lossy store's, bit/s, None: its default)."""

    fbank: FbankOptions
    store: str = "features"
    bitrate: int | None = None
    # Made, and so checked, with the options: the fbank options with the backend that computes the
    # features here, and what the index of audio shards says (the audio's format and the options the
    # loader computes the features with, backend auto: its numpy; None for feature shards).
    resolved: FbankOptions = field(init=False, repr=False, compare=False)
    index: AudioIndex | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ValueError(f"store must be one of {', '.join(STORES)}, got {self.store!r}")
        f = self.fbank
        if self.store in LOSSY_FORMATS:
            if f.sample_rate not in OPUS_RATES:
                raise ValueError(f"store {self.store}: Opus codes audio at {', '.join(map(str, OPUS_RATES))} Hz, not "
                                 f"{f.sample_rate}: give one of them as sample_rate (--sample-rate)")
            object.__setattr__(self, "bitrate", check_bitrate(OPUS_BITRATE if self.bitrate is None else self.bitrate))
        elif self.bitrate is not None:
            raise ValueError(f"bitrate applies to a lossy store ({', '.join(LOSSY_FORMATS)}), not to store "
                             f"{self.store!r}")
        object.__setattr__(self, "index", None if not self.stores_audio else AudioIndex(
            self.store, f.sample_rate, f.num_mel_bins, f.dither, "numpy" if f.backend == "auto" else f.backend))
        object.__setattr__(self, "resolved", resolve_options(f))

    @property
    def stores_audio(self) -> bool:
        return self.store != "features"

    def record(self) -> dict[str, Any]:
        """The fbank options (the backend resolved), ``store`` when the shards hold audio, and a
        lossy store's ``bitrate``."""
        return {**asdict(self.resolved), **({"store": self.store} if self.stores_audio else {}),
                **({"bitrate": self.bitrate} if self.bitrate is not None else {})}


@dataclass(frozen=True)
class PackOptions:
    """The options that decide a pack's shards (see :func:`wdsprep.pack_data` for each); checked when made.

    ``filter_group`` is kept as its groups in order (``LO:HI`` each, an open end left empty), so
    two spellings of the same groups are the same options.  ``audio``: ``pack-audio``'s.
    ``fields``: the fields each sample carries as members (``lang`` for the language), and
    ``index_fields`` those of them that are columns of the index too (the language always), each
    kept sorted: the order they were named in changes nothing.
    """

    fmt: str = "data-%05d.tar"
    filter_group: Sequence[str] | None = None
    utts_per_shard: int = 2000
    layout: str = "cat"
    dtype: str = "float32"
    dims: int | None = None
    shuffle: bool = True
    seed: int = 0
    audio: AudioOptions | None = None
    fields: Sequence[str] = ()
    index_fields: Sequence[str] = ()

    def __post_init__(self) -> None:
        fields = sorted({check_field_name(n) for n in self.fields})
        indexed = sorted({check_field_name(n) for n in self.index_fields} | ({LANG} & set(fields)))
        object.__setattr__(self, "fields", tuple(fields))
        object.__setattr__(self, "index_fields", tuple(indexed))
        check_fmt(self.fmt)
        check_dims(self.dims)
        check_dtype(self.dtype, self.layout)
        if self.utts_per_shard < 1:
            raise ValueError("utts_per_shard must be >= 1")
        groups = Groups(self.filter_group) if self.filter_group else None
        object.__setattr__(self, "filter_group", None if groups is None else tuple(str(g) for g in groups))

    @cached_property
    def groups(self) -> Groups | None:
        return Groups(self.filter_group) if self.filter_group else None

    @property
    def folders(self) -> list[str]:
        """Every shard folder of the pack, in order: one per length group, or the output folder itself."""
        return [""] if self.groups is None else [g.folder for g in self.groups]

    @property
    def audio_rate(self) -> int | None:
        """The sample rate of the audio the shards hold; None when they hold features."""
        a = self.audio
        return a.fbank.sample_rate if a is not None and a.stores_audio else None

    @property
    def audio_bitrate(self) -> int | None:
        """A lossy audio store's bit/s (None: lossless, or features)."""
        return None if self.audio is None else self.audio.bitrate

    @property
    def audio_index(self) -> AudioIndex | None:
        return None if self.audio is None else self.audio.index

    def record(self) -> dict[str, Any]:
        """The resume record, ``pack_plan.json``'s ``options``: a ``--resume`` is refused unless its
        record is this one.  The fields in order, as JSON values; a pack from audio has no ``dims``
        (its ``num_mel_bins`` decide them) and its :class:`AudioOptions` follow, flat.  The fields
        are there only when given, so a pack stopped before fields existed resumes."""
        record = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("audio", "fields", "index_fields")}
        record["filter_group"] = None if self.filter_group is None else list(self.filter_group)
        if self.fields:
            record.update(fields=list(self.fields), index_fields=list(self.index_fields))
        if self.audio is not None:
            del record["dims"]
            record.update(self.audio.record())
        return record


def check_fmt(fmt: str) -> None:
    try:
        name = fmt % 0
    except (TypeError, ValueError):
        raise ValueError(f"shard name format {fmt!r} must take one integer, e.g. data-%05d.tar") from None
    if "/" in name or not name.endswith(".tar") or name.startswith("."):
        raise ValueError(f"shard name format {fmt!r} must give a plain file name ending in .tar")


def check_dims(dims: int | None) -> None:
    if dims is not None and (not isinstance(dims, int) or dims < 1):
        raise ValueError(f"dims must be a positive number of feature dimensions, got {dims!r}")


FLOAT16_NOTE = ("float16 features: wdsprep's loader returns them as float32, but CAT's own reader (webdataset's "
                 ".decode()) hands the float16 arrays to the model as they are; train on these shards with wdsprep's "
                 "loader, or pack float32 for CAT")


def check_dtype(dtype: str, layout: str) -> None:
    """Refuse an unknown layout or dtype before any work starts; say plainly what float16 means for CAT.

    Both feature layouts are CAT's, so a float16 shard looks like one CAT can read; it can, but its
    model gets float16 tensors it was not built for.
    """
    layout_exts(layout)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if dtype == "float16":
        # stacklevel: the line that called pack_data (above check_dtype, __post_init__, __init__, pack_data).
        warnings.warn(f"{layout} layout with {FLOAT16_NOTE}", UserWarning, stacklevel=5)


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` of a pack spread over machines: planned shard ``j`` is this
    part's when ``j % count == index`` (fixed by the plan alone, so every machine agrees, and each
    part gets shards of every length group)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1 \
                or isinstance(self.index, bool) or not isinstance(self.index, int) or not 0 <= self.index < self.count:
            raise ValueError(f"part {self.index}/{self.count}: give I/N with N >= 1 and 0 <= I < N (I counts from 0, "
                             f"as SLURM_ARRAY_TASK_ID with --array=0-{{N-1}} does)")

    def mine(self, shard: int) -> bool:
        return shard % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def as_part(value: Part | str | tuple[int, int] | None) -> Part | None:
    """``--part``'s value: ``"I/N"``, ``(I, N)`` or a :class:`Part` (None: the whole pack)."""
    if value is None or isinstance(value, Part):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Part(*value)
    if isinstance(value, str):
        i, slash, n = value.partition("/")
        if slash and i.strip().isdigit() and n.strip().isdigit():
            return Part(int(i), int(n))
    raise ValueError(f"part {value!r}: give I/N, e.g. 0/3 (I counts from 0)")


def _part_json(value: Any) -> Part:
    part = as_part(value)
    assert part is not None
    return part


def _part_text(text: str) -> Part:
    """``--part``'s word; argparse shows the reason of an ArgumentTypeError, not of a ValueError."""
    import argparse

    try:
        return _part_json(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


PART = Kind("I/N", _part_text, _part_json)


@dataclass(frozen=True)
class Spread:
    """How one run takes part in a pack spread over machines (a job array): plan it, write one
    part, or (neither, with ``resume``) commit it.  Not recorded in the plan: the shards are the
    same however the pack is spread."""

    plan_only: bool = option(False, "write the pack's plan (pack_plan.json, the folder marked incomplete) and stop; "
                                    "then run each --part, then the same command with --resume to commit",
                             kind=SWITCH, ld=False)
    part: Part | None = option(None, "write and publish only part I of N of the planned shards (I from 0; planned "
                                     "shard j is part j mod N's); parts run in any order, at once on machines that "
                                     "share --out, each resumable; needs the plan (--plan-only) first",
                               kind=PART, ld=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "part", as_part(self.part))
        if self.plan_only and self.part is not None:
            raise ValueError("--plan-only writes the plan, --part writes shards of it: give one")
