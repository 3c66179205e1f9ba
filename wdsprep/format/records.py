"""Utterances as columns, and a shard read into them: what flows through the loader's stages.

A :class:`Records` block holds n utterances in two numpy arrays, numbers and objects, instead of n
Python objects.  The stages (shuffle, tokenize, filter, bucket, collate) move and select whole
blocks with a few numpy calls each: one object per utterance, made, passed through five
generators and sorted, cost the loader ~6 us per utterance, more than the C walk and
SentencePiece together.  Selecting 256 rows of a block costs ~5 us.

A row's features are either still in their shard (``sources[i]`` is the
:class:`~wdsprep.format.shardfile.ShardFile`, ``offsets[i]`` where the data starts, read by the collate
straight into the batch) or an array in memory (shards from pipes and URLs; ``offsets[i] == -1``),
or yet to be made from audio (an audio shard's row: ``sources[i]`` is its
:class:`~wdsprep.format.audio.FileAudio`, ``offsets[i] == AUDIO``, ``dims`` 0 until the features
stage, ``loading/features.py``, puts them in memory).  ``rows`` is each row's place in the
loader's shard set, which the augmentation draws are keyed by.  ``values`` are a row's fields (the
loader's ``fields=``, in that order: read from their members with the row), ``field_labels`` the
token ids of those tokenized (``text_fields=``), ``langs`` its language (from the index); a row's
columns move with it, so a batch never holds another utterance's field.

:func:`iter_records` reads a shard into blocks: a plain local shard takes one C call (the walk,
grouped into samples, with the ``.npy`` headers and transcripts decoded) and no Python step per
sample; anything else goes through the format's Python reader, with the same samples and the same
damage handling.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from wdsprep.format.audio import FileAudio
from wdsprep.format.samples import (
    OnCorrupt,
    check_on_error,
    decode_keys,
    iter_decoded,
    native_samples,
    skip_sample,
)
from wdsprep.format.shardfile import FileFeats, ShardFile
from wdsprep.units import fbank_frames

# Columns of ``num`` (int64; the first four in the order the C walk returns them) and of ``obj`` (object).
_OFFSET, _FRAMES, _DIMS, _ITEMSIZE, _LABEL_LEN, _CORPUS, _ROW, _EPOCH = range(8)
_UTTID, _TEXT, _SOURCE, _LABELS, _VALUES, _FIELD_LABELS, _LANG = range(7)
IN_MEMORY = -1  # the offset of features that are an array in ``sources``
AUDIO = -2  # the offset of a row whose features are still to be made from its FileAudio in ``sources``


def _column(array: str, index: int, doc: str) -> property:
    """A read-only property: column ``index`` of ``self.num`` or ``self.obj`` (a view)."""
    return property(lambda self: getattr(self, array)[:, index], doc=doc)


class Records:
    """A block of utterances: ``num`` int64 [n, 8] and ``obj`` object [n, 7] (see the columns below).

    Indexing with a slice, an index array or a boolean mask gives the selected rows as a new
    block (numpy semantics: a slice is a view).  Blocks passed between stages are not changed in
    place: :meth:`with_labels` returns a new one; only the shuffle buffer's own copy is
    overwritten (:meth:`put`).
    """

    __slots__ = ("num", "obj")

    def __init__(self, num: np.ndarray, obj: np.ndarray) -> None:
        self.num = num
        self.obj = obj

    @classmethod
    def empty(cls, n: int = 0) -> Records:
        """``n`` rows of zeros, no labels (``()``) and None for the rest."""
        r = cls(np.zeros((n, 8), np.int64), np.full((n, 7), None, object))
        r.obj[:, _LABELS].fill(())
        return r

    @classmethod
    def in_shard(cls, file: Any, uttids: Sequence[str], texts: Sequence[str], layout: np.ndarray,
                 values: Sequence[Sequence[str | None]] = ()) -> Records:
        """Rows whose features are in ``file``; ``layout`` int64 [n, 4]: offset, frames, dims, item size;
        ``values``: per field, each row's value."""
        n = len(uttids)
        r = cls.empty(n)
        r.num[:, :_LABEL_LEN] = layout
        r.obj[:, _UTTID] = uttids
        r.obj[:, _TEXT] = texts
        r.obj[:, _SOURCE].fill(file)  # fill, not assignment: numpy would take a ShardFile for a sequence
        if values:
            r.obj[:, _VALUES] = _tuples(list(zip(*(v[:n] for v in values))), n)
        return r

    @classmethod
    def of(cls, samples: Iterable[tuple[Any, ...]]) -> Records:
        """A block from ``(uttid, features, text)`` triples (or ``(uttid, features, text, values)``:
        the row's fields); features an array, a :class:`~wdsprep.format.shardfile.FileFeats` (stays
        in its shard) or a :class:`~wdsprep.format.audio.FileAudio` (an audio shard's).  One Python
        step per row: for the Python reader's path and for tests, not for the hot path."""
        rows = list(samples)
        r = cls.empty(len(rows))
        if rows and len(rows[0]) > 3:
            r.obj[:, _VALUES] = _tuples([tuple(row[3]) for row in rows], len(rows))
        for i, (uttid, feats, text, *_) in enumerate(rows):
            if type(feats) is FileAudio:
                h = feats.header
                r.num[i, :_LABEL_LEN] = (AUDIO, fbank_frames(h.samples, h.sample_rate), 0, 0)
                r.obj[i, _UTTID], r.obj[i, _TEXT], r.obj[i, _SOURCE] = uttid, text, feats
                continue
            if len(feats.shape) != 2:
                raise ValueError(f"utterance {uttid!r}: features must be 2-D (frames, dims), got shape {feats.shape}")
            on_disk = type(feats) is FileFeats
            r.num[i, :_LABEL_LEN] = (feats.offset if on_disk else IN_MEMORY, *feats.shape, feats.dtype.itemsize)
            r.obj[i, _UTTID] = uttid
            r.obj[i, _TEXT] = text
            r.obj[i, _SOURCE] = feats.file if on_disk else feats  # one cell: numpy stores the array itself
        return r

    @staticmethod
    def concat(blocks: Sequence[Records]) -> Records:
        if len(blocks) == 1:
            return blocks[0]
        return Records(np.concatenate([b.num for b in blocks]), np.concatenate([b.obj for b in blocks]))

    def __len__(self) -> int:
        return len(self.num)

    def __getitem__(self, rows: slice | np.ndarray) -> Records:
        return Records(self.num[rows], self.obj[rows])

    def put(self, rows: np.ndarray, other: Records) -> None:
        """Overwrite ``rows`` of this block with ``other``'s rows, in place (the shuffle buffer's)."""
        self.num[rows] = other.num
        self.obj[rows] = other.obj

    def in_corpus(self, corpus: int) -> Records:
        """These rows, marked in place as utterances of corpus ``corpus`` (its index in the loader's
        corpora): for a block just read, before it is passed on."""
        self.num[:, _CORPUS] = corpus
        return self

    def from_plan(self, corpora: np.ndarray | None, epochs: np.ndarray) -> Records:
        """These rows, marked in place with what the plan says of each: its corpus (None: as read,
        its shard's) and that corpus's epoch."""
        if corpora is not None:
            self.num[:, _CORPUS] = corpora
        self.num[:, _EPOCH] = epochs
        return self

    def at_rows(self, first: int) -> Records:
        """These rows, numbered in place from ``first`` (a shard's first row in the loader's shard set)."""
        self.num[:, _ROW] = np.arange(first, first + len(self), dtype=np.int64)
        return self

    def with_labels(self, labels: Sequence[Sequence[int]],
                    field_labels: Sequence[Sequence[Sequence[int]]] | None = None,
                    langs: Sequence[str] | None = None) -> Records:
        """A copy with these token ids (kept as tuples: the cyclic GC stops tracking a tuple of ints);
        ``field_labels``: per text field, each row's ids; ``langs``: each row's language."""
        out = Records(self.num.copy(), self.obj.copy())
        n = len(self)
        out.obj[:, _LABELS] = np.fromiter(map(tuple, labels), object, n)
        out.num[:, _LABEL_LEN] = np.fromiter(map(len, labels), np.int64, n)
        if field_labels:
            out.obj[:, _FIELD_LABELS] = _tuples([tuple(map(tuple, row)) for row in zip(*field_labels)], n)
        if langs is not None:
            out.obj[:, _LANG] = _tuples(list(langs), n)
        return out


    frames = _column("num", _FRAMES, "Frames of each row's features.")
    dims = _column("num", _DIMS, "Feature dimensions of each row.")
    offsets = _column("num", _OFFSET, "Byte offset of each row's features in its shard, or IN_MEMORY.")
    itemsizes = _column("num", _ITEMSIZE, "Bytes per feature value: 4 float32, 2 float16 (8 for float64 in memory).")
    label_lens = _column("num", _LABEL_LEN, "Tokens in each row's labels.")
    corpora = _column("num", _CORPUS, "Each row's corpus: its index in the loader's corpora (0 with one).")
    rows = _column("num", _ROW, "Each row's place in the loader's shard set.")
    epochs = _column("num", _EPOCH, "Each row's corpus epoch, as the plan set it: what its augmentation is drawn by.")
    uttids = _column("obj", _UTTID, "Utterance ids.")
    texts = _column("obj", _TEXT, "Transcripts.")
    sources = _column("obj", _SOURCE, "Each row's ShardFile (features on disk) or features array (in memory).")
    labels = _column("obj", _LABELS, "Each row's token ids (a tuple; () before tokenizing).")
    values = _column("obj", _VALUES, "Each row's fields' values (a tuple, in the loader's fields order; None: none).")
    field_labels = _column("obj", _FIELD_LABELS, "Each row's text fields' token ids (a tuple of tuples; None: none).")
    langs = _column("obj", _LANG, "Each row's language (None: the shards' index has none).")


def _tuples(items: list[Any], n: int) -> np.ndarray:
    """A 1-D object array of ``items`` as they are (numpy would make a 2-D array of equal-length tuples)."""
    return np.fromiter(items, object, n)


def iter_records(url: str, *, on_error: str = "warn", on_corrupt: OnCorrupt | None = None,
                 block: int = 256, source: ShardFile | None = None, fields: Sequence[str] = ()) -> Iterator[Records]:
    """A shard's samples as :class:`Records` of up to ``block`` rows each: what
    ``iter_decoded(url, lazy=True, float32=False)`` yields (same order, same damage handling), as
    columns.  ``source``: the shard already fetched (a pipe's or URL's copy); ``fields``: the
    fields read with each row (its ``values``)."""
    check_on_error(on_error)
    found = native_samples(url, source, fields)
    if found is not None:
        src, keys, texts, layout, values = found
        uttids, kept, bad = decode_keys(keys)
        for key, e in bad:  # left out alone, as the index scan leaves them out
            skip_sample(url, key, e, on_error)
        if kept is not None:
            texts, layout = [texts[i] for i in kept], layout[kept]
            values = [[v[i] for i in kept] for v in values]
        rows = Records.in_shard(src, uttids, texts, layout, values)
        for start in range(0, len(uttids), block):
            yield rows[start:start + block]
        return
    samples = iter_decoded(url, on_error=on_error, on_corrupt=on_corrupt, float32=False, lazy=True, source=source,
                           fields=list(fields) if fields else None)
    while chunk := list(itertools.islice(samples, block)):
        yield Records.of(chunk)
