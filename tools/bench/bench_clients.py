#!/usr/bin/env python
"""Which client library to fetch shards with: throughput and client CPU per GB, same servers.

Serves ``--objects`` random objects of 32 MB from 127.0.0.1 (moto's S3 server and Python's
``http.server``, in a process of their own, so the client's CPU is measured alone) and downloads
each into a mapped anonymous memory file, as ``wdsprep.remote.fetch`` does, with every client
that is installed: boto3, obstore, s3fs for S3; urllib3, requests, obstore for HTTP.  Best of 3.
How the choice was made: docs/remote.md.

    python tools/bench/bench_clients.py [--objects 8]
"""

from __future__ import annotations

import argparse
import mmap
import os
import subprocess
import sys
import tempfile
import time

SIZE = 32 << 20
SERVERS = r'''
import functools, http.server, os, sys, threading
from moto.server import ThreadedMotoServer
import boto3
root, n = sys.argv[1], int(sys.argv[2])
s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False); s3.start()
host, port = s3.get_host_and_port()
c = boto3.session.Session().client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                                   aws_access_key_id="x", aws_secret_access_key="x")
c.create_bucket(Bucket="clients")
for i in range(n):
    c.upload_file(f"{root}/o{i}.tar", "clients", f"p/o{i}.tar")
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
h = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
h.daemon_threads = True
threading.Thread(target=h.serve_forever, daemon=True).start()
print(f"http://{host}:{port} http://127.0.0.1:{h.server_address[1]}", flush=True)
sys.stdin.read()
'''


def sink(n: int):
    fd = os.memfd_create("bench")
    os.ftruncate(fd, n)
    return fd, mmap.mmap(fd, n)


def fill(read, n: int) -> int:
    fd, m = sink(n)
    got = 0
    while got < n:
        b = read(min(1 << 20, n - got))
        if not b:
            break
        m[got:got + len(b)] = b
        got += len(b)
    m.close()
    os.close(fd)
    return got


def fill_stream(chunks, n: int) -> int:
    fd, m = sink(n)
    got = 0
    for chunk in chunks:
        b = memoryview(chunk)
        m[got:got + len(b)] = b
        got += len(b)
    m.close()
    os.close(fd)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=8)
    n = ap.parse_args().objects
    root = tempfile.mkdtemp()
    for i in range(n):
        with open(f"{root}/o{i}.tar", "wb") as f:
            f.write(os.urandom(SIZE))
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, root, str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ep, web = proc.stdout.readline().split()
    os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=ep)
    ways = {}
    import boto3
    import urllib3

    s3 = boto3.session.Session().client("s3")

    def b3(i):
        r = s3.get_object(Bucket="clients", Key=f"p/o{i}.tar")
        return fill(r["Body"].read, r["ContentLength"])
    ways["S3 boto3"] = b3
    pool = urllib3.PoolManager()

    def u3(i):
        r = pool.request("GET", f"{web}/o{i}.tar", preload_content=False)
        got = fill(r.read, int(r.headers["Content-Length"]))
        r.release_conn()
        return got
    ways["HTTP urllib3"] = u3
    try:
        import obstore
        from obstore.store import HTTPStore, S3Store

        ob = S3Store("clients", endpoint=ep, region="us-east-1", access_key_id="x", secret_access_key="x",
                     client_options={"allow_http": True})
        hs = HTTPStore.from_url(web, client_options={"allow_http": True})
        ways["S3 obstore"] = lambda i: fill_stream(obstore.get(ob, f"p/o{i}.tar").stream(min_chunk_size=1 << 20), SIZE)
        ways["HTTP obstore"] = lambda i: fill_stream(obstore.get(hs, f"o{i}.tar").stream(min_chunk_size=1 << 20), SIZE)
    except ImportError:
        pass
    try:
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": ep})
        ways[f"S3 s3fs {s3fs.__version__}"] = lambda i: fill(fs.open(f"clients/p/o{i}.tar", "rb").read, SIZE)
    except ImportError:
        pass
    try:
        import requests

        sess = requests.Session()
        ways["HTTP requests"] = lambda i: fill(sess.get(f"{web}/o{i}.tar", stream=True).raw.read, SIZE)
    except ImportError:
        pass
    print("| client | MB/s | client CPU (s/GB) |\n| --- | ---: | ---: |")
    for name, fn in sorted(ways.items()):
        best = None
        for _ in range(3):
            c0, t0 = os.times(), time.perf_counter()
            for i in range(n):
                assert fn(i) == SIZE, name
            wall, c1 = time.perf_counter() - t0, os.times()
            cpu = c1.user + c1.system - c0.user - c0.system
            if best is None or wall < best[0]:
                best = (wall, cpu)
        gb = n * SIZE / 1e9
        print(f"| {name} | {gb * 1e3 / best[0]:.0f} | {best[1] / gb:.2f} |", flush=True)
    proc.stdin.close()
    proc.wait()


if __name__ == "__main__":
    main()
