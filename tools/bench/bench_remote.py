#!/usr/bin/env python
"""Remote shards against local ones: does the read-ahead hide the download behind training?

The benchmark corpus (``corpus.py``; by default 8,000 utterances in shards of 500, ~80 MB each)
is served from 127.0.0.1 by Python's ``http.server`` (bodies sent with ``sendfile``, as nginx
does) and by moto's S3 server, both in one process of their own on the same 2 cores, and read by
the same loader (``num_workers=0``, SentencePiece, ``max_frames``) three ways: local files,
``http://`` brace URLs and an ``s3://`` glob.  Each timed epoch is the second of a fresh loader
(the first warms clients, buffers and caches, as a training run's first epoch does).  Printed
(``--repeat`` rounds, medians, local and remote interleaved):

  download       one plain sequential download of every shard (urllib3 / boto3, into memory)
  epoch + step   an epoch with a stand-in training step: a sleep per batch, the sleeps adding up
                 to the plain download time; ratio = local epoch time / remote epoch time
                 (target >= 0.8 with read-ahead: the downloads hide behind the steps)
  bare epoch     the same without the sleep (bounded by the download; no target)
  peak RSS       VmHWM of a fresh process iterating one epoch with read-ahead on (2 shards), for N
                 and 4N shards (4N: the same shards under other names), and the most fetched shards
                 it held in memory at once; also with ``cache_dir`` and ``cache_bytes=0`` (a spool)

    python tools/bench/bench_remote.py [--utts 8000] [--per-shard 500] [--read-ahead 2 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus import GROUP_DIRS, DataSpec, prepare, train_tokenizer_once, x4_shards  # noqa: E402

BUCKET = "bench"
AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

# A web server and moto's S3 server on 127.0.0.1 (argv[1]: the folder the web server serves), in
# a process of their own; bench_scale.py puts the latency relay in front of them.
FILES_AND_S3 = r'''
import functools, http.server, os, sys, threading
from moto.server import ThreadedMotoServer
class Quiet(http.server.SimpleHTTPRequestHandler):
    """Python's file server, sending bodies with sendfile as nginx does (not 64 KB copies)."""
    def log_message(self, *a): pass
    def copyfile(self, src, dst):
        dst.flush()
        size = os.fstat(src.fileno()).st_size
        sent = 0
        while sent < size:
            sent += os.sendfile(self.connection.fileno(), src.fileno(), sent, size - sent)
h = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=sys.argv[1]))
h.daemon_threads = True
threading.Thread(target=h.serve_forever, daemon=True).start()
s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
s3.start()
host, port = s3.get_host_and_port()
'''

SERVERS = FILES_AND_S3 + r'''
print(f"http://127.0.0.1:{h.server_address[1]} http://{host}:{port}", flush=True)
sys.stdin.read()  # until the benchmark closes stdin
'''


def start_servers(root: Path) -> tuple[subprocess.Popen, str, str]:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    web, s3 = proc.stdout.readline().split()
    return proc, web, s3


def s3_client(endpoint: str):
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                          aws_access_key_id="bench", aws_secret_access_key="bench")


def upload(endpoint: str, work: Path) -> None:
    """shards-f32 to s3://bench/n/, and four copies of it (4N names) to s3://bench/x4/copyK/ (server-side copies)."""
    c = s3_client(endpoint)
    c.create_bucket(Bucket=BUCKET)
    src = work / "shards-f32"
    for g in GROUP_DIRS:
        for p in sorted((src / g).iterdir()):
            if p.name.startswith(("data-", "index.")):
                c.upload_file(str(p), BUCKET, f"n/{g}/{p.name}")
                for k in range(4):
                    c.copy_object(Bucket=BUCKET, Key=f"x4/copy{k}/{g}/{p.name}",
                                  CopySource={"Bucket": BUCKET, "Key": f"n/{g}/{p.name}"})


def brace(base: str, folder: Path) -> str:
    """The shards of a local shard dir as http brace ranges under ``base``."""
    parts = []
    for g in GROUP_DIRS:
        n = len(list((folder / g).glob("data-*.tar")))
        parts.append(f"{g}/data-{{00000..{n - 1:05d}}}.tar")
    return f"{base}/{{{','.join(parts)}}}"


def plain_download(urls: list[str]) -> float:
    """Seconds to download every URL once, sequentially, into memory (no loader)."""
    import urllib3

    from wdsprep.remote.clients import s3_client as ours

    pool = urllib3.PoolManager()
    t0 = time.perf_counter()
    for u in urls:
        if u.startswith("s3://"):
            b, k = u[5:].split("/", 1)
            ours(60.0).get_object(Bucket=b, Key=k)["Body"].read()
        else:
            pool.request("GET", u).data
    return time.perf_counter() - t0


def epoch_seconds(trset: str, tok: Path, max_frames: int, step: float, **kw) -> tuple[float, dict]:
    """Seconds of the second epoch of a fresh loader (the first warms it up, as any training run's
    first epoch does: clients, buffers, the tokenizer's caches), with ``step`` seconds of sleep per batch."""
    import wdsprep

    loader = wdsprep.make_loader(trset, tok, max_frames=max_frames, seed=0, **kw)
    loader.set_epoch(0)
    for _ in loader:
        pass
    loader.set_epoch(1)
    t0 = time.perf_counter()
    for _ in loader:
        if step:
            time.sleep(step)
    return time.perf_counter() - t0, loader.stats.to_dict()


def rss_child(trset: str, tok: str, max_frames: int, spool: str) -> None:
    import wdsprep

    kw = {"cache_dir": spool, "cache_bytes": 0} if spool else {}
    loader = wdsprep.make_loader(trset, tok, max_frames=max_frames, seed=0, read_ahead=2, **kw)
    for _ in loader:
        pass
    from wdsprep.remote.fetch import held_in_memory

    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    held = held_in_memory()
    print(json.dumps({"hwm_mb": hwm / 1024, "utts": loader.stats.utterances, "held": held["peak_shards"],
                      "held_mb": held["peak_bytes"] / 1e6}))


def peak_rss(trset: str, tok: Path, max_frames: int, env: dict, spool: str = "") -> dict:
    r = subprocess.run([sys.executable, __file__, "--_rss", trset, str(tok), str(max_frames), spool],
                       capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utts", type=int, default=8000)
    ap.add_argument("--per-shard", type=int, default=500)
    ap.add_argument("--max-frames", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the interleaved epochs (medians)")
    ap.add_argument("--data", type=Path, default=Path("/tmp/wdsprep-bench-remote"))
    ap.add_argument("--read-ahead", type=int, nargs="+", default=[2], help="read_ahead values to time (shards)")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--_rss", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._rss:
        rss_child(args._rss[0], args._rss[1], int(args._rss[2]), args._rss[3])
        return

    c = prepare(DataSpec(utts=args.utts, utts_per_shard=args.per_shard), args.data)
    tok = train_tokenizer_once(c, min(500, max(50, args.utts // 4)))
    x4 = x4_shards(c)
    proc, web, s3 = start_servers(c.work)
    os.environ.update({**AWS, "AWS_ENDPOINT_URL": s3})
    try:
        t0 = time.perf_counter()
        upload(s3, c.work)
        print(f"[bench] uploaded to the S3 server in {time.perf_counter() - t0:.1f} s", flush=True)
        size = sum(p.stat().st_size for p in c.shards32)
        rel = [p.relative_to(c.work / "shards-f32").as_posix() for p in c.shards32]
        ways = {"local": c.pattern32, "http": brace(f"{web}/shards-f32", c.work / "shards-f32"),
                "s3": f"s3://{BUCKET}/n/*/data-*.tar"}
        dl = {"http": plain_download([f"{web}/shards-f32/{r}" for r in rel]),
              "s3": plain_download([f"s3://{BUCKET}/n/{r}" for r in rel])}
        print(f"[bench] {len(rel)} shards, {size / 1e6:.0f} MB, {args.utts} utterances; plain download: "
              f"http {dl['http']:.2f} s ({size / dl['http'] / 1e6:.0f} MB/s), s3 {dl['s3']:.2f} s "
              f"({size / dl['s3'] / 1e6:.0f} MB/s)", flush=True)
        _, st = epoch_seconds(ways["local"], tok, args.max_frames, 0.0)  # warm-up, and the batch count
        batches = st["steps"]
        times: dict[tuple[str, str], list[float]] = {}
        stats: dict[tuple[str, str], dict] = {}
        for r in range(args.repeat):
            for server in ("http", "s3"):
                step = dl[server] / batches  # the steps add up to one plain download of the corpus
                runs = [("local", 0)] + [(server, k) for k in args.read_ahead]
                for way, k in (runs if r % 2 == 0 else runs[::-1]):
                    for mode, s in (("step", step), ("bare", 0.0)):
                        secs, st = epoch_seconds(ways[way], tok, args.max_frames, s, read_ahead=k or 2)
                        key = (f"{way}@{server}" if way == "local" else f"{way} read_ahead={k}", mode)
                        times.setdefault(key, []).append(secs)
                        stats[key] = st
                        print(f"[bench] round {r}: {key[0]:10s} {mode}: {secs:.2f} s "
                              f"(retries {st['retries']}, fetched {st['fetched_bytes'] / 1e6:.0f} MB)", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print("\n| server | plain download (s) | epoch + step: local / remote (s) | ratio "
              "| bare epoch: local / remote (s) | bare ratio |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for server in ("http", "s3"):
            for k in args.read_ahead:
                ls, rs = med[(f"local@{server}", "step")], med[(f"{server} read_ahead={k}", "step")]
                lb, rb = med[(f"local@{server}", "bare")], med[(f"{server} read_ahead={k}", "bare")]
                print(f"| {server}, read_ahead={k} | {dl[server]:.2f} | {ls:.2f} / {rs:.2f} | {ls / rs:.2f} "
                      f"| {lb:.2f} / {rb:.2f} | {lb / rb:.2f} |")
        if not args.no_rss:
            env = {**os.environ}
            x4_http = f"{web}/x4/{{{','.join(brace(f'copy{k}', c.work / 'x4' / f'copy{k}') for k in range(4))}}}"
            spool = str(c.work / "spool")  # cache_bytes=0: each shard spooled to local disk, unlinked once open
            rows = [("local", c.pattern32, f"{c.work}/x4/*/*/data-*.tar", ""),
                    ("http", ways["http"], x4_http, ""),
                    ("s3", ways["s3"], f"s3://{BUCKET}/x4/*/*/data-*.tar", ""),
                    ("s3, cache_dir with cache_bytes=0", ways["s3"], f"s3://{BUCKET}/x4/*/*/data-*.tar", spool)]
            print("\n| read from | peak RSS, N shards (MB) | peak RSS, 4N shards (MB) "
                  "| most shards held in memory, N / 4N | shard size (MB) |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for name, n, n4, sp in rows:
                a, b = peak_rss(n, tok, args.max_frames, env, sp), peak_rss(n4, tok, args.max_frames, env, sp)
                assert b["utts"] > 3 * a["utts"], (a, b)
                print(f"| {name} | {a['hwm_mb']:.0f} | {b['hwm_mb']:.0f} | {a['held']} / {b['held']} "
                      f"| {size / len(rel) / 1e6:.0f} |", flush=True)
            print(f"(4N: {len(x4)} shard names)")
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
