"""SentencePiece models, with CAT's ids and optional subword sampling."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.base import (
    BOS,
    BOS_ID,
    UNK,
    UNK_ID,
    FieldError,
    PathLike,
    Specials,
    SubwordSampling,
    TokenizerBase,
    check_ids,
    check_special_tokens,
    check_vocab_size,
    derive_seed,
    field,
    register,
    special_tokens_field,
    transcripts,
)

SPM_MODEL_TYPES = ("unigram", "bpe", "char")
# Options that would break the id convention if a user overrode them through ``spm_options``.
SPM_FIXED = frozenset({"bos_id", "unk_id", "eos_id", "pad_id", "bos_piece", "unk_piece", "unk_surface",
                        "vocab_size", "model_type", "minloglevel", "input", "model_prefix",
                        "sentence_iterator", "model_writer"})


@register
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

    def __init__(self, model_proto: bytes, *, num_threads: int = 1, special_tokens: Sequence[str] = ()) -> None:
        import sentencepiece as spm

        self._spm = spm
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.vocab_size = int(self._sp.vocab_size())
        if self.vocab_size < 2:
            raise ValueError(f"a sentencepiece model with {self.vocab_size} pieces")
        # Each special token is a piece of the model (trained as a user-defined symbol); the text
        # between them is encoded alone, so a prompt changes nothing of the transcript's pieces.
        ids = {s: int(self._sp.piece_to_id(s)) for s in special_tokens}
        missing = [s for s, i in ids.items() if i == self._sp.unk_id() or self._sp.id_to_piece(i) != s]
        if missing:
            raise ValueError(f"special tokens {missing} are no pieces of this sentencepiece model: train it with them "
                             f"(tokenizer train --special-tokens)")
        self.specials = Specials(ids)
        # Threads per call: 1 by default because DataLoader workers already use the cores.
        self.num_threads = num_threads
        self._seed = 0
        self._calls = 0

    @classmethod
    def train(cls, text_files: Sequence[PathLike], vocab_size: int | None, *, model_type: str = "unigram",
              character_coverage: float = 0.9995, spm_options: Mapping[str, Any] | None = None,
              special_tokens: Sequence[str] = ()) -> SentencePieceTokenizer:
        given = check_special_tokens(special_tokens, [BOS, UNK])
        options = dict(spm_options or {})
        if given:  # pieces of their own, ids 2 on; never learned from the text around them
            listed = options.get("user_defined_symbols", [])
            listed = listed.split(",") if isinstance(listed, str) else list(listed)
            options["user_defined_symbols"] = given + [s for s in listed if s not in given]
        return cls(_train_spm(text_files, vocab_size, model_type, character_coverage, options), special_tokens=given)

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
        return self.specials.encode_batch([text], lambda ts: [self._sp.encode(t) for t in ts])[0]

    def encode_batch(self, texts: Sequence[str], *, sampling: SubwordSampling | None = None) -> list[list[int]]:
        return self.specials.encode_batch(list(texts), lambda ts: self._encode_batch(ts, sampling))

    def _encode_batch(self, texts: list[str], sampling: SubwordSampling | None) -> list[list[int]]:
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
        return {"model": base64.b64encode(self._proto).decode("ascii"), **self.specials_json()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], num_threads: int = 1) -> SentencePieceTokenizer:
        model = field(doc, "model", lambda x: isinstance(x, str), "the .model file as base64 text")
        try:
            proto = base64.b64decode(model, validate=True)
        except (binascii.Error, ValueError) as e:  # ValueError: a character outside ASCII
            raise FieldError(f"has a 'model' field that is not base64 ({e})") from None
        return cls(proto, num_threads=num_threads, special_tokens=special_tokens_field(doc))


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


def _train_spm(text_files: Sequence[PathLike], vocab_size: int | None, model_type: str, character_coverage: float,
               options: dict[str, Any]) -> bytes:
    import sentencepiece as spm

    if model_type not in SPM_MODEL_TYPES:
        raise ValueError(f"unknown sentencepiece model type {model_type!r}; choose one of {', '.join(SPM_MODEL_TYPES)}")
    clash = sorted(SPM_FIXED & options.keys())
    if clash:
        raise ValueError(f"spm_options may not set {', '.join(clash)}: wdsprep fixes them (ids 0=<s>, 1=<unk>), "
                         f"or they have their own option (vocab_size, model_type)")
    if "character_coverage" in options:
        raise ValueError("set character_coverage with its own option (CLI: --character-coverage), not in spm_options")
    texts = list(transcripts(text_files))
    if not texts:
        raise ValueError(f"no non-empty transcript in {', '.join(map(str, text_files))}; nothing to train on")
    if vocab_size is None:
        if model_type != "char":
            raise ValueError("a sentencepiece unigram/bpe tokenizer needs vocab_size (CLI: --vocab-size N)")
        # Every character (plus the word-boundary piece and the specials) fits; hard_vocab_limit
        # off lets sentencepiece stop below this.
        vocab_size = len({c for t in texts for c in t}) + 3
        options.setdefault("hard_vocab_limit", False)
    check_vocab_size(vocab_size, 2)
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
