"""A tokenizer per language, as one: each utterance encoded by its language's tokenizer, ids laid out side by side.

The layout of an aggregate tokenizer (NeMo's ``AggregateTokenizer``, with CAT's specials shared):
ids 0 (``<s>``, the CTC/transducer blank) and 1 (``<unk>``) are every language's; each language's
other ids ``2 .. V_l - 1`` sit in a range of their own, from its ``offset``, in the order the
languages are given::

    en (V=30):  0, 1, 2..29  -> 0, 1, 2..29          (offset 2)
    zh (V=500): 0, 1, 2..499 -> 0, 1, 30..527        (offset 30)
    vocab_size = 2 + sum(V_l - 2) = 528

So one output layer covers every language, a language's ids never collide with another's, and
:meth:`AggregateTokenizer.decode` finds each id's language by its range.  Special tokens (a
language tag ``<|en|>``, a task ``<|transcribe|>``: the ones given, and every language tokenizer's
own) are shared too, one id each for every language, right after ``<unk>``; the languages' ranges
follow them.  The file holds each
language's tokenizer whole with its offset (``"languages": [{"lang", "offset", "tokenizer"}]``):
``load_tokenizer`` reads it back as it is, and a tokenizer changed since is a changed file.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from wdsprep.tokenizer.base import (
    FORMAT,
    REGISTRY,
    FieldError,
    Specials,
    SubwordSampling,
    Tokenizer,
    TokenizerBase,
    check_ids,
    describe,
    field,
    is_int,
    register,
    special_tokens_field,
)

SHARED = 2  # ids 0 and 1, every language's


@register
class AggregateTokenizer(TokenizerBase):
    """One tokenizer per language (``{lang: tokenizer}``, in the order given): see the module's doc.

    Encoding needs each text's language: ``encode(text, lang)``, ``encode_batch(texts, langs=...)``.
    """

    kind = "aggregate"

    def __init__(self, tokenizers: Mapping[str, Tokenizer], special_tokens: Sequence[str] = ()) -> None:
        if not tokenizers:
            raise ValueError("an aggregate tokenizer needs at least one language's tokenizer")
        self.languages = tuple(tokenizers)
        self.tokenizers = dict(tokenizers)
        symbols = list(dict.fromkeys([*special_tokens, *(s for tok in self.tokenizers.values()
                                                         for s in getattr(tok, "special_tokens", ()))]))
        self.specials = Specials({s: SHARED + k for k, s in enumerate(symbols)})
        offsets, at = [], SHARED + len(symbols)
        for lang, tok in self.tokenizers.items():
            if not isinstance(lang, str) or not lang or len(lang.split()) != 1:
                raise ValueError(f"language {describe(lang)}: a language is one word, e.g. en")
            if isinstance(tok, AggregateTokenizer):
                raise ValueError(f"language {lang}: its tokenizer is an aggregate itself; give each language's own")
            problem = getattr(tok, "id_convention_problem", lambda: None)()
            if problem is not None:
                raise ValueError(f"language {lang}: its tokenizer's ids are not CAT's ({problem}); ids 0 and 1 are "
                                 f"shared by every language, so each tokenizer must keep them for <s> and <unk>")
            if tok.vocab_size < SHARED:
                raise ValueError(f"language {lang}: a tokenizer of {tok.vocab_size} ids")
            offsets.append(at)
            at += tok.vocab_size - SHARED
        self.offsets = dict(zip(self.languages, offsets))
        self.vocab_size = at
        # Each id's language (by the start of its range) and its id in that language's tokenizer.
        self._starts = np.array(offsets, np.int64)

    def _ids(self, lang: str, local: Sequence[int]) -> list[int]:
        shift = self.offsets[lang] - SHARED
        return [i if i < SHARED else i + shift for i in local]

    def _encode(self, lang: str, texts: list[str], sampling: SubwordSampling | None = None) -> list[list[int]]:
        """Texts in language ``lang``: the shared special tokens' ids, the rest by its tokenizer."""
        tok = self._tokenizer(lang)
        return self.specials.encode_batch(texts, lambda ts: [self._ids(lang, x) for x in
                                                             (tok.encode_batch(ts, sampling=sampling) if ts else [])])

    def _tokenizer(self, lang: str | None) -> Tokenizer:
        if lang not in self.tokenizers:
            raise ValueError(f"no tokenizer for language {lang!r}; this aggregate tokenizer has {list(self.languages)}")
        return self.tokenizers[lang]

    def encode(self, text: str, lang: str | None = None) -> list[int]:  # type: ignore[override]
        """``text`` in language ``lang``'s tokenizer, its ids in that language's range."""
        if lang is None and len(self.languages) > 1:
            raise ValueError(f"an aggregate tokenizer encodes a text by its language: encode(text, lang) with lang "
                             f"one of {list(self.languages)}")
        lang = self.languages[0] if lang is None else lang
        return self._encode(lang, [text])[0]

    def encode_batch(self, texts: Sequence[str], *, sampling: SubwordSampling | None = None,
                     langs: Sequence[str] | None = None) -> list[list[int]]:
        """Each text by its language's tokenizer (one batched call per language, in the order the
        languages are given)."""
        texts = list(texts)
        if langs is None:
            if len(self.languages) > 1:
                raise ValueError("an aggregate tokenizer encodes texts by their languages: give langs=")
            langs = [self.languages[0]] * len(texts)
        if len(langs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(langs)} languages")
        out: list[list[int]] = [[] for _ in texts]
        by_lang: dict[str, list[int]] = {}
        for k, lang in enumerate(langs):
            by_lang.setdefault(lang, []).append(k)
        for lang in [x for x in self.languages if x in by_lang] + sorted(set(by_lang) - set(self.languages)):
            rows = by_lang[lang]
            for k, ids in zip(rows, self._encode(lang, [texts[k] for k in rows], sampling)):
                out[k] = ids
        return out

    def seed(self, seed: int) -> None:
        for tok in self.tokenizers.values():
            tok.seed(seed)

    def language_of(self, i: int) -> tuple[str | None, int]:
        """(the language of id ``i``, its id in that language's tokenizer); None for a shared id
        (``<s>``, ``<unk>`` and the special tokens, each its own id)."""
        check_ids([i], self.vocab_size)
        if i < SHARED + len(self.specials.ids):
            return None, i
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        lang = self.languages[k]
        return lang, i - self.offsets[lang] + SHARED

    def id_to_piece(self, i: int) -> str:
        lang, local = self.language_of(i)
        if lang is None and local >= SHARED:
            return self.specials.symbol(local)
        return self.tokenizers[lang or self.languages[0]].id_to_piece(local)

    def decode(self, ids: Sequence[int]) -> str:
        """Each run of ids of one language decoded by its tokenizer (shared ids join the run they
        are in), the runs' texts joined by a space."""
        runs: list[tuple[str, list[int]]] = []
        for i in (int(x) for x in ids):
            lang, local = self.language_of(i)
            if lang is None and local >= SHARED:  # a special token: a run of its own, its symbol
                runs.append(("", [local]))
                continue
            if lang is None:
                lang = runs[-1][0] if runs else self.languages[0]
            if runs and runs[-1][0] == lang:
                runs[-1][1].append(local)
            else:
                runs.append((lang, [local]))
        return " ".join(t for t in (self.specials.symbol(local[0]) if not lang else self.tokenizers[lang].decode(local)
                                    for lang, local in runs) if t)

    def file_version(self) -> int:
        return 2  # version 1 readers do not know the kind

    def to_dict(self) -> dict[str, Any]:
        return {**self.specials_json(),
                "languages": [{"lang": lang, "offset": self.offsets[lang],
                               "tokenizer": {"format": FORMAT, "version": tok.stored_version(), "kind": tok.kind,
                                             "vocab_size": tok.vocab_size, **tok.to_dict()}}
                              for lang, tok in self.tokenizers.items()]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> AggregateTokenizer:
        entries = field(doc, "languages", lambda x: isinstance(x, list) and x and all(isinstance(e, dict) for e in x),
                        "a list of {lang, offset, tokenizer} objects")
        tokenizers: dict[str, Tokenizer] = {}
        offsets = []
        for k, e in enumerate(entries):
            lang = field(e, "lang", lambda x: isinstance(x, str) and x, "a language")
            if lang in tokenizers:
                raise FieldError(f"lists language {describe(lang)} twice")
            offsets.append(field(e, "offset", is_int, "a whole number"))
            sub = field(e, "tokenizer", lambda x: isinstance(x, dict), "a tokenizer's fields")
            kind = sub.get("kind")
            if kind == cls.kind or kind not in REGISTRY:
                raise FieldError(f"has languages[{k}] ({lang}) of tokenizer kind {describe(kind)}, which must be one "
                                 f"of {sorted(set(REGISTRY) - {cls.kind})}")
            tokenizers[lang] = REGISTRY[kind].from_dict(sub, num_threads)  # type: ignore[assignment]
        tok = cls(tokenizers, special_tokens_field(doc))
        if offsets != [tok.offsets[lang] for lang in tok.languages]:
            raise FieldError(f"has offsets {offsets}, but its tokenizers' sizes lay the languages out at "
                             f"{list(tok.offsets.values())}")
        return tok
