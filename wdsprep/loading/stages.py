"""The loader's run-time stages: plain generator functions from planned batches to labelled rows.

The epoch plan (``wdsprep/plan/``) decided every batch; these stages read them.  Each takes an iterator
of ``(batch id, rows)`` pairs, ``rows`` a :class:`~wdsprep.format.records.Records` block held as
columns, and yields them on.  They are composed in one place, ``ReaderStream.stages``
(``stream.py``).  numpy only: no torch here, so they run and test anywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from wdsprep.format.records import Records, iter_records
from wdsprep.format.samples import report_damage
from wdsprep.format.shardfile import ShardError
from wdsprep.loading.readahead import ShardFetcher
from wdsprep.plan.options import FetchOptions
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.stats import WorkerTally
from wdsprep.plan.streams import BatchId, Planned
from wdsprep.plan.transforms import Transforms
from wdsprep.remote.fetch import ChangedError, FetchError
from wdsprep.remote.urls import redact
from wdsprep.tokenizer import UNK_ID, SubwordSampling, Tokenizer

Rows = tuple[BatchId, Records]
# A planned batch's rows' corpora (None: their shards') and corpus epochs.
Origins = Callable[[BatchId], tuple['np.ndarray | None', np.ndarray]]


class _Shard:
    """A shard read for the batches that need it: its rows, and why any planned row is missing."""

    __slots__ = ("rows", "missing")

    def __init__(self, rows: Records, missing: str) -> None:
        self.rows, self.missing = rows, missing


def read_batches(windows: Iterable[Sequence[Planned]], shards: ShardSet, *, label: Callable[[int, Records], Records],
                 on_error: str, counts: WorkerTally, block: int, fetch: FetchOptions | None = None,
                 fields: Sequence[str] = (), origins: Origins | None = None) -> Iterator[Rows]:
    """Each planned batch's rows, read from the shards (with their ``fields``) and labelled; rows a
    shard does not deliver are left out of their batch and counted.  ``origins(bid)``: per planned
    row, its corpus (None: its shard's) and corpus epoch, marked on the rows (default: the batch
    id's epoch).

    The batches come a window at a time (an epoch source deals a long epoch in windows).  Every
    shard they need is read once, when the first batch needs it (the next ones
    fetched meanwhile, in the order the batches need them: ``loading/readahead.py``), labelled whole by
    ``label(shard, rows)``, and let go after the last batch that needs it.  The next window is
    looked at before the current one is read, so a shard used on both sides of a boundary is read
    once and fetched ahead across it.
    """
    fetcher = ShardFetcher(shards.urls, shards.sizes, [], fetch or FetchOptions(), shards.checksums)
    waiting: dict[int, int] = {}  # shard -> planned rows of it not yet gathered, in the windows seen
    loaded: dict[int, _Shard] = {}

    def seen(planned: Sequence[Planned]) -> list[np.ndarray]:
        owners = [shards.shard_of(rows) for _, rows in planned]
        if owners:
            used, first, n = np.unique(np.concatenate(owners), return_index=True, return_counts=True)
            for s, k in zip(used.tolist(), n.tolist()):
                waiting[s] = waiting.get(s, 0) + k
            by_first = np.argsort(first, kind="stable")  # in the order first needed, with the batch that does
            batch_of = np.repeat(np.arange(len(owners)), [len(o) for o in owners])
            fetcher.extend(used[by_first].tolist(), batch_of[first[by_first]].tolist(), len(planned))
        return owners

    windows = iter(windows)
    try:
        current = next(windows, None)
        owners = seen(current) if current is not None else []
        while current is not None:
            upcoming = next(windows, None)
            upcoming_owners = seen(upcoming) if upcoming is not None else []
            yield from _gather(current, owners, shards, fetcher, waiting, loaded, label=label, on_error=on_error,
                               counts=counts, block=block, fields=fields, origins=origins)
            current, owners = upcoming, upcoming_owners
    finally:
        fetcher.close()  # stopped early: downloads in flight give up


def _gather(planned: Sequence[Planned], owners: list[np.ndarray], shards: ShardSet, fetcher: ShardFetcher,
            waiting: dict[int, int], loaded: dict[int, _Shard], *, label: Callable[[int, Records], Records],
            on_error: str, counts: WorkerTally, block: int, fields: Sequence[str],
            origins: Origins | None) -> Iterator[Rows]:
    for (bid, rows), owner in zip(planned, owners):
        fetcher.reached()
        within = rows - shards.starts[owner]
        present = list(dict.fromkeys(owner.tolist()))  # the batch's shards, first use first
        for s in present:
            if s not in loaded:
                got, missing = _read_shard(shards, s, on_error=on_error, counts=counts, block=block, fetcher=fetcher,
                                           fields=fields)
                loaded[s] = _Shard(label(s, got), missing)
        have = within < np.array([len(loaded[s].rows) for s in owner.tolist()], np.int64)
        for s in present:
            lost = int(((owner == s) & ~have).sum())
            if lost:
                counts.dropped[loaded[s].missing] += lost
        slots = [np.flatnonzero((owner == s) & have) for s in present]
        parts = [loaded[s].rows[within[k]] for s, k in zip(present, slots)]
        got_rows = Records.concat(parts) if parts else Records.empty()
        if parts:  # back to the planned order within the batch (the collate sorts by length, ties in this order)
            kept = np.concatenate(slots)
            order = np.argsort(kept, kind="stable")
            got_rows = got_rows[order]
            corpora, epochs = origins(bid) if origins is not None else (None, np.full(len(rows), bid[1], np.int64))
            got_rows.from_plan(None if corpora is None else corpora[kept[order]], epochs[kept[order]])
        yield bid, got_rows
        for s in present:
            waiting[s] -= int((owner == s).sum())
            if waiting[s] <= 0:
                del loaded[s], waiting[s]  # its last planned row is used: let its file (or bytes) go


def _read_shard(shards: ShardSet, s: int, *, on_error: str, counts: WorkerTally, block: int,
                fetcher: ShardFetcher, fields: Sequence[str] = ()) -> tuple[Records, str]:
    """What shard ``s`` delivers, checked against the frames it was planned with, and the reason
    any planned row it does not deliver is counted under."""
    url = redact(shards.urls[s])  # what names it in messages; the fetcher has the URL itself
    try:
        opened = fetcher.open(s)
    except ChangedError as e:  # the store's copy changed since it was indexed
        counts.retries += e.retries
        return _refuse_stale(str(e), on_error, counts)
    except FetchError as e:
        counts.retries += e.retries
        if on_error == "raise":
            raise
        warnings.warn(f"{e}; its utterances are skipped (counted as unreachable_shard)", RuntimeWarning, stacklevel=2)
        counts.unreachable_shards += 1
        return Records.empty(), "unreachable_shard"
    counts.retries += opened.retries
    counts.fetched_bytes += opened.fetched_bytes
    corrupt: list[str] = []
    blocks = list(iter_records(url, on_error=on_error, block=block, on_corrupt=lambda u, k, why: corrupt.append(why),
                               source=opened.source, fields=fields))
    rows = (Records.concat(blocks) if blocks else Records.empty()).in_corpus(int(shards.corpus[s]))
    rows.at_rows(int(shards.starts[s]))
    counts.read += len(rows)
    if corrupt:
        counts.corrupt_shards += 1
    planned = shards.frames[shards.starts[s]:shards.starts[s + 1]]
    n = min(len(rows), len(planned))
    differ = np.flatnonzero(rows.frames[:n] != planned[:n])
    if len(rows) < len(planned) and not corrupt and not len(differ):
        # The tar ended cleanly before the samples the index lists (a zero block where a header
        # was): damage all the same, reported as such rather than lost quietly.
        report_damage(url, f"it ends after {len(rows)} samples, its index lists {len(planned)}", on_error)
        counts.corrupt_shards += 1
    if len(rows) <= len(planned) and not len(differ):
        return rows, "corrupt_shard"
    at = (f"sample {differ[0]} has {rows.frames[differ[0]]} frames, the index {planned[differ[0]]}" if len(differ)
          else f"{len(rows)} samples, the index {len(planned)}")
    return _refuse_stale(f"shard {url} does not match the index the epoch was planned from ({at}): it was changed "
                         f"after it was indexed. Re-index it (wdsprep index --refresh) or repack it", on_error, counts)


def _refuse_stale(msg: str, on_error: str, counts: WorkerTally) -> tuple[Records, str]:
    """A shard that is not the one indexed: an error, or skipped and counted."""
    if on_error == "raise":
        raise ShardError(msg)
    warnings.warn(f"{msg}; its utterances are skipped", RuntimeWarning, stacklevel=3)
    counts.stale_shards += 1
    return Records.empty(), "stale_shard"


def tokenize(rows: Records, tokenizer: Tokenizer | Transforms, *, sampling: SubwordSampling | None, seed: int,
             langs: Sequence[str] | None = None, text_fields: Sequence[int] = (),
             field_names: Sequence[str] | None = None) -> Records:
    """Labels from raw text for one shard's rows, in one ``encode_batch`` call (per language, where
    the tokenizer has one per language: ``langs``, each row's, from the index); subword sampling
    seeded by ``seed``.  A corpus's :class:`~wdsprep.plan.transforms.Transforms` treat the text
    first.  ``text_fields``: the places in each row's ``values`` of the fields tokenized too, the
    same way (a missing value as an empty text: the row is dropped later, counted).

    Per shard, not per batch: sentencepiece starts a thread for every batched call, which cost
    1.6 ms a call beside the C reader's thread (594 calls, 0.94 of a 1.6 s epoch, measured).
    """
    t = tokenizer if isinstance(tokenizer, Transforms) else Transforms(tokenizer)
    if sampling is not None:
        t.tokenizer.seed(seed)
    if t.by_language and langs is None:
        raise ValueError("a tokenizer per language needs each utterance's language: the shards' index has no "
                         "language column (pack with --utt2lang)")
    labels = t.encode(rows.texts.tolist(), langs=langs, sampling=sampling)
    values = rows.values.tolist() if text_fields else []
    field_labels = []
    for k, name in zip(text_fields, field_names or [str(k) for k in text_fields]):
        texts = [v[k] or "" for v in values]
        field_labels.append(t.encode(texts, langs=langs, sampling=sampling))
        _say_unknown(name, texts, field_labels[-1])
    return rows.with_labels(labels, field_labels, langs)


# Text fields said to be mostly <unk>, once per process.
_SAID_UNKNOWN: set[str] = set()


def _say_unknown(name: str, texts: Sequence[str], ids: Sequence[Sequence[int]]) -> None:
    """Warn, once per field, when most of a text field's tokens are ``<unk>``: a prompt of symbols
    the tokenizer does not know (give them as special tokens) or text of another script."""
    total = sum(map(len, ids))
    unknown = sum(list(x).count(UNK_ID) for x in ids)
    if name in _SAID_UNKNOWN or unknown * 2 <= total:
        return
    _SAID_UNKNOWN.add(name)
    example = next((x for x, i in zip(texts, ids) if UNK_ID in i), "")
    warnings.warn(f"text field {name!r}: {unknown:,} of its {total:,} tokens in a shard are <unk> (e.g. "
                  f"{example!r}): the tokenizer does not know them; symbols such as <|en|> need to be special tokens "
                  f"(tokenizer train --special-tokens)", UserWarning, stacklevel=2)


def filter_fields(batches: Iterator[Rows], *, counts: WorkerTally) -> Iterator[Rows]:
    """Drop utterances that lack a field the loader delivers (a shard changed since it was indexed:
    its index lists the field), counted as ``missing_field``; the batch stays."""
    for bid, rows in batches:
        if len(rows):
            bad = np.fromiter((v is None or None in v for v in rows.values.tolist()), bool, len(rows))
            if bad.any():
                counts.dropped["missing_field"] += int(bad.sum())
                rows = rows[~bad]
        yield bid, rows


def filter_ctc(batches: Iterator[Rows], *, ctc_subsampling: int | None, counts: WorkerTally) -> Iterator[Rows]:
    """Drop utterances CTC cannot align (CAT's rule: ``frames // subsampling > labels``), counted;
    the batch stays, so the step count never changes (it may even be empty)."""
    for bid, rows in batches:
        if ctc_subsampling is not None and len(rows):
            bad = rows.frames // ctc_subsampling <= rows.label_lens
            if bad.any():
                counts.dropped["ctc_too_short"] += int(bad.sum())
                rows = rows[~bad]
        yield bid, rows
