#!/usr/bin/env python3
"""A loader at scale: 36 M indexed utterances dealt to 1,024 ranks, and start-up over 10,000 remote shards.

    python tools/bench/bench_scale.py index [--utts 36000000] [--folders 100] [--worlds 1024 8] [--repeat 3]
    python tools/bench/bench_scale.py remote [--folders 100] [--shards 100] [--latency 0.05] [--rate 25e6]
    ... [--base DIR]   # the same, in the same sitting, with the wdsprep at DIR (e.g. `git archive` of main)

``index``: an index as ``pack`` writes it (frames, text lengths, keys, speakers: 50 utterances
each), ``--utts`` utterances in 2,000-utterance shards spread over ``--folders`` folders, beside
sparse shard files of the indexed sizes (no byte is read).  In a fresh process (torch imported
first, as in a trainer): ``make_loader(..., rank=0, world_size=W, num_workers=8)`` and
``set_epoch(0)``: seconds, and memory grown over the process before it: the peak RSS (VmHWM), the
private (anonymous) memory and the proportional set size (Pss) at the end.  A digest of the
epoch's plan shows every world size plans the same batches (each rank yields batches of it).

``remote``: ``--folders`` folders of ``--shards`` small shards each (one packed folder, its
shards and index under every folder name), served by Python's ``http.server`` and moto's S3
server behind the latency relay (``tests/relay.py``: ``--latency`` s before each response's
first byte, ``--rate`` bytes/s per connection), all in one process of their own.  A fresh
process builds the loader (HTTP: brace ranges; S3: a glob, so the bucket is listed) and takes
its first batch: seconds of each, and the requests the relay saw and the most at once.

The machine's load moves every time here (2 shared cores): each figure is the median of
``--repeat`` fresh processes, and ``--base`` puts the commit before beside it in the same sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from bench_remote import AWS, BUCKET, FILES_AND_S3  # the servers, their credentials and bucket

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

PROBE = r'''
import json, sys, time, warnings
warnings.simplefilter("ignore")
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
def pss():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
'''

INDEX_RUN = PROBE + r'''
import hashlib
import numpy as np
import wdsprep, wdsprep.loader, torch  # a trainer has torch loaded before it builds a loader
pattern, tok, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = wdsprep.load_tokenizer(tok)
open("/proc/self/clear_refs", "w").write("5")  # the peak from here on
before = {"rss": status("VmRSS"), "anon": status("RssAnon"), "pss": pss()}
t0 = time.perf_counter()
loader = wdsprep.make_loader(pattern, tok, max_frames=20000, rank=0, world_size=world, num_workers=8)
built = time.perf_counter() - t0
loader.set_epoch(0)
seconds = time.perf_counter() - t0
after = {"peak": status("VmHWM"), "anon": status("RssAnon"), "pss": pss(), "rss": status("VmRSS")}
h = hashlib.blake2b(digest_size=8)
for s in loader.source.corpus.plan(0).streams:
    h.update(np.ascontiguousarray(s.rows, np.int64).tobytes())
    h.update(np.ascontiguousarray(s.starts, np.int64).tobytes())
print(json.dumps({"seconds": seconds, "make_loader": built, "steps": len(loader), "plan": h.hexdigest(),
                  "peak_mb": after["peak"] - before["rss"], "anon_mb": after["anon"] - before["anon"],
                  "pss_mb": after["pss"] - before["pss"], "rss_mb": after["rss"] - before["rss"]}))
'''

REMOTE_RUN = PROBE + r'''
import wdsprep, wdsprep.loader, torch
pattern, tok = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
loader = wdsprep.make_loader(pattern, tok, max_frames=4000, num_workers=0)
loader.set_epoch(0)
built = time.perf_counter() - t0
batch = next(iter(loader))
first = time.perf_counter() - t0
print(json.dumps({"make_loader": built, "first_batch": first, "shards": len(loader.source.shards),
                  "utterances": int(loader.source.shards.num_utts), "batch": len(batch.keys)}))
'''

SERVERS = FILES_AND_S3 + r'''
import json
sys.path.insert(0, sys.argv[2])
from relay import relay
latency, rate = float(sys.argv[3]), float(sys.argv[4])
with relay(f"http://127.0.0.1:{h.server_address[1]}", latency=latency, rate=rate) as rh, \
        relay(f"http://{host}:{port}", latency=latency, rate=rate) as rs:
    print(f"{rh.url} {rs.url} http://{host}:{port}", flush=True)
    for line in sys.stdin:  # "stats" -> the relays' counts (and a reset); EOF ends
        print(json.dumps({name: {"requests": r.requests, "peak_in_flight": r.peak_in_flight, "sent": r.sent}
                          for name, r in (("http", rh), ("s3", rs))}), flush=True)
        rh.reset(); rs.reset()
'''


def fresh(code: str, args: list[str], base: Path | None, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh Python (with the wdsprep at ``base`` first on its path, if given)."""
    env = {**os.environ, **(env or {})}
    if base is not None:
        env["PYTHONPATH"] = str(base)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                       env=env, cwd="/", timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def tokenizer(work: Path) -> Path:
    from wdsprep.tokenizer import train_tokenizer

    path = work / "char.json"
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        (work / "text").write_text("u1 a b c\n")
        train_tokenizer("char", [work / "text"], path)
    return path


def build_index(root: Path, utts: int, folders: int, per_shard: int = 2000) -> None:
    """``utts`` indexed utterances in ``folders`` folders of 2,000-utterance sparse shards (once)."""
    from wdsprep.format.index import FolderIndex, Speakers, write_index

    stamp = root / f".made-{utts}-{folders}-{per_shard}"
    if stamp.exists():
        return
    rng = np.random.default_rng(1)
    per_folder = utts // per_shard // folders
    row = 0
    for f in range(folders):
        folder = root / f"f{f:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        n = per_folder * per_shard
        frames = np.clip(rng.lognormal(np.log(500), 0.5, n), 20, 3000).astype(np.int32)
        starts = np.arange(0, n + 1, per_shard)
        names, sizes, mtimes = [], [], []
        for i in range(per_folder):
            path = folder / f"data-{i:05d}.tar"
            size = int(frames[starts[i]:starts[i + 1]].sum()) * 80 * 4 + per_shard * 2048
            with open(path, "wb") as fh:
                fh.truncate(size)  # sparse: the size the index records, no bytes on disk
            names.append(path.name)
            sizes.append(size)
            mtimes.append(os.stat(path).st_mtime_ns)
        speaker = (row + np.arange(n)) // 50
        ids = (speaker - speaker[0]).astype(np.int32)
        spk = Speakers(ids, [f"spk{int(s):07d}" for s in range(int(speaker[0]), int(speaker[-1]) + 1)], "utt2spk")
        index = FolderIndex("cat", 80, "float32", names, np.full(per_folder, per_shard, np.int64), frames,
                            rng.integers(5, 120, n).astype(np.int32), sizes=np.array(sizes),
                            mtimes=np.array(mtimes), keys=[f"spk{int(s):07d}-utt{row + i:09d}"
                                                           for i, s in enumerate(speaker)], speakers=spk)
        write_index(folder, index)
        row += n
    stamp.touch()


def bench_index(args: argparse.Namespace) -> None:
    root = args.work / f"index-{args.utts}-{args.folders}"
    t0 = time.perf_counter()
    build_index(root, args.utts, args.folders)
    print(f"[scale] index of {args.utts:,} utterances in {args.folders} folders ready "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    tok = tokenizer(args.work)
    codes = [("after", None)] + ([("before", args.base)] if args.base else [])
    rows: dict[tuple[str, int], list[dict]] = {}
    for k in range(args.repeat):
        for world in args.worlds:
            for name, base in (codes if k % 2 == 0 else codes[::-1]):
                r = fresh(INDEX_RUN, [f"{root}/*/data-*.tar", str(tok), str(world)], base)
                rows.setdefault((name, world), []).append(r)
                print(f"[scale] {name} world {world}: {r['seconds']:.2f} s (make_loader {r['make_loader']:.2f} s), "
                      f"peak +{r['peak_mb']:.0f} MB, private +{r['anon_mb']:.0f} MB, Pss +{r['pss_mb']:.0f} MB, "
                      f"{r['steps']} steps, plan {r['plan']}", flush=True)
    print("\n| wdsprep | ranks x workers | make_loader + set_epoch(0) (s) | peak RSS growth (MB) "
          "| private growth (MB) | Pss growth (MB) | plan digest |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for (name, world), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_mb", "anon_mb", "pss_mb")}
        spread = f"{min(r['seconds'] for r in rs):.1f}-{max(r['seconds'] for r in rs):.1f}"
        print(f"| {name} | {world:,} x 8 | {med['seconds']:.1f} ({spread}) | {med['peak_mb']:.0f} "
              f"| {med['anon_mb']:.0f} | {med['pss_mb']:.0f} | {rs[0]['plan']} |")
    plans = {r["plan"] for rs in rows.values() for r in rs}
    print(f"plans: {'the same on every world size and commit' if len(plans) == 1 else 'DIFFER: ' + str(plans)}")


def build_remote(work: Path, folders: int, shards: int) -> Path:
    """``folders`` folders named f000... of ``shards`` small shards each: one packed folder under every name."""
    sys.path.insert(0, str(REPO / "tests"))
    from shardsets import build

    root = work / f"remote-{folders}x{shards}"
    stamp = root / ".made"
    if stamp.exists():
        return root
    out, _ = build(work / "remote-pack", n=shards * 50, utts_per_shard=50, groups=["0:"])
    src = next(p for p in out.iterdir() if p.is_dir())
    for f in range(folders):
        dest = root / f"f{f:03d}"
        dest.mkdir(parents=True, exist_ok=True)
        for p in src.iterdir():
            if not (dest / p.name).exists():
                os.symlink(p.resolve(), dest / p.name)
    stamp.touch()
    return root


def upload(endpoint: str, root: Path, folders: int) -> None:
    """The first folder to s3://bench/scale/f000/, server-side copies of it under the other names."""
    import boto3

    c = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                       aws_access_key_id="bench", aws_secret_access_key="bench")
    c.create_bucket(Bucket=BUCKET)
    first = sorted((root / "f000").iterdir())
    for p in first:
        c.upload_file(str(p), BUCKET, f"scale/f000/{p.name}")
    for f in range(1, folders):
        for p in first:
            c.copy_object(Bucket=BUCKET, Key=f"scale/f{f:03d}/{p.name}",
                          CopySource={"Bucket": BUCKET, "Key": f"scale/f000/{p.name}"})


def bench_remote(args: argparse.Namespace) -> None:
    root = build_remote(args.work, args.folders, args.shards)
    tok = tokenizer(args.work)
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, str(root), str(REPO / "tests"), str(args.latency),
                             str(args.rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    web, s3, s3_direct = proc.stdout.readline().split()
    try:
        t0 = time.perf_counter()
        upload(s3_direct, root, args.folders)
        print(f"[scale] {args.folders * args.shards:,} shards in {args.folders} folders on the S3 server "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        ways = {"http": f"{web}/f{{000..{args.folders - 1:03d}}}/data-{{00000..{args.shards - 1:05d}}}.tar",
                "s3": f"s3://{BUCKET}/scale/*/data-*.tar"}
        codes = [("after", None)] + ([("before", args.base)] if args.base else [])
        rows: dict[tuple[str, str], list[dict]] = {}
        for k in range(args.repeat):
            for server, pattern in ways.items():
                for name, base in (codes if k % 2 == 0 else codes[::-1]):
                    proc.stdin.write("stats\n")  # resets the counts
                    proc.stdin.flush()
                    proc.stdout.readline()
                    r = fresh(REMOTE_RUN, [pattern, str(tok)], base, {**AWS, "AWS_ENDPOINT_URL": s3})
                    proc.stdin.write("stats\n")
                    proc.stdin.flush()
                    r.update(json.loads(proc.stdout.readline())[server])
                    rows.setdefault((name, server), []).append(r)
                    print(f"[scale] {name} {server}: make_loader {r['make_loader']:.1f} s, first batch "
                          f"{r['first_batch']:.1f} s, {r['requests']} requests, at most {r['peak_in_flight']} at once "
                          f"({r['shards']:,} shards)", flush=True)
        print("\n| wdsprep | store | make_loader (s) | to the first batch (s) | requests | most at once |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for (name, server), rs in rows.items():
            med = {k: statistics.median(r[k] for r in rs) for k in ("make_loader", "first_batch", "requests",
                                                                   "peak_in_flight")}
            print(f"| {name} | {server} | {med['make_loader']:.1f} | {med['first_batch']:.1f} | {med['requests']:.0f} "
                  f"| {med['peak_in_flight']:.0f} |")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["index", "remote"])
    ap.add_argument("--utts", type=int, default=36_000_000)
    ap.add_argument("--folders", type=int, default=100)
    ap.add_argument("--shards", type=int, default=100, help="remote: shards per folder")
    ap.add_argument("--worlds", type=int, nargs="+", default=[1024, 8])
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--rate", type=float, default=25e6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--base", type=Path, help="a checkout of the commit to compare with (its wdsprep/ built)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-scale"))
    args = ap.parse_args()
    (bench_index if args.what == "index" else bench_remote)(args)


if __name__ == "__main__":
    main()
