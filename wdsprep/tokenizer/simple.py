"""Units written with spaces between them, each looked up whole (CAT's SimpleTokenizer)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.base import (
    BOS,
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
class SimpleTokenizer(VocabTokenizer):
    """The transcript split at whitespace; each unit (a word, a phone, a character of text written
    with spaces) is looked up in the vocabulary, unknown ones become ``<unk>`` (1).

    This is CAT's SimpleTokenizer: ``encode`` gives its ids for the same vocabulary.  ``decode``
    joins units with one space and, like every wdsprep tokenizer, drops id 0 (the blank).
    """

    kind = "simple"

    @classmethod
    def train(cls, text_files: Sequence[PathLike], vocab_size: int | None, *,
              special_tokens: Sequence[str] = ()) -> SimpleTokenizer:
        given = check_special_tokens(special_tokens, [BOS, UNK])
        check_vocab_size(vocab_size, 2 + len(given))
        strip = Specials(dict.fromkeys(given, 0)).strip
        counts = Counter(u for t in transcripts(text_files) for u in strip(t).split())
        return cls(vocabulary(counts, vocab_size, [BOS, UNK, *given]), given)

    def encode_plain(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(u, UNK_ID) for u in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        check_ids(ids, self.vocab_size)
        return " ".join(self._pieces[i] for i in ids if i)

    def file_version(self) -> int:
        return 2  # version 1 readers do not know the kind

    def to_dict(self) -> dict[str, Any]:
        return {"vocab": self._pieces, **self.specials_json()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> SimpleTokenizer:
        return cls(field(doc, "vocab", is_texts, "a list of strings"), special_tokens_field(doc))
