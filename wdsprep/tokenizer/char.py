"""Characters as tokens."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

from wdsprep.tokenizer.base import (
    BOS,
    SPACE,
    UNK,
    UNK_ID,
    PathLike,
    Specials,
    VocabTokenizer,
    check_ids,
    check_special_tokens,
    check_vocab_size,
    field,
    is_texts,
    register,
    special_tokens_field,
    transcripts,
    vocabulary,
)


@register
class CharTokenizer(VocabTokenizer):
    """One id per character.

    Whitespace: leading/trailing whitespace is dropped and each inner run of whitespace becomes one
    ``<space>`` token (id 2) when ``keep_spaces`` (the default; word boundaries matter for English),
    or is dropped when not (Mandarin transcripts whose spaces are arbitrary word segmentation).
    So ``decode(encode(t)) == " ".join(t.split())`` for in-vocabulary text.
    """

    kind = "char"

    def __init__(self, vocab: Sequence[str], *, keep_spaces: bool = True, special_tokens: Sequence[str] = ()) -> None:
        super().__init__(vocab, special_tokens)
        self.keep_spaces = keep_spaces
        if keep_spaces and self._ids.get(SPACE) != 2:
            raise ValueError(f"a char vocabulary with keep_spaces must have {SPACE!r} at id 2")
        self._space_id = self._ids.get(SPACE, UNK_ID)

    @classmethod
    def train(cls, text_files: Sequence[PathLike], vocab_size: int | None, *, keep_spaces: bool = True,
              special_tokens: Sequence[str] = ()) -> CharTokenizer:
        fixed = [BOS, UNK] + ([SPACE] if keep_spaces else [])
        given = check_special_tokens(special_tokens, fixed)
        check_vocab_size(vocab_size, len(fixed) + len(given))
        strip = Specials(dict.fromkeys(given, 0)).strip
        counts = Counter(p for t in transcripts(text_files) for p in cls.pieces_of(strip(t), False))
        return cls(vocabulary(counts, vocab_size, fixed + given), keep_spaces=keep_spaces, special_tokens=given)

    @staticmethod
    def pieces_of(text: str, keep_spaces: bool) -> Iterator[str]:
        words = text.split()
        for k, w in enumerate(words):
            if k and keep_spaces:
                yield SPACE
            yield from w

    def encode_plain(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(p, UNK_ID) for p in self.pieces_of(text, self.keep_spaces)]

    def decode(self, ids: Sequence[int]) -> str:
        check_ids(ids, self.vocab_size)
        # Id 0 is the blank/<s> and carries no text.
        return "".join(" " if i == self._space_id and self.keep_spaces else self._pieces[i] for i in ids if i)

    def to_dict(self) -> dict[str, Any]:
        return {"keep_spaces": self.keep_spaces, "vocab": self._pieces, **self.specials_json()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> CharTokenizer:
        return cls(field(doc, "vocab", is_texts, "a list of strings"),
                   keep_spaces=field(doc, "keep_spaces", lambda x: isinstance(x, bool), "true or false"),
                   special_tokens=special_tokens_field(doc))
