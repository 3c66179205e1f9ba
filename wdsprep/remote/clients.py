"""One S3 client and one HTTP connection pool per process, and the byte streams the stores open with them.

S3 goes through boto3, so the endpoint, region and credentials are found the way the AWS CLI
finds them: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` ...,
``AWS_PROFILE``, ``~/.aws/config`` and ``~/.aws/credentials``, instance roles (MinIO and Ceph
work with an endpoint URL).  http(s) goes through urllib3 (which boto3 uses underneath, so it
costs no install), with ``http(s)_proxy`` / ``no_proxy`` honoured.  Neither retries by itself:
:mod:`wdsprep.remote.fetch` does, counting each retry, and every :class:`Stream` (opened by its
store, :mod:`wdsprep.remote.stores`) says for every failure whether a retry can help
(:class:`Retryable`) or not (:class:`Final`).

Clients are made per process: a DataLoader worker forked from a process that had one gets its
own (connection pools must not be shared across a fork), and the threads of a process share
theirs (boto3 clients and urllib3 pools are thread-safe).  Their connections register with the
attempt being made (:mod:`wdsprep.remote.deadline`), which can shut them down when a server
trickles.

A pack writing into a bucket writes through the same S3 client (:func:`s3_put` and its neighbours),
with S3's conditional writes (``If-None-Match: *``, ``If-Match``) where it must not overwrite; a
condition not met is :class:`Precondition`.

``https://USER:PASSWORD@host/...`` is sent as basic auth (as curl does), the query of a URL as it
is (a presigned URL's signature); neither is ever part of a message (``urls.redact``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit, urlunsplit

from wdsprep.remote import deadline

_lock = threading.Lock()
_clients: dict[tuple, Any] = {}
# Connections kept per host: a reader's downloads in flight (FetchOptions.max_requests) and the
# index fetches at start-up each hold one, and one kept is one that need not be opened again
# (a TLS handshake is another round trip or two).
POOL_CONNECTIONS = 64
# Statuses worth another attempt: the server or something on the way was busy or failing.
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_RETRY_S3_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling",
                   "ThrottlingException", "RequestTimeTooSkewed"}


class Retryable(Exception):
    """A failure another attempt may not meet (a dropped connection, 5xx, a cut-off body).

    ``restart``: the next attempt must start from byte 0 (the object changed under a resumed read);
    ``wait``: at least this many seconds first (the server's Retry-After).
    """

    def __init__(self, why: str, *, restart: bool = False, wait: float | None = None) -> None:
        super().__init__(why)
        self.restart, self.wait = restart, wait


class Final(Exception):
    """A failure retrying cannot fix (no such object, access denied); ``missing`` for "no such object"."""

    def __init__(self, why: str, *, missing: bool = False) -> None:
        super().__init__(why)
        self.missing = missing


class Stream:
    """An object's bytes from ``start`` on.  ``total``: the whole object's size, None when the
    server did not say; ``etag``, ``modified``: the version the server says it is sending (ETag,
    Last-Modified); ``validator``: the one that pins a resumed read to that version, and which a
    resumed response must have again."""

    start: int = 0
    total: int | None = None
    etag: str | None = None
    modified: str | None = None

    @property
    def validator(self) -> str | None:
        """A strong ETag, else the Last-Modified date (If-Range takes no weak ETag), else None (a
        read cut short then starts over: it cannot be resumed safely)."""
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        return self.modified

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def readinto(self, view: memoryview) -> int:
        """Fill (part of) ``view``; how many bytes, 0 at the end."""
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        pass


def _socket_readinto(response: Any, view: memoryview) -> int:
    """Read from a urllib3 response's http.client response into ``view`` (no intermediate bytes);
    a body that ends early returns 0 before its length (the caller counts), a reset raises."""
    fp = getattr(response, "_fp", None)
    if fp is None or not hasattr(fp, "readinto"):
        data = response.read(len(view))
        view[:len(data)] = data
        return len(data)
    return fp.readinto(view) or 0


def _watched_connection(cls: type) -> type:
    """``cls`` (a urllib3 connection class) registering each request's connection with the attempt
    this thread is making, so the watchdog can shut its socket down (headers and body alike)."""

    class Watched(cls):  # type: ignore[misc, valid-type]
        def request(self, *args: Any, **kwargs: Any) -> Any:
            watch = deadline.current()
            if watch is not None:
                watch.attach(lambda: deadline.shutdown(getattr(self, "sock", None)))
            return super().request(*args, **kwargs)

    Watched.__name__ = Watched.__qualname__ = f"Watched{cls.__name__}"
    return Watched


def _watch_pools(classes: dict) -> None:
    """Every pool class of a scheme -> pool class map (urllib3's ``pool_classes_by_scheme``), in
    place, made to open watched connections."""
    for name, pool in list(classes.items()):
        watched = _watched_connection(pool.ConnectionCls)
        classes[name] = type(f"Watched{pool.__name__}", (pool,), {"ConnectionCls": watched})


def _watch_response(response: Any) -> None:
    """Register the socket a response is read from with this thread's attempt (for a connection
    that did not register itself)."""
    watch = deadline.current()
    if watch is None:
        return
    conn = getattr(response, "connection", None) or getattr(response, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:  # http.client's response: its file's socket
        raw = getattr(getattr(getattr(response, "_fp", None), "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
    if sock is not None:
        watch.attach(lambda: deadline.shutdown(sock))


def _client(key: tuple, make: Any) -> Any:
    key = (os.getpid(), *key)
    with _lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = make()
        return c


def s3_client(timeout: float) -> Any:
    """This process's boto3 S3 client (retries off: ours count them)."""
    def make() -> Any:
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=min(timeout, 20),
                                read_timeout=timeout, max_pool_connections=POOL_CONNECTIONS))
        # botocore's pools are not configurable: its session's scheme -> pool map (one dict, shared
        # by its pool and proxy managers) is made to open watched connections.  Should a botocore
        # release rename it, a trickling S3 response is still cut once its body is read
        # (_watch_response), only its headers are not.
        classes = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None),
                          "_pool_classes_by_scheme", None)
        if isinstance(classes, dict):
            _watch_pools(classes)
        return client
    # The endpoint and profile are read when the client is made: a change of them makes another.
    env = tuple(os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE"))
    return _client(("s3", timeout, env), make)


def http_pool(url: str, timeout: float) -> Any:
    """This process's urllib3 pool for ``url`` (through the proxy the environment names, if any)."""
    from urllib.request import getproxies, proxy_bypass  # imports http.client and ssl: only when needed

    import urllib3

    parts = urlsplit(url)
    proxy = None if proxy_bypass(parts.hostname or "") else getproxies().get(parts.scheme)

    def make() -> Any:
        kw = dict(num_pools=16, maxsize=POOL_CONNECTIONS,
                  timeout=urllib3.Timeout(connect=min(timeout, 20), read=timeout),
                  retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5,
                                        raise_on_status=False))
        manager = urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw)
        manager.pool_classes_by_scheme = dict(manager.pool_classes_by_scheme)  # this manager's own
        _watch_pools(manager.pool_classes_by_scheme)
        return manager
    return _client(("http", proxy, timeout), make)


def _s3_error(e: Exception) -> Exception:
    """A botocore error as Retryable or Final."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return Final(f"no S3 credentials ({e}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
                     f"~/.aws/credentials (and AWS_ENDPOINT_URL for MinIO or Ceph)")
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
            what = "no such bucket" if code == "NoSuchBucket" else "no such object"
            return Final(f"{what} (check the pattern, the bucket and AWS_ENDPOINT_URL)", missing=True)
        if code in ("PreconditionFailed", "412") or status == 412:
            return Retryable("the object changed while it was read", restart=True)
        if code == "InvalidRange" or status == 416:
            return Retryable("the server refused the resumed range", restart=True)
        if status in _RETRY_STATUS or status >= 500 or code in _RETRY_S3_CODES:
            return Retryable(f"S3 error {code or status}: {err.get('Message', '')}".rstrip(": "))
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return Final(f"access denied ({code}): check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, "
                         f"~/.aws/credentials) and the bucket's policy")
        return Final(f"S3 error {code or status}: {err.get('Message', '')}")
    return Retryable(f"{type(e).__name__}: {e}")


class S3Stream(Stream):
    """Object ``key`` of ``bucket`` (``url``) through this process's boto3 client, resumed by ETag."""

    def __init__(self, url: str, bucket: str, key: str, start: int, validator: str | None, timeout: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        self.url = url
        self._errors = (BotoCoreError, ClientError)
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start:
            kw["Range"] = f"bytes={start}-"
            if validator:
                kw["IfMatch"] = validator  # a resumed read of another version fails (412): start over
        try:
            r = s3_client(timeout).get_object(**kw)
        except self._errors as e:
            raise _s3_error(e) from None
        except OSError as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None
        except (ValueError, TypeError) as e:  # a header botocore cannot parse (a Content-Length of "abc")
            raise Retryable(f"the server sent a malformed response ({type(e).__name__}: {e})") from None
        self.body = r["Body"]
        _watch_response(getattr(self.body, "_raw_stream", None))
        self.etag, self.modified = r.get("ETag"), None  # S3 resumes by ETag (If-Match)
        span = _content_range(r.get("ContentRange"))
        if span is not None:
            self.start, self.total = span
        else:
            self.start, self.total = 0, _content_length(r.get("ContentLength"))

    def read(self, n: int) -> bytes:
        try:
            return self.body.read(n)
        except Exception as e:  # botocore/urllib3 errors of a cut-off stream, socket errors
            raise Retryable(f"the connection failed mid-body ({type(e).__name__}: {e})") from None

    def readinto(self, view: memoryview) -> int:
        raw = getattr(self.body, "_raw_stream", None)  # botocore's StreamingBody over a urllib3 response
        if raw is None:
            return super().readinto(view)
        try:
            return _socket_readinto(raw, view)
        except Exception as e:
            raise Retryable(f"the connection failed mid-body ({type(e).__name__}: {e})") from None

    def close(self) -> None:
        raw = getattr(self.body, "_raw_stream", None)
        try:
            if raw is not None and raw.isclosed():
                raw.release_conn()  # read to its end: the connection serves the next request
            else:
                self.body.close()
        except Exception:
            pass


def _content_length(value: Any) -> int | None:
    """A Content-Length header's bytes (None without one); Retryable for one that is no count
    (a broken server or proxy: another attempt may meet a sound one)."""
    if value is None or isinstance(value, int):
        return None if value is None or value < 0 else value
    counts = {v.strip() for v in str(value).split(",")}  # "n, n": a header repeated by a proxy
    if len(counts) != 1 or not next(iter(counts)).isdigit():
        raise Retryable(f"the server sent a malformed Content-Length {str(value)[:40]!r}")
    return int(counts.pop())


def _content_range(value: str | None) -> tuple[int, int | None] | None:
    """(first byte, total) of ``bytes a-b/total``; None without one."""
    m = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", value or "")
    if not m:
        return None
    return int(m.group(1)), None if m.group(2) == "*" else int(m.group(2))


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(``url`` without its userinfo, (user, password) percent-decoded, or None): what an HTTP client
    sends as basic auth, as curl does with ``https://USER:PASSWORD@host/...``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    return (urlunsplit(parts._replace(netloc=host)),
            (unquote(parts.username or ""), unquote(parts.password or "")))


class HTTPStream(Stream):
    """``url`` from a web server through this process's urllib3 pool, resumed by If-Range."""

    def __init__(self, url: str, start: int, validator: str | None, timeout: float) -> None:
        import urllib3

        target, auth = credentials(url)
        headers = {}
        if auth is not None:
            headers.update(urllib3.util.make_headers(basic_auth=f"{auth[0]}:{auth[1]}"))
        if start:
            headers["Range"] = f"bytes={start}-"
            if validator:
                headers["If-Range"] = validator  # changed since: the server sends it whole (200)
        try:
            r = http_pool(target, timeout).request("GET", target, headers=headers, preload_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None
        self.r = r
        _watch_response(r)
        status = r.status
        if status in (200, 206):
            try:
                span = _content_range(r.headers.get("Content-Range")) if status == 206 else None
                if span is not None:
                    self.start, self.total = span
                else:
                    self.start, self.total = 0, _content_length(r.headers.get("Content-Length"))
            except Retryable:
                self.close()
                raise
            self.etag, self.modified = r.headers.get("ETag"), r.headers.get("Last-Modified")
            return
        self.close()
        if status in (404, 410):
            raise Final(f"HTTP {status} (no such file on the server: check the URL)", missing=True)
        if status == 416:
            raise Retryable("HTTP 416 for a resumed range", restart=True)
        if status in _RETRY_STATUS or status >= 500:
            raise Retryable(f"HTTP {status}", wait=_retry_after(r.headers.get("Retry-After")))
        if status == 401 and auth is not None:
            raise Final("HTTP 401 (the server refuses the user and password in the URL: check them)")
        if status == 401:
            raise Final("HTTP 401 (the server wants credentials: put USER:PASSWORD@ before the host in the URL, sent "
                        "as basic auth, or use a presigned URL)")
        if status == 403:
            raise Final("HTTP 403 (the server refuses access: check the credentials or token in the URL and the "
                        "file's permissions on the server)")
        raise Final(f"HTTP {status}")

    def read(self, n: int) -> bytes:
        try:
            return self.r.read(n)
        except Exception as e:  # urllib3 IncompleteRead/ProtocolError, read timeouts, socket errors
            raise Retryable(f"the connection failed mid-body ({type(e).__name__}: {e})") from None

    def readinto(self, view: memoryview) -> int:
        try:
            return _socket_readinto(self.r, view)
        except Exception as e:
            raise Retryable(f"the connection failed mid-body ({type(e).__name__}: {e})") from None

    def close(self) -> None:
        try:
            if not self.r.isclosed():
                self.r.close()  # a body left unread: this connection cannot serve another request
            self.r.release_conn()
        except Exception:
            pass


def _retry_after(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for; None for a date or nonsense (the backoff decides).
    The wait is capped by the retry policy."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


class PipeStream(Stream):
    """Command ``cmd``'s stdout; its exit status is checked at the end (a failed command is retried)."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd
        self.err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty command cannot block on it
        self.proc = subprocess.Popen(self.cmd, shell=True, stdout=subprocess.PIPE, stderr=self.err)
        watch = deadline.current()
        if watch is not None:
            watch.attach(self.proc.kill)  # a command that trickles is ended like a slow server

    def read(self, n: int) -> bytes:
        assert self.proc.stdout is not None
        chunk = self.proc.stdout.read(n)
        if not chunk:
            code = self.proc.wait()
            if code != 0:
                self.err.seek(0)
                tail = self.err.read()[-500:].decode("utf-8", "replace").strip()
                raise Retryable(f"command exited with status {code}" + (f": {tail}" if tail else ""))
        return chunk

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


class GopenStream(Stream):
    """``url`` through webdataset's ``gopen``, which runs the command-line tool of its scheme
    (``gsutil cat``, ``ais get``)."""

    def __init__(self, url: str) -> None:
        from webdataset.gopen import gopen

        try:
            self.f = gopen(url, "rb")
        except Exception as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None

    def read(self, n: int) -> bytes:
        try:
            return self.f.read(n)
        except Exception as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None

    def close(self) -> None:
        try:
            self.f.close()
        except Exception as e:  # webdataset checks the helper command's exit status on close
            raise Retryable(f"{type(e).__name__}: {e}") from None


def list_s3(bucket: str, prefix: str, timeout: float) -> list[tuple[str, int]]:
    """(key, size) of every object under ``prefix``; raises Retryable or Final."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        paginator = s3_client(timeout).get_paginator("list_objects_v2")
        pages: Iterator[dict] = paginator.paginate(Bucket=bucket, Prefix=prefix)
        return [(o["Key"], int(o["Size"])) for page in pages for o in page.get("Contents", [])]
    except (BotoCoreError, ClientError) as e:
        raise _s3_error(e) from None
    except (OSError, ValueError, TypeError) as e:
        raise Retryable(f"{type(e).__name__}: {e}") from None


# -- writing: what a pack's output in a bucket needs ------------------------------------------------------


class Precondition(Exception):
    """A conditional write or delete refused (HTTP 412): the object is there already (``if_absent``),
    or is not the version named (``if_match``)."""


def _s3_call(what: str, call: Any) -> Any:
    """``call()`` (a boto3 request), its failure as :class:`Precondition`, Retryable or Final."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except ClientError as e:
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        code = str(e.response.get("Error", {}).get("Code", ""))
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise Precondition(f"{what}: {code or status}") from None
        raise _s3_error(e) from None
    except BotoCoreError as e:
        raise _s3_error(e) from None
    except (OSError, ValueError, TypeError) as e:
        raise Retryable(f"{type(e).__name__}: {e}") from None


def s3_put(bucket: str, key: str, body: bytes | str, *, timeout: float, if_absent: bool = False,
           if_match: str | None = None, metadata: dict[str, str] | None = None) -> str:
    """Write object ``key``: ``body`` (bytes, or a local file's path, sent in parts when large); its
    ETag.  ``if_absent``: only if no such object is there (``If-None-Match: *``); ``if_match``: only
    over that version (``If-Match``); else :class:`Precondition`."""
    client = s3_client(timeout)
    extra: dict[str, Any] = {"Metadata": metadata} if metadata else {}
    if isinstance(body, str):  # a file: boto3's managed upload (multipart above 8 MB); conditions are for small objects
        assert not if_absent and if_match is None
        _s3_call(key, lambda: client.upload_file(body, bucket, key, ExtraArgs=extra or None))
        return ""
    if if_absent:
        extra["IfNoneMatch"] = "*"
    if if_match is not None:
        extra["IfMatch"] = if_match
    return str(_s3_call(key, lambda: client.put_object(Bucket=bucket, Key=key, Body=body, **extra)).get("ETag", ""))


def _s3_found(key: str, call: Any) -> Any:
    """``_s3_call(key, call)``, or None where the object is not there."""
    try:
        return _s3_call(key, call)
    except Final as e:
        if e.missing:
            return None
        raise


def s3_copy(bucket: str, source: str, key: str, *, timeout: float) -> None:
    """Copy object ``source`` to ``key`` in the bucket, server-side (its metadata with it)."""
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=5 << 30)  # one request below S3's 5 GB limit for it
    _s3_call(key, lambda: s3_client(timeout).copy({"Bucket": bucket, "Key": source}, bucket, key, Config=config))


def s3_head(bucket: str, key: str, *, timeout: float) -> tuple[int, str, dict[str, str]] | None:
    """(size, ETag, metadata) of object ``key``, or None when there is none."""
    r = _s3_found(key, lambda: s3_client(timeout).head_object(Bucket=bucket, Key=key))
    if r is None:
        return None
    return int(r.get("ContentLength", 0)), str(r.get("ETag", "")), dict(r.get("Metadata") or {})


def s3_get(bucket: str, key: str, *, timeout: float, limit: int) -> tuple[bytes, str] | None:
    """(bytes, ETag) of a small object, at most ``limit`` bytes (ValueError beyond), or None."""
    r = _s3_found(key, lambda: s3_client(timeout).get_object(Bucket=bucket, Key=key))
    if r is None:
        return None
    if int(r.get("ContentLength", 0)) > limit:
        r["Body"].close()
        raise ValueError(f"s3://{bucket}/{key}: {r['ContentLength']:,} bytes, more than the {limit:,} it can have")
    return r["Body"].read(limit + 1)[:limit], str(r.get("ETag", ""))


def s3_delete(bucket: str, keys: list[str], *, timeout: float) -> None:
    """Delete objects (1,000 per request); one that is not there is no error."""
    client = s3_client(timeout)
    for i in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[i:i + 1000]]
        r = _s3_call(keys[i], lambda batch=batch: client.delete_objects(Bucket=bucket, Delete={"Objects": batch,
                                                                                               "Quiet": True}))
        errors = r.get("Errors") or []
        if errors:
            raise Final(f"cannot delete s3://{bucket}/{errors[0].get('Key')}: {errors[0].get('Code')} "
                        f"{errors[0].get('Message', '')}".rstrip())
