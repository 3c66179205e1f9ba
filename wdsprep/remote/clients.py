"""One S3 client and one HTTP connection pool per process, and a byte stream over any location.

S3 goes through boto3, so the endpoint, region and credentials are found the way the AWS CLI
finds them: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` ...,
``AWS_PROFILE``, ``~/.aws/config`` and ``~/.aws/credentials``, instance roles (MinIO and Ceph
work with an endpoint URL).  http(s) goes through urllib3 (which boto3 uses underneath, so it
costs no install), with ``http(s)_proxy`` / ``no_proxy`` honoured.  Neither retries by itself:
:mod:`wdsprep.remote.fetch` does, counting each retry, and :func:`open_stream` says for every
failure whether a retry can help (:class:`Retryable`) or not (``FetchError``).

Clients are made per process: a DataLoader worker forked from a process that had one gets its
own (connection pools must not be shared across a fork), and the threads of a process share
theirs (boto3 clients and urllib3 pools are thread-safe).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit

from wdsprep.remote.urls import scheme, split_s3

_lock = threading.Lock()
_clients: dict[tuple, Any] = {}
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
    server did not say; ``validator``: an ETag or date a resumed read must match."""

    start: int = 0
    total: int | None = None
    validator: str | None = None

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

        return boto3.session.Session().client(
            "s3", config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=min(timeout, 20),
                                read_timeout=timeout, max_pool_connections=32))
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
        kw = dict(num_pools=16, maxsize=8, timeout=urllib3.Timeout(connect=min(timeout, 20), read=timeout),
                  retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=5,
                                        raise_on_status=False))
        return urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw)
    return _client(("http", proxy, timeout), make)


def _s3_error(e: Exception, url: str) -> Exception:
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


class _S3Stream(Stream):
    def __init__(self, url: str, start: int, validator: str | None, timeout: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        self.url = url
        self._errors = (BotoCoreError, ClientError)
        bucket, key = split_s3(url)
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start:
            kw["Range"] = f"bytes={start}-"
            if validator:
                kw["IfMatch"] = validator  # a resumed read of another version fails (412): start over
        try:
            r = s3_client(timeout).get_object(**kw)
        except self._errors as e:
            raise _s3_error(e, url) from None
        except OSError as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None
        self.body = r["Body"]
        self.validator = r.get("ETag")
        span = _content_range(r.get("ContentRange"))
        if span is not None:
            self.start, self.total = span
        else:
            self.start, self.total = 0, int(r["ContentLength"])

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


def _content_range(value: str | None) -> tuple[int, int | None] | None:
    """(first byte, total) of ``bytes a-b/total``; None without one."""
    m = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", value or "")
    if not m:
        return None
    return int(m.group(1)), None if m.group(2) == "*" else int(m.group(2))


class _HTTPStream(Stream):
    def __init__(self, url: str, start: int, validator: str | None, timeout: float) -> None:
        import urllib3

        headers = {}
        if start:
            headers["Range"] = f"bytes={start}-"
            if validator:
                headers["If-Range"] = validator  # changed since: the server sends it whole (200)
        try:
            r = http_pool(url, timeout).request("GET", url, headers=headers, preload_content=False)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Retryable(f"{type(e).__name__}: {e}") from None
        self.r = r
        status = r.status
        if status in (200, 206):
            length = r.headers.get("Content-Length")
            span = _content_range(r.headers.get("Content-Range")) if status == 206 else None
            if span is not None:
                self.start, self.total = span
            else:
                self.start, self.total = 0, int(length) if length is not None else None
            self.validator = r.headers.get("ETag") or r.headers.get("Last-Modified")
            return
        self.close()
        if status in (404, 410):
            raise Final(f"HTTP {status} (no such file on the server: check the URL)", missing=True)
        if status == 416:
            raise Retryable("HTTP 416 for a resumed range", restart=True)
        if status in _RETRY_STATUS or status >= 500:
            raise Retryable(f"HTTP {status}", wait=_retry_after(r.headers.get("Retry-After")))
        if status in (401, 403):
            raise Final(f"HTTP {status} (the server refuses access: check the URL's credentials or token)")
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
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


class _PipeStream(Stream):
    """A command's stdout; its exit status is checked at the end (a failed command is retried)."""

    def __init__(self, url: str) -> None:
        self.cmd = url[len("pipe:"):]
        self.err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty command cannot block on it
        self.proc = subprocess.Popen(self.cmd, shell=True, stdout=subprocess.PIPE, stderr=self.err)

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


class _GopenStream(Stream):
    """gs://, ais://: webdataset's openers, as before."""

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


def open_stream(url: str, *, start: int = 0, validator: str | None = None, timeout: float = 60.0) -> Stream:
    """The bytes of ``url`` from ``start`` (a server that ignores the range starts at 0: see
    ``Stream.start``).  Raises :class:`Retryable` or :class:`Final`."""
    kind = scheme(url)
    if kind == "s3":
        return _S3Stream(url, start, validator, timeout)
    if kind == "http":
        return _HTTPStream(url, start, validator, timeout)
    if kind == "pipe":
        return _PipeStream(url)
    return _GopenStream(url)


def list_s3(bucket: str, prefix: str, timeout: float) -> list[tuple[str, int]]:
    """(key, size) of every object under ``prefix``; raises Retryable or Final."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        paginator = s3_client(timeout).get_paginator("list_objects_v2")
        pages: Iterator[dict] = paginator.paginate(Bucket=bucket, Prefix=prefix)
        return [(o["Key"], int(o["Size"])) for page in pages for o in page.get("Contents", [])]
    except (BotoCoreError, ClientError) as e:
        raise _s3_error(e, f"s3://{bucket}/{prefix}") from None
    except OSError as e:
        raise Retryable(f"{type(e).__name__}: {e}") from None
