"""Words as jieba cuts them (CAT's Mandarin word tokenizer)."""

from __future__ import annotations

import io
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

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
    is_int,
    is_texts,
    register,
    special_tokens_field,
    transcripts,
    vocabulary,
)


def _quiet_jieba() -> Any:
    import jieba

    # jieba logs "Building prefix dict..." at DEBUG on every new Tokenizer; keep stderr for real problems.
    jieba.setLogLevel(logging.WARNING)
    return jieba


def _is_latin_edge(c: str) -> bool:
    return c.isascii() and c.isalnum()


@register
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
    - ``dictionary``: the text of a jieba main dictionary (``word freq [tag]`` lines) used instead of
      jieba's bundled one, as CAT's ``JiebaTokenizer(userdict=...)`` does; None keeps jieba's.
    - ``whitespace="cat"`` cuts as CAT's JiebaTokenizer: the text is stripped and only words that
      are exactly one ``" "`` are dropped, so a tab or an ideographic space (U+3000) inside a
      transcript is a word, ``<unk>`` unless the vocabulary has it.  The default ``"drop"`` drops
      every whitespace word.
    """

    kind = "jieba"
    WHITESPACE = ("drop", "cat")

    def __init__(self, vocab: Sequence[str], *, user_dict: Sequence[Sequence[Any]] = (),
                 dictionary: str | None = None, whitespace: str = "drop", special_tokens: Sequence[str] = ()) -> None:
        super().__init__(vocab, special_tokens)
        if whitespace not in self.WHITESPACE:
            raise ValueError(f"jieba whitespace rule {whitespace!r}: choose one of {', '.join(self.WHITESPACE)}")
        self.user_dict = [[str(w), None if f is None else int(f)] for w, f in user_dict]
        self.dictionary = dictionary
        self.whitespace = whitespace
        self._jieba = make_jieba(self.user_dict, dictionary)

    @classmethod
    def train(cls, text_files: Sequence[PathLike], vocab_size: int | None, *, user_dict: PathLike | None = None,
              special_tokens: Sequence[str] = ()) -> JiebaTokenizer:
        given = check_special_tokens(special_tokens, [BOS, UNK])
        check_vocab_size(vocab_size, 2 + len(given))
        entries = read_user_dict(user_dict) if user_dict is not None else []
        cutter = make_jieba(entries)
        strip = Specials(dict.fromkeys(given, 0)).strip
        counts = Counter(w for t in transcripts(text_files) for w in cutter.cut(strip(t), HMM=False)
                         if not w.isspace())
        return cls(vocabulary(counts, vocab_size, [BOS, UNK, *given]), user_dict=entries, special_tokens=given)

    def cut(self, text: str) -> list[str]:
        """Words of ``text``, whitespace dropped by the tokenizer's rule."""
        return list(cut_words(self._jieba, text, self.whitespace))

    def encode_plain(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(w, UNK_ID) for w in cut_words(self._jieba, text, self.whitespace)]

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

    def file_version(self) -> int:
        # Version 1 readers know neither field and would cut differently without a word.
        return 2 if self.dictionary is not None or self.whitespace != "drop" else 1

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"hmm": False, "user_dict": self.user_dict, "vocab": self._pieces,
                               **self.specials_json()}
        if self.file_version() > 1:
            doc.update(dictionary=self.dictionary, whitespace=self.whitespace)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> JiebaTokenizer:
        return cls(field(doc, "vocab", is_texts, "a list of strings"),
                   user_dict=field(doc, "user_dict", _is_user_dict, "a list of [word, count or null]", None) or [],
                   dictionary=field(doc, "dictionary", _is_text_or_none, "a jieba dictionary's text or null", None),
                   whitespace=field(doc, "whitespace", lambda x: x in cls.WHITESPACE,
                                    f"one of {', '.join(map(repr, cls.WHITESPACE))}", "drop"),
                   special_tokens=special_tokens_field(doc))


def _is_user_dict(x: Any) -> bool:
    # A negative count would make jieba's log of it fail at the first transcript.
    return x is None or (isinstance(x, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and (e[1] is None or (is_int(e[1]) and e[1] >= 0))
        for e in x))


def _is_text_or_none(x: Any) -> bool:
    return x is None or isinstance(x, str)


def cut_words(cutter: Any, text: str, whitespace: str) -> Iterator[str]:
    """jieba's words of ``text`` (dictionary only, HMM off) without whitespace words.

    ``"drop"``: every whitespace word goes.  ``"cat"``: CAT's JiebaTokenizer.cut, which strips the
    text and drops only the words that are one ASCII space.
    """
    if whitespace == "cat":
        return (w for w in cutter.cut(text.strip(), HMM=False) if w != " ")
    return (w for w in cutter.cut(text, HMM=False) if not w.isspace())


_JIEBA_BASE: Any = None


def make_jieba(user_dict: Sequence[Sequence[Any]], dictionary: str | None = None) -> Any:
    """A private ``jieba.Tokenizer``: jieba's default dictionary (or ``dictionary``, the text of a
    main dictionary, instead), plus ``user_dict``."""
    global _JIEBA_BASE
    jieba = _quiet_jieba()
    tk = jieba.Tokenizer()
    if dictionary is not None:
        # The parse jieba's initialize() runs on a dictionary file, on the text we hold: no temporary
        # file and no cache file in /tmp.  Errors name the line ("invalid dictionary entry in the
        # dictionary at Line 3: ...").
        text = io.BytesIO(dictionary.encode("utf-8"))
        text.name = "the dictionary"
        tk.FREQ, tk.total = tk.gen_pfdict(text)
        # jieba takes the log of every count and of their total when it cuts: say it here, not there.
        if tk.total <= 0 or min(tk.FREQ.values()) < 0:
            raise ValueError("the jieba dictionary has a negative count, or its counts add up to 0 or less")
        tk.initialized = True
    else:
        if _JIEBA_BASE is None:
            # Loading the 350k-word default dictionary takes ~1 s (more on a busy machine); do it once
            # per process and give each private tokenizer its own copy of the counts (~10 ms).
            _JIEBA_BASE = jieba.Tokenizer()
            _JIEBA_BASE.initialize()
        # The same three attributes jieba's own initialize() sets from its cache; copying FREQ keeps a
        # user dictionary out of the shared base.
        tk.FREQ, tk.total, tk.initialized = dict(_JIEBA_BASE.FREQ), _JIEBA_BASE.total, True
    for word, freq in user_dict:
        tk.add_word(word, freq)
    return tk


def default_dictionary_words() -> list[str]:
    """The words (and word prefixes) of jieba's bundled dictionary, in its order: the vocabulary CAT's
    JiebaTokenizer() builds without a dictionary, after ``<s>`` and ``<unk>``."""
    make_jieba([])
    return list(_JIEBA_BASE.FREQ)


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
            raise ValueError(f"{path}:{lineno}: not UTF-8; convert the dictionary, "
                             f"e.g. iconv -f GBK -t UTF-8") from None
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
