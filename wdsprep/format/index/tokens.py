"""Token columns beside an index: each label's length in one tokenizer's tokens (the cost model's u).

Counted once per tokenizer by the loader (``wdsprep.plan.tokens``) and kept beside the index
it counts, named by the tokenizer and the index's shards (:func:`tokens_name`), so another
tokenizer or a re-indexed folder gets a column of its own instead of a stale one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from wdsprep.errors import DataError
from wdsprep.files import atomic_path
from wdsprep.format.index.model import FolderIndex

TOKENS_PREFIX = "index.tokens."


def tokens_name(index: FolderIndex, tokenizer_digest: str) -> str:
    """The file name of ``index``'s token column for the tokenizer of ``tokenizer_digest``."""
    doc = json.dumps([tokenizer_digest, index.names, index.digests, index.utts.tolist()])
    return f"{TOKENS_PREFIX}{hashlib.blake2b(doc.encode(), digest_size=8).hexdigest()}.npy"


def parse_tokens(data: bytes | Path, num_utts: int, where: str) -> np.ndarray:
    """A token column read from its file (or bytes), checked: int32, one count >= 0 per utterance."""
    try:
        column = np.load(io.BytesIO(data) if isinstance(data, bytes) else data, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{where}: not a token column ({e}); delete it, the loader counts the tokens again") from None
    if column.dtype != np.int32 or column.shape != (num_utts,) or (len(column) and int(column.min()) < 0):
        raise DataError(f"{where}: a token column of {column.dtype} {column.shape}, the index has {num_utts} "
                        f"utterances; delete it, the loader counts the tokens again")
    return column


def write_tokens(folder: str | os.PathLike, name: str, column: np.ndarray) -> Path:
    """Write a token column beside the index, atomically."""
    path = Path(folder) / name
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(column, np.int32), allow_pickle=False)
    return path

