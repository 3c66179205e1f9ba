"""Each label's length in the tokenizer's tokens, before the epoch: what a cost model's ``u`` needs.

Counted once per (index folder, tokenizer) from the shards' transcripts (headers and text
members only, no features read) and kept beside the index (``format/index/tokens.py``), so a
second run reads a column instead.  Shards on S3 or a web server need the column uploaded with
the index: counting would download the whole corpus on every rank.  Shards in no index are
counted each time.  The plan uses each transcript's one best segmentation: with subword sampling
a label's length varies per use (see docs/batching.md).  A corpus's transcripts are counted as
its readers tokenize them: after its text treatment (``normalize``), each by its language's
tokenizer where there is one per language (the index's ``lang`` column says which).
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
    Values,
    parse_tokens,
    read_index,
    read_tokens_at,
    tokens_name,
    write_tokens,
)
from wdsprep.format.keys import LANG
from wdsprep.format.records import iter_records
from wdsprep.format.shardlist import expand_shards, index_place, is_url
from wdsprep.plan.transforms import Transforms
from wdsprep.remote.fetch import RetryPolicy, fetch_file
from wdsprep.remote.urls import has_folder, redact
from wdsprep.tokenizer import Tokenizer, load_tokenizer, parse_normalize


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """What decides a tokenizer's segmentation, as a digest."""
    doc = json.dumps([tokenizer.kind, tokenizer.to_dict()], sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()


def count_tokens(tokenizer: Tokenizer | Transforms, texts: list[str], langs: list[str] | None = None) -> np.ndarray:
    """int32: each text's length in tokens (its best segmentation), after a corpus's treatment."""
    t = tokenizer if isinstance(tokenizer, Transforms) else Transforms(tokenizer)
    return np.fromiter(map(len, t.encode(texts, langs=langs)), np.int32, len(texts))


class LabelTokens:
    """The token column of every index folder a shard set reads, for one tokenizer (and text treatment)."""

    def __init__(self, tokenizer: Tokenizer | Transforms, *, policy: RetryPolicy | None = None) -> None:
        self.transforms = tokenizer if isinstance(tokenizer, Transforms) else Transforms(tokenizer)
        self.tokenizer = self.transforms.tokenizer
        self.digest = tokenizer_digest(self.tokenizer)
        if self.transforms.normalize is not None:  # another treatment, another column
            steps = json.dumps([self.digest, self.transforms.normalize.to_json()])
            self.digest = hashlib.blake2b(steps.encode(), digest_size=8).hexdigest()
        self.policy = policy or RetryPolicy()

    def folder(self, folder: str, index: FolderIndex) -> np.ndarray:
        """int32 per row of ``index``: read from beside it, else counted and written there."""
        name = tokens_name(index, self.digest)
        if has_folder(folder):
            column = read_tokens_at(folder, name, index.num_utts, partial(fetch_file, policy=self.policy))
            if column is None:
                raise DataError(
                    f"{redact(folder)}/{name}: the plan counts label tokens (a cost model that counts them, a label "
                    f"filter or the CTC rule), and no token column for this "
                    f"tokenizer was uploaded beside the index; count them on a local copy (wdsprep tokenizer "
                    f"count-labels 'DIR/*/data-*.tar' --tokenizer TOKENIZER) and upload {name} with the index files")
            return _plausible(column, index, f"{redact(folder)}/{name}")
        path = Path(folder) / name
        if path.is_file():
            return _plausible(parse_tokens(path, index.num_utts, str(path)), index, str(path))
        langs = self._langs(folder, index)
        column = np.concatenate([self._texts_of(os.path.join(folder, shard), int(n),
                                                None if langs is None else langs.rows(int(a), int(a + n)))
                                 for shard, n, a in zip(index.names, index.utts, index.starts)]
                                or [np.zeros(0, np.int32)])
        if not (Path(folder) / INDEX_NAME).is_file():  # a growing folder: its published shards change, keep none
            return column
        try:
            write_tokens(folder, name, column)
        except OSError as e:  # a read-only corpus: counted again next time
            warnings.warn(f"{path}: cannot keep the label tokens counted ({e.strerror}); they are counted again by "
                          f"the next loader", RuntimeWarning, stacklevel=2)
        return column

    def _langs(self, folder: str, index: FolderIndex) -> Values | None:
        """The rows' languages where the tokenizer needs them (one per language); an error without."""
        if not self.transforms.by_language:
            return None
        langs = index.columns.get(LANG)
        if langs is None:
            raise DataError(f"{folder}: the tokenizer has one per language, and the index has no language column; "
                            f"pack with --utt2lang (or re-index: wdsprep index --force, if the shards carry KEY.lang)")
        return langs

    def shard(self, url: str) -> np.ndarray:
        """A shard in no index: its labels counted from its transcripts (and languages)."""
        return self._texts_of(url, None, None)

    def _texts_of(self, url: str, expected: int | None, langs: Values | None) -> np.ndarray:
        # A damaged shard's index holds the samples before the damage: read those, quietly (the
        # loader reports the damage when it reads the shard).
        by_language = self.transforms.by_language and langs is None
        blocks = list(iter_records(url, on_corrupt=lambda *_: None, fields=[LANG] if by_language else ()))
        texts = [t for block in blocks for t in block.texts.tolist()]
        if expected is not None and len(texts) != expected:
            raise DataError(f"{url}: {len(texts)} transcripts, its index lists {expected}: the shard changed since it "
                            f"was indexed; re-index it (wdsprep index --refresh)")
        names = langs.values() if langs is not None else (
            [v[0] for block in blocks for v in block.values.tolist()] if by_language else None)
        if names is not None and None in names:
            raise DataError(f"{url}: an utterance without a language (member KEY.lang), and the tokenizer has one per "
                            f"language; pack with --utt2lang")
        return count_tokens(self.transforms, texts, names)


def count_labels(patterns: str | os.PathLike | Sequence[str | os.PathLike],
                 tokenizer: Tokenizer | str | os.PathLike, *, normalize: Sequence[str] | None = None) -> dict[str, str]:
    """Write the token column of every index folder ``patterns`` reach, for ``tokenizer`` (what a
    cost model that counts label tokens plans with); returns ``{folder: what was done}``.  Local
    shards only: for shards on S3 or a web server, count a local copy and upload the column.
    ``normalize``: the text treatment the loader applies (its ``normalize=``)."""
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    counter = LabelTokens(Transforms(tokenizer, parse_normalize(normalize)))
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


# The most tokens a label may count per character of its transcript (a byte-level or phone
# tokenizer, NFKC's expansions): far above any real one, far below a column rewritten with 2^31-1.
MAX_TOKENS_PER_CHAR = 32


def _plausible(column: np.ndarray, index: FolderIndex, where: str) -> np.ndarray:
    """A token column kept beside an index, refused when no tokenizer could have counted it: more
    tokens than its transcript could make, or none for every non-empty transcript (a column
    rewritten by hand or by a tool); the loader counts them again once it is deleted."""
    text_lens = np.asarray(index.text_lens, np.int64)
    over = np.flatnonzero(column.astype(np.int64) > MAX_TOKENS_PER_CHAR * text_lens + 8)
    why = None
    if len(over):
        i = int(over[0])
        why = (f"row {i} counts {int(column[i]):,} tokens for a {int(text_lens[i]):,}-character transcript "
               f"({len(over):,} such rows)")
    elif len(column) and (text_lens > 0).any() and not column.any():
        why = f"every one of its {len(column):,} rows counts 0 tokens, though the transcripts are not empty"
    if why is not None:
        raise DataError(f"{where}: {why}: no tokenizer counts so, the column was changed; delete it, the loader "
                        f"counts the tokens again")
    return column
