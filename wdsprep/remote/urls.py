"""Shard locations named: which strings are URLs, where their index lives, their globs, and their secrets masked.

What a URL's scheme can do is its store's (:mod:`wdsprep.remote.stores`: ``s3://``, ``http(s)://``,
``pipe:CMD``, and ``gs://``/``ais://`` through webdataset's ``gopen``); the functions here ask it.
Globs are answered in ``listing.py``.

A URL may hold secrets: a user and password (``https://USER:PASSWORD@host/...``, sent as HTTP
basic auth) or a token or signature in its query (a presigned URL, sent as it is).  Every
message that names a URL names it through :func:`redact`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from wdsprep.remote.stores import STORES, store_for


def is_url(s: str) -> bool:
    """Whether ``s`` names a shard that is not a local path."""
    return store_for(s) is not None


def has_folder(url: str) -> bool:
    """Whether an index can be fetched beside ``url`` (S3 and http(s); a command has no folder)."""
    store = store_for(url)
    return store is not None and store.has_folder


def can_list(url: str) -> bool:
    """Whether the store of ``url`` answers a glob by listing (S3 does; a web server does not)."""
    store = store_for(url)
    return store is not None and store.lists


def folder_of(url: str) -> str:
    """The folder URL of an object URL (its index lives there)."""
    return url.split("?", 1)[0].rsplit("/", 1)[0]


def is_glob(url: str) -> bool:
    """Whether a URL holds a glob: any of its store's glob characters where its store reads globs
    (any of ``*?[`` in an S3 key; ``*`` or ``[`` in an http(s) path, where ``?`` starts the query)."""
    store = store_for(url)
    return store is not None and store.is_glob(url)


# scheme://USER[:PASSWORD]@: the userinfo of any URL in a text (a URL, a pipe: command, a message).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"]+@")
# The query of a URL whose store has queries (http(s); in an s3:// URL a ``?`` is a glob character),
# up to its last character that is not a sentence's punctuation.
_WITH_QUERY = "|".join(re.escape(p) for s in STORES if s.has_query for p in s.prefixes)
_QUERY = re.compile(rf"(?i)(\b(?:{_WITH_QUERY})[^?#\s'\"]*\?)[^#\s'\"]*[^#\s'\":;,.)\]]")
MASK = "***"


def _mask_query(query: str) -> str:
    """``a=1&b=2`` as ``a=***&b=***``: the names stay (they say what kind of URL it is), the values go."""
    return "&".join(f"{part.partition('=')[0]}={MASK}" if "=" in part else MASK for part in query.split("&"))


def redact(text: str, url: str | None = None) -> str:
    """``text`` (a URL, a command, a message) with its secrets masked: the user and password of every
    ``scheme://USER:PASSWORD@``, the query values of every http(s) URL, and, where ``url`` is given,
    ``url``'s own secrets wherever they occur (an HTTP library's message may quote its path and query
    without the host).  Everything that names a URL in a message names it through this."""
    if url is not None:
        store = store_for(url)
        parts = urlsplit(url) if store is not None and store.has_query else None
        if parts is not None and parts.query:
            text = text.replace(parts.query, _mask_query(parts.query))
        if parts is not None and "@" in parts.netloc:
            text = text.replace(parts.netloc.rpartition("@")[0] + "@", MASK + "@")
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    return _QUERY.sub(lambda m: m.group(1) + _mask_query(m.group(0)[len(m.group(1)):]), text)
