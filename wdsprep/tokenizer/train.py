"""Training a tokenizer on the transcripts of Kaldi ``text`` files."""

from __future__ import annotations

import io
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from wdsprep.prep.kaldi import iter_table
from wdsprep.tokenizer.base import (
    BOS,
    BOS_ID,
    KINDS,
    SPACE,
    SPM_FIXED,
    SPM_MODEL_TYPES,
    UNK,
    UNK_ID,
    PathLike,
    Tokenizer,
    TokenizerBase,
)
from wdsprep.tokenizer.char import CharTokenizer
from wdsprep.tokenizer.simple import SimpleTokenizer
from wdsprep.tokenizer.spm import SentencePieceTokenizer
from wdsprep.tokenizer.words import JiebaTokenizer, make_jieba, read_user_dict


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
    (except ``model_type="char"``), optional for char/jieba/simple (the most frequent pieces are
    kept).  ``simple``: the units the transcripts write with spaces between them (words, phones).
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
    if spm_options and kind != "sentencepiece":
        raise ValueError(f"sentencepiece options ({', '.join(spm_options)}) are for --kind sentencepiece, not {kind!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    tok: TokenizerBase
    if kind == "char":
        _check_vocab_size(vocab_size, 3 if keep_spaces else 2)
        counts = Counter(p for t in _transcripts(files) for p in CharTokenizer.pieces_of(t, False))
        specials = [BOS, UNK] + ([SPACE] if keep_spaces else [])
        counts.pop(SPACE, None)
        limit = None if vocab_size is None else vocab_size - len(specials)
        tok = CharTokenizer(specials + _ranked(counts, limit), keep_spaces=keep_spaces)
    elif kind == "simple":
        _check_vocab_size(vocab_size, 2)
        counts = Counter(u for t in _transcripts(files) for u in t.split())
        for special in (BOS, UNK):
            counts.pop(special, None)
        limit = None if vocab_size is None else vocab_size - 2
        tok = SimpleTokenizer([BOS, UNK] + _ranked(counts, limit))
    elif kind == "jieba":
        _check_vocab_size(vocab_size, 2)
        entries = read_user_dict(user_dict) if user_dict is not None else []
        cutter = make_jieba(entries)
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
    clash = sorted(SPM_FIXED & options.keys())
    if clash:
        raise ValueError(f"spm_options may not set {', '.join(clash)}: wdsprep fixes them (ids 0=<s>, 1=<unk>), "
                         f"or they have their own option (vocab_size, model_type)")
    if "character_coverage" in options:
        raise ValueError("set character_coverage with its own option (CLI: --character-coverage), not in spm_options")
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
