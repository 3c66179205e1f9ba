"""The per-folder index of a shard set: every shard's size and totals, every utterance's frames.

Written by ``pack`` (and by ``wdsprep index``, :mod:`wdsprep.format.reindex`, for shards packed
elsewhere) beside the shards; the loader plans every epoch from it without reading a tar,
``inspect`` reads it instead of the tars, ``verify`` holds it against them.  By concept, bottom up:

- ``files.py``: the files on disk (their format), opened regular files only;
- ``model.py``: the index in memory (:class:`FolderIndex`, :class:`ShardInfo`, :class:`Speakers`,
  :class:`AudioIndex`);
- ``check.py``: a folder's ``index.json`` and columns read and checked whole (:func:`check_index`);
  ``write.py``: the writer (:func:`write_index`);
- ``entries.py``: a growing pack's index, one entry per published shard;
- ``read.py``: :func:`read_index`, the one entry every reader gets an index through (a complete
  folder's, a growing folder's entries, or none); ``tokens.py``: token columns beside an index;
- ``remote.py``: an index beside remote shards, fetched within size bounds.

A damaged index is one :class:`DamagedIndexError` naming the file and field, whoever reads it, and
``wdsprep index --force`` rebuilds it from the shards whatever state it is in.  Nothing here reads
a tar.
"""

from wdsprep.format.index.check import check_index
from wdsprep.format.index.entries import entry_dir, read_entries, read_entry_record, write_entry
from wdsprep.format.index.files import (
    AUDIO_INDEX_FILES,
    FRAMES_FILE,
    INDEX_FILES,
    INDEX_NAME,
    KEYS_FILE,
    SAMPLES_FILE,
    SPEAKER_NAMES_FILE,
    SPEAKERS_FILE,
    TEXT_LENS_FILE,
    DamagedIndexError,
    field_files,
    is_index_file,
)
from wdsprep.format.index.model import (
    FROM_KEYS,
    FROM_UTT2SPK,
    AudioIndex,
    FolderIndex,
    ShardInfo,
    Speakers,
    Values,
    frames_digest,
    stale_reason,
)
from wdsprep.format.index.read import read_index
from wdsprep.format.index.remote import FetchFile, index_file_limit, read_index_at, read_tokens_at
from wdsprep.format.index.tokens import parse_tokens, tokens_name, write_tokens
from wdsprep.format.index.write import index_file_names, write_index

__all__ = [
    "AUDIO_INDEX_FILES", "FRAMES_FILE", "INDEX_FILES", "INDEX_NAME", "KEYS_FILE", "SAMPLES_FILE",
    "SPEAKER_NAMES_FILE", "SPEAKERS_FILE", "TEXT_LENS_FILE", "FROM_KEYS", "FROM_UTT2SPK",
    "AudioIndex", "DamagedIndexError", "FetchFile", "FolderIndex", "ShardInfo", "Speakers", "Values",
    "check_index", "field_files", "frames_digest", "index_file_limit", "index_file_names", "is_index_file",
    "parse_tokens", "entry_dir", "read_index", "read_index_at", "read_entry_record", "read_entries", "read_tokens_at",
    "stale_reason", "tokens_name",
    "write_index", "write_entry", "write_tokens",
]
