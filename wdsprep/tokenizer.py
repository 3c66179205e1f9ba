"""Tokenizers that turn raw transcripts into label ids on the fly: SentencePiece, jieba words, characters.

Ids follow CAT for every kind: 0 is ``<s>`` (also the CTC/transducer blank), 1 is ``<unk>``.

A trained tokenizer is saved as ONE JSON file (never a pickle, so loading it cannot run code)::

    {"format": "wdsprep-tokenizer", "version": 1, "kind": "...", "vocab_size": N, ...}

- ``sentencepiece``: ``"model"`` holds the serialized SentencePiece ModelProto as base64; it is the
  exact ``.model`` file sentencepiece would write, so ``base64 -d`` gives a file ``spm_encode`` reads.
- ``jieba``: ``"vocab"`` (list, index = id) and ``"user_dict"`` (``[word, freq-or-null]`` entries
  added to a private ``jieba.Tokenizer``), so loading needs no other file.
- ``char``: ``"vocab"`` (list, index = id) and ``"keep_spaces"``.

sentencepiece and jieba are imported only inside the classes that need them, so ``import wdsprep``
stays cheap.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from wdsprep.files import write_text
from wdsprep.prep.kaldi import iter_table

PathLike = str | os.PathLike

FORMAT = "wdsprep-tokenizer"
VERSION = 1
KINDS = ("sentencepiece", "jieba", "char")
SPM_MODEL_TYPES = ("unigram", "bpe", "char")
BOS, UNK = "<s>", "<unk>"
BOS_ID, UNK_ID = 0, 1
# A visible piece for the space in the char tokenizer; a literal " " in a vocab listing is unreadable.
SPACE = "<space>"
# Options that would break the id convention if a user overrode them through ``spm_options``.
_SPM_FIXED = frozenset({"bos_id", "unk_id", "eos_id", "pad_id", "bos_piece", "unk_piece", "unk_surface",
                        "vocab_size", "model_type", "minloglevel", "input", "model_prefix",
                        "sentence_iterator", "model_writer"})


class TokenizerFileError(ValueError):
    """A tokenizer file is missing, not ours, or damaged; the message names the file."""


@dataclass(frozen=True)
class SubwordSampling:
    """SentencePiece subword sampling, applied freshly each time a transcript is encoded.

    unigram: ``alpha`` smooths the sampling distribution, ``nbest_size=-1`` samples from the whole
    lattice (or from the n best when > 1). bpe: ``alpha`` is the BPE-dropout probability and
    ``nbest_size`` is ignored by sentencepiece.
    """

    alpha: float = 0.1
    nbest_size: int = -1

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"SubwordSampling.alpha must be > 0, got {self.alpha}")
        if self.nbest_size in (0, 1) or self.nbest_size < -1:
            raise ValueError(f"SubwordSampling.nbest_size must be -1 (whole lattice) or > 1, got {self.nbest_size}")


@runtime_checkable
class Tokenizer(Protocol):
    """What the loader and the CLI use; every kind implements it."""

    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], *, sampling: SubwordSampling | None = None) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def seed(self, seed: int) -> None: ...

    def id_to_piece(self, i: int) -> str: ...

    def save(self, path: PathLike, *, overwrite: bool = False) -> None: ...


def derive_seed(*parts: int) -> int:
    """A 32-bit seed from any integers, e.g. ``derive_seed(seed, epoch, rank, worker)``.

    Hashing (not adding) keeps nearby tuples such as (epoch=1, rank=0) and (epoch=0, rank=1) apart.
    """
    h = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=4)
    return int.from_bytes(h.digest(), "little")


def _quiet_jieba() -> Any:
    import jieba

    # jieba logs "Building prefix dict..." at DEBUG on every new Tokenizer; keep stderr for real problems.
    jieba.setLogLevel(logging.WARNING)
    return jieba


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {i} is outside the vocabulary (0..{vocab_size - 1}); "
                             f"were these ids made by another tokenizer?")


class _Base:
    kind = ""
    vocab_size = 0

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str], *, sampling: SubwordSampling | None = None) -> list[list[int]]:
        """Encode many transcripts; ``sampling`` only exists for SentencePiece."""
        if sampling is not None:
            raise ValueError(f"subword sampling needs a sentencepiece tokenizer; this one is {self.kind!r} "
                             f"(drop the sampling option or train with --kind sentencepiece)")
        return [self.encode(t) for t in texts]

    def seed(self, seed: int) -> None:
        """Encoding is deterministic for this kind; nothing to seed."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, path: PathLike, *, overwrite: bool = False) -> None:
        """Write the tokenizer as one JSON file, atomically (a crash never leaves half a file)."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "version": VERSION, "kind": self.kind, "vocab_size": self.vocab_size,
               **self.to_dict()}
        write_text(path, json.dumps(doc, ensure_ascii=False, indent=1) + "\n")

    def __reduce__(self) -> tuple[Any, ...]:
        # DataLoader workers started with "spawn" pickle the dataset; native handles (the spm
        # processor, jieba's lock) cannot be pickled, so rebuild from the same state the file holds.
        return (_from_doc, ({"kind": self.kind, **self.to_dict()}, "<pickled tokenizer>",
                            getattr(self, "num_threads", 1)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind!r} vocab_size={self.vocab_size}>"


class _VocabTokenizer(_Base):
    """Shared by char and jieba: an explicit list of pieces whose index is the id."""

    def __init__(self, vocab: Sequence[str]) -> None:
        vocab = list(vocab)
        if vocab[:2] != [BOS, UNK]:
            raise ValueError(f"vocabulary must start with {BOS!r}, {UNK!r} (ids 0 and 1), got {vocab[:2]}")
        if len(set(vocab)) != len(vocab):
            dup = next(p for p, n in Counter(vocab).items() if n > 1)
            raise ValueError(f"vocabulary lists {dup!r} twice")
        self._pieces = vocab
        self._ids = {p: i for i, p in enumerate(vocab)}
        self.vocab_size = len(vocab)

    def id_to_piece(self, i: int) -> str:
        _check_ids([i], self.vocab_size)
        return self._pieces[i]


class CharTokenizer(_VocabTokenizer):
    """One id per character.

    Whitespace: leading/trailing whitespace is dropped and each inner run of whitespace becomes one
    ``<space>`` token (id 2) when ``keep_spaces`` (the default; word boundaries matter for English),
    or is dropped when not (Mandarin transcripts whose spaces are arbitrary word segmentation).
    So ``decode(encode(t)) == " ".join(t.split())`` for in-vocabulary text.
    """

    kind = "char"

    def __init__(self, vocab: Sequence[str], *, keep_spaces: bool = True) -> None:
        super().__init__(vocab)
        self.keep_spaces = keep_spaces
        if keep_spaces and self._ids.get(SPACE) != 2:
            raise ValueError(f"a char vocabulary with keep_spaces must have {SPACE!r} at id 2")
        self._space_id = self._ids.get(SPACE, UNK_ID)

    @staticmethod
    def pieces_of(text: str, keep_spaces: bool) -> Iterator[str]:
        words = text.split()
        for k, w in enumerate(words):
            if k and keep_spaces:
                yield SPACE
            yield from w

    def encode(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(p, UNK_ID) for p in self.pieces_of(text, self.keep_spaces)]

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(ids, self.vocab_size)
        # Id 0 is the blank/<s> and carries no text.
        return "".join(" " if i == self._space_id and self.keep_spaces else self._pieces[i] for i in ids if i)

    def to_dict(self) -> dict[str, Any]:
        return {"keep_spaces": self.keep_spaces, "vocab": self._pieces}


def _is_latin_edge(c: str) -> bool:
    return c.isascii() and c.isalnum()


class JiebaTokenizer(_VocabTokenizer):
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
        self._jieba = _make_jieba(self.user_dict)

    def cut(self, text: str) -> list[str]:
        """Words of ``text`` with whitespace removed."""
        return [w for w in self._jieba.cut(text, HMM=False) if not w.isspace()]

    def encode(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(w, UNK_ID) for w in self.cut(text)]

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(ids, self.vocab_size)
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


def _make_jieba(user_dict: Sequence[Sequence[Any]]) -> Any:
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


class SentencePieceTokenizer(_Base):
    """A SentencePiece model trained with ``<s>`` = 0, ``<unk>`` = 1, no eos/pad (as CAT does).

    ``encode`` is deterministic. ``encode_batch(..., sampling=...)`` samples a segmentation per
    transcript with sentencepiece's batched encoder. sentencepiece restarts its sampling RNG from its
    global seed on every batched call, so before each sampled call we set that seed to
    ``derive_seed(seed, call_number)``: the same ``seed()`` and the same sequence of calls give the
    same segmentations, and successive calls differ.
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, *, num_threads: int = 1) -> None:
        import sentencepiece as spm

        self._spm = spm
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.vocab_size = int(self._sp.vocab_size())
        if self.vocab_size < 2 or self._sp.id_to_piece(BOS_ID) != BOS or self._sp.unk_id() != UNK_ID:
            raise ValueError(f"sentencepiece model must have {BOS!r} at id 0 and {UNK!r} at id 1 (CAT's "
                             f"convention); retrain it with wdsprep tokenizer train --kind sentencepiece")
        # Threads per call: 1 by default because DataLoader workers already use the cores.
        self.num_threads = num_threads
        self._seed = 0
        self._calls = 0

    def seed(self, seed: int) -> None:
        """Make subword sampling repeatable: the same seed gives the same segmentations."""
        self._seed = int(seed)
        self._calls = 0

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], *, sampling: SubwordSampling | None = None) -> list[list[int]]:
        texts = list(texts)
        if sampling is None:
            return self._sp.encode(texts, num_threads=self.num_threads)
        self._spm.set_random_generator_seed(derive_seed(self._seed, self._calls))
        self._calls += 1
        return self._sp.encode(texts, enable_sampling=True, alpha=sampling.alpha, nbest_size=sampling.nbest_size,
                               num_threads=self.num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        _check_ids(ids, self.vocab_size)
        return self._sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        _check_ids([i], self.vocab_size)
        return self._sp.id_to_piece(i)

    def to_dict(self) -> dict[str, Any]:
        # num_threads is a property of the machine, not of the tokenizer: not saved.
        return {"model": base64.b64encode(self._proto).decode("ascii")}


def _transcripts(text_files: Sequence[PathLike]) -> Iterator[str]:
    for path in text_files:
        for e in iter_table(path, allow_empty_value=True):
            if e.value.strip():
                yield e.value


def _ranked(counts: Counter[str], limit: int | None) -> list[str]:
    # Frequency first, then the piece itself: the vocabulary does not depend on file order.
    ranked = sorted(counts, key=lambda p: (-counts[p], p))
    return ranked if limit is None else ranked[:limit]


def _check_vocab_size(vocab_size: int | None, specials: int) -> None:
    if vocab_size is not None and vocab_size <= specials:
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the {specials} special tokens")


def train_tokenizer(kind: str, text_files: Sequence[PathLike], out: PathLike, *, vocab_size: int | None = None,
                    model_type: str = "unigram", user_dict: PathLike | None = None, keep_spaces: bool = True,
                    character_coverage: float = 0.9995, spm_options: Mapping[str, Any] | None = None,
                    overwrite: bool = False) -> Tokenizer:
    """Train a tokenizer on the transcripts of Kaldi ``text`` files, save it to ``out``, return it.

    ``vocab_size`` counts every id including ``<s>`` and ``<unk>``; required for sentencepiece
    (except ``model_type="char"``), optional for char/jieba (the most frequent pieces are kept).
    ``model_type`` and ``character_coverage`` apply to sentencepiece, ``user_dict`` to jieba,
    ``keep_spaces`` to char. ``spm_options`` are passed to ``SentencePieceTrainer.train`` (e.g.
    ``input_sentence_size``), except options that would break the id convention.
    Empty transcripts are skipped.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}")
    # One path where a list was meant must not become a list of characters.
    files = [text_files] if isinstance(text_files, (str, os.PathLike)) else list(text_files)
    if not files:
        raise ValueError("no training text given; pass one or more Kaldi text files")
    if user_dict is not None and kind != "jieba":
        raise ValueError(f"a user dictionary is for --kind jieba, not {kind!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    tok: _Base
    if kind == "char":
        _check_vocab_size(vocab_size, 3 if keep_spaces else 2)
        counts = Counter(p for t in _transcripts(files) for p in CharTokenizer.pieces_of(t, False))
        specials = [BOS, UNK] + ([SPACE] if keep_spaces else [])
        counts.pop(SPACE, None)
        limit = None if vocab_size is None else vocab_size - len(specials)
        tok = CharTokenizer(specials + _ranked(counts, limit), keep_spaces=keep_spaces)
    elif kind == "jieba":
        _check_vocab_size(vocab_size, 2)
        entries = read_user_dict(user_dict) if user_dict is not None else []
        cutter = _make_jieba(entries)
        counts = Counter(w for t in _transcripts(files) for w in cutter.cut(t, HMM=False) if not w.isspace())
        for special in (BOS, UNK):
            counts.pop(special, None)
        limit = None if vocab_size is None else vocab_size - 2
        tok = JiebaTokenizer([BOS, UNK] + _ranked(counts, limit), user_dict=entries)
    else:
        tok = SentencePieceTokenizer(_train_spm(files, vocab_size, model_type, character_coverage,
                                                dict(spm_options or {})))
    tok.save(out, overwrite=overwrite)
    return tok  # type: ignore[return-value]


def _train_spm(text_files: Sequence[PathLike], vocab_size: int | None, model_type: str, character_coverage: float,
               options: dict[str, Any]) -> bytes:
    import sentencepiece as spm

    if model_type not in SPM_MODEL_TYPES:
        raise ValueError(f"unknown sentencepiece model type {model_type!r}; choose one of {', '.join(SPM_MODEL_TYPES)}")
    clash = sorted(_SPM_FIXED & options.keys())
    if clash:
        raise ValueError(f"spm_options may not set {', '.join(clash)}: wdsprep fixes them (ids 0=<s>, 1=<unk>)")
    texts = list(_transcripts(text_files))
    if not texts:
        raise ValueError(f"no non-empty transcript in {', '.join(map(str, text_files))}; nothing to train on")
    if vocab_size is None:
        if model_type != "char":
            raise ValueError("a sentencepiece unigram/bpe tokenizer needs vocab_size (CLI: --vocab-size N)")
        # Every character (plus the word-boundary piece and the specials) fits; hard_vocab_limit
        # off lets sentencepiece stop below this.
        vocab_size = len({c for t in texts for c in t}) + 3
        options.setdefault("hard_vocab_limit", False)
    _check_vocab_size(vocab_size, 2)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage,
            bos_id=BOS_ID, bos_piece=BOS, unk_id=UNK_ID, unk_piece=UNK, unk_surface=UNK, eos_id=-1, pad_id=-1,
            minloglevel=2,  # otherwise ~65 lines of trainer_interface INFO on stderr
            **options)
    except RuntimeError as e:
        # e.g. "Vocabulary size too high (500). Please set it to a value <= 231."
        raise ValueError(f"sentencepiece training failed on {', '.join(map(str, text_files))}: {e}") from None
    return model.getvalue()


def _from_doc(doc: Mapping[str, Any], where: str, num_threads: int = 1) -> Tokenizer:
    kind = doc.get("kind")
    try:
        if kind == "sentencepiece":
            proto = base64.b64decode(doc["model"], validate=True)
            return SentencePieceTokenizer(proto, num_threads=num_threads)  # type: ignore[return-value]
        if kind == "char":
            return CharTokenizer(doc["vocab"], keep_spaces=bool(doc["keep_spaces"]))  # type: ignore[return-value]
        if kind == "jieba":
            return JiebaTokenizer(doc["vocab"], user_dict=doc.get("user_dict") or [])  # type: ignore[return-value]
    except KeyError as e:
        raise TokenizerFileError(f"{where}: {kind} tokenizer lacks the {e.args[0]!r} field; the file is damaged, "
                                 f"retrain it with wdsprep tokenizer train") from None
    except (binascii.Error, RuntimeError, ValueError, TypeError) as e:
        raise TokenizerFileError(f"{where}: damaged {kind} tokenizer ({e}); retrain it with wdsprep tokenizer train") from None
    raise TokenizerFileError(f"{where}: unknown tokenizer kind {kind!r}; this version knows {', '.join(KINDS)}")


def load_tokenizer(path: PathLike, *, num_threads: int = 1) -> Tokenizer:
    """Load a tokenizer saved by :func:`train_tokenizer` (one JSON file).

    ``num_threads``: threads per SentencePiece ``encode_batch`` call. 1 suits DataLoader workers,
    which already keep the cores busy; a single-process loader may use more (-1 = all cores).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such tokenizer file; make one with wdsprep tokenizer train") from None
    except IsADirectoryError:
        raise TokenizerFileError(f"{path}: is a directory; pass the tokenizer's JSON file") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        hint = " (it looks like a pickle, e.g. CAT's tokenizer.json; wdsprep never unpickles)" if raw[:1] == b"\x80" else ""
        raise TokenizerFileError(f"{path}: not a wdsprep tokenizer file, it is not JSON{hint}; "
                                 f"train one with wdsprep tokenizer train") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TokenizerFileError(f"{path}: JSON but not a wdsprep tokenizer (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise TokenizerFileError(f"{path}: tokenizer file version {doc.get('version')!r}; this wdsprep reads "
                                 f"version {VERSION}")
    tok = _from_doc(doc, str(path), num_threads)
    if "vocab_size" in doc and doc["vocab_size"] != tok.vocab_size:
        raise TokenizerFileError(f"{path}: says vocab_size {doc['vocab_size']} but holds {tok.vocab_size} pieces; "
                                 f"the file is damaged")
    return tok
