"""What every tokenizer kind shares: the id convention, the interface, subword sampling, seeding."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from wdsprep.errors import DataError
from wdsprep.files import make_dir, write_text
from wdsprep.format.shardlist import file_kind
from wdsprep.prep.kaldi import iter_table

PathLike = str | os.PathLike

FORMAT = "wdsprep-tokenizer"
# The newest file version this wdsprep reads and writes.  A file says the lowest version that
# holds everything in it (TokenizerBase.stored_version), so files older readers can use stay 1.
# 3: special tokens (a reader that does not know them would split them into pieces).
VERSION = 3
BOS, UNK = "<s>", "<unk>"
BOS_ID, UNK_ID = 0, 1
# A visible piece for the space in the char tokenizer; a literal " " in a vocab listing is unreadable.
SPACE = "<space>"


class TokenizerFileError(DataError):
    """A tokenizer file is missing, not ours, or damaged; the message names the file."""


class FieldError(ValueError):
    """A field of a tokenizer's stored form is missing or not what it must be.

    The message completes "<kind> tokenizer ..." ("lacks the 'vocab' field"); the reader of the
    file adds the file."""


def read_tokenizer_file(path: Path, what: str, missing: str) -> bytes:
    """The bytes of the tokenizer file ``path`` (``what`` it should be, for messages).

    FileNotFoundError saying ``missing`` (what to do) when it is absent; TokenizerFileError for a
    directory, a FIFO or another file that is not a regular one (reading a FIFO would wait for good).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {missing}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TokenizerFileError(f"{path}: is a {file_kind(mode)}, not a file; pass {what}")
        return f.read()


def describe(value: Any, *, bare: bool = False, limit: int = 80) -> str:
    """At most ``limit`` characters saying what ``value`` (read from a tokenizer file) is, for messages.

    Looks at a few items two levels down, never more: ``repr`` of a crafted value walks all of it
    (a tuple nested 2,000,000 deep, a DAG of 2^80 nodes) and a huge integer has no decimal ``repr``.
    ``bare`` writes a string without quotes.
    """
    text = value[:limit] if bare and isinstance(value, str) else _sketch(value, 2, limit)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sketch(x: Any, depth: int, limit: int) -> str:
    if isinstance(x, (str, bytes, bytearray)):
        return repr(x[:limit])
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
        return f"<an integer of {x.bit_length()} bits>"
    if isinstance(x, (list, tuple, set, frozenset, dict)):
        if depth == 0:
            return f"<{type(x).__name__} of {len(x)}>"
        if isinstance(x, dict):
            parts = [f"{_sketch(k, depth - 1, limit)}: {_sketch(v, depth - 1, limit)}" for k, v in islice(x.items(), 3)]
        else:
            parts = [_sketch(i, depth - 1, limit) for i in islice(x, 3)]
        brackets = {list: "[]", tuple: "()"}.get(type(x), "{}")
        return brackets[0] + ", ".join(parts) + (", ..." if len(x) > 3 else "") + brackets[1]
    # Numbers, None, and the few types of the readers themselves (a CAT object, a pickle global),
    # whose repr is short.
    return repr(x)[:limit]


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


class Specials:
    """A tokenizer's special tokens: symbols (a language tag ``<|en|>``, a task ``<|transcribe|>``,
    a noise mark ``[laughter]``) each encoded as one id wherever they appear in a text, never split
    and never changed by a text treatment; the text between them is encoded as it would be alone
    (ESPnet's non-linguistic symbols, WeNet's ``non_lang_syms``, NeMo's special tokens)."""

    def __init__(self, ids: Mapping[str, int] | None = None) -> None:
        self.ids = dict(ids or {})
        for s in self.ids:
            if not isinstance(s, str) or not s or s != s.strip() or len(s.split()) != 1:
                raise ValueError(f"special token {describe(s)}: a special token is one word without spaces, e.g. "
                                 f"<|en|>")
        # The longest first, so a symbol that holds another is matched whole.
        self._pattern = re.compile("|".join(map(re.escape, sorted(self.ids, key=lambda s: (-len(s), s))))) \
            if self.ids else None

    def __bool__(self) -> bool:
        return bool(self.ids)

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(self.ids)

    def split(self, text: str) -> list[str | int]:
        """``text`` as its plain stretches (non-empty) and its special tokens' ids, in order."""
        if self._pattern is None:
            return [text] if text else []
        out: list[str | int] = []
        at = 0
        for m in self._pattern.finditer(text):
            if m.start() > at:
                out.append(text[at:m.start()])
            out.append(self.ids[m.group()])
            at = m.end()
        if at < len(text):
            out.append(text[at:])
        return out

    def encode_batch(self, texts: Sequence[str], plain: Callable[[list[str]], list[list[int]]]) -> list[list[int]]:
        """Each text's ids: its special tokens' own, the stretches between them by ``plain`` (one
        call for all of them, so a sampling tokenizer draws in one sequence)."""
        if self._pattern is None:
            return plain(list(texts))
        parts = [self.split(t) for t in texts]
        stretches = [p for ps in parts for p in ps if isinstance(p, str)]
        encoded = iter(plain(stretches) if stretches else [])
        return [[i for p in ps for i in ([p] if isinstance(p, int) else next(encoded))] for ps in parts]

    def plain(self, text: str, treat: Callable[[str], str]) -> str:
        """``text`` with ``treat`` applied to the stretches between its special tokens (a text
        treatment that would lowercase or strip a tag's punctuation leaves the tags whole)."""
        if self._pattern is None:
            return treat(text)
        return "".join(self.symbol(p) if isinstance(p, int) else treat(p) for p in self.split(text))

    def symbol(self, i: int) -> str:
        return next(s for s, j in self.ids.items() if j == i)

    def strip(self, text: str) -> str:
        """``text`` without its special tokens (what a tokenizer learns its pieces from)."""
        return " ".join(p for p in self.split(text) if isinstance(p, str))


def special_tokens_field(doc: Mapping[str, Any]) -> list[str]:
    """A stored tokenizer's ``special_tokens`` (none when absent: files made before them)."""
    return field(doc, "special_tokens", is_texts, "a list of strings", default=[])


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


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {describe(i)} is outside the vocabulary (0..{vocab_size - 1}); "
                             f"were these ids made by another tokenizer?")


_REQUIRED: Any = object()
T = TypeVar("T")


def field(doc: Mapping[str, Any], key: str, check: Callable[[Any], bool], expected: str,
          default: Any = _REQUIRED) -> Any:
    """``doc[key]`` if ``check`` accepts it (``default`` if the field is absent and has one);
    otherwise FieldError naming the field, what it must be and (briefly) what it is."""
    if key not in doc:
        if default is _REQUIRED:
            raise FieldError(f"lacks the {key!r} field")
        return default
    value = doc[key]
    if not check(value):
        raise FieldError(f"has field {key!r} = {describe(value)}, which must be {expected}")
    return value


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_texts(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(p, str) for p in x)


def is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(map(is_int, x))


class TokenizerBase:
    kind = ""
    vocab_size = 0
    specials = Specials()

    @classmethod
    def train(cls: type[T], text_files: Sequence[PathLike], vocab_size: int | None) -> T:
        """A tokenizer of this kind trained on the transcripts of Kaldi ``text`` files (empty ones
        skipped).  A kind's own options follow as keyword-only arguments, which
        :func:`~wdsprep.tokenizer.train.train_tokenizer` passes it; a kind that keeps this one
        (``lexicon``: imported from CAT) is not trained."""
        raise NotImplementedError

    @classmethod
    def trainable(cls) -> bool:
        """Whether ``train_tokenizer`` makes this kind (it has its own :meth:`train`)."""
        return cls.train.__func__ is not TokenizerBase.train.__func__  # type: ignore[attr-defined]

    @classmethod
    def train_options(cls) -> tuple[str, ...]:
        """The options of ``train_tokenizer`` this kind's :meth:`train` takes."""
        return tuple(p.name for p in inspect.signature(cls.train).parameters.values() if p.kind is p.KEYWORD_ONLY)

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
        """The tokenizer's fields as the file holds them (besides format, version, kind, vocab_size)."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls: type[T], doc: Mapping[str, Any], num_threads: int = 1) -> T:
        """The tokenizer :meth:`to_dict` describes; FieldError (a ValueError) names a field that is
        missing or of the wrong type, ValueError says what else is wrong."""
        raise NotImplementedError

    def file_version(self) -> int:
        """The lowest file version that holds this kind (see ``VERSION``)."""
        return 1

    def stored_version(self) -> int:
        """The lowest file version that holds this tokenizer: its kind's, or 3 with special tokens."""
        return max(self.file_version(), 3 if self.specials else 1)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return self.specials.symbols

    def specials_json(self) -> dict[str, Any]:
        """What the file holds of the special tokens (nothing without them: older files compare equal)."""
        return {"special_tokens": list(self.special_tokens)} if self.specials else {}

    def save(self, path: PathLike, *, overwrite: bool = False) -> None:
        """Write the tokenizer as one JSON file, atomically (a crash never leaves half a file)."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
        make_dir(path.parent)
        doc = {"format": FORMAT, "version": self.stored_version(), "kind": self.kind, "vocab_size": self.vocab_size,
               **self.to_dict()}
        write_text(path, json.dumps(doc, ensure_ascii=False, indent=1) + "\n")

    def __reduce__(self) -> tuple[Any, ...]:
        # DataLoader workers started with "spawn" pickle the dataset; native handles (the spm
        # processor, jieba's lock) cannot be pickled, so rebuild from the same state the file holds.
        return (type(self).from_dict, (self.to_dict(), getattr(self, "num_threads", 1)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind!r} vocab_size={self.vocab_size}>"


class VocabTokenizer(TokenizerBase):
    """Shared by char, jieba and simple: an explicit list of pieces whose index is the id, special
    tokens among them; a kind encodes the text between special tokens (:meth:`encode_plain`)."""

    def __init__(self, vocab: Sequence[str], special_tokens: Sequence[str] = ()) -> None:
        vocab = list(vocab)
        if vocab[:2] != [BOS, UNK]:
            raise ValueError(f"vocabulary must start with {BOS!r}, {UNK!r} (ids 0 and 1), got {describe(vocab[:2])}")
        if len(set(vocab)) != len(vocab):
            dup = next(p for p, n in Counter(vocab).items() if n > 1)
            raise ValueError(f"vocabulary lists {describe(dup)} twice")
        self._pieces = vocab
        self._ids = {p: i for i, p in enumerate(vocab)}
        self.vocab_size = len(vocab)
        missing = [s for s in special_tokens if s not in self._ids]
        if missing:
            raise ValueError(f"special tokens {missing} are not in the vocabulary")
        self.specials = Specials({s: self._ids[s] for s in special_tokens})

    def encode_plain(self, text: str) -> list[int]:
        """A text without special tokens."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.specials.encode_batch([text], lambda ts: [self.encode_plain(t) for t in ts])[0]

    def id_to_piece(self, i: int) -> str:
        check_ids([i], self.vocab_size)
        return self._pieces[i]


# -- the kinds -----------------------------------------------------------------------------------

K = TypeVar("K", bound=type[TokenizerBase])
# Every kind a tokenizer file may hold, by name: each kind's module registers its class, and
# wdsprep/tokenizer/__init__.py imports every kind's module.
REGISTRY: dict[str, type[TokenizerBase]] = {}


def register(cls: K) -> K:
    """Class decorator of a tokenizer kind: files of its ``kind`` are read with it and, when it has
    its own ``train``, ``train_tokenizer`` (and ``wdsprep tokenizer train --kind``) makes it."""
    assert cls.kind and REGISTRY.get(cls.kind, cls) is cls, f"two tokenizer classes of kind {cls.kind!r}"
    REGISTRY[cls.kind] = cls
    return cls


def file_kinds() -> tuple[str, ...]:
    """Every kind a tokenizer file may hold."""
    return tuple(sorted(REGISTRY))


def trainable_kinds() -> tuple[str, ...]:
    """The kinds ``train_tokenizer`` makes."""
    return tuple(k for k in file_kinds() if REGISTRY[k].trainable())


# -- what the kinds' training shares -------------------------------------------------------------

def transcripts(text_files: Sequence[PathLike]) -> Iterator[str]:
    """The non-empty transcripts of Kaldi ``text`` files."""
    for path in text_files:
        for e in iter_table(path, allow_empty_value=True):
            if e.value.strip():
                yield e.value


def check_special_tokens(special_tokens: Sequence[str], fixed: Sequence[str]) -> list[str]:
    """The special tokens given for training, checked: distinct symbols, none a fixed piece."""
    given = list(special_tokens)
    Specials(dict.fromkeys(given, 0))  # each one a word without spaces
    clash = [s for s in given if s in fixed]
    if clash or len(set(given)) != len(given):
        raise ValueError(f"special tokens {given}: each once, and none of {list(fixed)}")
    return given


def vocabulary(counts: Counter[str], vocab_size: int | None, specials: Sequence[str]) -> list[str]:
    """``specials``, then the most frequent other pieces of ``counts``: ``vocab_size`` in all (every
    piece when None)."""
    rest = Counter({p: n for p, n in counts.items() if p not in specials})
    # Frequency first, then the piece itself: the vocabulary does not depend on file order.
    order = sorted(rest, key=lambda p: (-rest[p], p))
    return [*specials, *(order if vocab_size is None else order[:vocab_size - len(specials)])]


def check_vocab_size(vocab_size: int | None, specials: int) -> None:
    if vocab_size is not None and vocab_size <= specials:
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the {specials} special tokens")
