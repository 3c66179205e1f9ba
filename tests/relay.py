"""A latency relay: a store across a network, made of a test server on 127.0.0.1.

:func:`relay` puts an HTTP/1.1 proxy on 127.0.0.1 in front of a server (``remote_servers``'s
``http.server`` or moto's S3 server; the benchmarks' too) that holds every response's first byte
until ``latency`` seconds after its request arrived, and sends each connection's bytes no faster
than ``rate`` bytes/s: what a real store's first-byte latency (20-100 ms) and per-connection
bandwidth (tens of MB/s) look like to a client, where on loopback a request costs nothing.  What
keeps a trainer fed is then how many requests are in flight, which the relay counts
(:attr:`Relay.in_flight`, :attr:`Relay.peak_in_flight`).

It lives beside the test servers it fronts and outside the library: the tests import it, the
benchmarks (``tools/bench/``) put ``tests/`` on their path, as they do for the other fixtures.
It parses just enough HTTP to know where a request and a response end (``Content-Length``, or a
chunked body's last chunk); a client connection gets one upstream connection of its own, so
keep-alive works as it does against the server.  asyncio, in a thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import urlsplit

CHUNK = 64 << 10
_HEAD_END = b"\r\n\r\n"


def _headers(block: bytes) -> tuple[str, dict[str, str]]:
    """(first line, headers by lower-case name) of a header block."""
    lines = block.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


class Relay:
    """The relay's address and counts; made by :func:`relay`."""

    def __init__(self, upstream: str, latency: float, rate: float) -> None:
        u = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.latency, self.rate = latency, rate
        self.lock = threading.Lock()
        self.requests = self.in_flight = self.peak_in_flight = 0
        self.sent = 0  # response bytes sent to clients
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Counts from zero (the requests in flight now stay counted)."""
        with self.lock:
            self.requests, self.peak_in_flight, self.sent = 0, self.in_flight, 0

    def _count(self, step: int) -> None:
        with self.lock:
            self.in_flight += step
            if step > 0:
                self.requests += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, relayed over one upstream connection of its own."""
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        asked: asyncio.Queue[tuple[str, float]] = asyncio.Queue()
        tasks = [asyncio.ensure_future(self._requests(reader, up_writer, asked)),
                 asyncio.ensure_future(self._responses(up_reader, writer, asked))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the relay stops
            pass
        finally:
            for t in tasks:
                t.cancel()
            for w in (writer, up_writer):
                w.close()
            while not asked.empty():  # requests that will get no response now
                asked.get_nowait()
                self._count(-1)

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter,
                        asked: asyncio.Queue[tuple[str, float]]) -> None:
        """Client -> upstream: each request forwarded as it comes, its method and arrival queued."""
        while True:
            try:
                head = await reader.readuntil(_HEAD_END)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            line, fields = _headers(head)
            self._count(+1)
            await asked.put((line.split(" ", 1)[0], time.monotonic()))
            up.write(head)
            left = int(fields.get("content-length") or 0)
            while left > 0:
                data = await reader.read(min(CHUNK, left))
                if not data:
                    return
                up.write(data)
                left -= len(data)
            await up.drain()

    async def _responses(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         asked: asyncio.Queue[tuple[str, float]]) -> None:
        """Upstream -> client: each response held until its request's time plus the latency, then paced."""
        while True:
            method, at = await asked.get()
            pace = _Pace(self.rate)
            try:
                while True:  # an interim (1xx) response, then the final one, answer one request
                    head = await up.readuntil(_HEAD_END)
                    line, fields = _headers(head)
                    wait = at + self.latency - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    pace.restart()
                    await pace.send(writer, head)
                    parts = line.split(" ")
                    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                    if not 100 <= status < 200:
                        break
                if method == "HEAD" or status in (204, 304):
                    pass
                elif "chunked" in fields.get("transfer-encoding", "").lower():
                    await self._chunked(up, writer, pace)
                elif "content-length" in fields:
                    await self._body(up, writer, pace, int(fields["content-length"]))
                else:  # a body to the end of the connection
                    await self._body(up, writer, pace, None)
                    return
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
                return
            finally:
                self._count(-1)
                with self.lock:
                    self.sent += pace.sent

    async def _body(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: _Pace,
                    left: int | None) -> None:
        while left is None or left > 0:
            data = await up.read(CHUNK if left is None else min(CHUNK, left))
            if not data:
                if left:
                    raise ConnectionError("upstream ended the body early")
                return
            await pace.send(writer, data)
            if left is not None:
                left -= len(data)

    async def _chunked(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: _Pace) -> None:
        while True:
            size_line = await up.readuntil(b"\r\n")
            await pace.send(writer, size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await pace.send(writer, await up.readuntil(b"\r\n"))  # the (empty) trailer
                return
            await self._body(up, writer, pace, size + 2)  # the chunk and its CRLF


class _Pace:
    """One response's bytes sent no faster than ``rate`` bytes/s (0: at once)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.sent, self.paced = rate, 0, 0
        self.start = time.monotonic()

    def restart(self) -> None:
        """Pace from now (the latency's wait is no part of the transfer)."""
        self.start, self.paced = time.monotonic(), self.sent

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.sent += len(data)
        if self.rate:
            ahead = self.start + (self.sent - self.paced) / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)


@contextmanager
def relay(upstream: str, *, latency: float = 0.05, rate: float = 25e6) -> Iterator[Relay]:
    """A relay on 127.0.0.1 in front of ``upstream`` (a URL or host:port) while the block runs:
    ``latency`` seconds before each response's first byte, ``rate`` bytes/s per connection at most."""
    r = Relay(upstream, latency, rate)
    ready = threading.Event()
    stop: list[asyncio.Event] = []

    def run() -> None:
        async def main() -> None:
            server = await asyncio.start_server(r.serve, "127.0.0.1", 0, limit=1 << 20)
            r.port = server.sockets[0].getsockname()[1]
            r.loop = asyncio.get_running_loop()
            stop.append(asyncio.Event())
            ready.set()
            async with server:
                await stop[0].wait()
        asyncio.run(main())

    thread = threading.Thread(target=run, name="latency-relay", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the latency relay did not start")
    try:
        yield r
    finally:
        assert r.loop is not None
        r.loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
