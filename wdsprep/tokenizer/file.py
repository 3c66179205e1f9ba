"""Reading a tokenizer file: one JSON document, never a pickle."""

from __future__ import annotations

import json
import os
import pickletools
from pathlib import Path
from typing import Any, Mapping, Sequence

from wdsprep.tokenizer.aggregate import AggregateTokenizer
from wdsprep.tokenizer.base import (
    FORMAT,
    REGISTRY,
    VERSION,
    FieldError,
    PathLike,
    Tokenizer,
    TokenizerFileError,
    describe,
    file_kinds,
    is_int,
    read_tokenizer_file,
)
from wdsprep.tokenizer.spm import sentencepiece_from_model

# A tokenizer as the loader takes it: one, the path of one, or one per language ({lang: either}).
TokenizerSpec = Tokenizer | PathLike | Mapping[str, Tokenizer | PathLike]


def from_doc(doc: Mapping[str, Any], where: str, num_threads: int = 1) -> Tokenizer:
    """The tokenizer a file's document describes; TokenizerFileError naming ``where`` and the field
    for anything missing, of the wrong type or inconsistent."""
    kind = doc.get("kind")
    cls = REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise TokenizerFileError(f"{where}: unknown tokenizer kind {describe(kind)}; this version knows "
                                 f"{', '.join(file_kinds())}")
    redo = ("import it again with wdsprep tokenizer import-cat" if kind == "lexicon"
            else "make it again with wdsprep tokenizer train (or import-cat)")
    try:
        return cls.from_dict(doc, num_threads)  # type: ignore[return-value]
    except FieldError as e:
        raise TokenizerFileError(f"{where}: {kind} tokenizer {e}; the file is damaged, {redo}") from None
    except (RuntimeError, ValueError, TypeError) as e:  # RuntimeError: sentencepiece's parse of the model
        raise TokenizerFileError(f"{where}: damaged {kind} tokenizer ({describe(str(e), bare=True, limit=200)}); "
                                 f"{redo}") from None


def looks_like_pickle(raw: bytes) -> bool:
    """Protocol 2+ pickles start with PROTO (0x80); older ones are a run of opcodes ending with STOP.

    Only the opcodes are parsed (``pickletools.genops``): nothing is built or run.
    """
    if raw[:1] == b"\x80":
        return True
    if not raw.endswith(b"."):
        return False
    try:
        for _ in pickletools.genops(raw):
            pass
    except Exception:  # genops raises ValueError, UnicodeDecodeError, ... on what is not a pickle
        return False
    return True


def load_tokenizer(path: PathLike, *, num_threads: int = 1) -> Tokenizer:
    """Load a tokenizer: the JSON file :func:`train_tokenizer` or ``import-cat`` wrote, or a sentencepiece ``.model``.

    A ``.model`` keeps its own ids (a model CAT trained keeps CAT's); one whose ids differ from
    CAT's convention warns.  A CAT ``.tknz`` (a pickle) is refused, never unpickled: convert it
    once with ``wdsprep tokenizer import-cat``.  A damaged or crafted file (wrong types, nesting
    too deep for the JSON parser, numbers too long to read) is a TokenizerFileError naming the
    file and, where there is one, the field.

    ``num_threads``: threads per SentencePiece ``encode_batch`` call. 1 suits DataLoader workers,
    which already keep the cores busy; a single-process loader may use more (-1 = all cores).
    """
    path = Path(path)
    raw = read_tokenizer_file(path, "the tokenizer's JSON file", "no such tokenizer file; make one with wdsprep "
                              "tokenizer train")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        if looks_like_pickle(raw):
            raise TokenizerFileError(f"{path}: a pickle (CAT's tokenizer .tknz); wdsprep never unpickles: convert it "
                                     f"once with 'wdsprep tokenizer import-cat {path} --out NEW.json' and use "
                                     f"NEW.json") from None
        tok = sentencepiece_from_model(raw, str(path), num_threads=num_threads)
        if tok is None:
            raise TokenizerFileError(f"{path}: neither a wdsprep tokenizer file (JSON) nor a sentencepiece .model; "
                                     f"train one with wdsprep tokenizer train") from None
        return tok  # type: ignore[return-value]
    except (ValueError, RecursionError) as e:
        # JSON the parser will not build: an integer of more than 4,300 digits, arrays nested
        # about a thousand deep.  No tokenizer has either.
        why = describe(str(e), bare=True, limit=120)
        raise TokenizerFileError(f"{path}: JSON that cannot be read as a tokenizer ({why}); the file is damaged or "
                                 f"crafted") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TokenizerFileError(f"{path}: JSON but not a wdsprep tokenizer (no \"format\": \"{FORMAT}\")")
    version = doc.get("version")
    if not is_int(version) or not 1 <= version <= VERSION:
        raise TokenizerFileError(f"{path}: tokenizer file version {describe(version)}; this wdsprep reads "
                                 f"versions 1 to {VERSION} (a newer wdsprep wrote it?)")
    tok = from_doc(doc, str(path), num_threads)
    if "vocab_size" in doc and doc["vocab_size"] != tok.vocab_size:
        raise TokenizerFileError(f"{path}: says vocab_size {describe(doc['vocab_size'])} but holds {tok.vocab_size} "
                                 f"pieces; the file is damaged")
    return tok


def as_tokenizer(spec: TokenizerSpec, *, num_threads: int = 1) -> Tokenizer:
    """The tokenizer ``spec`` names: itself, the file at a path, or for ``{lang: tokenizer or path}``
    an :class:`~wdsprep.tokenizer.aggregate.AggregateTokenizer` of them, the languages in the order
    given (the ids' layout follows it)."""
    if isinstance(spec, Mapping):
        return AggregateTokenizer({str(lang): as_tokenizer(t, num_threads=num_threads) for lang, t in spec.items()})
    if isinstance(spec, (str, os.PathLike)):
        return load_tokenizer(spec, num_threads=num_threads)
    if not isinstance(spec, Tokenizer):
        raise ValueError(f"a tokenizer is a Tokenizer, the path of one or {{lang: tokenizer}}, not {describe(spec)}")
    return spec


def aggregate_tokenizers(languages: Mapping[str, Tokenizer | PathLike], out: PathLike, *,
                         special_tokens: Sequence[str] = (), overwrite: bool = False) -> AggregateTokenizer:
    """One tokenizer per language (``{lang: tokenizer or path}``, in the order their ids are laid
    out) saved as one aggregate tokenizer file at ``out``; returned.  ``special_tokens``: symbols
    each encoded as one id shared by every language (the languages' own special tokens are too)."""
    tok = AggregateTokenizer({str(lang): as_tokenizer(t) for lang, t in dict(languages).items()}, special_tokens)
    tok.save(out, overwrite=overwrite)
    return tok
