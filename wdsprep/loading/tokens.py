"""Each label's length in the tokenizer's tokens, before the epoch: what a cost model's ``u`` needs.

Counted once per (index folder, tokenizer) from the shards' transcripts (headers and text
members only, no features read) and kept beside the index (``format/index.tokens_name``), so a
second run reads a column instead.  Shards on S3 or a web server need the column uploaded with
the index: counting would download the whole corpus on every rank.  Shards in no index are
counted each time.  The plan uses each transcript's one best segmentation: with subword sampling
a label's length varies per use (see docs/batching.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np

from wdsprep.errors import DataError
from wdsprep.format.index import (
    INDEX_NAME,
    FolderIndex,
    parse_tokens,
    read_index,
    read_tokens_at,
    tokens_name,
    write_tokens,
)
from wdsprep.format.shardlist import expand_shards, index_place, is_url
from wdsprep.loading.read import iter_records
from wdsprep.remote.fetch import RetryPolicy, fetch_file
from wdsprep.remote.urls import has_folder, redact
from wdsprep.tokenizer import Tokenizer, load_tokenizer


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """What decides a tokenizer's segmentation, as a digest."""
    doc = json.dumps([tokenizer.kind, tokenizer.to_dict()], sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """int32: each text's length in tokens (its best segmentation)."""
    return np.fromiter(map(len, tokenizer.encode_batch(texts)), np.int32, len(texts))


class LabelTokens:
    """The token column of every index folder a shard set reads, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, *, policy: RetryPolicy | None = None) -> None:
        self.tokenizer = tokenizer
        self.digest = tokenizer_digest(tokenizer)
        self.policy = policy or RetryPolicy()

    def folder(self, folder: str, index: FolderIndex) -> np.ndarray:
        """int32 per row of ``index``: read from beside it, else counted and written there."""
        name = tokens_name(index, self.digest)
        if has_folder(folder):
            column = read_tokens_at(folder, name, index.num_utts, partial(fetch_file, policy=self.policy))
            if column is None:
                raise DataError(
                    f"{redact(folder)}/{name}: the cost model counts label tokens, and no token column for this "
                    f"tokenizer was uploaded beside the index; count them on a local copy (wdsprep tokenizer "
                    f"count-labels 'DIR/*/data-*.tar' --tokenizer TOKENIZER) and upload {name} with the index files")
            return column
        path = Path(folder) / name
        if path.is_file():
            return parse_tokens(path, index.num_utts, str(path))
        column = np.concatenate([self._texts_of(os.path.join(folder, shard), int(n))
                                 for shard, n in zip(index.names, index.utts)] or [np.zeros(0, np.int32)])
        if not (Path(folder) / INDEX_NAME).is_file():  # a growing folder: its published shards change, keep none
            return column
        try:
            write_tokens(folder, name, column)
        except OSError as e:  # a read-only corpus: counted again next time
            warnings.warn(f"{path}: cannot keep the label tokens counted ({e.strerror}); they are counted again by "
                          f"the next loader", RuntimeWarning, stacklevel=2)
        return column

    def shard(self, url: str) -> np.ndarray:
        """A shard in no index: its labels counted from its transcripts."""
        return self._texts_of(url, None)

    def _texts_of(self, url: str, expected: int | None) -> np.ndarray:
        # A damaged shard's index holds the samples before the damage: read those, quietly (the
        # loader reports the damage when it reads the shard).
        texts = [t for block in iter_records(url, on_corrupt=lambda *_: None) for t in block.texts.tolist()]
        if expected is not None and len(texts) != expected:
            raise DataError(f"{url}: {len(texts)} transcripts, its index lists {expected}: the shard changed since it "
                            f"was indexed; re-index it (wdsprep index --refresh)")
        return count_tokens(self.tokenizer, texts)


def count_labels(patterns: str | os.PathLike | Sequence[str | os.PathLike],
                 tokenizer: Tokenizer | str | os.PathLike) -> dict[str, str]:
    """Write the token column of every index folder ``patterns`` reach, for ``tokenizer`` (what a
    cost model that counts label tokens plans with); returns ``{folder: what was done}``.  Local
    shards only: for shards on S3 or a web server, count a local copy and upload the column."""
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    counter = LabelTokens(tokenizer)
    done: dict[str, str] = {}
    for url in expand_shards(patterns):
        if is_url(url):
            raise ValueError(f"{url}: label tokens are counted on local shards; count a local copy and upload the "
                             f"index.tokens.*.npy it writes beside the index")
        folder, _ = index_place(url)
        if folder in done:
            continue
        index = read_index(folder)
        if index is None:
            raise DataError(f"{folder}: no index; write one first (wdsprep index '{url}')")
        name = tokens_name(index, counter.digest)
        had = (Path(folder) / name).is_file()
        column = counter.folder(folder, index)
        done[folder] = (f"{name}: {'already there' if had else 'written'}, {len(column):,} labels, "
                        f"{float(column.mean()) if len(column) else 0:.1f} tokens on average")
    return done
