"""An index beside shards on S3 or a web server: its files fetched, each within a size bound, and read.

The format does not fetch: the layers above hand in a :class:`FetchFile` that brings a small
object with the user's retries (``remote.fetch.fetch_file``).  Each file is bounded by what an
index of the utterances its ``index.json`` lists can hold (:func:`index_file_limit`), so a server
cannot make a reader download or map more than that.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Protocol

import numpy as np

from wdsprep.errors import DataError, OverLimit
from wdsprep.format.commit import MARKER_NAME, UncommittedPackError
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
    field_files,
)
from wdsprep.format.index.model import FolderIndex
from wdsprep.format.index.read import read_index
from wdsprep.format.index.tokens import parse_tokens
from wdsprep.format.keys import FIELD_NAME
from wdsprep.remote.urls import redact


class FetchFile(Protocol):
    """A small object at a URL into a local file, at most ``limit`` bytes (an ``OverLimit`` error
    beyond): True when it was there.  The layers above pass one that fetches with the user's
    retries (``remote.fetch.fetch_file``): the format reads, it does not fetch."""

    def __call__(self, url: str, path: str, *, limit: int) -> bool: ...


# The most bytes an index file downloaded beside remote shards may have.  index.json is O(shards)
# (~200 bytes a shard: 32 MiB holds ~160,000 shards in one folder); the others follow from the
# utterances (and speakers) it lists: int32 columns, and keys or speaker names of up to 1 KiB on
# average.  A server sending more (a Content-Length of 10^12, an endless body) is cut off there.
MAX_SUMMARY_BYTES = 32 << 20
_SLACK = 64 << 10  # an .npy header, a text file's last line
_PER_ROW = {FRAMES_FILE: 4, TEXT_LENS_FILE: 4, SPEAKERS_FILE: 4, SAMPLES_FILE: 4, KEYS_FILE: 1024,
            SPEAKER_NAMES_FILE: 1024}


def index_file_limit(name: str, summary: dict) -> int:
    """The most bytes index file ``name`` can have beside the ``index.json`` ``summary`` (parsed)."""
    if name == INDEX_NAME:
        return MAX_SUMMARY_BYTES
    try:
        if name == SPEAKER_NAMES_FILE:
            rows = int(summary["speakers"]["count"])
        elif name.endswith(".txt") and name not in _PER_ROW:  # an indexed field's values
            rows = int(summary["fields"][name[len("index.field."):-len(".txt")]]["values"])
        else:
            rows = sum(int(shard["utts"]) for shard in summary["shards"])
    except (KeyError, TypeError, ValueError):
        rows = 0  # a damaged index.json: read_index names what is wrong with it
    return _SLACK + _PER_ROW.get(name, 1024 if name.endswith(".txt") else 4) * max(0, rows)


def _field_files(summary: dict) -> list[str]:
    """The files of the fields ``index.json`` says are indexed (names that are no field's are left to
    read_index to refuse)."""
    fields = summary.get("fields")
    if not isinstance(fields, dict):
        return []
    return [f for name, meta in fields.items() if isinstance(name, str) and FIELD_NAME.fullmatch(name)
            and isinstance(meta, dict) and "values" in meta for f in field_files(name)]


def read_index_at(folder: str, fetch: FetchFile, *, keys: bool = False) -> FolderIndex:
    """The index uploaded beside remote shards in ``folder`` (an s3:// or http(s):// folder URL),
    its files fetched by ``fetch``, each bounded by :func:`index_file_limit`, into a temporary
    folder and read there by :func:`read_index`; its columns (the stored speakers too) stay
    memory-mapped after the folder is gone.  The keys are fetched only with ``keys`` (``verify``,
    speakers by the key rule): planning does not need them."""
    shown = redact(folder)
    with tempfile.TemporaryDirectory(prefix="wdsprep-index-") as tmp:
        _refuse_uncommitted(folder, fetch, tmp)
        summary: dict = {}
        names = [*INDEX_FILES, *AUDIO_INDEX_FILES]  # an audio folder's sample counts too
        for name in names:
            if name == KEYS_FILE and not keys:
                continue
            path = os.path.join(tmp, name)
            limit = index_file_limit(name, summary)
            try:
                found = fetch(f"{folder}/{name}", path, limit=limit)
            except OverLimit:
                bound = ("about 200 bytes per shard" if name == INDEX_NAME
                         else f"for the utterances its {INDEX_NAME} lists")
                raise DataError(
                    f"{shown}/{name}: more than the {limit:,} bytes an index file can have here ({bound}): not an "
                    f"index wdsprep wrote, or the server sends more than the file; check the server, or index a "
                    f"local copy again (wdsprep index --force) and upload its index files") from None
            if name == INDEX_NAME and not found:
                raise DataError(
                    f"{shown}/{INDEX_NAME}: the shards there have no index; the loader plans every epoch from it and "
                    f"will not download a whole remote corpus on every rank to read its headers. Index a local copy "
                    f"(wdsprep index 'DIR/*/data-*.tar'; pack writes it too) and upload its index files "
                    f"({', '.join(INDEX_FILES)}) beside the shards, e.g. aws s3 sync DIR s3://BUCKET/PREFIX "
                    f"--exclude '*' --include '*index*'")
            if not found:
                os.unlink(path)  # missing: read_index says what it lacks
            elif name == INDEX_NAME:
                try:
                    summary = json.loads(Path(path).read_bytes())
                except ValueError:
                    summary = {}  # read_index names what is wrong with it
                summary = summary if isinstance(summary, dict) else {}
                names.extend(_field_files(summary))  # the indexed fields' columns and values
        try:
            index = read_index(tmp)
            if index is not None and keys:
                index.keys()  # read now: the folder goes
            if index is not None and index.has_speakers:
                index.speakers()
        except DataError as e:
            raise DataError(str(e).replace(tmp, shown)) from None
    assert index is not None
    return index


def _refuse_uncommitted(folder: str, fetch: FetchFile, tmp: str) -> None:
    """:class:`UncommittedPackError` when a pack's marker is beside the remote shards or in the folder
    above (a pack writing into a bucket, or a folder uploaded before its pack committed): as a local
    folder's, its shards may be a part of the corpus only."""
    for where in (folder, folder.rsplit("/", 1)[0]):
        if where.endswith(":/"):  # the folder is a bucket's top: nothing above it
            continue
        if fetch(f"{where}/{MARKER_NAME}", os.path.join(tmp, MARKER_NAME), limit=_SLACK):
            raise UncommittedPackError(
                f"shards in {redact(folder)}: part of a pack that did not finish ({redact(where)}/{MARKER_NAME} is "
                f"there): its shards may be a part of the corpus only; finish the pack (the same command with "
                f"--resume) before training on it")


def read_tokens_at(folder: str, name: str, num_utts: int, fetch: FetchFile) -> np.ndarray | None:
    """A token column uploaded beside a remote index (:func:`tokens_name`), or None when there is none."""
    with tempfile.TemporaryDirectory(prefix="wdsprep-tokens-") as tmp:
        path = os.path.join(tmp, name)
        try:
            if not fetch(f"{folder}/{name}", path, limit=_SLACK + 4 * num_utts):
                return None
        except OverLimit:
            raise DataError(f"{redact(folder)}/{name}: longer than a token column of {num_utts:,} labels can be; "
                            f"count the labels again and upload the column") from None
        return parse_tokens(Path(path).read_bytes(), num_utts, f"{redact(folder)}/{name}")
