"""Sample keys and member names: how an utterance id and a layout become tar member names, and back.

A shard is a plain POSIX tar; one sample is the pair of members that share a key:

============  ======================  ==========================
layout        features (or audio)     transcript
============  ======================  ==========================
``cat``       ``<key>.npy``           ``<key>.txt``
``cat-v3``    ``<key>.mat.npy``       ``<key>.label.txt``
``flac``      ``<key>.flac``          ``<key>.txt``
``wav``       ``<key>.wav``           ``<key>.txt``
``opus``      ``<key>.opus``          ``<key>.txt``
============  ======================  ==========================

The audio layouts hold audio (1 to 8 channels) instead of features (``audio.py``: 16-bit FLAC or WAV, or Ogg
Opus); the loader computes the features while training.

A sample may carry fields besides (``pack --utt2lang``, ``--field NAME=FILE``): each one member
``<key>.NAME`` holding its value as UTF-8 text, the language under the name ``lang``
(:data:`LANG`).  One extension without a dot, so ``webdataset.WebDataset`` (the key ends at the
first dot), WeNet (at the last) and wdsprep all give the sample a field ``NAME``; a field name is
checked by :func:`check_field_name`: never a layout's member, nor an extension webdataset's
``.decode()`` would turn into something other than bytes (``json``, ``cls``, ``pyd``, ...).

The one member-name rule (:func:`split_member`): a member's key is its name without the longest
layout suffix it ends with.  So keys with dots, such as the speed-perturbed ids
``sp0.9-spk00-utt0003`` that CAT and webdataset write unencoded (and then cannot read back: a
webdataset key ends at the first dot), are read whole.  Only a name with no layout suffix falls
back to webdataset's rule.  wdsprep itself writes keys percent-encoded (:func:`encode_key`), which
every reader can split.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

LAYOUTS: dict[str, tuple[str, str]] = {
    "cat": ("npy", "txt"),
    "cat-v3": ("mat.npy", "label.txt"),
    "flac": ("flac", "txt"),
    "wav": ("wav", "txt"),
    "opus": ("opus", "txt"),
}
AUDIO_LAYOUTS = ("flac", "wav", "opus")  # each named by the audio format of its first member (format/audio.py)
FEATURE_LAYOUTS = tuple(k for k in LAYOUTS if k not in AUDIO_LAYOUTS)
ROLES = ("feats", "text")  # "feats": the member the features are (or, in an audio layout, come from)

# (".ext", layout, role), longest first: "x.mat.npy" is cat-v3's "x" + ".mat.npy", not cat's "x.mat" + ".npy".
SUFFIXES: list[tuple[str, str, str]] = sorted(
    ((f".{ext}", layout, role) for layout, exts in LAYOUTS.items() for ext, role in zip(exts, ROLES)),
    key=lambda t: -len(t[0]),
)

# Bytes that survive as themselves in a key; everything else is percent-encoded.  '.' must go
# (webdataset ends a key at the first dot of a member name), and so must '/' and '%'.
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


# The language of an utterance: a field of this name, always a column of the index.
LANG = "lang"
FIELD_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Names a field may not take: the layouts' member extensions (and their parts), and what
# webdataset's decoders act on by extension (text, numbers, JSON, pickles, tensors, images, audio,
# video), so its .decode() hands every field over as the bytes wdsprep wrote.
RESERVED_FIELDS = frozenset({
    *(part for exts in LAYOUTS.values() for ext in exts for part in ext.split(".")),
    "txt", "text", "transcript", "cls", "cls2", "class", "count", "index", "inx", "id", "json", "jsn", "pkl",
    "pickle", "pyd", "pth", "ten", "tb", "tenbin", "mp", "msg", "msgpack", "npy", "npz", "cbor",
    "jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "gif", "bmp", "tif", "tiff", "webp",
    "mp3", "sox", "m4a", "ogg", "wma", "mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv",
    "key", "url",
})


def check_field_name(name: str) -> str:
    """``name`` when it can name a field of a sample (:data:`FIELD_NAME`, not :data:`RESERVED_FIELDS`);
    else a ValueError saying why."""
    if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
        raise ValueError(f"field name {name!r}: use 1-32 lowercase letters, digits and '_', starting with a letter "
                         f"(it becomes the member extension KEY.{name})")
    if name in RESERVED_FIELDS:
        raise ValueError(f"field name {name!r} is taken: a shard layout or webdataset's decoder reads members of "
                         f"that extension; pick another (e.g. {name}_field)")
    return name


def is_field_member(ext: str) -> bool:
    """Whether a member extension (:func:`split_member`'s) is a field's: a valid field name."""
    return FIELD_NAME.fullmatch(ext) is not None and ext not in RESERVED_FIELDS


MAX_NAME_CHARS = 1024  # an utterance id, a speaker or a language: a name, not a document


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an utterance id, a speaker or a language in a pack (None: it can): the
    rule of Kaldi's tables, which the index's files follow (one name a line, names apart by
    whitespace): not empty, no whitespace and no control characters (a newline, a NUL), at most
    :data:`MAX_NAME_CHARS` characters."""
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"has {len(name):,} characters, more than {MAX_NAME_CHARS:,}"
    if name.isprintable() and " " not in name:  # in C: no whitespace (but " ") nor control character is printable
        return None
    bad = next((c for c in name if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        return f"holds {bad!r}: a name has no whitespace or control characters (as in Kaldi's tables)"
    return None


def encode_key(uttid: str) -> str:
    """Make an utterance id safe as a tar sample key; ``urllib.parse.unquote`` inverts it.

    Percent-encoding is injective (``%`` itself is encoded), so two ids never share a key.
    """
    return "".join(chr(b) if b in _KEY_SAFE else f"%{b:02X}" for b in uttid.encode("utf-8"))


def decode_key(key: str) -> str:
    """The utterance id a key was made from; UnicodeDecodeError when it was not made by :func:`encode_key`."""
    return unquote(key, errors="strict") if "%" in key else key


def uttid_for_message(key: str | None) -> str | None:
    """The utterance id to name in a message; the raw key when it does not decode."""
    try:
        return decode_key(key) if key else key
    except UnicodeDecodeError:
        return key


def describe_layouts() -> str:
    """Every layout's members, for messages: ``KEY.npy + KEY.txt (cat), ...``."""
    return ", ".join(f"KEY.{f} + KEY.{t} ({name})" for name, (f, t) in LAYOUTS.items())


def layout_exts(layout: str) -> tuple[str, str]:
    """(features extension, transcript extension) of a layout, or a clear error."""
    try:
        return LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown shard layout {layout!r}; choose one of {sorted(LAYOUTS)}") from None


def member_role(name: str) -> tuple[str, str, str] | None:
    """``(key, layout, role)`` of a member name by its layout suffix; None when it has none."""
    for suffix, layout, role in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix) and name[-len(suffix) - 1] != "/":
            return name[: -len(suffix)], layout, role
    return None


def member_layouts(name: str) -> list[str]:
    """Every layout member ``name`` can belong to by its suffix (the longest it ends with): a
    transcript ``KEY.txt`` is one of ``cat``'s and of the audio layouts'; empty when none."""
    known = member_role(name)
    if known is None:
        return []
    suffix = name[len(known[0]):]
    return [layout for s, layout, _ in SUFFIXES if s == suffix]


def split_member(name: str) -> tuple[str, str]:
    """(key, extension) of a member name: by its layout suffix, else where webdataset splits it
    (the key ends at the first dot of the base name)."""
    known = member_role(name)
    if known is not None:
        key = known[0]
        return key, name[len(key) + 1:]
    dirname, _, base = name.rpartition("/")
    key, _, ext = base.partition(".")
    return (f"{dirname}/{key}" if dirname else key), ext


# A Kaldi speed-perturbation prefix (``sp0.9-``, ``sp1.1-``): the same speaker, slowed or sped up.
_SPEED_PREFIX = re.compile(r"sp\d+(?:\.\d+)?-")


def speaker_of(uttid: str) -> str:
    """The speaker an utterance id names by the Kaldi convention: the id up to its first ``-``,
    after a speed-perturbation prefix (``sp0.9-``, ``sp1.1-``) is stripped.

    ``spk01-utt3``, ``sp0.9-spk01-utt3`` -> ``spk01``; LibriSpeech's ``103-1240-0000`` -> ``103``;
    an id without ``-`` is a speaker of its own.  Used where no ``utt2spk`` was given at pack time;
    ids that do not start with their speaker (e.g. AISHELL's ``BAC009S0002W0122``) need ``utt2spk``.
    """
    m = _SPEED_PREFIX.match(uttid)
    rest = uttid[m.end():] if m and m.end() < len(uttid) else uttid
    return rest.split("-", 1)[0] or rest
