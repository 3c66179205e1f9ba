"""Shard locations that are not local paths, and the globs a store can answer.

``s3://bucket/key`` (AWS S3 or any S3-compatible store: the endpoint and credentials come from
the standard AWS variables and files), ``http://`` and ``https://`` (any web server), and
``pipe:CMD`` (a command that writes the shard to stdout).  ``gs://`` and ``ais://`` are passed to
webdataset's openers as before.

Globs are answered in ``listing.py``.

A URL may hold secrets: a user and password (``https://USER:PASSWORD@host/...``, sent as HTTP
basic auth) or a token or signature in its query (a presigned URL, sent as it is).  Every
message that names a URL names it through :func:`redact`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

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


# scheme://USER[:PASSWORD]@: the userinfo of any URL in a text (a URL, a pipe: command, a message).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"]+@")
# The query of an http(s) URL (in an s3:// URL a ``?`` is a glob character, not a query).
_QUERY = re.compile(r"(?i)(\bhttps?://[^?#\s'\"]*\?)[^#\s'\"]*[^#\s'\":;,.)\]]")  # not a sentence's punctuation
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
        parts = urlsplit(url) if scheme(url) == "http" else None
        if parts is not None and parts.query:
            text = text.replace(parts.query, _mask_query(parts.query))
        if parts is not None and "@" in parts.netloc:
            text = text.replace(parts.netloc.rpartition("@")[0] + "@", MASK + "@")
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    return _QUERY.sub(lambda m: m.group(1) + _mask_query(m.group(0)[len(m.group(1)):]), text)


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(``url`` without its userinfo, (user, password) percent-decoded, or None): what an HTTP client
    sends as basic auth, as curl does with ``https://USER:PASSWORD@host/...``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    return (urlunsplit(parts._replace(netloc=host)),
            (unquote(parts.username or ""), unquote(parts.password or "")))


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
