"""wdsprep: Kaldi data dirs to length-grouped tar shards, and a streaming loader for ASR training.

Importing this package is cheap and safe on CPU-only machines: torch, torchaudio and webdataset
are imported only by the functions that need them.
"""

from .fbank import compute_fbank
from .pack import pack_data
from .pack_audio import pack_audio
from .report import Report, StrictError
from .shards import decode_key, encode_key, read_index
from .tokenizer import SubwordSampling, Tokenizer, load_tokenizer, train_tokenizer

__version__ = "0.1.0"

__all__ = ["pack_data", "Report", "StrictError", "encode_key", "decode_key", "read_index",
           "SubwordSampling", "Tokenizer", "load_tokenizer", "train_tokenizer"]

# The loader imports torch; resolve these names on first use so ``import wdsprep`` stays cheap.
_LAZY = {"make_loader": "loader", "Batch": "loader", "Loader": "loader", "LoaderStats": "loader",
         "make_loader_from_hyper": "hyper"}
__all__ += list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wdsprep' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ += ["compute_fbank", "pack_audio"]
