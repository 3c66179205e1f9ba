"""Batches: padding a batch's utterances into one buffer, and the layout of that buffer, defined once.

A collated batch is one flat byte buffer (:class:`Packed`): lens, label_lens (int64 [B]), labels
(int64 [B, U]), then feats (float32 [B, T, D]).  :class:`BatchLayout` says where each part sits;
the collate writes through it and :meth:`BatchLayout.batch` hands the trainer a :class:`Batch`
of four tensors that are views on the buffer (no copy).  What a batch carries besides (each
utterance's language and fields, :class:`SampleFields`) travels beside the buffer, small.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from wdsprep.format.records import IN_MEMORY, Records
from wdsprep.format.shardfile import ShardError, bulk_reads

LABEL_PAD = 0  # labels are padded with 0 (<s>/blank), like CAT's collate; use label_lens to mask


class _BatchFields(NamedTuple):
    feats: torch.Tensor
    feat_lens: torch.Tensor
    labels: torch.Tensor
    label_lens: torch.Tensor
    keys: list[str]


class Batch(_BatchFields):
    """One rank's batch.  The first four unpack like CAT's collate: ``xs, x_lens, ys, y_lens = batch[:4]``.

    ``feats`` float32 [B, T, D], zero-padded; ``feat_lens`` int64 [B]; ``labels`` int64 [B, U]
    padded with :data:`LABEL_PAD` (0); ``label_lens`` int64 [B]; ``keys`` the utterance ids.
    Utterances are sorted by length, longest first (what ``pack_padded_sequence`` wants).

    ``corpus`` int64 [B]: each utterance's corpus, an index into ``loader.corpora`` (all 0 with
    one corpus).  An attribute, not a sixth field, so a batch still unpacks into five.

    What the samples carry besides (``pack --utt2lang``, ``--field``), in the batch's order, as
    attributes: ``lang``, each utterance's language (a list of str; None when the shards' index has
    no language); ``fields[NAME]``, each utterance's value of the fields the loader delivers
    (``fields=``, and ``text_fields=``: a list of str); ``field_tokens[NAME]`` int64 [B, U_NAME],
    padded with :data:`LABEL_PAD`, and ``field_lens[NAME]`` int64 [B], those of ``text_fields``
    tokenized as the labels are (the utterance's tokenizer, language and text treatment).

    With ``features="waveform"`` (audio shards): ``audio`` float32 [B, S], each utterance's
    augmented waveform zero-padded, and ``audio_lens`` int64 [B] its samples, rows in the order of
    ``keys``; ``feats`` is then empty ([B, T, 0]) and ``feat_lens`` the frames fbank of ``audio``
    gives (what the plan counted).  Otherwise both are None.
    """

    corpus: torch.Tensor
    audio: torch.Tensor | None
    audio_lens: torch.Tensor | None
    lang: list[str] | None
    fields: dict[str, list[str]]
    field_tokens: dict[str, torch.Tensor]
    field_lens: dict[str, torch.Tensor]

    def __new__(cls, feats: torch.Tensor, feat_lens: torch.Tensor, labels: torch.Tensor, label_lens: torch.Tensor,
                keys: list[str], corpus: torch.Tensor | None = None, extras: SampleFields | None = None,
                audio: torch.Tensor | None = None, audio_lens: torch.Tensor | None = None) -> Batch:
        self = super().__new__(cls, feats, feat_lens, labels, label_lens, keys)
        self.corpus = torch.zeros(len(keys), dtype=torch.int64) if corpus is None else corpus
        self.audio, self.audio_lens = audio, audio_lens
        x = extras or SampleFields()
        self.lang, self.fields = x.lang, x.fields
        self.field_tokens = {k: torch.from_numpy(v) for k, v in x.field_tokens.items()}
        self.field_lens = {k: torch.from_numpy(v) for k, v in x.field_lens.items()}
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The batch on ``device``, ``corpus`` too.  Trainers move a batch by its ``to`` when it has one
        (Lightning, accelerate); rebuilt field by field as a tuple, it would lose ``corpus``."""
        return Batch(self.feats.to(device, non_blocking=non_blocking),
                     self.feat_lens.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking),
                     self.label_lens.to(device, non_blocking=non_blocking), self.keys,
                     self.corpus.to(device, non_blocking=non_blocking), None,
                     None if self.audio is None else self.audio.to(device, non_blocking=non_blocking),
                     None if self.audio_lens is None else self.audio_lens.to(device, non_blocking=non_blocking))


@dataclass
class SampleFields:
    """A batch's utterances' language and fields (see :class:`Batch`), numpy and lists, in its order."""

    lang: list[str] | None = None
    fields: dict[str, list[str]] = field(default_factory=dict)
    field_tokens: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [B, U], padded with LABEL_PAD
    field_lens: dict[str, np.ndarray] = field(default_factory=dict)  # int64 [B]

    def rows(self, keep: np.ndarray) -> SampleFields:
        """The rows ``keep`` (an index array) alone; the padded width stays."""
        pick = keep.tolist()
        return SampleFields(None if self.lang is None else [self.lang[i] for i in pick],
                            {k: [v[i] for i in pick] for k, v in self.fields.items()},
                            {k: v[keep] for k, v in self.field_tokens.items()},
                            {k: v[keep] for k, v in self.field_lens.items()})


def sample_fields(batch: Records, names: Sequence[str], text: Sequence[str]) -> SampleFields | None:
    """The language and fields of a batch's rows (``names``: the fields its rows' values hold, in
    order; ``text``: those tokenized too, in order of their token ids); None when there are none."""
    langs = batch.langs.tolist()
    lang = None if all(x is None for x in langs) else langs
    if lang is None and not names:
        return None
    values = batch.values.tolist()
    fields = {name: [v[k] for v in values] for k, name in enumerate(names)}
    tokens, lens = {}, {}
    ids = batch.field_labels.tolist()
    for k, name in enumerate(text):
        rows = [row[k] for row in ids]
        n = np.fromiter(map(len, rows), np.int64, len(rows))
        padded = np.full((len(rows), int(n.max(initial=0))), LABEL_PAD, np.int64)
        padded[np.arange(padded.shape[1]) < n[:, None]] = np.fromiter(itertools.chain.from_iterable(rows), np.int64,
                                                                       int(n.sum()))
        tokens[name], lens[name] = padded, n
    return SampleFields(lang, fields, tokens, lens)


@dataclass(frozen=True)
class BatchLayout:
    """Where the parts of a packed batch of ``n`` utterances (``t`` frames of ``d`` dims, ``u``
    labels at most) sit in its buffer: the int64 parts first, so every part is aligned."""

    n: int
    t: int
    d: int
    u: int

    @property
    def _ends(self) -> tuple[int, int, int, int]:
        n, t, d, u = self.n, self.t, self.d, self.u
        return 8 * n, 16 * n, 16 * n + 8 * n * u, 16 * n + 8 * n * u + 4 * n * t * d

    @property
    def nbytes(self) -> int:
        return self._ends[3]

    def views(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """numpy views (lens, label_lens, labels, feats) on a uint8 buffer: what the collate writes."""
        o1, o2, o3, o4 = self._ends
        return (buf[:o1].view(np.int64), buf[o1:o2].view(np.int64), buf[o2:o3].view(np.int64).reshape(self.n, self.u),
                buf[o3:o4].view(np.float32).reshape(self.n, self.t, self.d))

    def batch(self, buf: torch.Tensor, keys: list[str], corpus: torch.Tensor | None = None,
              extras: SampleFields | None = None, audio: tuple[torch.Tensor, torch.Tensor] | None = None) -> Batch:
        """The :class:`Batch` whose four tensors are views on the uint8 tensor ``buf`` (no copy);
        ``audio``: (audio, audio_lens) of a waveform batch."""
        wave, wave_lens = audio if audio is not None else (None, None)
        if not self.n:  # every utterance of the batch was filtered out: empty tensors of the right ranks
            return Batch(torch.zeros(0, 0, self.d), torch.zeros(0, dtype=torch.int64),
                         torch.zeros(0, 0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), keys, None, extras,
                         wave, wave_lens)
        o1, o2, o3, o4 = self._ends
        return Batch(buf[o3:o4].view(torch.float32).view(self.n, self.t, self.d), buf[:o1].view(torch.int64),
                     buf[o2:o3].view(torch.int64).view(self.n, self.u), buf[o1:o2].view(torch.int64), keys, corpus,
                     extras, wave, wave_lens)


class Packed(NamedTuple):
    """A collated batch as one flat byte buffer plus its shape: what a worker sends.

    A :class:`Batch` has four tensors; sent from a worker, each would cost its own file
    descriptor hand-over.  All four are views on ``buf``, so one hand-over carries the batch.
    A pooled slot's buffer is sent only on the slot's first use per epoch; after that ``buf`` is
    None and the main process reads the slot's memory through the handle it kept (see ShmPool).
    """

    buf: torch.Tensor | None  # uint8, laid out as BatchLayout(*shape) says
    shape: tuple[int, int, int, int]  # B, T, D, U
    keys: list[str]
    slot: int = -1  # the worker's pool slot holding ``buf`` (-1: not pooled); see ShmPool
    gen: int = 0  # the slot buffer's generation: bumped whenever the worker replaces the buffer
    nonfinite: int = 0  # utterances left out: their features held a NaN or an infinity
    corpus: np.ndarray | None = None  # int64 [B]: each utterance's corpus (None: all corpus 0)
    extras: SampleFields | None = None  # each utterance's language and fields (None: none)
    audio: torch.Tensor | None = None  # float32 [B, S]: features="waveform"'s padded waveforms (None: fbank)
    audio_lens: torch.Tensor | None = None  # int64 [B]: their samples

    @property
    def layout(self) -> BatchLayout:
        return BatchLayout(*self.shape)


def unpack(p: Packed) -> Batch:
    """The :class:`Batch` of a packed batch (views on its buffer)."""
    return p.layout.batch(p.buf, p.keys, None if p.corpus is None else torch.from_numpy(p.corpus), p.extras,
                          None if p.audio is None else (p.audio, p.audio_lens))


def alloc_buffer(nbytes: int, shared: bool) -> torch.Tensor:
    """An uninitialized uint8 buffer; ``shared``: in shared memory from the start.

    DataLoader workers send tensors through shared memory and copy every tensor that is not
    already there; allocating the batch there directly makes sending it a handle, not a copy.
    ``_new_shared`` is what torch's own ``default_collate`` uses in workers for the same reason.
    """
    if shared:
        storage = torch.UntypedStorage._new_shared(max(1, nbytes))
        return torch.empty(0, dtype=torch.uint8).set_(storage)[:nbytes]
    return torch.empty(nbytes, dtype=torch.uint8)


def collate(batch: Records, *, shared: bool = False,
            alloc: Callable[[int], tuple[torch.Tensor, int]] | None = None, dims: int | None = None,
            fields: Sequence[str] = (), text_fields: Sequence[str] = ()) -> Packed:
    """Pad into one uninitialized buffer (one copy per utterance; float16 becomes float32 here).

    Features still in their shard are read straight into their row, in one C call for the batch
    (:class:`~wdsprep.format.shardfile.RowReads`): for float32 the only copy of those bytes; float16 rows
    are converted on the way.  Only the padding is zeroed: ``np.zeros``
    wrote every byte twice.  Every byte of the returned view is written, so a recycled ``alloc``
    buffer never leaks old data.
    """
    return start_collate(batch, shared=shared, alloc=alloc, dims=dims, fields=fields, text_fields=text_fields)()


def start_collate(batch: Records, *, shared: bool = False,
                  alloc: Callable[[int], tuple[torch.Tensor, int]] | None = None,
                  reader: Any = None, dims: int | None = None, on_error: str = "warn",
                  fields: Sequence[str] = (), text_fields: Sequence[str] = (),
                  waveform: bool = False) -> Callable[[], Packed]:
    """:func:`collate` in two halves: all but the bulk feature read now, that read on ``reader``'s
    thread (a :func:`~wdsprep.format.shardfile.row_reader`) while the caller goes on; calling the result
    waits for it and returns the :class:`Packed`.  The read is ~half a worker's time, so the
    stages of the next batches overlap it.  ``dims`` shapes an empty batch (every utterance of it
    was filtered out): feats [0, 0, dims].

    Features with a NaN or an infinity never reach the trainer: the row is checked as it is read
    (in C, while in the CPU cache), and such an utterance leaves the batch, counted in
    ``Packed.nonfinite`` (``on_error="raise"``: a ShardError naming it).  ``fields``: the fields
    the rows' values hold, in order; ``text_fields``: those of them tokenized (:func:`sample_fields`).
    ``waveform``: the rows are 1-D waveforms of dims 0 (``features="waveform"``), padded into
    ``Packed.audio``; there are no features to read (feats [B, T, 0]).
    """
    batch = batch[np.argsort(-batch.frames, kind="stable")]  # longest first; ties keep their order
    n = len(batch)
    lens, label_lens, row_dims = batch.frames, batch.label_lens, batch.dims
    uttids = batch.uttids.tolist()
    corpus = batch.corpora.copy() if batch.corpora.any() else None  # None: all corpus 0, nothing to send
    extras = sample_fields(batch, fields, text_fields)
    d = int(row_dims[0]) if n else int(dims or 0)
    if (row_dims != d).any():
        i = int(np.flatnonzero(row_dims != d)[0])
        raise ValueError(f"utterance {uttids[i]!r} has {row_dims[i]} feature dims, {uttids[0]!r} in the same "
                         f"batch has {d}: mixed feature sets in trset?")
    layout = BatchLayout(n, int(lens[0]) if n else 0, d, int(label_lens.max(initial=0)))
    buf, slot = alloc(layout.nbytes) if alloc is not None else (alloc_buffer(layout.nbytes, shared), -1)
    v_lens, v_label_lens, v_labels, v_feats = layout.views(buf.numpy())
    v_lens[:] = lens
    v_label_lens[:] = label_lens
    # Labels in one go: the row-major True cells of the mask are exactly the concatenated labels.
    v_labels[...] = LABEL_PAD
    v_labels[np.arange(layout.u) < label_lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(batch.labels), np.int64, int(label_lens.sum()))
    offsets, itemsizes, sources = batch.offsets, batch.itemsizes, batch.sources.tolist()
    # The common case, features of one dtype still in the shards, in one C call (float16 is
    # converted there, in the same thread: torch's conversion, parallel on every core, left its
    # threads spinning on the core the read needed).
    reads = None
    waveform = waveform and bool(n)
    waves = _pad_waves(sources, shared) if waveform else None
    if not waveform and n and (offsets != IN_MEMORY).all() and (itemsizes == itemsizes[0]).all():
        reads = bulk_reads(sources, offsets, lens * d * itemsizes, int(itemsizes[0]))
    if reads is not None:
        reads.start(v_feats, reader)

    def finish() -> Packed:
        done = reads.wait() if reads is not None else 0
        bad = list(np.flatnonzero(reads.bad[:done])) if reads is not None else []
        if waves is not None:
            done, bad = n, [i for i in range(n) if not np.isfinite(sources[i]).all()]
        # Whatever the bulk read left, row by row (which raises the error naming a row that
        # cannot be read).
        with warnings.catch_warnings():
            # from_numpy warns that a read-only array (a view on an in-memory pipe/URL shard) is not
            # writable; the tensor is only ever read here.
            warnings.simplefilter("ignore", UserWarning)
            t_feats = torch.from_numpy(v_feats)
            for i in range(done, n):
                k = int(lens[i])
                row = v_feats[i, :k]
                if offsets[i] == IN_MEMORY:
                    feats = sources[i]
                else:  # float32 straight into the batch
                    feats = row if itemsizes[i] == 4 else np.empty((k, d), np.float16)
                    sources[i].readinto(feats, int(offsets[i]), f"utterance {uttids[i]!r}")
                if feats is not row:
                    if feats.dtype == np.float32:
                        row[...] = feats  # numpy's call overhead is lower than torch's for a plain copy
                    else:
                        # numpy converts float16 element by element (~10x slower than the copy); torch's
                        # conversion is vectorized, and writes straight into the batch.
                        t_feats[i, :k].copy_(torch.from_numpy(feats))
                v_feats[i, k:] = 0
                if not np.isfinite(row).all():
                    bad.append(i)
        audio, audio_lens = waves if waves is not None else (None, None)
        if not bad:
            return Packed(buf, (layout.n, layout.t, layout.d, layout.u), uttids, slot, corpus=corpus, extras=extras,
                          audio=audio, audio_lens=audio_lens)
        bad = sorted(bad)
        where = f"utterance {uttids[bad[0]]!r} of {getattr(sources[bad[0]], 'url', 'an in-memory shard')}"
        more = f" and {len(bad) - 1} more of its batch" if len(bad) > 1 else ""
        msg = f"NaN or infinite features in {where}{more}"
        if on_error == "raise":
            raise ShardError(f"{msg}: fix the features and repack (verify names every such utterance)")
        warnings.warn(f"{msg}: left out of the batch (counted as nonfinite_features). Fix the features and repack; "
                      f"verify names every such utterance", RuntimeWarning, stacklevel=2)
        out = _without(buf, layout, uttids, slot, bad, corpus, extras)
        if audio is None or audio_lens is None:
            return out
        keep = torch.from_numpy(np.setdiff1d(np.arange(n), bad))
        return out._replace(audio=audio[keep], audio_lens=audio_lens[keep])

    return finish


def _pad_waves(waves: list[np.ndarray], shared: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Waveforms (1-D float32, longest first) zero-padded into audio float32 [B, S] and their lengths
    int64 [B]; in shared memory when ``shared`` (a worker sends a handle, not a copy)."""
    lens = np.fromiter(map(len, waves), np.int64, len(waves))
    s = int(lens.max(initial=0))
    audio = alloc_buffer(4 * len(waves) * s, shared).view(torch.float32).view(len(waves), s)
    out = audio.numpy()
    for i, w in enumerate(waves):
        out[i, :len(w)] = w
        out[i, len(w):] = 0
    return audio, torch.from_numpy(lens)


def _without(buf: torch.Tensor, layout: BatchLayout, keys: list[str], slot: int, drop: list[int],
             corpus: np.ndarray | None, extras: SampleFields | None = None) -> Packed:
    """The packed batch less rows ``drop``, compacted in its own buffer (the padded length stays)."""
    keep = np.setdiff1d(np.arange(layout.n), drop)
    small = BatchLayout(len(keep), layout.t, layout.d, layout.u)
    old, new = layout.views(buf.numpy()), small.views(buf.numpy())
    # Small parts copied out first: the new layout starts lower in the same buffer.
    lens, label_lens, labels = old[0][keep].copy(), old[1][keep].copy(), old[2][keep].copy()
    for i, k in enumerate(keep.tolist()):  # ascending: each row moves down, never onto a row still to move
        new[3][i] = old[3][k]
    new[0][:], new[1][:], new[2][:] = lens, label_lens, labels
    return Packed(buf, (small.n, small.t, small.d, small.u), [keys[k] for k in keep], slot, nonfinite=len(drop),
                  corpus=None if corpus is None else corpus[keep], extras=None if extras is None else extras.rows(keep))
