"""Reading a tokenizer file: one JSON document, never a pickle."""

from __future__ import annotations

import base64
import binascii
import json
import pickletools
from pathlib import Path
from typing import Any, Mapping

from wdsprep.tokenizer.base import FILE_KINDS, FORMAT, VERSION, PathLike, Tokenizer, TokenizerFileError
from wdsprep.tokenizer.char import CharTokenizer
from wdsprep.tokenizer.lexicon import LexiconTokenizer
from wdsprep.tokenizer.simple import SimpleTokenizer
from wdsprep.tokenizer.spm import SentencePieceTokenizer, sentencepiece_from_model
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
            return JiebaTokenizer(doc["vocab"], user_dict=doc.get("user_dict") or [],  # type: ignore[return-value]
                                  dictionary=doc.get("dictionary"), whitespace=doc.get("whitespace", "drop"))
        if kind == "simple":
            return SimpleTokenizer(doc["vocab"])  # type: ignore[return-value]
        if kind == "lexicon":
            return LexiconTokenizer(doc["units"], doc["lexicon"], unk=doc["unk"],  # type: ignore[return-value]
                                    segment=doc.get("segment", "whitespace"), dictionary=doc.get("dictionary"))
    except KeyError as e:
        raise TokenizerFileError(f"{where}: {kind} tokenizer lacks the {e.args[0]!r} field; the file is damaged, "
                                 f"retrain it with wdsprep tokenizer train") from None
    except (binascii.Error, RuntimeError, ValueError, TypeError) as e:
        raise TokenizerFileError(f"{where}: damaged {kind} tokenizer ({e}); "
                                 f"retrain it with wdsprep tokenizer train") from None
    raise TokenizerFileError(f"{where}: unknown tokenizer kind {kind!r}; this version knows {', '.join(FILE_KINDS)}")


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
    once with ``wdsprep tokenizer import-cat``.

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
        if looks_like_pickle(raw):
            raise TokenizerFileError(f"{path}: a pickle (CAT's tokenizer .tknz); wdsprep never unpickles: convert it "
                                     f"once with 'wdsprep tokenizer import-cat {path} --out NEW.json' and use "
                                     f"NEW.json") from None
        tok = sentencepiece_from_model(raw, str(path), num_threads=num_threads)
        if tok is None:
            raise TokenizerFileError(f"{path}: neither a wdsprep tokenizer file (JSON) nor a sentencepiece .model; "
                                     f"train one with wdsprep tokenizer train") from None
        return tok  # type: ignore[return-value]
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TokenizerFileError(f"{path}: JSON but not a wdsprep tokenizer (no \"format\": \"{FORMAT}\")")
    if doc.get("version") not in range(1, VERSION + 1):
        raise TokenizerFileError(f"{path}: tokenizer file version {doc.get('version')!r}; this wdsprep reads "
                                 f"versions 1 to {VERSION} (a newer wdsprep wrote it?)")
    tok = from_doc(doc, str(path), num_threads)
    if "vocab_size" in doc and doc["vocab_size"] != tok.vocab_size:
        raise TokenizerFileError(f"{path}: says vocab_size {doc['vocab_size']} but holds {tok.vocab_size} pieces; "
                                 f"the file is damaged")
    return tok
