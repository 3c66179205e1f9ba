"""Shard locations that are not local paths, and the globs a store can answer.

``s3://bucket/key`` (AWS S3 or any S3-compatible store: the endpoint and credentials come from
the standard AWS variables and files), ``http://`` and ``https://`` (any web server), and
``pipe:CMD`` (a command that writes the shard to stdout).  ``gs://`` and ``ais://`` are passed to
webdataset's openers as before.

Globs are answered in ``listing.py``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SCHEMES = ("pipe:", "http://", "https://", "gs://", "s3://", "ais://")


def is_url(s: str) -> bool:
    """Whether ``s`` names a shard that is not a local path."""
    return s.startswith(SCHEMES)


def scheme(url: str) -> str:
    """``"s3"``, ``"http"``, ``"pipe"``, ``"other"`` (gs://, ais://) or ``"local"``."""
    if url.startswith("s3://"):
        return "s3"
    if url.startswith(("http://", "https://")):
        return "http"
    if url.startswith("pipe:"):
        return "pipe"
    return "other" if is_url(url) else "local"


def has_folder(url: str) -> bool:
    """Whether an index can be fetched beside ``url`` (S3 and http(s); a command has no folder)."""
    return scheme(url) in ("s3", "http")


def folder_of(url: str) -> str:
    """The folder URL of an object URL (its index lives there)."""
    return url.split("?", 1)[0].rsplit("/", 1)[0]


def split_s3(url: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; ValueError naming a URL without a bucket."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url!r}: an S3 URL is s3://BUCKET/KEY")
    return bucket, key


def magic(s: str) -> int:
    """Index of the first glob character of ``s``, or -1."""
    found = [i for i in (s.find(c) for c in "*?[") if i >= 0]
    return min(found) if found else -1


def is_glob(url: str) -> bool:
    """Whether a URL holds a glob: any of ``*?[`` in an S3 key; ``*`` or ``[`` in an http(s) path
    (``?`` starts its query, as in a presigned URL)."""
    kind = scheme(url)
    if kind == "s3":
        return magic(split_s3(url)[1]) >= 0
    if kind == "http":
        path = urlsplit(url).path
        return "*" in path or "[" in path
    return False
