"""Globs over a store that can list: S3.

A glob in an S3 key (``s3://b/corpus/*/data-*.tar``) is answered by listing the bucket from the
literal prefix before the first glob character; the sizes the listing returns are kept, so a
shard that changed since it was indexed is caught before the epoch starts.  A web server cannot
list files: a glob in an http(s) URL is an error saying to write the names as a brace range.
"""

from __future__ import annotations

import fnmatch
import threading
from functools import partial
from typing import Callable

from wdsprep.remote.clients import list_s3
from wdsprep.remote.fetch import RetryPolicy, with_retries
from wdsprep.remote.urls import magic, redact, scheme, split_s3

# Sizes from the last listing of each object (url -> bytes): a stale shard is caught at start.
_listed: dict[str, int] = {}
_listed_lock = threading.Lock()


def expand_glob(pattern: str, *, policy: RetryPolicy = RetryPolicy()) -> list[str]:
    """Every object a glob URL matches, sorted; ``*`` and ``?`` never match ``/`` (as a local glob).

    S3 is listed from the literal prefix before the first glob character, with ``policy``'s
    retries.  An http(s) glob is a ValueError: web servers do not list files.
    """
    kind = scheme(pattern)
    if kind == "http":
        raise ValueError(f"shard pattern {redact(pattern)!r}: a web server cannot list files, so an http(s) URL "
                         f"cannot hold a glob; write the shard names as a brace range (data-{{00000..00099}}.tar; "
                         f"egs/large/local/make_hyper.py --remote writes one from the local copy), or put the "
                         f"shards on S3, which can list")
    if kind != "s3":
        raise ValueError(f"shard pattern {redact(pattern)!r}: globs work in local paths and s3:// URLs only")
    bucket, key = split_s3(pattern)
    prefix = key[:magic(key)]
    parts = key.split("/")
    found, _ = with_retries(lambda: list_s3(bucket, prefix, policy.timeout), pattern, policy)
    out = []
    with _listed_lock:
        for name, size in found:
            names = name.split("/")
            if len(names) == len(parts) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts)):
                url = f"s3://{bucket}/{name}"
                _listed[url] = size
                out.append(url)
    return sorted(out)


def take_listed_size(url: str) -> int | None:
    """The size of ``url`` in the listing that named it, or None; taken once (by the shard set
    built from that listing), so a later pattern never checks against an old listing."""
    with _listed_lock:
        return _listed.pop(url, None)


def lister(policy: RetryPolicy) -> Callable[[str], list[str]]:
    """:func:`expand_glob` with ``policy``'s retries: what ``format.shardlist.expand_shards`` calls
    for a glob URL (the format does not list or fetch itself)."""
    return partial(expand_glob, policy=policy)
