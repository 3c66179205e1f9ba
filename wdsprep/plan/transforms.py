"""What each corpus does to its data: its tokenizer, its text treatment and its augmentation.

Named corpora may each give their own (OpenNMT's transforms per corpus)::

    make_loader({"en": {"shards": "en/*/data-*.tar", "tokenizer": "exp/en.json", "augment": {...}},
                 "zh": {"shards": "zh/*/data-*.tar", "tokenizer": "exp/zh.json", "normalize": ["remove_spaces"]}},
                tokenizer=..., ...)

A corpus given as a pattern, or without one of them, inherits the loader's (``tokenizer``,
``normalize``, ``augment``).  A corpus's tokenizer may be one per language (``{lang: path}``, an
aggregate: ``tokenizer/aggregate.py``).  Each corpus's ids are its own tokenizer's: corpora that
share an output layer share a tokenizer (or one per language).  Augmentation draws stay a function
of (the corpus's seed, its epoch, the utterance), whatever corpus they are drawn for.  Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from wdsprep.plan.augment import Augment, parse_augment
from wdsprep.tokenizer import AggregateTokenizer, Normalizer, Tokenizer, as_tokenizer, parse_normalize

# What a named corpus's object may say besides its shards.
CORPUS_KEYS = ("tokenizer", "normalize", "augment")
Trset = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any]


@dataclass(frozen=True)
class Transforms:
    """One corpus's treatment of its utterances."""

    tokenizer: Tokenizer
    normalize: Normalizer | None = None
    augment: Augment | None = None

    @property
    def by_language(self) -> bool:
        """Whether its tokenizer encodes each utterance by its language."""
        return isinstance(self.tokenizer, AggregateTokenizer)

    def encode(self, texts: Sequence[str], *, langs: Sequence[str] | None, sampling: Any = None) -> list[list[int]]:
        """``texts`` treated and tokenized (each by its language's tokenizer, where there is one per language)."""
        if self.normalize is not None:  # special tokens are left as they are (a tag is no text)
            specials = getattr(self.tokenizer, "specials", None)
            texts = [specials.plain(x, self.normalize) for x in texts] if specials else self.normalize.batch(texts)
        if self.by_language:
            return self.tokenizer.encode_batch(texts, sampling=sampling, langs=langs)  # type: ignore[call-arg]
        return self.tokenizer.encode_batch(texts, sampling=sampling)

    def text_json(self) -> dict[str, Any]:
        """What the labels depend on, for fingerprints and token columns: the tokenizer and the treatment."""
        return {"tokenizer": [self.tokenizer.kind, self.tokenizer.to_dict()],
                "normalize": None if self.normalize is None else self.normalize.to_json()}


def split_trset(trset: Trset) -> tuple[Trset, dict[str, dict[str, Any]]]:
    """The shard patterns of ``trset``, and what each named corpus given as an object says besides
    (``{"shards": ..., "tokenizer": ..., "normalize": ..., "augment": ...}``)."""
    if not isinstance(trset, Mapping):
        return trset, {}
    patterns: dict[str, Any] = {}
    own: dict[str, dict[str, Any]] = {}
    for name, value in trset.items():
        name = str(name)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"shards", *CORPUS_KEYS})
            if unknown or "shards" not in value:
                raise ValueError(f"corpus {name!r}: an object with \"shards\" and any of {list(CORPUS_KEYS)}"
                                 + (f", not {unknown}" if unknown else ""))
            patterns[name] = value["shards"]
            own[name] = {k: value[k] for k in CORPUS_KEYS if k in value}
        else:
            patterns[name] = value
    return patterns, own


def corpus_transforms(names: Sequence[str], own: Mapping[str, Mapping[str, Any]],
                      default: Transforms) -> tuple[Transforms, ...]:
    """Each corpus's transforms: what it gives (``own``), the loader's (``default``) for the rest.
    A corpus's ``"augment": null`` or ``"normalize": null`` turns the loader's off for it."""
    out = []
    for name in names:
        given = own.get(name, {})
        try:
            out.append(Transforms(
                as_tokenizer(given["tokenizer"]) if "tokenizer" in given else default.tokenizer,
                parse_normalize(given["normalize"]) if "normalize" in given else default.normalize,
                parse_augment(given["augment"]) if "augment" in given else default.augment))
        except (ValueError, OSError) as e:
            raise type(e)(f"corpus {name!r}: {e}") from None
    return tuple(out)
