"""SentencePiece models, with CAT's ids and optional subword sampling."""

from __future__ import annotations

import base64
from typing import Any, Sequence

from wdsprep.tokenizer.base import BOS, BOS_ID, UNK, UNK_ID, SubwordSampling, TokenizerBase, check_ids, derive_seed


class SentencePieceTokenizer(TokenizerBase):
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
        check_ids(ids, self.vocab_size)
        return self._sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        check_ids([i], self.vocab_size)
        return self._sp.id_to_piece(i)

    def to_dict(self) -> dict[str, Any]:
        # num_threads is a property of the machine, not of the tokenizer: not saved.
        return {"model": base64.b64encode(self._proto).decode("ascii")}
