"""Words spelled out as units by a lexicon (CAT's LexiconTokenizer and JiebaComposeLexiconTokenizer)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.base import TokenizerBase, check_ids, describe, field, is_ids, is_texts, register
from wdsprep.tokenizer.words import cut_words, make_jieba

SEGMENTS = ("whitespace", "jieba")


@register
class LexiconTokenizer(TokenizerBase):
    """Each word of the transcript becomes the unit ids its lexicon entry lists (phones, usually).

    - ``units``: the unit of each id (index = id).  CAT puts ``<s>`` at 0 and ``<unk>`` at 1 when
      it adds them; a lexicon may also list them itself.
    - ``lexicon``: word -> unit ids; a word not in it becomes ``unk`` (the ids of CAT's entry for
      its unknown-word symbol, ``[1]`` usually).
    - ``segment="whitespace"``: words are the transcript split at whitespace (CAT's
      LexiconTokenizer).  ``"jieba"``: words as CAT's JiebaTokenizer cuts them (dictionary only,
      HMM off, the text stripped, single spaces dropped), each then split at whitespace (CAT's
      JiebaComposeLexiconTokenizer); ``dictionary`` is the jieba main dictionary's text, or None
      for jieba's bundled one.
    - ``decode`` writes the units with one space between them and drops id 0 (the blank).

    Only imported from CAT (``wdsprep tokenizer import-cat``) or built in Python; not trained.
    """

    kind = "lexicon"

    def __init__(self, units: Sequence[str], lexicon: Mapping[str, Sequence[int]], *, unk: Sequence[int],
                 segment: str = "whitespace", dictionary: str | None = None) -> None:
        self._units = [str(u) for u in units]
        if len(set(self._units)) != len(self._units):
            dup = next(u for u, n in Counter(self._units).items() if n > 1)
            raise ValueError(f"units list {describe(dup)} twice")
        if segment not in SEGMENTS:
            raise ValueError(f"lexicon segmentation {segment!r}: choose one of {', '.join(SEGMENTS)}")
        self.vocab_size = len(self._units)
        self._lexicon = {str(w): [int(i) for i in ids] for w, ids in lexicon.items()}
        self._unk = [int(i) for i in unk]
        for word, ids in [*self._lexicon.items(), ("<unknown-word ids>", self._unk)]:
            try:
                check_ids(ids, self.vocab_size)
            except ValueError as e:
                raise ValueError(f"lexicon entry {describe(word)}: {e}") from None
        self.segment = segment
        self.dictionary = dictionary
        self._jieba = make_jieba([], dictionary) if segment == "jieba" else None

    def words(self, text: str) -> list[str]:
        """The words of ``text`` that are looked up in the lexicon."""
        if self._jieba is None:
            return text.split()
        return [u for w in cut_words(self._jieba, text, "cat") for u in w.split()]

    def encode(self, text: str) -> list[int]:
        get, unk = self._lexicon.get, self._unk
        return [i for w in self.words(text) for i in get(w, unk)]

    def decode(self, ids: Sequence[int]) -> str:
        check_ids(ids, self.vocab_size)
        return " ".join(self._units[i] for i in ids if i)

    def id_to_piece(self, i: int) -> str:
        check_ids([i], self.vocab_size)
        return self._units[i]

    def file_version(self) -> int:
        return 2  # version 1 readers do not know the kind

    def to_dict(self) -> dict[str, Any]:
        return {"units": self._units, "lexicon": self._lexicon, "unk": self._unk, "segment": self.segment,
                "dictionary": self.dictionary}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> LexiconTokenizer:
        return cls(field(doc, "units", is_texts, "a list of strings"),
                   field(doc, "lexicon", lambda x: isinstance(x, dict) and all(map(is_ids, x.values())),
                         "an object mapping each word to a list of unit ids"),
                   unk=field(doc, "unk", is_ids, "a list of unit ids"),
                   segment=field(doc, "segment", lambda x: x in SEGMENTS, f"one of {', '.join(map(repr, SEGMENTS))}",
                                 "whitespace"),
                   dictionary=field(doc, "dictionary", lambda x: x is None or isinstance(x, str),
                                    "a jieba dictionary's text or null", None))
