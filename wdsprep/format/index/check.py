"""One folder's ``index.json`` and columns read and checked whole: the index reader's damage check.

:func:`read_index_json` reads what a complete folder's ``index.json`` (version 1 or 2) describes,
each field's type and range checked, its columns' headers and sizes checked and mapped;
:func:`check_index` then holds every field and column against the others.  Anything the writer
would not have written is a :class:`~wdsprep.format.index.files.DamagedIndexError` naming the file
and field, whoever reads it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from wdsprep.format.audio import AUDIO_BITS, FBANK_BACKENDS, MAX_MEL_BINS
from wdsprep.format.index.files import (
    FRAMES_FILE,
    INDEX_NAME,
    INDEX_VERSION,
    SAMPLES_FILE,
    SPEAKER_NAMES_FILE,
    SPEAKERS_FILE,
    TEXT_LENS_FILE,
    DamagedIndexError,
    field_files,
    read_column,
    read_file,
    read_lines,
)
from wdsprep.format.index.model import (
    AudioIndex,
    FolderIndex,
    ShardInfo,
    Speakers,
    Values,
    audio_problem,
    frames_digest,
)
from wdsprep.format.npy import FEATURE_DTYPES
from wdsprep.units import fbank_frames

INDEX_DTYPES = frozenset(str(d.newbyteorder("=")) for d in FEATURE_DTYPES.values())  # "float32", ...
_INT32_MAX, _INT64_MAX = 2**31 - 1, 2**63 - 1
_TAR_BLOCK = 512  # every tar member takes at least its header block
_REQUIRED = object()


def read_index_json(folder: Path) -> FolderIndex | None:
    """The index ``folder``'s ``index.json`` describes, checked whole (:func:`check_index`), or
    None when there is no ``index.json``."""
    path = folder / INDEX_NAME
    data = read_file(path, required=False)
    if data is None:
        return None
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DamagedIndexError(path, f"not valid JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(d, dict):
        raise DamagedIndexError(path, f"holds {_show(d)}, not a JSON object")
    version = _field(path, d, "version", f"1 or {INDEX_VERSION}", lambda v: type(v) is int and v in (1, INDEX_VERSION))
    index, stated = (_index_v1 if version == 1 else _index_v2)(folder, path, d)
    check_index(index, stated)
    return index


@dataclass
class _Stated:
    """What ``index.json`` states besides the columns (totals, per-shard frames), to hold against them."""

    shard_frames: list[int]
    num_utts: int
    num_frames: int


def _index_v2(folder: Path, path: Path, d: dict) -> tuple[FolderIndex, _Stated]:
    """The index ``index.json`` (version 2) describes, its fields' types and ranges checked, its
    columns' headers and sizes checked and mapped."""
    layout, dims, dtype = _layout_fields(path, d)
    shards = _field(path, d, "shards", "a list", lambda v: isinstance(v, list))
    rows = []
    for i, s in enumerate(shards):
        at = f"shards[{i}]."
        if not isinstance(s, dict):
            raise DamagedIndexError(path, f"field 'shards[{i}]' is {_show(s)}, not a JSON object")
        rows.append((_field(path, s, "name", *_NAME, at), _field(path, s, "size", *_SIZE, at),
                     _field(path, s, "mtime_ns", *_MTIME, at), _field(path, s, "utts", *_COUNT, at),
                     _field(path, s, "frames", *_SIZE, at), _field(path, s, "frames_digest", *_DIGEST, at),
                     _field(path, s, "lost", *_SIZE, at, default=0),
                     _field(path, s, "sha256", *_SHA256, at, default=None)))
    names, sizes, mtimes, utts, shard_frames, digests, lost, checksums = (
        (list(c) for c in zip(*rows)) if rows else ([],) * 8)
    stated = _Stated(shard_frames, _field(path, d, "num_utts", *_SIZE), _field(path, d, "num_frames", *_SIZE))
    n = sum(utts)
    if stated.num_utts != n:
        raise DamagedIndexError(path, f"field 'num_utts' is {stated.num_utts:,}, its shards' 'utts' add up to {n:,}")
    # mmap: a loader over 15M utterances maps 60 MB per column instead of reading it.
    frames, text_lens = read_column(folder / FRAMES_FILE, n), read_column(folder / TEXT_LENS_FILE, n)
    meta = _field(path, d, "speakers", "a JSON object with 'count' and 'source'", lambda v: isinstance(v, dict),
                  default=None)
    speakers = None
    if meta is not None:
        count = _field(path, meta, "count", *_COUNT, "speakers.")
        source = _field(path, meta, "source", "a string", lambda v: isinstance(v, str), "speakers.")
        names_path = folder / SPEAKER_NAMES_FILE
        speaker_names = read_lines(names_path)
        if len(speaker_names) != count:
            raise DamagedIndexError(names_path, f"{len(speaker_names):,} names; index.json's field 'speakers.count' "
                                                f"says {count:,}")
        speakers = Speakers(read_column(folder / SPEAKERS_FILE, n), speaker_names, source)
    audio = _audio_field(path, d, layout)
    samples = None if audio is None else read_column(folder / SAMPLES_FILE, n)
    fields, columns = _fields(folder, path, d, n)
    index = FolderIndex(layout, dims, dtype, names, np.array(utts, np.int64), frames, text_lens,
                        sizes=np.array(sizes, np.int64),
                        mtimes=np.array(mtimes, np.int64), digests=digests, folder=folder,
                        lost=np.array(lost, np.int64), speakers=speakers, checksums=checksums, audio=audio,
                        samples=samples, fields=fields, columns=columns)
    return index, stated


def _fields(folder: Path, path: Path, d: dict, n: int) -> tuple[list[str], dict[str, Values]]:
    """``index.json``'s ``fields`` object (optional): the fields the samples carry, and the columns of
    those indexed (``{"values": count}``), each read and its count held against its values file."""
    from wdsprep.format.keys import FIELD_NAME, RESERVED_FIELDS

    raw = _field(path, d, "fields", "a JSON object of field names", lambda v: isinstance(v, dict), default={})
    names, columns = [], {}
    for name, meta in raw.items():
        if not FIELD_NAME.fullmatch(name) or name in RESERVED_FIELDS:
            raise DamagedIndexError(path, f"field 'fields' names {_show(name)}, which is no field name")
        if not isinstance(meta, dict):
            raise DamagedIndexError(path, f"field 'fields.{name}' is {_show(meta)}, not a JSON object")
        names.append(name)
        if "values" not in meta:
            continue
        count = _field(path, meta, "values", *_COUNT, f"fields.{name}.")
        ids_file, names_file = field_files(name)
        values = read_lines(folder / names_file)
        if len(values) != count:
            raise DamagedIndexError(folder / names_file, f"{len(values):,} values; index.json's field "
                                                         f"'fields.{name}.values' says {count:,}")
        columns[name] = Values(read_column(folder / ids_file, n), values)
    return names, columns


def _audio_field(path: Path, d: dict, layout: str) -> AudioIndex | None:
    """``index.json``'s ``audio`` object, which an audio layout needs and a features layout must not have."""
    from wdsprep.format.keys import AUDIO_LAYOUTS

    raw = _field(path, d, "audio", "a JSON object with 'format', 'sample_rate', 'bits' and 'fbank'",
                 lambda v: isinstance(v, dict), default=None)
    if raw is None:
        if layout in AUDIO_LAYOUTS:
            raise DamagedIndexError(path, f"field 'audio' is missing: layout {layout!r} holds audio, and the index "
                                          f"says its rate and the fbank options the loader computes features with")
        return None
    if layout not in AUDIO_LAYOUTS:
        raise DamagedIndexError(path, f"field 'audio' is there, but layout {layout!r} holds features")
    layout = _field(path, raw, "format", f"the layout, {layout!r}", lambda v: v == layout, "audio.")
    rate = _field(path, raw, "sample_rate", *_whole(1000, 1_000_000), "audio.")
    _field(path, raw, "bits", str(AUDIO_BITS), lambda v: type(v) is int and v == AUDIO_BITS, "audio.")
    fb = _field(path, raw, "fbank", "a JSON object", lambda v: isinstance(v, dict), "audio.")
    bins = _field(path, fb, "num_mel_bins", *_whole(1, MAX_MEL_BINS), "audio.fbank.")
    audio = AudioIndex(layout, rate, num_mel_bins=bins,
                       dither=_field(path, fb, "dither", "a number >= 0", lambda v: not isinstance(v, bool) and
                                     isinstance(v, (int, float)) and 0 <= v < 1e6, "audio.fbank."),
                       backend=_field(path, fb, "backend", f"one of {list(FBANK_BACKENDS)}",
                                      lambda v: v in FBANK_BACKENDS, "audio.fbank."))
    return audio


def _index_v1(folder: Path, path: Path, d: dict) -> tuple[FolderIndex, None]:
    """A version 1 index: every shard's keys, frames and transcript lengths in ``index.json``."""
    layout, dims, dtype = _layout_fields(path, d)
    infos = []
    for i, s in enumerate(_field(path, d, "shards", "a list", lambda v: isinstance(v, list))):
        at = f"shards[{i}]."
        if not isinstance(s, dict):
            raise DamagedIndexError(path, f"field 'shards[{i}]' is {_show(s)}, not a JSON object")
        keys = _field(path, s, "keys", "a list of keys", lambda v: isinstance(v, list) and all(
            isinstance(k, str) and k for k in v), at)
        columns = [_field(path, s, c, f"a list of {len(keys)} whole numbers in [0, {_INT32_MAX:,}]",
                          lambda v: isinstance(v, list) and len(v) == len(keys) and all(
                              type(x) is int and 0 <= x <= _INT32_MAX for x in v), at)
                   for c in ("frames", "text_lens")]
        infos.append(ShardInfo(_field(path, s, "name", *_NAME, at), list(keys), *columns))
    index = FolderIndex.from_shards(layout, dims, dtype, infos)
    index.folder = folder
    return index, None


def _layout_fields(path: Path, d: dict) -> tuple[str, int | None, str]:
    from wdsprep.format.keys import LAYOUTS

    return (_field(path, d, "layout", f"one of {sorted(LAYOUTS)}", lambda v: isinstance(v, str) and v in LAYOUTS),
            _field(path, d, "dims", "null or " + _DIMS[0], lambda v: v is None or _DIMS[1](v), default=None),
            _field(path, d, "dtype", f"one of {sorted(INDEX_DTYPES)}",
                   lambda v: isinstance(v, str) and v in INDEX_DTYPES, default="float32"))


def check_index(index: FolderIndex, stated: _Stated | None = None) -> None:
    """Hold every field and column of an index against the others (and against what ``index.json``
    ``stated`` about them): a DamagedIndexError naming the file and field of the first that does not fit.

    Utterance counts against the columns, each shard's utterances and lost samples against its byte
    size (a tar member takes at least a 512-byte block), frames >= 1 and transcript lengths >= 0,
    each shard's frame digest and frame total against its rows, speaker ids within the speaker
    table, shard names unique plain file names.
    """
    folder = index.folder if index.folder is not None else Path(".")
    path = folder / INDEX_NAME
    seen: set[str] = set()
    for i, name in enumerate(index.names):
        if name in seen:
            raise DamagedIndexError(path, f"field 'shards[{i}].name' is {name!r}, which an earlier shard has too")
        seen.add(name)
    # An indexed sample has two members, a lost one at least one (lost on the left: 2**63 - 1 is a valid int64).
    for i in np.flatnonzero((index.sizes >= 0) & (index.lost > index.sizes // _TAR_BLOCK - 2 * index.utts)):
        raise DamagedIndexError(path, f"fields 'shards[{i}].utts' ({int(index.utts[i]):,}) and 'lost' "
                                      f"({int(index.lost[i]):,}) are more samples than its {int(index.sizes[i]):,} "
                                      f"bytes can hold")
    frames, text_lens = index.frames, index.text_lens
    if len(frames) and int(frames.min()) < 1:
        raise DamagedIndexError(folder / FRAMES_FILE, f"frame count {int(frames.min())} at row "
                                                      f"{int(np.argmin(frames))}; every utterance has at least 1")
    if len(text_lens) and int(text_lens.min()) < 0:
        raise DamagedIndexError(folder / TEXT_LENS_FILE, f"transcript length {int(text_lens.min())} at row "
                                                         f"{int(np.argmin(text_lens))}")
    plain = np.asarray(frames).view(np.ndarray)  # slices of a plain view cost less than a memmap's
    total = 0
    for i, (a, b) in enumerate(zip(index.starts[:-1].tolist(), index.starts[1:].tolist())):
        rows = plain[a:b]
        if frames_digest(rows) != index.digests[i]:
            raise DamagedIndexError(path, f"field 'shards[{i}].frames_digest' does not match rows {a:,}:{b:,} of "
                                          f"{FRAMES_FILE}")
        n = int(rows.sum(dtype=np.int64))  # per shard: one int64 copy of the column would be 120 MB at 15M rows
        if stated is not None and stated.shard_frames[i] != n:
            raise DamagedIndexError(path, f"field 'shards[{i}].frames' is {stated.shard_frames[i]:,}, its rows of "
                                          f"{FRAMES_FILE} add up to {n:,}")
        total += n
    if stated is not None and stated.num_frames != total:
        raise DamagedIndexError(path, f"field 'num_frames' is {stated.num_frames:,}, {FRAMES_FILE} adds up to "
                                      f"{total:,}")
    if index.audio is not None and index.samples is not None:
        _check_audio(index, folder)
    sp = index._speakers
    if sp is not None:
        _check_ids(sp, folder / SPEAKERS_FILE, f"{SPEAKER_NAMES_FILE} names", "speaker")
    for name, column in index.columns.items():
        ids_file, names_file = field_files(name)
        _check_ids(column, folder / ids_file, f"{names_file} holds", f"{name} value", none=True)


def _check_ids(values: Values, path: Path, holds: str, what: str, *, none: bool = False) -> None:
    """Every id of a column numbers one of its names (``none``: or is -1, a row without a value)."""
    if not len(values.ids):
        return
    lo, hi = int(values.ids.min()), int(values.ids.max())
    if lo < (-1 if none else 0) or hi >= len(values.names):
        bad = lo if lo < 0 else hi
        raise DamagedIndexError(path, f"{what} id {bad} at row {int(np.flatnonzero(values.ids == bad)[0])}; "
                                      f"{holds} {len(values.names):,}")


def _check_audio(index: FolderIndex, folder: Path) -> None:
    """An audio folder: a sample count >= 1 per utterance, frames the fbank framing of it, dims its mel bins."""
    audio, samples = index.audio, index.samples
    assert audio is not None and samples is not None
    problem = audio_problem(audio)
    if problem is not None:
        raise DamagedIndexError(folder / INDEX_NAME, f"field 'audio': {problem}")
    if index.dims != audio.num_mel_bins:
        raise DamagedIndexError(folder / INDEX_NAME, f"field 'dims' is {index.dims}, its audio's fbank gives "
                                                     f"{audio.num_mel_bins} mel bins")
    if len(samples) and int(samples.min()) < 1:
        raise DamagedIndexError(folder / SAMPLES_FILE, f"sample count {int(samples.min())} at row "
                                                       f"{int(np.argmin(samples))}; every utterance has at least 1")
    odd = np.flatnonzero(fbank_frames(np.asarray(samples), audio.sample_rate) != np.asarray(index.frames))
    if len(odd):
        r = int(odd[0])
        raise DamagedIndexError(folder / FRAMES_FILE, f"row {r:,} says {int(index.frames[r]):,} frames, but its "
                                                      f"{int(samples[r]):,} samples at {audio.sample_rate} Hz give "
                                                      f"{int(fbank_frames(int(samples[r]), audio.sample_rate)):,} "
                                                      f"({SAMPLES_FILE})")


def _field(path: Path, obj: dict, key: str, want: str, ok: Callable[[object], bool], where: str = "", *,
           default: object = _REQUIRED) -> Any:
    """``obj[key]`` when ``ok`` holds for it; else a DamagedIndexError naming field ``where + key``
    and saying it should be ``want``.  A missing key is ``default``, when one is given."""
    if key not in obj:
        if default is _REQUIRED:
            raise DamagedIndexError(path, f"field {where + key!r} is missing")
        return default
    value = obj[key]
    if not ok(value):
        raise DamagedIndexError(path, f"field {where + key!r} is {_show(value)}, not {want}")
    return value


def _whole(lo: int, hi: int) -> tuple[str, Callable[[object], bool]]:
    """(what, test) of a whole number in ``[lo, hi]`` (JSON's true/false are not numbers)."""
    return f"a whole number in [{lo:,}, {hi:,}]", lambda v: type(v) is int and lo <= v <= hi


_COUNT, _SIZE, _DIMS = _whole(0, _INT32_MAX), _whole(0, _INT64_MAX), _whole(1, _INT32_MAX)
_MTIME = _whole(-_INT64_MAX, _INT64_MAX)


def _is_name(v: object) -> bool:
    """A shard's file name in its folder: nothing that leaves it or could not be one line."""
    return isinstance(v, str) and v not in ("", ".", "..") and not any(c in v for c in "/\\\0\n")


def _is_digest(v: object) -> bool:
    return isinstance(v, str) and _DIGEST_RE.fullmatch(v) is not None


_NAME, _DIGEST = ("a file name", _is_name), ("16 hex digits", _is_digest)
# A shard's SHA-256, absent in version 2 indexes without checksums.
_SHA256 = ("64 lowercase hex digits", lambda v: isinstance(v, str) and len(v) == 64
           and all(c in "0123456789abcdef" for c in v))
_DIGEST_RE = re.compile("[0-9a-f]{16}")


def _show(v: object) -> str:
    """A JSON value for a message: short, whatever it holds (nested 1,000 deep, 5,000 digits)."""
    if isinstance(v, dict):
        return f"a JSON object of {len(v)} field(s)"
    if isinstance(v, list):
        return f"a list of {len(v)} item(s)"
    if isinstance(v, str):
        return repr(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int) and abs(v) >= 10**18:
        return f"a {len(str(abs(v)))}-digit number"
    return repr(v)
