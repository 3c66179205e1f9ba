"""A shard's samples: members grouped by key, each pair decoded, damage reported the loader's way.

What counts as a usable sample is decided here once, for the loader and for ``verify``
(:func:`decode_sample`): one features member and one transcript member of a layout, an
``.npy`` header of little-endian float16/32/64, 2-D, at least one frame (in an audio layout: an
audio header of 16-bit PCM of 1 to 8 channels with at least one frame's samples, ``audio.py``), a UTF-8
transcript and a key that percent-decodes.  A sample that fails any of these in a tar that is
whole (its members all there, the tar's own headers intact) is left out alone and the shard read
on: a member cut short, empty or of garbage, an Opus stream without its end, an ``.npy`` whose
magic is broken, a header saying what the readers do not use (stereo, 24-bit, a rate no speech
has: :class:`~wdsprep.format.audio.RefusedAudio`).  The index scan does the same (it counts that
sample lost, and the loader reports it as unreadable), and so does ``verify``.  Damage to the tar
itself ends the shard: what follows cannot be found.  A sample's fields
(members ``KEY.NAME``, ``keys.py``) are read when asked for (:func:`decode_fields`): UTF-8 text,
None where the sample has no such member.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from wdsprep.format import native
from wdsprep.format.audio import AudioHeader, FileAudio, RefusedAudio, audio_header
from wdsprep.format.keys import (
    AUDIO_LAYOUTS,
    FEATURE_LAYOUTS,
    LAYOUTS,
    decode_key,
    describe_layouts,
    split_member,
    uttid_for_message,
)
from wdsprep.format.npy import FEATURE_DTYPES, as_features, npy_header_end, npy_layout
from wdsprep.format.shardfile import FileFeats, ShardError, ShardFile, Source, open_shard
from wdsprep.format.shardlist import is_url
from wdsprep.format.tar import PEEK, Member, _Exotic, member_bytes, scan_tarfile, scan_ustar
from wdsprep.units import fbank_frames

OnCorrupt = Callable[[str, "str | None", str], None]  # (shard, key or None, why): lets a caller count the damage


# What a reader does with a damaged shard: skip the rest of it, counted, or stop.
ON_ERROR = ("warn", "raise")


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")


def report_damage(url: str, why: str, on_error: str, cause: Exception | None = None) -> None:
    """Raise (``on_error="raise"``) or warn that shard ``url`` is damaged, ``why``; a warning says the
    rest of the shard is skipped, which is what the readers then do."""
    if on_error == "raise":
        raise ShardError(f"shard {url}: {why}. Re-create the shard (wdsprep pack) or remove it from the shard "
                         f"list") from cause
    warnings.warn(f"shard {url}: {why}; the rest of the shard is skipped. Re-create the shard (wdsprep pack) "
                  f"or remove it from the shard list", RuntimeWarning, stacklevel=3)


def open_members(url: str, *, whole: bool = False,
                 source: ShardFile | None = None) -> tuple[Source, list[Member], str | None]:
    """The shard's source, its members and what is wrong with the tar (None: nothing).

    ``source``: the shard already open (a fetched copy, which a pipe's or URL's shard must be:
    the format does not fetch); ``url`` then only names it."""
    try:
        src = source if source is not None else open_shard(url, whole=whole)
    except (OSError, ValueError) as e:  # ShardError is a ValueError
        return b"", [], f"cannot read: {e}"
    try:
        members, problem = scan_ustar(src)
    except _Exotic:
        members, problem = scan_tarfile(src)
    return src, members, problem


def group_samples(members: list[Member]) -> Iterator[tuple[str, dict[str, Member]]]:
    """(key, {extension: member}) for each run of consecutive members that share a key."""
    key: str | None = None
    group: dict[str, Member] = {}
    for m in members:
        k, ext = split_member(m[0])
        if k != key:
            if key is not None:
                yield key, group
            key, group = k, {}
        group[ext] = m
    if key is not None:
        yield key, group


def samples_before_damage(members: list[Member], problem: str | None) -> Iterator[tuple[str, dict[str, Member]]]:
    """:func:`group_samples`, less the last group when the tar is damaged: its members may have been
    cut off (the .npy arrived but not the .txt)."""
    groups = group_samples(members)
    pending = next(groups, None)
    while pending is not None:
        following = next(groups, None)
        if following is None and problem is not None:
            return
        yield pending
        pending = following


def shard_samples(url: str, *, on_error: str, on_corrupt: OnCorrupt | None, whole: bool,
                   source: ShardFile | None = None) -> Iterator[tuple[Source, str, dict[str, Member]]]:
    """(source, key, {extension: member}) for every complete sample; damage reported at the end."""
    check_on_error(on_error)
    src, members, problem = open_members(url, whole=whole, source=source)
    # One group at a time: a list of all groups would keep thousands of dicts alive for the GC to walk.
    count = 0
    last: str | None = None
    for key, group in samples_before_damage(members, problem):
        count += 1
        last = key
        yield src, key, group
    if problem is not None:
        groups = list(group_samples(members))
        bad_key = groups[count][0] if count < len(groups) else None
        if on_corrupt is not None:
            on_corrupt(url, bad_key, problem)
        where = f" (at or after utterance {uttid_for_message(bad_key)!r})" if bad_key else (
            f" (after utterance {uttid_for_message(last)!r})" if last else "")
        report_damage(url, f"{problem}{where}; {count} samples read before it", on_error)


def split_sample(members: dict[str, Member]) -> tuple[Member, Member]:
    """(feature member, transcript member) of a sample in either layout; ValueError naming what is missing."""
    for feat_ext, text_ext in LAYOUTS.values():
        if feat_ext in members and text_ext in members:
            return members[feat_ext], members[text_ext]
    for feat_ext, text_ext in LAYOUTS.values():
        if feat_ext in members:
            raise ValueError(f"features .{feat_ext} but no transcript member .{text_ext}")
        if text_ext in members:
            raise ValueError(f"transcript .{text_ext} but no features member .{feat_ext}")
    raise ValueError(f"no member of a known layout (.{', .'.join(sorted(members))}); expected {describe_layouts()}")


def sample_layout(members: dict[str, Member], feats: Member) -> str:
    """The layout whose features (or audio) member ``feats`` is, of a sample :func:`split_sample` split."""
    return next(layout for layout, exts in LAYOUTS.items() if members.get(exts[0]) is feats)


def read_audio_header(src: Source, m: Member) -> AudioHeader:
    """The header of audio member ``m`` (its format from its name); ValueError when the readers refuse it."""
    name, offset, size, head = m
    layout = next(x for x in AUDIO_LAYOUTS if name.endswith("." + x))
    header = audio_header(layout, head, size, lambda a, b: bytes(src[offset + a:offset + b]))
    if not fbank_frames(header.samples, header.sample_rate):
        raise RefusedAudio(f"{header.samples} samples at {header.sample_rate} Hz, less than one 25 ms frame")
    return header


def read_audio(src: Source, m: Member, key: str) -> FileAudio:
    """An audio member left in its shard, its header checked (see :func:`read_audio_header`)."""
    return FileAudio(src, m[1], m[2], read_audio_header(src, m), key)


def feature_layout(src: Source, m: Member) -> tuple[np.dtype, bool, tuple[int, int], int]:
    """(dtype, Fortran order, shape, data offset within the member) of a features member, from its
    ``.npy`` header alone; ValueError when the readers refuse it (see :func:`~wdsprep.format.npy.npy_layout`)."""
    _, offset, size, head = m
    end = npy_header_end(head)
    if end > len(head):  # a header longer than numpy writes: read all of it
        head = bytes(src[offset:offset + end])
    return npy_layout(head, size)


def read_features(src: Source, m: Member, key: str, *, float32: bool, lazy: bool) -> np.ndarray | FileFeats:
    """A features member as an array (or, ``lazy``, a :class:`FileFeats` left in a local shard);
    ValueError when the readers refuse it (see :func:`feature_layout`)."""
    offset = m[1]
    dtype, fortran, shape, start = feature_layout(src, m)
    count = shape[0] * shape[1]
    if not isinstance(src, ShardFile):
        return as_features(np.frombuffer(src, dtype, count, offset + start), shape, fortran, float32)
    feats = FileFeats(src, offset + start, shape[::-1] if fortran else shape, dtype, key)
    if lazy and not fortran and dtype.itemsize != 8:
        return feats
    return as_features(feats.read().reshape(-1), shape, fortran, float32)


def decode_fields(src: Source, members: dict[str, Member], names: Sequence[str]) -> tuple[str | None, ...]:
    """The values of fields ``names`` of one sample (None where it has no such member); ValueError
    (UnicodeDecodeError) for one that is not UTF-8."""
    return tuple(None if n not in members else str(member_bytes(src, members[n]), "utf-8") for n in names)


def decode_sample(src: Source, key: str, members: dict[str, Member], *, float32: bool = True,
                  lazy: bool = False) -> tuple[str, np.ndarray | FileFeats | FileAudio, str]:
    """(utterance id, features, transcript) of one sample; ValueError (UnicodeDecodeError is one)
    saying why the readers refuse it.  The features of an audio sample are its :class:`FileAudio`
    (header checked, not decoded)."""
    feat_m, text_m = split_sample(members)
    if sample_layout(members, feat_m) in AUDIO_LAYOUTS:
        feats: np.ndarray | FileFeats | FileAudio = read_audio(src, feat_m, key)
    else:
        feats = read_features(src, feat_m, key, float32=float32, lazy=lazy)
    text = str(member_bytes(src, text_m), "utf-8")
    return decode_key(key), feats, text


# The C walk reads feature layouts only (split_sample's order); an audio shard goes the Python way,
# where the audio's decoding costs far more than the walk.
_LAYOUT_EXTS = [(LAYOUTS[name][0].encode(), LAYOUTS[name][1].encode()) for name in FEATURE_LAYOUTS]
_ITEMSIZE_DTYPES = {4: FEATURE_DTYPES["<f4"], 2: FEATURE_DTYPES["<f2"]}


def native_samples(url: str, source: ShardFile | None = None, fields: Sequence[str] = ()
                   ) -> tuple[ShardFile, list[str], list[str], np.ndarray, list[list[str | None]]] | None:
    """A shard's samples as the C part reads them: the file, keys, transcripts, int64 [n, 4]
    (offset, frames, dims, item size) and, per field of ``fields``, each sample's value (None: no
    such member); None when it leaves the shard to Python.  A pipe's or URL's shard is read so only
    from its fetched copy, ``source``."""
    if native.lib is None:
        return None
    if source is not None:
        src = source
    elif is_url(url):
        return None
    else:
        try:
            src = ShardFile(url)
        except (OSError, ShardError):
            return None  # the Python path reports it
    if fields:
        found = native.lib.samples(src.fileno(), PEEK, len(src), _LAYOUT_EXTS, [n.encode() for n in fields])
        if found is None:
            return None
        keys, texts, layout, values = found
    else:
        found = native.lib.samples(src.fileno(), PEEK, len(src), _LAYOUT_EXTS)
        if found is None:
            return None
        (keys, texts, layout), values = found, []
    return src, keys, texts, np.frombuffer(layout, np.int64).reshape(-1, 4), values


def decode_keys(keys: list[str]) -> tuple[list[str], list[int] | None, list[tuple[str, Exception]]]:
    """The utterance ids of the ``keys`` that decode, their places among ``keys`` (None: all of
    them), and each key that does not, with why."""
    if not any("%" in k for k in keys):  # rare; unquoting costs more than the walk
        return keys, None, []
    uttids, kept, bad = [], [], []
    for i, k in enumerate(keys):
        try:
            uttids.append(decode_key(k))
            kept.append(i)
        except UnicodeDecodeError as e:
            bad.append((k, e))
    return uttids, (kept if bad else None), bad


def skip_sample(url: str, key: str, e: Exception, on_error: str) -> None:
    """A sample the readers refuse in a tar that is whole (see the module's doc): a ShardError
    (``on_error="raise"``), else a warning that it alone is left out and the shard read on."""
    if on_error == "raise":
        raise ShardError(f"shard {url}: utterance {uttid_for_message(key)!r}: {e}. Repack the shard, or remove it "
                         f"from the shard list") from None
    warnings.warn(f"shard {url}: utterance {uttid_for_message(key)!r}: {e}; this sample is left out (counted as "
                  f"unreadable) and the rest of the shard read", RuntimeWarning, stacklevel=3)


def iter_decoded(
    url: str,
    *,
    on_error: str = "warn",
    on_corrupt: OnCorrupt | None = None,
    float32: bool = True,
    lazy: bool = False,
    whole: bool = False,
    source: ShardFile | None = None,
    fields: Sequence[str] | None = None,
) -> Iterator[tuple[Any, ...]]:
    """(utterance id, features, transcript) for every sample of a shard, either layout; with
    ``fields`` (names), ``(utterance id, features, transcript, values)``: the sample's fields, None
    where it has no such member.

    Features are arrays in their own memory (``whole=True``: read-only views on the shard's
    bytes).  With ``lazy``, float16/32 features stay in the shard file (a local one, or a pipe's
    or URL's fetched copy) as :class:`FileFeats` until read; with ``float32=False`` float16 stays
    float16.  ``source``: the shard already open (a fetched copy); ``url`` then only names it.

    A sample that cannot be decoded in a tar that is whole is left out alone (a warning, or a
    ShardError with ``on_error="raise"``); damage to the tar itself ends the shard (see the module's
    doc).
    """
    check_on_error(on_error)
    # The plain shards our writer makes in one C call per shard.
    found = native_samples(url, source, fields or ()) if lazy and not whole else None
    if found is not None:
        src, keys, texts, layout, values = found
        uttids, kept, bad = decode_keys(keys)
        for key, e in bad:
            skip_sample(url, key, e, on_error)
        rows = list(zip(*values)) if fields else []
        for uttid, i in zip(uttids, kept if kept is not None else range(len(keys))):
            offset, frames, dims, itemsize = layout[i].tolist()
            feats = FileFeats(src, offset, (frames, dims), _ITEMSIZE_DTYPES[itemsize], keys[i])
            yield (uttid, feats, texts[i], rows[i]) if fields is not None else (uttid, feats, texts[i])
        return
    samples = shard_samples(url, on_error=on_error, on_corrupt=on_corrupt, whole=whole, source=source)
    for src, key, group in samples:
        try:
            decoded = decode_sample(src, key, group, float32=float32, lazy=lazy)
            if fields is not None:
                decoded = (*decoded, decode_fields(src, group, fields))
        except ValueError as e:  # a sample refused in a whole tar: the index counts it lost (unreadable); read on
            skip_sample(url, key, e, on_error)
            continue
        yield decoded
