"""Tokenizers that turn raw transcripts into label ids on the fly: SentencePiece, jieba words, characters.

Ids follow CAT for every kind: 0 is ``<s>`` (also the CTC/transducer blank), 1 is ``<unk>``.

A trained tokenizer is saved as ONE JSON file (never a pickle, so loading it cannot run code)::

    {"format": "wdsprep-tokenizer", "version": 1, "kind": "...", "vocab_size": N, ...}

- ``sentencepiece``: ``"model"`` holds the serialized SentencePiece ModelProto as base64; it is the
  exact ``.model`` file sentencepiece would write, so ``base64 -d`` gives a file ``spm_encode`` reads.
- ``jieba``: ``"vocab"`` (list, index = id) and ``"user_dict"`` (``[word, freq-or-null]`` entries
  added to a private ``jieba.Tokenizer``), so loading needs no other file.
- ``char``: ``"vocab"`` (list, index = id) and ``"keep_spaces"``.
- ``simple``: ``"vocab"``; the transcript split at whitespace, each unit looked up (CAT's SimpleTokenizer).
- ``lexicon`` (imported from CAT): ``"units"``, ``"lexicon"`` (word -> unit ids), ``"unk"``,
  ``"segment"`` (``whitespace`` or ``jieba``) and ``"dictionary"``.
- ``aggregate``: a tokenizer per language, ``"languages"``: each language's tokenizer (its whole
  file's fields) and the offset its ids start at; ids 0 and 1 and the special tokens shared
  (``aggregate``).

``"version"`` is the lowest file version that holds the tokenizer: 1 unless it needs what version
2 added (the ``simple`` and ``lexicon`` kinds, jieba's ``"dictionary"`` and ``"whitespace"``) or
version 3 (``"special_tokens"``: symbols that are one id each, never split).
CAT's pickled ``.tknz`` is converted once by :func:`import_cat_tokenizer`, which reads the pickle's
opcodes without unpickling it (``cat``); a sentencepiece ``.model`` loads as it is.

sentencepiece and jieba are imported only inside the classes that need them, so ``import wdsprep``
stays cheap.  One module per kind (``char``, ``words`` for jieba, ``spm``, ``simple``, ``lexicon``,
``aggregate``), ``train``, ``file`` (loading) and ``cat`` (the import); ``base`` holds what they
share, ``normalize`` the text treatment applied before tokenizing (training and loading alike);
``train`` trains on Kaldi ``text`` files, a manifest or packed shards, one tokenizer or one per
language.  A kind's
class registers itself (``base.register``) and, when it is trained, has its own ``train``: a new
kind is its module plus its import below; the file reader, ``train_tokenizer`` and the CLI's
``--kind`` choices follow from the registry.
"""

from wdsprep.tokenizer.aggregate import AggregateTokenizer
from wdsprep.tokenizer.base import (
    BOS,
    BOS_ID,
    SPACE,
    UNK,
    UNK_ID,
    SubwordSampling,
    Tokenizer,
    TokenizerFileError,
    derive_seed,
    file_kinds,
    trainable_kinds,
)
from wdsprep.tokenizer.cat import CAT_CLASSES, import_cat_tokenizer, read_cat_tokenizer
from wdsprep.tokenizer.char import CharTokenizer
from wdsprep.tokenizer.file import TokenizerSpec, aggregate_tokenizers, as_tokenizer, load_tokenizer
from wdsprep.tokenizer.lexicon import LexiconTokenizer
from wdsprep.tokenizer.normalize import STEPS as NORMALIZE_STEPS
from wdsprep.tokenizer.normalize import Normalizer, parse_normalize
from wdsprep.tokenizer.simple import SimpleTokenizer
from wdsprep.tokenizer.spm import SentencePieceTokenizer
from wdsprep.tokenizer.train import ShardTranscripts, Transcripts, train_aggregate_tokenizer, train_tokenizer
from wdsprep.tokenizer.words import JiebaTokenizer, read_user_dict

# Kinds train_tokenizer makes, and every kind a file may hold (a "lexicon" is imported from CAT).
KINDS = trainable_kinds()
FILE_KINDS = file_kinds()

__all__ = ["BOS", "BOS_ID", "FILE_KINDS", "KINDS", "SPACE", "UNK", "UNK_ID", "SubwordSampling", "Tokenizer",
           "TokenizerFileError", "derive_seed", "CharTokenizer", "JiebaTokenizer", "SentencePieceTokenizer",
           "SimpleTokenizer", "LexiconTokenizer", "AggregateTokenizer", "TokenizerSpec", "aggregate_tokenizers",
           "as_tokenizer", "load_tokenizer", "train_tokenizer", "train_aggregate_tokenizer", "ShardTranscripts",
           "Transcripts", "read_user_dict", "CAT_CLASSES", "import_cat_tokenizer",
           "read_cat_tokenizer", "NORMALIZE_STEPS", "Normalizer", "parse_normalize"]
