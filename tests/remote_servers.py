"""Real servers on 127.0.0.1 for the remote-shard tests, with faults planted on request.

- :func:`http_server`: Python's ``ThreadingHTTPServer`` serving a directory (Content-Length,
  optionally byte ranges), or relaying to another server (:func:`s3_server`'s, to plant faults
  in S3 responses).
- :func:`s3_server`: moto's S3-compatible server (``ThreadedMotoServer``), with the AWS variables
  pointing boto3 at it.

Faults are planted per path: ``server.faults[path] = ["503", "503"]`` makes the next two GETs of
that path answer 503; ``"truncate"`` sends half the body and ends the connection cleanly (the
client sees the body end early), ``"reset"`` sends half and resets the connection (RST),
``"slow"`` sends half, sleeps and then the rest.  Hostile ones: ``"trickle"`` sends the body one
byte every ``server.trickle_seconds`` (slow-loris), ``"trickle-headers"`` the status line and
headers so; ``"huge-length"`` says ``Content-Length: 10^12`` and sends the body; ``"endless"``
sends a chunked body of zeros until the client goes; ``"bad-length"`` says ``Content-Length: abc``;
``"503-wait"`` answers 503 with ``Retry-After: 10^9``; ``"truncate-swap"`` sends half, then
replaces the file with ``server.swaps[path]`` (a new version for the retry; the server ignores
``If-Range``, as some do).  Every GET is counted in ``server.gets[path]``, its headers kept in
``server.requests[path]`` (names in lower case).

``server.etags``: send an ETag (a hash of the file's bytes); ``server.auth = (user, password)``:
answer 401 to a request without that basic auth; ``server.token``: answer 403 to a request for a
shard (``.tar``) whose query has no ``token=`` of that value (as presigned shard URLs).  Servers
stop when their ``with`` block ends; every test bounds its time (pytest-timeout).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import os
import socket
import struct
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, unquote, urlsplit

BUCKET = "wdsprep-test"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: connections are reused, as real clients do
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_PUT(self) -> None:
        self._relay()

    do_POST = do_DELETE = do_PUT

    def _fault(self, path: str) -> str | None:
        with self.server.lock:
            self.server.gets[path] += 1
            self.server.requests[path].append({k.lower(): v for k, v in self.headers.items()})
            queue = self.server.faults.get(path)
            return queue.pop(0) if queue else None

    def _refused(self) -> tuple[int, bytes] | None:
        """401 or 403 when the server wants credentials or a token the request does not bring."""
        if self.server.auth is not None:
            want = "Basic " + base64.b64encode(":".join(self.server.auth).encode()).decode()
            if self.headers.get("Authorization") != want:
                return 401, b"who are you"
        if self.server.token is not None and urlsplit(self.path).path.endswith(".tar"):
            if parse_qs(urlsplit(self.path).query).get("token") != [self.server.token]:
                return 403, b"no token"
        return None

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        fault = None if head else self._fault(path)
        refused = self._refused()
        if fault in ("503", "503-wait") or refused is not None:
            status, body = refused or (503, b"busy")
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            if fault == "503-wait":  # "come back in 31 years"
                self.send_header("Retry-After", str(10**9))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.server.upstream is not None:
            status, headers, body = self._upstream(head)
        else:
            status, headers, body = self._file(path)
        if fault in ("huge-length", "bad-length", "endless"):
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers += [("Transfer-Encoding", "chunked")] if fault == "endless" else \
                [("Content-Length", "abc" if fault == "bad-length" else str(10**12)), ("Connection", "close")]
            self.close_connection = True
        if fault == "trickle-headers":
            self._trickle(f"HTTP/1.1 {status} OK\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
                          + b"\r\n" + body)
            return
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if head or not body:
            return
        try:
            self._body(path, fault, body)
        except OSError:  # the client went (a hostile body is cut off by the client)
            self.close_connection = True

    def _body(self, path: str, fault: str | None, body: bytes) -> None:
        if fault == "trickle":
            self._trickle(body)
            return
        if fault == "endless":
            chunk = b"%x\r\n" % (64 << 10) + bytes(64 << 10) + b"\r\n"
            while True:
                self.wfile.write(chunk)
        if fault in ("truncate", "reset", "slow", "truncate-swap"):
            half = len(body) // 2
            self.wfile.write(body[:half])
            self.wfile.flush()
            if fault == "slow":
                time.sleep(self.server.slow_seconds)
                self.wfile.write(body[half:])
                return
            if fault == "truncate-swap":  # a new version for the retry, the same size
                (self.server.root / path.lstrip("/")).write_bytes(self.server.swaps[path])
            if fault == "reset":  # abortive close: the client gets a connection reset
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_WR)
            self.close_connection = True
            return
        self.wfile.write(body)

    def _trickle(self, data: bytes) -> None:
        """One byte every ``trickle_seconds`` (slow-loris), until done or the client goes."""
        try:
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(self.server.trickle_seconds)
        except OSError:
            pass
        self.close_connection = True

    def _file(self, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        f = (self.server.root / path.lstrip("/")).resolve()
        if self.server.root not in f.parents or not f.is_file():
            return 404, [("Content-Length", "9")], b"not found"
        data = f.read_bytes()
        headers = [("Content-Type", "application/x-tar"), ("Last-Modified", self.date_time_string(f.stat().st_mtime))]
        if self.server.etags:
            headers.append(("ETag", f'"{hashlib.sha1(data).hexdigest()}"'))
        rng = self.headers.get("Range")
        if self.server.ranges and rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
            if start >= len(data):
                return 416, [("Content-Length", "0")], b""
            headers += [("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"),
                        ("Content-Length", str(len(data) - start))]
            return 206, headers, data[start:]
        return 200, headers + [("Content-Length", str(len(data)))], data

    def _upstream(self, head: bool) -> tuple[int, list[tuple[str, str]], bytes]:
        body = self._request_body()
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            r = conn.getresponse()
            data = r.read()
            skip = {"transfer-encoding", "connection", "content-length"}
            headers = [(k, v) for k, v in r.getheaders() if k.lower() not in skip]
            length = r.getheader("Content-Length") if head else str(len(data))
            return r.status, headers + ([("Content-Length", length)] if length is not None else []), data
        finally:
            conn.close()

    def _request_body(self) -> bytes | None:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else None

    def _relay(self) -> None:
        status, headers, body = self._upstream(head=False)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path | None, upstream: tuple[str, int] | None, ranges: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root.resolve() if root is not None else Path("/nonexistent")
        self.upstream = upstream
        self.ranges = ranges
        self.lock = threading.Lock()
        self.faults: dict[str, list[str]] = {}
        self.gets: Counter[str] = Counter()
        self.requests: defaultdict[str, list[dict]] = defaultdict(list)
        self.slow_seconds = 0.5
        self.trickle_seconds = 0.5
        self.swaps: dict[str, bytes] = {}
        self.etags = False
        self.auth: tuple[str, str] | None = None
        self.token: str | None = None

    def reset(self) -> None:
        """No fault, no credentials asked, nothing counted: as started."""
        with self.lock:
            self.faults.clear()
            self.gets.clear()
            self.requests.clear()
            self.swaps.clear()
            self.etags, self.auth, self.token = False, None, None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def http_server(root: Path | None = None, *, upstream: str | None = None, ranges: bool = True) -> Iterator[_Server]:
    """A threaded HTTP server on 127.0.0.1 serving ``root`` (or relaying to ``upstream``, a URL)."""
    up = None
    if upstream is not None:
        u = urlsplit(upstream)
        up = (u.hostname or "127.0.0.1", u.port or 80)
    srv = _Server(root, up, ranges)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (its endpoint URL), with bucket :data:`BUCKET` made."""
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        srv.stop()


def client(endpoint: str):
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                          aws_access_key_id="testing", aws_secret_access_key="testing")


def upload(endpoint: str, root: Path, prefix: str) -> None:
    """Every file under ``root`` to ``s3://BUCKET/PREFIX/<relative path>`` (as aws s3 sync does)."""
    c = client(endpoint)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            c.upload_file(str(p), BUCKET, f"{prefix}/{p.relative_to(root).as_posix()}")


def use_endpoint(monkeypatch, endpoint: str) -> None:
    """Point boto3 at ``endpoint`` the standard way (AWS variables), for this process and its children."""
    for k, v in {**AWS_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
