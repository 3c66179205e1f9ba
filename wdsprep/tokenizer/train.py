"""Training a tokenizer on the transcripts of Kaldi ``text`` files: each kind trains itself."""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from wdsprep.prep.kaldi import iter_table
from wdsprep.tokenizer.base import REGISTRY, PathLike, Specials, Tokenizer, trainable_kinds
from wdsprep.tokenizer.normalize import Normalizer, parse_normalize


def train_tokenizer(kind: str, text_files: Sequence[PathLike], out: PathLike, *, vocab_size: int | None = None,
                    model_type: str = "unigram", user_dict: PathLike | None = None, keep_spaces: bool = True,
                    character_coverage: float = 0.9995, spm_options: Mapping[str, Any] | None = None,
                    normalize: Normalizer | str | Sequence[str] | None = None, special_tokens: Sequence[str] = (),
                    overwrite: bool = False) -> Tokenizer:
    """Train a tokenizer on the transcripts of Kaldi ``text`` files, save it to ``out``, return it.

    ``vocab_size`` counts every id including ``<s>`` and ``<unk>``; required for sentencepiece
    (except ``model_type="char"``), optional for char/jieba/simple (the most frequent pieces are
    kept).  ``simple``: the units the transcripts write with spaces between them (words, phones).
    ``model_type`` and ``character_coverage`` apply to sentencepiece, ``user_dict`` to jieba,
    ``keep_spaces`` to char: an option another kind takes is refused unless at its default.
    ``spm_options`` are passed to ``SentencePieceTrainer.train`` (e.g. ``input_sentence_size``),
    except options that would break the id convention.  Empty transcripts are skipped.
    ``normalize``: the text treatment the loader's ``normalize=`` applies (``tokenizer/normalize.py``),
    applied to every transcript before training, so the tokenizer learns the text it will be given.
    ``special_tokens``: symbols (``<|en|>``, ``<|transcribe|>``) each encoded as one id wherever they
    appear, in transcripts and text fields, never split and never changed by a text treatment.
    """
    cls = REGISTRY.get(kind)
    if cls is None or not cls.trainable():
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(trainable_kinds())}")
    # One path where a list was meant must not become a list of characters.
    files = [text_files] if isinstance(text_files, (str, os.PathLike)) else list(text_files)
    if not files:
        raise ValueError("no training text given; pass one or more Kaldi text files")
    options = {"model_type": model_type, "user_dict": user_dict, "keep_spaces": keep_spaces,
               "character_coverage": character_coverage, "spm_options": spm_options or None,
               "special_tokens": tuple(special_tokens)}
    takes = cls.train_options()
    defaults = inspect.signature(train_tokenizer).parameters
    for name, value in options.items():
        if name not in takes and value != defaults[name].default:
            others = [k for k in trainable_kinds() if name in REGISTRY[k].train_options()]
            raise ValueError(f"{name} is for --kind {' or '.join(others)}, not {kind!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    treatment = parse_normalize(normalize)
    with tempfile.TemporaryDirectory(prefix="wdsprep-normalized-") as tmp:
        if treatment is not None:
            specials = Specials(dict.fromkeys(special_tokens, 0))
            files = [_normalized(f, lambda x: specials.plain(x, treatment), Path(tmp) / f"text.{k}")
                     for k, f in enumerate(files)]
        tok = cls.train(files, vocab_size, **{name: options[name] for name in takes})
    tok.save(out, overwrite=overwrite)
    return tok  # type: ignore[return-value]


def _normalized(path: PathLike, treatment: Callable[[str], str], out: Path) -> Path:
    """A copy of Kaldi text file ``path`` with each transcript treated."""
    with open(out, "w", encoding="utf-8") as f:
        for e in iter_table(path, allow_empty_value=True):
            f.write(f"{e.uttid} {treatment(e.value)}\n")
    return out
