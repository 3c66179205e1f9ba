"""What a pack is asked for, each option in its one home: the flags of ``pack``, ``pack-audio`` and
``fbank``, the defaults of ``pack_data``, ``pack_audio`` and ``compute_fbank`` and the resume
record follow from these classes (``tests/test_cli_mirror.py`` holds them to it).

:class:`PackOptions` (with :class:`AudioOptions` and the fbank's ``FbankOptions``) decide the
shards: checked when made, their :meth:`~PackOptions.record` is the resume record
``pack_plan.json`` keeps (:mod:`wdsprep.format.commit`).  What a pack reads besides its features
or audio (:class:`PackInputs`), what it does with its output folder (:class:`OutputOptions`), how
it runs (``prep.options.JobOptions``; :class:`Engine`: an existing engine's workers, such as a
Dask cluster's, in place of the local pool) and which share of a pack spread over machines a run
does (:class:`Spread`) are not recorded.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Sequence

from wdsprep.format.audio import LOSSY_FORMATS, OPUS_BITRATE, OPUS_ENCODER, OPUS_RATES, check_bitrate, opus_encoder
from wdsprep.format.index import AudioIndex
from wdsprep.format.keys import LANG, check_field_name, layout_exts
from wdsprep.options import (
    FILES,
    NAMED_PATHS,
    NAMES,
    NUMBER,
    PATH,
    SWITCH,
    TOGGLE,
    Kind,
    choice,
    fingerprinted,
    flag_of,
    option,
    options_of,
)
from wdsprep.pack.groups import Groups
from wdsprep.prep.fbank import resolve_options
from wdsprep.prep.options import FbankOptions

DTYPES = ("float32", "float16")
# What pack-audio stores: fbank features, or the audio itself (its features made while training).
STORES = ("features", "flac", "wav", "opus")
FEATURE_LAYOUTS = ("cat", "cat-v3")


def _bitrate(text: str) -> int:
    """``--bitrate``: bit/s, or kbit/s with a ``k`` (``32k``)."""
    import argparse

    t = text.strip().lower()
    scale = 1000 if t.endswith("k") else 1
    try:
        return int(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a bitrate in bit/s (e.g. 32000, or 32k)") from None


BITRATE = Kind("BITS", _bitrate, int)

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
    store: str = option("features", "features: fbank computed now; flac, wav or opus: the audio itself (16-bit, at "
                                    "--sample-rate), the loader computes the features with these fbank options while "
                                    "training (docs/audio.md)", kind=choice(*STORES), ld=False, plan=True)
    bitrate: int | None = option(None, "--store opus: bit/s, e.g. 32000 or 32k (default: 32k, ~14 MB per hour of "
                                       "speech)", kind=BITRATE, ld=False, plan=True)
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
            opus_encoder()  # not installed: said before the pack reads anything
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
        """The fbank options (the backend resolved; ``channel`` only when one is picked: the mean of
        the channels records none), ``store`` when the shards hold audio, and a lossy store's
        ``bitrate`` and encoder settings (a pack begun with other ones resumes no further)."""
        return {**fingerprinted(self.resolved), **({"store": self.store} if self.stores_audio else {}),
                **({"bitrate": self.bitrate, "encoder": OPUS_ENCODER} if self.bitrate is not None else {})}


@dataclass(frozen=True)
class PackOptions:
    """The options that decide a pack's shards (see :func:`wdsprep.pack_data` for each); checked when made.

    ``filter_group`` is kept as its groups in order (``LO:HI`` each, an open end left empty), so
    two spellings of the same groups are the same options.  ``audio``: ``pack-audio``'s.
    ``fields``: the fields each sample carries as members (``lang`` for the language), and
    ``index_fields`` those of them that are columns of the index too (the language always), each
    kept sorted: the order they were named in changes nothing.
    """

    fmt: str = option("data-%05d.tar", "shard file name, FMT % i", kind=PATH, metavar="FMT", ld=False, plan=True)
    filter_group: Sequence[str] | None = option(
        None, "length groups, LO <= frames < HI, each a folder LO_HI of the output: in frames (10 ms), or in seconds "
              "with an s (:5s 5s:15s 15s: is :500 500:1500 1500:); an open end is allowed",
        kind=Kind("LO:HI", str, list, nargs="+", join=list), ld=False, plan=True)
    utts_per_shard: int = option(2000, "utterances per shard at most", ld=False, plan=True)
    layout: str = option("cat", "cat: KEY.npy + KEY.txt; cat-v3: KEY.mat.npy + KEY.label.txt (CAT's older recipes)",
                         kind=choice(*FEATURE_LAYOUTS), ld=False, plan=True)
    dtype: str = option("float32", "feature dtype on disk; readers return float32", kind=choice(*DTYPES), ld=False,
                        plan=True)
    dims: int | None = option(None, "pack only N-dim features and report the others as other_dims (without it, "
                                    "features of more than one dimension fail the pack)", ld=False, plan=True)
    shuffle: bool = option(True, "each length group's utterances go to shards in a seeded random order, so every "
                                 "shard holds all speakers; --no-shuffle keeps input order (which Kaldi sorts by "
                                 "speaker)", kind=TOGGLE, ld=False, plan=True)
    seed: int = option(0, "seed of the shuffle", ld=False, plan=True)
    audio: AudioOptions | None = None
    fields: Sequence[str] = ()
    index_fields: Sequence[str] = option((), "a --field that is also a column of the index, for plans (mix_by) and "
                                             "inspect (the language always is)", kind=NAMES, flag="--index-field",
                                         ld=False, plan=True)

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
        are there only when given: a record without them is one of a pack without fields."""
        record = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("audio", "fields", "index_fields")}
        record["filter_group"] = None if self.filter_group is None else list(self.filter_group)
        if self.fields:
            record.update(fields=list(self.fields), index_fields=list(self.index_fields))
        if self.audio is not None:
            del record["dims"]
            record.update(self.audio.record())
        return record


@dataclass(frozen=True)
class PackInputs:
    """What a pack reads beside the features or the audio: the Kaldi tables of the utterances'
    transcripts, segments, speakers, languages and fields.  Not options of the shards (their
    digests are in the pack's plan); a manifest (``--from``) names these itself."""

    f_labels: Sequence[str] | None = option(None, "Kaldi text file(s): uttid transcript (not with --from: the "
                                                  "manifest has the transcripts)", kind=FILES, flag="--text",
                                            metavar="TEXT", ld=False)
    utt2spk: Sequence[str] | None = option(
        None, "Kaldi utt2spk file(s): speakers kept in the index for the loader's shuffle report and "
              "--max-utts-per-speaker (default: the id up to its first '-', after an spN.N- prefix)", kind=FILES,
        metavar="UTT2SPK", ld=False)
    utt2lang: Sequence[str] | None = option(
        None, "'uttid language' file(s): each utterance's language, a member KEY.lang of the shards and a column of "
              "the index (batch.lang, a tokenizer per language, mix_by lang); an utterance without one is not packed "
              "(missing_lang)", kind=FILES, metavar="UTT2LANG", ld=False)
    fields: dict[str, str] | None = option(
        None, "a field of the utterances from an 'uttid value' file, a member KEY.NAME of the shards (repeatable), "
              "e.g. prev_text=data/train/text.prev; an utterance without a value is not packed (missing_field). With "
              "--from: NAME=KEY, a key (hf: column) of the manifest's lines, e.g. pnc=pnc; a line without it is "
              "packed without the member", kind=NAMED_PATHS, flag="--field", metavar="NAME=FILE|KEY", ld=False)


@dataclass(frozen=True)
class OutputOptions:
    """What a pack does with its output folder: replace an earlier pack, finish a stopped one, how
    many utterances left out fail it.  Not recorded."""

    max_lost: float = option(0.01, "exit 1 if a larger share of the utterances is not packed (the report names "
                                   "each), or if none is packed", kind=NUMBER, metavar="SHARE", ld=False,
                             doc="the share of the utterances that may go unpacked (counted in the report) before "
                                 "the pack fails with LostError (exit 1), after writing the report and committing "
                                 "what it wrote; a pack that writes none fails whatever its value")
    overwrite: bool = option(False, "replace the shards, indexes and report of an earlier pack in --out",
                             kind=SWITCH, ld=False)
    resume: bool = option(False, "finish a pack stopped in --out (killed, out of disk, Ctrl-C): keep the shards it "
                                 "published, write the rest; refused unless the inputs and options are those it "
                                 "started with", kind=SWITCH, ld=False)

    def __post_init__(self) -> None:
        if not 0 <= self.max_lost <= 1:  # NaN too
            raise ValueError(f"max_lost={self.max_lost!r}: a share of the utterances, from 0 to 1 (e.g. 0.01)")


def record_differences(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How two resume records (:meth:`PackOptions.record`) differ, each as the command line spells
    the option (``--store flac (the pack started with features)``).  A record key no flag sets
    (the ``layout`` an audio ``store`` decides) is left out where the flag that decides it differs."""
    homes = {f.name: (f, s) for cls in (PackOptions, AudioOptions, FbankOptions) for f, s in options_of(cls)}
    derived = {"layout": "store"} if "store" in was or "store" in now else {}

    def spelled(name: str, value: Any) -> str:
        f, s = homes.get(name, (None, None))
        if f is None or s is None:
            return f"{name}={value!r}"
        flag = flag_of(f, s) or name
        if value is None and f.default is not None:
            value = f.default  # a record leaves an option at its default out (store: features)
        if value is None:
            return f"no {flag}"
        if isinstance(value, bool):
            if s.kind is TOGGLE:
                return flag if value else f"--no-{flag[2:]}"
            return flag if value != f.default else f"no {flag}"
        return f"{flag} {' '.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"

    out = []
    for name in dict.fromkeys([*was, *now]):
        if was.get(name) == now.get(name) or derived.get(name) in {k for k in dict.fromkeys([*was, *now])
                                                                    if was.get(k) != now.get(k)}:
            continue
        out.append(f"{spelled(name, now.get(name))} (the pack started with {spelled(name, was.get(name))})")
    return out


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


@dataclass(frozen=True)
class Engine:
    """Who writes a pack's shards when not this machine's own worker processes (``--nj``): an
    existing engine's workers, each planned shard one task, published by this process in plan
    order as the tasks finish.  Not recorded: the shards are the same whoever writes them."""

    dask: str | None = option(None, "the address of a Dask scheduler (tcp://HOST:8786): its workers write the shards, "
                                    "one task per planned shard, and a task lost with its worker is run again; the "
                                    "workers must reach the inputs and --out (a bucket, or a shared folder)",
                              kind=Kind("ADDRESS", str, str), ld=False)
    executor: Any = option(None, "a concurrent.futures.Executor whose workers write the shards (Dask's "
                                 "Client.get_executor(), a Ray-backed one, a ProcessPoolExecutor); None: nj local "
                                 "worker processes", flag=False, ld=False)

    def __post_init__(self) -> None:
        if self.dask is not None and self.executor is not None:
            raise ValueError("dask (--dask) names a cluster to run the shards on, executor is one already: give one")
        if self.executor is not None and not callable(getattr(self.executor, "submit", None)):
            raise ValueError(f"executor must be a concurrent.futures.Executor (it has no submit()), got "
                             f"{type(self.executor).__name__}")
