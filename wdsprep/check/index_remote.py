"""``wdsprep index`` on shards in a bucket, in place: each folder's index written beside its shards.

The index a folder has there already is read (``index.json`` and its columns, a few MB); a shard it
lists at the size the bucket's listing gives, with its SHA-256, is kept as indexed without a byte
of it downloaded.  Only the shards it does not list, or lists at another size (and every shard,
``force``), are downloaded, one at a time into memory, and read as ``wdsprep index`` reads a local
one (:func:`wdsprep.format.reindex.scan_shard`); then the folder's index files are uploaded,
``index.json`` last (a reader that finds it finds the rest).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import partial
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from wdsprep.errors import DataError
from wdsprep.format.index import FROM_KEYS, FolderIndex, ShardInfo, write_index
from wdsprep.format.index.remote import read_index_at
from wdsprep.format.keys import AUDIO_LAYOUTS, check_field_name
from wdsprep.format.reindex import IndexResult, _carried_speakers, _folder_audio, scan_shard
from wdsprep.format.shardfile import ShardFile
from wdsprep.format.shardlist import expand_shards, index_place, refuse_commands
from wdsprep.remote.fetch import RetryPolicy, fetch_file, fetch_shard
from wdsprep.remote.listing import lister
from wdsprep.remote.stores import writable_store
from wdsprep.remote.urls import redact


def index_remote(patterns: str | Sequence[str], *, refresh: bool = False, force: bool = False,
                 index_fields: Sequence[str] = (), progress: bool | None = None,
                 policy: RetryPolicy = RetryPolicy()) -> IndexResult:
    """Write the index of every bucket folder the URL pattern(s) name (see the module's doc);
    ``refresh`` is implied (a shard whose size changed is read again), ``force`` reads every shard."""
    for name in index_fields:
        check_field_name(name)
    urls = expand_shards(patterns, check_commit=False, list_glob=lister(policy))
    refuse_commands(urls, "index")
    by_folder: dict[str, list[str]] = {}
    for url in urls:
        by_folder.setdefault(index_place(url)[0], []).append(url)
    result = IndexResult()
    with tqdm(total=len(urls), desc="index", unit="shard", disable=None if progress is None else not progress) as bar:
        for folder, shards in by_folder.items():
            _index_folder(folder, shards, result, force=force, index_fields=index_fields, policy=policy, bar=bar)
    return result


def _index_folder(folder: str, shards: list[str], result: IndexResult, *, force: bool, index_fields: Sequence[str],
                  policy: RetryPolicy, bar: tqdm) -> None:
    store = writable_store(folder)
    if store is None:  # a local folder among URL patterns
        raise ValueError(f"{folder}: index local and remote shards in separate runs")
    listed = store.listing(folder + "/", timeout=policy.timeout)
    try:
        old = read_index_at(folder, partial(fetch_file, policy=policy), keys=True)
    except DataError as e:
        if "have no index" not in str(e) and not force:
            raise
        old = None
    kept: dict[str, int] = {}  # name -> its place in the old index
    if old is not None and not force and set(index_fields) <= set(old.columns):
        for i, name in enumerate(old.names):
            size = listed.get(f"{folder}/{name}")
            if size is not None and size == int(old.sizes[i]) and old.checksums[i] is not None and not old.lost[i]:
                kept[name] = i
    names = sorted({u.rsplit("/", 1)[-1] for u in shards} | set(kept))
    indexed = list(dict.fromkeys([*index_fields, *(old.columns if old is not None else ())]))
    infos, sizes, lost, layouts, dims, rates, fields = [], [], [], set(), set(), set(), None
    read = 0
    for name in names:
        url = f"{folder}/{name}"
        if name in kept:
            assert old is not None
            i = kept[name]
            infos.append(old.shard(i))
            sizes.append(int(old.sizes[i]))
            lost.append(0)
            fields = set(old.fields) if fields is None else fields & set(old.fields)
        else:
            copy, _ = fetch_shard(url, policy=policy)
            try:
                scan = scan_shard(redact(url), source=ShardFile(redact(url), copy), index_fields=indexed)
                scan.info.sha256 = hashlib.sha256(copy.read()).hexdigest()
                sizes.append(copy.size)
            finally:
                copy.close()
            scan.info.name = name
            infos.append(scan.info)
            lost.append(scan.lost)
            result.problems.extend(scan.problems)
            layouts |= scan.layouts
            dims |= scan.dims
            rates |= scan.rates
            fields = set(scan.fields) if fields is None else fields & set(scan.fields)
            read += 1
        bar.update(1)
    if old is not None and kept:
        layouts.add(old.layout)
        rates |= {old.audio.sample_rate} if old.audio is not None else set()
        dims |= {old.dims} if old.dims is not None and old.audio is None else set()
    for what, found in (("layouts", layouts), ("feature dims", dims), ("sample rates", rates)):
        if len(found) > 1:
            raise ValueError(f"{redact(folder)}: shards of different {what} {sorted(map(str, found))}; a folder is "
                             f"one shard set: move them apart")
    layout = layouts.pop() if layouts else "cat"
    notes: list[str] = []
    audio = _folder_audio(old, layout, rates.pop() if rates else None, notes) if layout in AUDIO_LAYOUTS else None
    dtype = old.dtype if old is not None and old.audio is None else "float32"
    named = [_named(i, n) for i, n in zip(infos, names)]
    speakers = None  # speakers packed from utt2spk are in no tar: kept for the utterances still there
    if old is not None and old.has_speakers and old.speakers().source != FROM_KEYS:
        speakers = _carried_speakers(old, [k for i in named for k in i.keys])
    index = FolderIndex.from_shards(layout, audio.num_mel_bins if audio else dims.pop() if dims else None, dtype,
                                    named, sizes=sizes, mtimes=[0] * len(names), lost=lost, speakers=speakers,
                                    audio=audio, fields=sorted(fields or ()))
    if old is not None and read == 0 and len(names) == len(old.names):
        result.folders[redact(folder)] = "up to date"
    else:
        with tempfile.TemporaryDirectory(prefix="wdsprep-index-") as tmp:
            write_index(tmp, index)
            files = sorted(os.listdir(tmp), key=lambda n: n == "index.json")  # index.json last
            for f in files:
                store.put(f"{folder}/{f}", str(Path(tmp) / f), timeout=policy.timeout)
        result.folders[redact(folder)] = "; ".join([f"indexed in place: {len(names)} shards, {read} downloaded",
                                                   *notes])
    result.shards += len(names)
    result.scanned += read
    result.utterances += index.num_utts


def _named(info: ShardInfo, name: str) -> ShardInfo:
    info.name = name
    return info
