"""Glob URLs answered by listing their store (:meth:`~wdsprep.remote.stores.Store.list`: S3).

A glob in an S3 key (``s3://b/corpus/*/data-*.tar``) is answered by listing the bucket from the
literal prefix before the first glob character; the sizes the listing returns are kept, so a
shard that changed since it was indexed is caught before the epoch starts.  A store that cannot
list (a web server) makes a glob an error saying why and what to write instead (a brace range).
"""

from __future__ import annotations

import fnmatch
import threading
from functools import partial
from typing import Callable

from wdsprep.remote.fetch import RetryPolicy, with_retries
from wdsprep.remote.stores import Store, store_for
from wdsprep.remote.urls import redact

# Sizes from the last listing of each object (url -> bytes): a stale shard is caught at start.
_listed: dict[str, int] = {}
_listed_lock = threading.Lock()


def expand_glob(pattern: str, *, policy: RetryPolicy = RetryPolicy()) -> list[str]:
    """Every object a glob URL matches, sorted; ``*`` and ``?`` never match ``/`` (as a local glob).

    The store lists the literal prefix before the first glob character, with ``policy``'s
    retries.  A glob in a store that cannot list (a web server) is a ValueError saying why.
    """
    store = store_for(pattern)
    found = None
    if store is not None:
        found, _ = with_retries(lambda: store.list(pattern, policy.timeout), pattern, policy)
    if found is None:
        raise ValueError(f"shard pattern {redact(pattern)!r}: {(store or Store).unlisted}")
    parts = pattern.split("/")
    out = []
    with _listed_lock:
        for url, size in found:
            names = url.split("/")
            if len(names) == len(parts) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts)):
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
