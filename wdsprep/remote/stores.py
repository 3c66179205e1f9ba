"""Where a shard can live besides a local disk, one store per URL scheme: the one module that names a scheme.

Every question that depends on a URL's scheme is a :class:`Store`'s: whether a string names a
URL at all, whether an index can live beside the shards (a folder URL), which characters make a
glob and whether the store can list one, where the local cache keeps a copy, how a byte stream
is opened, and whether (and how) a pack can write its output there (``writes``: :meth:`Store.put`,
``copy``, ``head``, ``get``, ``delete``, ``listing``, with conditional writes for a pack's lease
and published entries).  :func:`store_for` finds a URL's store in :data:`STORES`; no other module
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
    writes: ClassVar[bool] = False  # a pack can write its output here (the methods below)
    # Why a pack cannot write its output to this store's URLs.
    unwritable: ClassVar[str] = "a pack writes to a local folder or an s3:// bucket"

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

    # Writing (``writes``): each raises Retryable or Final, and Precondition for a condition not met.
    def put(self, url: str, body: bytes | str, *, timeout: float, if_absent: bool = False,
            if_match: str | None = None, metadata: dict[str, str] | None = None) -> str:
        """Write ``url`` (bytes, or a local file's path): its version (ETag).  ``if_absent``: only
        where nothing is; ``if_match``: only over that version."""
        raise NotImplementedError(self.unwritable)

    def copy(self, source: str, url: str, *, timeout: float) -> None:
        """Copy object ``source`` to ``url`` within the store (nothing passes through here)."""
        raise NotImplementedError(self.unwritable)

    def head(self, url: str, *, timeout: float) -> tuple[int, str, dict[str, str]] | None:
        """(size, version, metadata) of ``url``; None when there is no such object."""
        raise NotImplementedError(self.unwritable)

    def get(self, url: str, *, timeout: float, limit: int) -> tuple[bytes, str] | None:
        """(bytes, version) of a small object, at most ``limit`` bytes; None when there is none."""
        raise NotImplementedError(self.unwritable)

    def delete(self, urls: list[str], *, timeout: float) -> None:
        """Delete objects; one not there is no error."""
        raise NotImplementedError(self.unwritable)

    def listing(self, prefix: str, *, timeout: float) -> dict[str, int]:
        """URL -> size of every object whose URL starts with ``prefix``."""
        raise NotImplementedError(self.unwritable)


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

    writes = True

    def put(self, url: str, body: bytes | str, *, timeout: float, if_absent: bool = False,
            if_match: str | None = None, metadata: dict[str, str] | None = None) -> str:
        from wdsprep.remote.clients import s3_put

        return s3_put(*self.split(url), body, timeout=timeout, if_absent=if_absent, if_match=if_match,
                      metadata=metadata)

    def copy(self, source: str, url: str, *, timeout: float) -> None:
        from wdsprep.remote.clients import s3_copy

        bucket, key = self.split(url)
        s3_copy(bucket, self.split(source)[1], key, timeout=timeout)

    def head(self, url: str, *, timeout: float) -> tuple[int, str, dict[str, str]] | None:
        from wdsprep.remote.clients import s3_head

        return s3_head(*self.split(url), timeout=timeout)

    def get(self, url: str, *, timeout: float, limit: int) -> tuple[bytes, str] | None:
        from wdsprep.remote.clients import s3_get

        return s3_get(*self.split(url), timeout=timeout, limit=limit)

    def delete(self, urls: list[str], *, timeout: float) -> None:
        from wdsprep.remote.clients import s3_delete

        if urls:
            s3_delete(self.split(urls[0])[0], [self.split(u)[1] for u in urls], timeout=timeout)

    def listing(self, prefix: str, *, timeout: float) -> dict[str, int]:
        from wdsprep.remote.clients import list_s3

        bucket, key = self.split(prefix)
        return {f"{self.prefixes[0]}{bucket}/{name}": size for name, size in list_s3(bucket, key, timeout)}


class HTTPStore(Store):
    """``http://`` and ``https://``: any web server.  Cannot list (a glob is an error saying to
    write a brace range); resumes by a strong ETag or Last-Modified."""

    name, prefixes = "http", ("http://", "https://")
    has_folder = has_query = True
    glob_chars = "*["  # "?" starts the query, as in a presigned URL
    unwritable = ("a web server is read, not written: pack into a local folder (or an s3:// bucket) and serve that "
                  "folder")
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
    unwritable = ("gs:// and ais:// are read through their command-line tools, not written: pack into a local folder, "
                  "or into an s3:// URL of the store's S3-compatible endpoint (AWS_ENDPOINT_URL)")

    def open(self, url: str, *, start: int, validator: str | None, timeout: float) -> Stream:
        from wdsprep.remote.clients import GopenStream

        return GopenStream(url)


STORES: tuple[Store, ...] = (S3Store(), HTTPStore(), PipeStore(), GopenStore())
# What opens and caches anything no store owns (a local path, handed to the fetch by mistake):
# webdataset's gopen opens a file too.
_FALLBACK: Store = GopenStore()


def writable_store(url: str) -> Store | None:
    """The store a pack's output URL is written to (None: a local path); ValueError naming the URL
    when no store can be written there, or it names a scheme no store knows (``s3:/x``, ``gcs://``),
    which would otherwise be a local folder of that name."""
    import re

    store = store_for(url)
    if store is None and re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", url):
        raise ValueError(f"{url!r} names no store wdsprep knows (s3://BUCKET/PREFIX, or a local folder); a pack "
                         f"would make a local folder of that name")
    if store is not None and not store.writes:
        raise ValueError(f"{url!r}: {store.unwritable}")
    return store


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
