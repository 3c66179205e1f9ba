"""A REFERENCE MODEL OF CAT'S TOKENIZERS, for the tests: what CAT does, not what wdsprep does.

Written from reading CAT's ``cat/shared/tokenizer.py`` (github.com/thu-spmi/CAT, v3), for facts
only; CAT is not a dependency and none of its code is here.  Each class has CAT's name and, while
:func:`cat_module` is active, CAT's module path, so ``pickle.dumps`` writes what ``tknz.save``
writes: the object, its state from ``__getstate__`` (``state_dict()``), default protocol, no
wrapper.  ``encode`` follows CAT's ``_enc`` rule by rule, so the tests can compare ids.

The facts, per class:

- ``SentencePieceTokenizer``: keeps the ``.model`` file's bytes; state ``{"model-data": bytes}``;
  ``encode`` is sentencepiece's ``Encode`` (the model's own ids).  ``train`` passes CAT's defaults
  (``bos_id=0, unk_id=1, eos_id=-1, unk_surface="<unk>", character_coverage=0.9995``, ...).
- ``JiebaTokenizer(userdict=None)``: vocabulary = ``<s>``, ``<unk>``, then every key of jieba's
  ``FREQ`` in order (words AND the word prefixes jieba adds with frequency 0: ~498k ids); with a
  ``userdict`` the dictionary REPLACES jieba's (``set_dictionary``) and only its words with
  frequency > 0 are in the vocabulary.  Ids are positions.  ``cut`` = ``jieba.cut(s.strip(),
  HMM=False)`` minus words equal to ``" "``; a word not in the vocabulary is ``<unk>``.  State
  ``{"vocab": OrderedDict, "reverse-vocab": tuple, "dict-data": bytes | None}``.
- ``SimpleTokenizer``: ``<s>``=0, ``<unk>``=1, then the listed units in order (duplicates skipped);
  ``encode`` splits at whitespace, unknown -> 1.  The state IS the ``OrderedDict`` word -> id.
- ``LexiconTokenizer``: lexicon lines ``word unit unit ...`` (first pronunciation kept); units
  ``<s>``=0, ``<unk>``=1, then the set of all units in set-iteration order (so ids vary between
  runs; only the pickle fixes them); ``encode`` splits at whitespace and concatenates each word's
  unit ids, unknown words -> the ``<unk>`` entry.  State: the instance ``__dict__``.
- ``JiebaComposeLexiconTokenizer``: jieba cut as above, each word through a LexiconTokenizer; its
  own vocabulary emptied; state = JiebaTokenizer's + ``"w2p"``: the LexiconTokenizer pickled.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import re
import sys
import types
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
CAT_MODULE = "cat.shared.tokenizer"


class _CatTokenizer:
    def state_dict(self) -> OrderedDict:
        return OrderedDict(self.__dict__.items())

    def __getstate__(self):
        return self.state_dict()


class SentencePieceTokenizer(_CatTokenizer):
    def __init__(self, model_file: str) -> None:
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor(model_file=model_file)
        self.byte_model = Path(model_file).read_bytes()

    def encode(self, s: str) -> list[int]:
        return self._sp.Encode(s)

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def state_dict(self) -> OrderedDict:
        return OrderedDict([("model-data", self.byte_model)])

    @staticmethod
    def train(f_text: str, model_prefix: str, vocab_size: int, add_dummy_prefix: bool = True,
              character_coverage: float = 0.9995, model_type: str = "unigram", use_all_vocab: bool = False,
              **options) -> None:
        import sentencepiece as spm

        spm.SentencePieceTrainer.Train(input=f_text, model_prefix=model_prefix, vocab_size=vocab_size,
                                       add_dummy_prefix=add_dummy_prefix, character_coverage=character_coverage,
                                       model_type=model_type, use_all_vocab=use_all_vocab, bos_id=0, unk_id=1,
                                       eos_id=-1, unk_surface="<unk>", minloglevel=2, user_defined_symbols="",
                                       train_extremely_large_corpus=False, **options)


class JiebaTokenizer(_CatTokenizer):
    def __init__(self, userdict: bytes | None = None, *, cache_dir: Path | None = None) -> None:
        import jieba

        self._tokenizer = jieba.Tokenizer()
        if cache_dir is not None:
            self._tokenizer.tmp_dir = str(cache_dir)  # jieba's cache of a custom dictionary: not in /tmp
        if userdict is None:
            self._tokenizer.initialize()
            words = list(self._tokenizer.FREQ)
            self.byte_dict = None
        else:
            assert cache_dir is not None
            path = cache_dir / "cat-userdict.txt"
            path.write_bytes(userdict)
            self._tokenizer.set_dictionary(str(path))
            self._tokenizer.initialize()
            words = [w for w, freq in self._tokenizer.FREQ.items() if freq > 0]
            self.byte_dict = userdict
        vocab = OrderedDict()
        for w in ["<s>", "<unk>", *words]:
            vocab.setdefault(w, None)  # a repeated key keeps its first place, as in CAT's OrderedDict(list)
        for i, w in enumerate(vocab):
            vocab[w] = i
        self._vocabulary = vocab
        self._reverse_vocab = tuple(vocab)

    def cut(self, s: str) -> Iterator[str]:
        return (w for w in self._tokenizer.cut(s.strip(), HMM=False) if w != " ")

    def encode(self, s: str) -> list[int]:
        unk = self._vocabulary["<unk>"]
        return [self._vocabulary.get(w, unk) for w in self.cut(s)]

    @property
    def vocab_size(self) -> int:
        return len(self._vocabulary)

    def state_dict(self) -> OrderedDict:
        return OrderedDict([("vocab", self._vocabulary), ("reverse-vocab", self._reverse_vocab),
                            ("dict-data", self.byte_dict)])


class SimpleTokenizer(_CatTokenizer):
    def __init__(self, units: list[str]) -> None:
        self._r_vocab = OrderedDict([("<s>", 0), ("<unk>", 1)])
        for u in units:
            if u not in self._r_vocab:
                self._r_vocab[u] = len(self._r_vocab)

    def encode(self, s: str) -> list[int]:
        return [self._r_vocab.get(u, 1) for u in s.split()]

    @property
    def vocab_size(self) -> int:
        return len(self._r_vocab)

    def state_dict(self) -> OrderedDict:
        return self._r_vocab


class LexiconTokenizer(_CatTokenizer):
    def __init__(self, lexicon: str, add_special_token: bool = True) -> None:
        self._bos_token, self._unk_token, self.sort_units = "<s>", "<unk>", False
        entries: dict[str, list[str]] = {}
        for line in Path(lexicon).read_text(encoding="utf-8").splitlines():
            fields = re.sub(r"\s+", " ", line).strip().split()
            entries.setdefault(fields[0], fields[1:])  # the first pronunciation wins
        units: dict[str, int] = {}
        w2u: OrderedDict = OrderedDict()
        if add_special_token:
            units.update({"<s>": 0, "<unk>": 1})
            w2u.update({"<s>": (0,), "<unk>": (1,)})
        first = len(units)
        units.update({u: first + k for k, u in enumerate(set().union(*entries.values()))})
        for word, us in entries.items():
            w2u[word] = tuple(units[u] for u in us)
        self._w2pid = w2u
        self._units = units

    def encode(self, s: str) -> list[int]:
        unk = self._w2pid[self._unk_token]
        return [i for w in s.split() for i in self._w2pid.get(w, unk)]

    @property
    def vocab_size(self) -> int:
        return len(self._units)


class JiebaComposeLexiconTokenizer(JiebaTokenizer):
    def __init__(self, lexicon: str, userdict: bytes | None = None, *, cache_dir: Path | None = None) -> None:
        super().__init__(userdict, cache_dir=cache_dir)
        self._w2p_tokenizer = LexiconTokenizer(lexicon)
        self._vocabulary.clear()
        self._reverse_vocab = tuple()

    def encode(self, s: str) -> list[int]:
        return [i for w in self.cut(s) for i in self._w2p_tokenizer.encode(w)]

    @property
    def vocab_size(self) -> int:
        return self._w2p_tokenizer.vocab_size

    def state_dict(self) -> OrderedDict:
        state = super().state_dict()
        state.update({"w2p": pickle.dumps(self._w2p_tokenizer)})
        return state


CLASSES = (SentencePieceTokenizer, JiebaTokenizer, SimpleTokenizer, LexiconTokenizer, JiebaComposeLexiconTokenizer)


@contextlib.contextmanager
def cat_module() -> Iterator[types.ModuleType]:
    """``cat.shared.tokenizer`` exists (holding the classes above) only inside this block, so pickles
    made here name CAT's classes, and nothing named ``cat`` is importable once it is over."""
    saved = {name: sys.modules.get(name) for name in ("cat", "cat.shared", CAT_MODULE)}
    module = types.ModuleType(CAT_MODULE)
    for cls in CLASSES:
        cls.__module__ = CAT_MODULE
        setattr(module, cls.__name__, cls)
    sys.modules.update({"cat": types.ModuleType("cat"), "cat.shared": types.ModuleType("cat.shared"),
                        CAT_MODULE: module})
    try:
        yield module
    finally:
        for cls in CLASSES:
            cls.__module__ = __name__
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def tknz(obj: _CatTokenizer, path: Path, protocol: int | None = None) -> Path:
    """What CAT's ``tokenizer.save(obj, path)`` writes: ``pickle.dump(obj)``."""
    with cat_module(), open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return path


# ---------------------------------------------------------------------------------------------
# ~600 real-looking transcripts: the demo corpus's English and Mandarin, recombined, code-switched,
# word-segmented with spaces, and with the whitespace and characters real transcripts carry.

RARE = ["火星", "☃", "龘", "Ω", "é"]


def demo_transcripts() -> list[str]:
    lines = []
    for part in ("train", "dev"):
        for line in (REPO / "egs" / "demo" / "data" / part / "text").read_text(encoding="utf-8").splitlines():
            _, _, text = line.partition(" ")
            lines.append(text)
    return lines


def corpus(n: int = 600, seed: int = 19) -> list[str]:
    rng = random.Random(seed)
    demo = demo_transcripts()
    en = [t for t in demo if t.isascii()]
    zh = [t for t in demo if not t.isascii()]
    en_words = sorted({w.lower() for t in en for w in t.split()})
    out: list[str] = []
    for i in range(n):
        kind = i % 8
        if kind == 0:
            text = rng.choice(en)
        elif kind == 1:
            text = f"{rng.choice(en)} {rng.choice(en)}".lower()
        elif kind == 2:
            text = rng.choice(zh)
        elif kind == 3:  # code-switched
            text = f"{rng.choice(zh)}{' '.join(rng.sample(en_words, 2))}{rng.choice(zh)}"
        elif kind == 4:  # word-segmented Mandarin: spaces between words
            t = rng.choice(zh)
            cuts = sorted(rng.sample(range(1, len(t)), min(3, len(t) - 1))) if len(t) > 1 else []
            text = " ".join(t[a:b] for a, b in zip([0, *cuts], [*cuts, len(t)]))
        elif kind == 5:  # numbers, full-width punctuation, mixed case
            text = f"{rng.choice(zh)}，{rng.randint(0, 2025)}年 {rng.choice(en).title()}。"
        elif kind == 6:  # whitespace as real transcripts carry it
            sep = rng.choice(["  ", "\t", "\u3000", " \u3000 "])
            text = f" {rng.choice(zh)}{sep}{rng.choice(en).lower()}{sep}{rng.choice(zh)} "
        else:  # unseen characters
            text = f"{rng.choice(zh)}{rng.choice(RARE)}{rng.choice(en).lower()} {rng.choice(RARE)}"
        out.append(text)
    return out
