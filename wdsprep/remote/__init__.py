"""Where shards live besides a local disk, and how their bytes get here.

``stores.py`` holds one store per URL scheme (``s3://bucket/key``, ``http(s)://``, ``pipe:CMD``, and
``gs://``/``ais://`` through webdataset's ``gopen``), the one place a scheme is named: what each can
do (an index beside its shards, globs, a listing, its place in the cache), how it opens a byte
stream, and where a pack can write its output (S3), how it writes there; ``urls.py`` names the
locations through them and masks their secrets in messages; ``listing.py`` answers globs where a
store can list (S3); ``clients.py`` holds one S3 client (boto3) and one HTTP pool (urllib3) per
process and the streams the stores open, classifying every failure as worth a retry or not;
``deadline.py`` holds every download to a minimum rate; ``fetch.py`` brings a whole object into an
anonymous memory file or a file, with retries, resuming a cut-off body where it stopped, checked
against the size and checksum the index recorded; ``pace.py`` sizes a reader's downloads in flight
to the store (its measured latency and bandwidth against the pace the reader reads at);
``cache.py`` is the optional local shard cache, shared safely by the ranks of a node.

Nothing here knows what a shard holds: the bytes are parsed only by ``wdsprep.format``, which
reads what the layers above fetched with this package, handed to it as a local copy.

The names below are resolved on first use: importing ``wdsprep.remote.urls`` (as the format
does, for naming URLs) does not import the fetching side, nor the clients the stores open streams
with.
"""

from wdsprep.lazy import lazy_exports

_LAZY = {"FetchError": "fetch", "ChangedError": "fetch", "LocalCopy": "fetch", "NotFoundError": "fetch",
         "RetryPolicy": "fetch", "TooLargeError": "fetch", "fetch_file": "fetch", "fetch_shard": "fetch",
         "is_url": "urls", "redact": "urls"}
__all__ = list(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY)
