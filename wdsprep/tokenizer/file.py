"""Reading a tokenizer file: one JSON document, never a pickle."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any, Mapping

from wdsprep.tokenizer.base import FORMAT, KINDS, VERSION, PathLike, Tokenizer, TokenizerFileError
from wdsprep.tokenizer.char import CharTokenizer
from wdsprep.tokenizer.spm import SentencePieceTokenizer
from wdsprep.tokenizer.words import JiebaTokenizer


def from_doc(doc: Mapping[str, Any], where: str, num_threads: int = 1) -> Tokenizer:
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
    tok = from_doc(doc, str(path), num_threads)
    if "vocab_size" in doc and doc["vocab_size"] != tok.vocab_size:
        raise TokenizerFileError(f"{path}: says vocab_size {doc['vocab_size']} but holds {tok.vocab_size} pieces; "
                                 f"the file is damaged")
    return tok
