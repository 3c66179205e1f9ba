"""What every tokenizer kind shares: the id convention, the interface, subword sampling, seeding."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

from wdsprep.files import make_dir, write_text

PathLike = str | os.PathLike

FORMAT = "wdsprep-tokenizer"
# The newest file version this wdsprep reads and writes.  A file says the lowest version that
# holds everything in it (TokenizerBase.file_version), so files older readers can use stay 1.
VERSION = 2
# Kinds train_tokenizer makes; a file may also hold a "lexicon" (imported from CAT).
KINDS = ("sentencepiece", "jieba", "char", "simple")
FILE_KINDS = (*KINDS, "lexicon")
SPM_MODEL_TYPES = ("unigram", "bpe", "char")
BOS, UNK = "<s>", "<unk>"
BOS_ID, UNK_ID = 0, 1
# A visible piece for the space in the char tokenizer; a literal " " in a vocab listing is unreadable.
SPACE = "<space>"
# Options that would break the id convention if a user overrode them through ``spm_options``.
SPM_FIXED = frozenset({"bos_id", "unk_id", "eos_id", "pad_id", "bos_piece", "unk_piece", "unk_surface",
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


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {i} is outside the vocabulary (0..{vocab_size - 1}); "
                             f"were these ids made by another tokenizer?")


class TokenizerBase:
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

    def file_version(self) -> int:
        """The lowest file version that holds this tokenizer (see ``VERSION``)."""
        return 1

    def save(self, path: PathLike, *, overwrite: bool = False) -> None:
        """Write the tokenizer as one JSON file, atomically (a crash never leaves half a file)."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
        make_dir(path.parent)
        doc = {"format": FORMAT, "version": self.file_version(), "kind": self.kind, "vocab_size": self.vocab_size,
               **self.to_dict()}
        write_text(path, json.dumps(doc, ensure_ascii=False, indent=1) + "\n")

    def __reduce__(self) -> tuple[Any, ...]:
        # DataLoader workers started with "spawn" pickle the dataset; native handles (the spm
        # processor, jieba's lock) cannot be pickled, so rebuild from the same state the file holds.
        from wdsprep.tokenizer.file import from_doc

        return (from_doc, ({"kind": self.kind, **self.to_dict()}, "<pickled tokenizer>",
                            getattr(self, "num_threads", 1)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind!r} vocab_size={self.vocab_size}>"


class VocabTokenizer(TokenizerBase):
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
        check_ids([i], self.vocab_size)
        return self._pieces[i]
