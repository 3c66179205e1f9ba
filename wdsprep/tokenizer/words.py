"""Words as jieba cuts them (CAT's Mandarin word tokenizer)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from wdsprep.tokenizer.base import UNK_ID, PathLike, VocabTokenizer, check_ids


def _quiet_jieba() -> Any:
    import jieba

    # jieba logs "Building prefix dict..." at DEBUG on every new Tokenizer; keep stderr for real problems.
    jieba.setLogLevel(logging.WARNING)
    return jieba


def _is_latin_edge(c: str) -> bool:
    return c.isascii() and c.isalnum()


class JiebaTokenizer(VocabTokenizer):
    """Words as cut by jieba (dictionary only, HMM off, as CAT does), looked up in a word vocabulary.

    - Unknown words become ``<unk>`` (1); there is no back-off to characters.
    - Whitespace only separates words and is never a token: Mandarin transcripts often carry
      arbitrary word-segmentation spaces. Latin words are kept whole (jieba cuts "hello" as one word,
      "don't" as "don", "'", "t"); case is kept as is.
    - ``decode`` joins words with no separator, except one space between two words that meet with
      ASCII letters/digits ("我 爱 hello world" -> "我爱hello world").
    - The user dictionary (``[word, freq-or-null]`` entries) is added to a private
      ``jieba.Tokenizer``, never to jieba's global one, so other code using jieba is unaffected.
    """

    kind = "jieba"

    def __init__(self, vocab: Sequence[str], *, user_dict: Sequence[Sequence[Any]] = ()) -> None:
        super().__init__(vocab)
        self.user_dict = [[str(w), None if f is None else int(f)] for w, f in user_dict]
        self._jieba = make_jieba(self.user_dict)

    def cut(self, text: str) -> list[str]:
        """Words of ``text`` with whitespace removed."""
        return [w for w in self._jieba.cut(text, HMM=False) if not w.isspace()]

    def encode(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(w, UNK_ID) for w in self.cut(text)]

    def decode(self, ids: Sequence[int]) -> str:
        check_ids(ids, self.vocab_size)
        out: list[str] = []
        for i in ids:
            if not i:
                continue
            w = self._pieces[i]
            if out and _is_latin_edge(out[-1][-1]) and _is_latin_edge(w[0]):
                out.append(" ")
            out.append(w)
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"hmm": False, "user_dict": self.user_dict, "vocab": self._pieces}


_JIEBA_BASE: Any = None


def make_jieba(user_dict: Sequence[Sequence[Any]]) -> Any:
    """A private ``jieba.Tokenizer`` with the default dictionary plus ``user_dict``."""
    global _JIEBA_BASE
    jieba = _quiet_jieba()
    if _JIEBA_BASE is None:
        # Loading the 350k-word default dictionary takes ~1 s (more on a busy machine); do it once
        # per process and give each private tokenizer its own copy of the counts (~10 ms).
        _JIEBA_BASE = jieba.Tokenizer()
        _JIEBA_BASE.initialize()
    tk = jieba.Tokenizer()
    # The same three attributes jieba's own initialize() sets from its cache; copying FREQ keeps a
    # user dictionary out of the shared base.
    tk.FREQ, tk.total, tk.initialized = dict(_JIEBA_BASE.FREQ), _JIEBA_BASE.total, True
    for word, freq in user_dict:
        tk.add_word(word, freq)
    return tk


def read_user_dict(path: PathLike) -> list[list[Any]]:
    """A jieba user dictionary: lines ``word [freq] [tag]``, UTF-8; errors name file:line."""
    entries: list[list[Any]] = []
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such jieba user dictionary") from None
    for lineno, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8").lstrip("\ufeff").strip()
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{lineno}: not UTF-8; convert the dictionary, e.g. iconv -f GBK -t UTF-8") from None
        if not line:
            continue
        parts = line.split()
        freq: int | None = None
        rest = parts[1:]
        if rest and rest[0].isdigit():
            freq = int(rest.pop(0))
        if len(rest) > 1 or (rest and not rest[0].isalpha()):
            raise ValueError(f"{path}:{lineno}: expected 'word [freq] [tag]' (jieba user dictionary), got {line!r}")
        entries.append([parts[0], freq])
    return entries
