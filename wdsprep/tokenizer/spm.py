"""SentencePiece models, with CAT's ids and optional subword sampling."""

from __future__ import annotations

import base64
import binascii
import warnings
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.base import (
    BOS,
    BOS_ID,
    UNK,
    UNK_ID,
    FieldError,
    SubwordSampling,
    TokenizerBase,
    check_ids,
    derive_seed,
    field,
)


class SentencePieceTokenizer(TokenizerBase):
    """A SentencePiece model; ids are the model's own, so a model CAT trained keeps CAT's ids.

    ``wdsprep tokenizer train`` makes models with ``<s>`` = 0, ``<unk>`` = 1, no eos/pad, as CAT
    does; a model made otherwise is used as it is (:meth:`id_convention_problem` says how it differs).

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
        if self.vocab_size < 2:
            raise ValueError(f"a sentencepiece model with {self.vocab_size} pieces")
        # Threads per call: 1 by default because DataLoader workers already use the cores.
        self.num_threads = num_threads
        self._seed = 0
        self._calls = 0

    def id_convention_problem(self) -> str | None:
        """How the model's ids differ from CAT's convention (0 = ``<s>``/blank, 1 = ``<unk>``), or None.

        Such a model still encodes exactly as sentencepiece (and CAT) would; but a CTC or
        transducer model takes id 0 as its blank, so id 0 should be no real piece.
        """
        zero = self._sp.id_to_piece(BOS_ID)
        problems = []
        if zero != BOS:
            problems.append(f"id 0 is {zero!r}, not {BOS!r} (CTC/transducer models use id 0 as the blank)")
        if self._sp.unk_id() != UNK_ID:
            problems.append(f"{UNK!r} is id {self._sp.unk_id()}, not {UNK_ID}")
        return "; ".join(problems) or None

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
        check_ids(ids, self.vocab_size)
        return self._sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        check_ids([i], self.vocab_size)
        return self._sp.id_to_piece(i)

    def to_dict(self) -> dict[str, Any]:
        # num_threads is a property of the machine, not of the tokenizer: not saved.
        return {"model": base64.b64encode(self._proto).decode("ascii")}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> SentencePieceTokenizer:
        model = field(doc, "model", lambda x: isinstance(x, str), "the .model file as base64 text")
        try:
            proto = base64.b64decode(model, validate=True)
        except (binascii.Error, ValueError) as e:  # ValueError: a character outside ASCII
            raise FieldError(f"has a 'model' field that is not base64 ({e})") from None
        return cls(proto, num_threads=num_threads)


def sentencepiece_from_model(proto: bytes, where: str, *, num_threads: int = 1) -> SentencePieceTokenizer | None:
    """A tokenizer from the bytes of a sentencepiece ``.model`` (a protobuf, read without pickle), or
    None when they are not one.  A model whose ids break CAT's convention warns and is used as it is."""
    if not proto:
        return None
    try:
        tok = SentencePieceTokenizer(proto, num_threads=num_threads)
    except (RuntimeError, ValueError):
        return None
    problem = tok.id_convention_problem()
    if problem:
        warnings.warn(f"{where}: {problem}; its ids are kept as they are, so a model trained on them keeps working",
                      UserWarning, stacklevel=3)
    return tok
