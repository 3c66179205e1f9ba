"""wdsprep: Kaldi data dirs to length-grouped tar shards, and a streaming loader for ASR training.

Importing this package is cheap and safe on CPU-only machines: torch, torchaudio and webdataset
are imported only by the functions that need them (``lazy``).

The folders follow the data flow (docs/architecture.md): ``prep`` (Kaldi input, fbank), ``pack``
(utterances to shards), ``format`` (the bytes on disk), ``remote`` (shards elsewhere), ``tokenizer``
(text to ids), ``plan`` (every epoch planned from the index), ``loading`` (the readers), ``device``
(the trainer's side), ``check`` (looking before training), ``export`` (shards as other projects'
manifests).  In front: ``loader`` (``make_loader``), ``hyper`` (CAT's ``hyper-p.json``), ``cli``
(the ``wdsprep`` command).  Beneath all: ``options`` (an option's one definition), ``errors`` (bad
data against a bad command line), ``files`` (atomic writes), ``units``, ``report``.
"""

from wdsprep.check.inspect import InspectResult, inspect_shards
from wdsprep.check.verify import VerifyResult, verify_shards
from wdsprep.errors import StrictError
from wdsprep.format.index import read_index
from wdsprep.format.keys import decode_key, encode_key
from wdsprep.format.reindex import index_shards
from wdsprep.format.shardlist import shard_pattern
from wdsprep.lazy import lazy_exports
from wdsprep.pack import Manifest, pack_audio, pack_data
from wdsprep.plan.augment import Augment, Clip, Codec, Lowpass, Noise, Reverb, SpecAugment, Speed
from wdsprep.prep.fbank import compute_fbank
from wdsprep.report import Report
from wdsprep.tokenizer import (
    AggregateTokenizer,
    ShardTranscripts,
    SubwordSampling,
    Tokenizer,
    aggregate_tokenizers,
    import_cat_tokenizer,
    load_tokenizer,
    train_aggregate_tokenizer,
    train_tokenizer,
)

__version__ = "0.1.0"

__all__ = ["compute_fbank", "pack_data", "pack_audio", "Manifest", "Report", "StrictError",
           "encode_key", "decode_key", "read_index", "shard_pattern", "index_shards", "SubwordSampling", "Tokenizer",
           "load_tokenizer", "train_tokenizer", "train_aggregate_tokenizer", "ShardTranscripts", "import_cat_tokenizer",
           "AggregateTokenizer", "aggregate_tokenizers",
           "inspect_shards", "InspectResult", "verify_shards", "VerifyResult",
           "Augment", "Speed", "Noise", "Reverb", "SpecAugment", "Lowpass", "Clip", "Codec"]

# The loader and the device modules import torch; resolve these names on first use so ``import
# wdsprep`` stays cheap.
_LAZY = {"make_loader": "loader", "Batch": "loader", "Loader": "loader", "LoaderStats": "loader",
         "make_loader_from_hyper": "hyper", "Fbank": "device", "SpecAugmentModule": "device"}
__all__ += list(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY)
