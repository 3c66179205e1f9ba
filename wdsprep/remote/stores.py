"""Where a shard can live besides a local disk, one store per URL scheme: the one module that names a scheme.

Every question that depends on a URL's scheme is a :class:`Store`'s: whether a string names a
URL at all, whether an index can live beside the shards (a folder URL), which characters make a
glob and whether the store can list one, where the local cache keeps a copy, and how a byte
stream is opened.  :func:`store_for` finds a URL's store in :data:`STORES`; no other module
compares a scheme.  A new scheme (gs:// with listing and resumed ranges, say) is one class here
and one entry in :data:`STORES`.

The stores open their streams with the clients (:mod:`wdsprep.remote.clients`), imported only when
a stream is opened or a listing made: the format names URLs through :mod:`wdsprep.remote.urls`,
which asks the stores, and never fetches.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from wdsprep.remote.clients import Stream


def first_glob_index(s: str, chars: str = "*?[") -> int:
    """Index of the first glob character (one of ``chars``) in ``s``, or -1."""
    found = [i for i in (s.find(c) for c in chars) if i >= 0]
    return min(found) if found else -1


class Store(ABC):
    """One kind of location, named by the prefixes of its URLs.

    ``name``: the folder its objects are cached under; ``has_folder``: an index can be fetched
    beside its shards (``FOLDER/index.json``); ``has_query``: a ``?`` starts the URL's query (sent
    as it is, its values masked in messages), not a glob; ``glob_chars``: the characters that make
    a glob in :meth:`globbed`'s part of a URL.
    """

    name: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]
    has_folder: ClassVar[bool] = False
    lists: ClassVar[bool] = False  # list() answers a glob
    has_query: ClassVar[bool] = False
    glob_chars: ClassVar[str] = ""
    # Why a glob in this store's URLs cannot be answered (a store whose list() answers None).
    unlisted: ClassVar[str] = "globs work in local paths and s3:// URLs only"

    def owns(self, url: str) -> bool:
        return url.startswith(self.prefixes)

    def globbed(self, url: str) -> str:
        """The part of ``url`` a glob may be in ("": none)."""
        return ""

    def is_glob(self, url: str) -> bool:
        globbed = self.globbed(url)
        return any(c in globbed for c in self.glob_chars)

    @abstractmethod
    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        """The bytes of ``url`` from ``start`` (a server that ignores the range starts at 0: see
        ``Stream.start``), pinned to ``validator``'s version where given.  Raises ``Retryable`` or
        ``Final`` (:mod:`wdsprep.remote.clients`)."""

    def list(self, pattern: str, timeout: float) -> list[tuple[str, int]] | None:
        """(URL, size) of every object under the literal prefix of glob ``pattern`` (what comes
        before its first glob character); None: this store cannot list (see ``unlisted``)."""
        return None

    def cache_parts(self, url: str) -> list[str]:
        """The path of ``url``'s copy in the local cache, as parts under the cache's folder."""
        return [self.name, hashlib.sha256(url.encode()).hexdigest()[:24] + ".tar"]


class S3Store(Store):
    """``s3://bucket/key``: AWS S3 or any S3-compatible store (the endpoint and credentials come
    from the standard AWS variables and files).  Lists a glob's prefix; resumes by ETag."""

    name, prefixes = "s3", ("s3://",)
    has_folder = lists = True
    glob_chars = "*?["

    def split(self, url: str) -> tuple[str, str]:
        """(bucket, key) of ``s3://bucket/key``; ValueError naming a URL without a bucket."""
        bucket, _, key = url[len(self.prefixes[0]):].partition("/")
        if not bucket:
            raise ValueError(f"{url!r}: an S3 URL is s3://BUCKET/KEY")
        return bucket, key

    def globbed(self, url: str) -> str:
        return self.split(url)[1]

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        from wdsprep.remote.clients import S3Stream

        bucket, key = self.split(url)
        return S3Stream(url, bucket, key, start, validator, timeout)

    def list(self, pattern: str, timeout: float) -> list[tuple[str, int]]:
        from wdsprep.remote.clients import list_s3

        bucket, key = self.split(pattern)
        prefix = key[:first_glob_index(key, self.glob_chars)]
        return [(f"{self.prefixes[0]}{bucket}/{name}", size) for name, size in list_s3(bucket, prefix, timeout)]

    def cache_parts(self, url: str) -> list[str]:
        bucket, key = self.split(url)
        return [self.name, bucket, *key.split("/")]


class HTTPStore(Store):
    """``http://`` and ``https://``: any web server.  Cannot list (a glob is an error saying to
    write a brace range); resumes by a strong ETag or Last-Modified."""

    name, prefixes = "http", ("http://", "https://")
    has_folder = has_query = True
    glob_chars = "*["  # "?" starts the query, as in a presigned URL
    unlisted = ("a web server cannot list files, so an http(s) URL cannot hold a glob; write the shard names as a "
                "brace range (data-{00000..00099}.tar; `wdsprep pattern FOLDER --remote URL` writes one from the "
                "local copy), or put the shards on S3, which can list")

    def globbed(self, url: str) -> str:
        return urlsplit(url).path

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        from wdsprep.remote.clients import HTTPStream

        return HTTPStream(url, start, validator, timeout)

    def cache_parts(self, url: str) -> list[str]:
        u = urlsplit(url)  # the query (e.g. a presigned URL's signature) changes, the object does not
        return [self.name, (u.hostname or "") + (f"_{u.port}" if u.port else ""), *u.path.split("/")]


class PipeStore(Store):
    """``pipe:CMD``: a command that writes the shard to stdout (no folder: no index beside it)."""

    name, prefixes = "pipe", ("pipe:",)

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        from wdsprep.remote.clients import PipeStream

        return PipeStream(url[len(self.prefixes[0]):])


class GopenStore(Store):
    """``gs://``, ``ais://``: read through webdataset's ``gopen`` (their command-line tools), like
    a command: no folder, no listing, no resumed ranges."""

    name, prefixes = "url", ("gs://", "ais://")

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        from wdsprep.remote.clients import GopenStream

        return GopenStream(url)


STORES: tuple[Store, ...] = (S3Store(), HTTPStore(), PipeStore(), GopenStore())
# What opens and caches anything no store owns (a local path, handed to the fetch by mistake):
# webdataset's gopen opens a file too.
_FALLBACK: Store = GopenStore()


def store_for(url: str) -> Store | None:
    """The store ``url`` lives in; None for a local path."""
    for store in STORES:
        if store.owns(url):
            return store
    return None


def open_stream(url: str, *, start: int = 0, validator: str | None = None, timeout: float = 60.0) -> Stream:
    """The bytes of ``url`` from ``start``, through its store (:meth:`Store.open`)."""
    return (store_for(url) or _FALLBACK).open(url, start=start, validator=validator, timeout=timeout)


def cache_parts(url: str) -> list[str]:
    """The path of ``url``'s copy in the local cache, as parts (:meth:`Store.cache_parts`)."""
    return (store_for(url) or _FALLBACK).cache_parts(url)
