"""Where shards live besides a local disk, and how their bytes get here.

``urls.py`` names the locations (``s3://bucket/key``, ``http(s)://``, ``pipe:CMD``) and lists S3
for globs; ``clients.py`` holds one S3 client (boto3) and one HTTP pool (urllib3) per process
and opens a byte stream, classifying every failure as worth a retry or not; ``fetch.py`` brings a
whole object into an anonymous memory file or a file, with retries, resuming a cut-off body where
it stopped, checked against the size the index recorded; ``cache.py`` is the optional local
shard cache, shared safely by the ranks of a node.

Nothing here knows what a shard holds: the bytes are parsed only by ``wdsprep.format``, which
opens what this package fetched like a local file.
"""

from wdsprep.remote.fetch import (
    FetchError,
    LocalCopy,
    NotFoundError,
    RetryPolicy,
    SizeMismatchError,
    fetch_bytes,
    fetch_shard,
)
from wdsprep.remote.urls import SCHEMES, is_url

__all__ = ["FetchError", "LocalCopy", "NotFoundError", "RetryPolicy", "SizeMismatchError", "fetch_bytes",
           "fetch_shard", "SCHEMES", "is_url"]
