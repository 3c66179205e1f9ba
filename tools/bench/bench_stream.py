#!/usr/bin/env python3
"""Feeding a trainer from a store at real latency: the share of the epoch it waits for data.

    python tools/bench/bench_stream.py [--utts 8000] [--shard-mb 7 80] [--latency 0.05] [--rate 25e6]
        [--trainer-mb 100] [--workers 2] [--repeat 1] [--base DIR]

The benchmark corpus (``corpus.py``: 80-dim float32 features, lognormal lengths), packed twice:
in shards of about 7 MB and about 80 MB.  Both are served by Python's ``http.server`` (sendfile)
and moto's S3 server behind the latency relay (``tests/relay.py``), which holds every response's
first byte ``--latency`` seconds and sends each connection at most ``--rate`` bytes/s, all in one
process of their own.  A fresh process reads one epoch (``num_workers=--workers``,
SentencePiece, ``max_frames=20000``) with a trainer stand-in that consumes ``--trainer-mb`` MB/s
of shard bytes: after each batch it sleeps for the batch's feature bytes at that rate.

Printed per store and shard size: the share of the epoch after the first batch the trainer
waited for the next batch (target <= 5%), and after every worker's first batch (each reader's
start-up done: its first batch may need a whole shard at one connection's bandwidth, 5 s for
a 125 MB shard at 25 MB/s), the epoch's seconds against the trainer's own, the
most requests in flight at once (at the relay), and the peak RSS (VmHWM) of the loader's main
process and of each worker.  ``--base DIR`` runs the wdsprep at DIR (e.g. ``git archive`` of the
commit before, its ``_native`` module copied in) in the same sitting: today's figures beside.
The machine (2 shared cores) runs the servers, the relay and the loader at once: the figures
are of that, one epoch each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_scale import AWS, SERVERS  # noqa: E402  (the servers behind the relay, and their credentials)
from corpus import GROUP_DIRS, DataSpec, prepare, train_tokenizer_once  # noqa: E402

BUCKET = "bench"
FEATURE_BYTES = 80 * 4  # a frame of the corpus's float32 features

EPOCH = r'''
import json, os, sys, time, warnings
warnings.simplefilter("ignore")
import wdsprep
def hwm(pid="self"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
def children():
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            found += open(f"/proc/self/task/{task}/children").read().split()
        except OSError:
            pass
    return found
pattern, tok = sys.argv[1], sys.argv[2]
workers, rate, frame_bytes = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
options = json.loads(sys.argv[6])
loader = wdsprep.make_loader(pattern, tok, max_frames=20000, seed=0, num_workers=workers, **options)
loader.set_epoch(0)
t0 = time.perf_counter()
waited = stepped = 0.0
first = None
batches = 0
steady_at = steady_waited = None  # from the batch after every worker's first (each reader's start-up done)
it = iter(loader)
while True:
    t = time.perf_counter()
    batch = next(it, None)
    got = time.perf_counter()
    if batch is None:
        break
    if first is None:
        first = got  # the start-up (the first shards' download) is not counted
    else:
        waited += got - t
    if batches == max(1, workers) - 1:
        steady_at, steady_waited = got, waited
    step = int(batch.feat_lens.sum()) * frame_bytes / rate
    time.sleep(step)
    stepped += step
    batches += 1
end = time.perf_counter()
print(json.dumps({"batches": batches, "first_batch": first - t0, "after_first": end - first, "waited": waited,
                  "steady": (waited - steady_waited) / (end - steady_at),
                  "trainer": stepped, "main_mb": hwm(), "workers_mb": [hwm(p) for p in children()],
                  "utterances": loader.stats.utterances, "fetched_mb": loader.stats.fetched_bytes / 1e6}))
'''


def upload(endpoint: str, work: Path, names: list[str]) -> None:
    import boto3

    c = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                       aws_access_key_id="bench", aws_secret_access_key="bench")
    c.create_bucket(Bucket=BUCKET)
    for name in names:
        for g in GROUP_DIRS:
            for p in sorted((work / name / "shards-f32" / g).iterdir()):
                if p.name.startswith(("data-", "index.")):
                    c.upload_file(str(p), BUCKET, f"{name}/{g}/{p.name}")


def brace(base: str, folder: Path) -> str:
    parts = [f"{g}/data-{{00000..{len(list((folder / g).glob('data-*.tar'))) - 1:05d}}}.tar" for g in GROUP_DIRS]
    return f"{base}/{{{','.join(parts)}}}"


def run(pattern: str, tok: Path, args: argparse.Namespace, base: Path | None, s3: str, extra: list[str]) -> dict:
    """One epoch in a fresh process (the wdsprep at ``base``, if given); ``extra``: more loader options, KEY=JSON."""
    env = {**os.environ, **AWS, "AWS_ENDPOINT_URL": s3}
    if base is not None:
        env["PYTHONPATH"] = str(base)
    options = {"streams": args.streams or args.workers, "pool_size": args.pool, "shuffle_buffer": args.buffer,
               **dict(kv.split("=", 1) for kv in extra)}
    options = {k: json.loads(v) if isinstance(v, str) else v for k, v in options.items()}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(EPOCH), pattern, str(tok), str(args.workers),
                        str(args.trainer_mb * 1e6), str(FEATURE_BYTES), json.dumps(options)], capture_output=True,
                       text=True, env=env, cwd="/", timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--utts", type=int, default=8000)
    ap.add_argument("--shard-mb", type=int, nargs="+", default=[7, 80], help="shard sizes (about)")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds before each response's first byte")
    ap.add_argument("--rate", type=float, default=25e6, help="bytes/s per connection")
    ap.add_argument("--trainer-mb", type=float, default=100.0, help="MB/s of shard bytes the trainer consumes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--streams", type=int, help="the plan's streams (default: one per worker)")
    ap.add_argument("--pool", type=int, default=1000, help="pool_size: utterances batched together")
    ap.add_argument("--buffer", type=int, default=500, help="shuffle_buffer")
    ap.add_argument("--config", nargs="+", default=["after", "before"],
                    help="what to run: 'after' (this wdsprep), 'before' (--base's), or NAME:KEY=JSON,... (this "
                         "wdsprep with those options, e.g. ahead8:read_ahead=8)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--servers", nargs="+", default=["http", "s3"])
    ap.add_argument("--base", type=Path, help="a checkout of the commit to compare with (its wdsprep/ built)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-stream"))
    args = ap.parse_args()

    corpora = {}
    for mb in args.shard_mb:
        per_shard = max(1, round(mb * 1e6 / (500 * 1.03 * FEATURE_BYTES)))  # ~515 frames an utterance on average
        c = prepare(DataSpec(utts=args.utts, utts_per_shard=per_shard), args.work / f"s{mb}")
        size = sum(p.stat().st_size for p in c.shards32) / len(c.shards32) / 1e6
        corpora[mb] = c
        print(f"[stream] {len(c.shards32)} shards of {size:.1f} MB on average ({per_shard} utterances)", flush=True)
    tok = train_tokenizer_once(corpora[args.shard_mb[0]], 500)
    proc = subprocess.Popen([sys.executable, "-c", SERVERS, str(args.work), str(REPO / "tests"), str(args.latency),
                             str(args.rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    web, s3, s3_direct = proc.stdout.readline().split()

    def relay_counts() -> dict:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("stats\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        upload(s3_direct, args.work, [f"s{mb}" for mb in args.shard_mb])
        codes = []
        for c in args.config:
            name, _, kv = c.partition(":")
            if name == "before" and args.base is None:
                continue
            codes.append((name, args.base if name == "before" else None, kv.split(",") if kv else []))
        rows: dict[tuple[str, int, str], list[dict]] = {}
        for k in range(args.repeat):
            for mb in args.shard_mb:
                for server in args.servers:
                    pattern = (brace(f"{web}/s{mb}/shards-f32", args.work / f"s{mb}" / "shards-f32")
                               if server == "http" else f"s3://{BUCKET}/s{mb}/*/data-*.tar")
                    for name, base, extra in (codes if k % 2 == 0 else codes[::-1]):
                        relay_counts()  # from zero
                        r = run(pattern, tok, args, base, s3, extra)
                        r.update(relay_counts()[server])
                        rows.setdefault((server, mb, name), []).append(r)
                        print(f"[stream] {name} {server} {mb} MB: waited {r['waited'] / r['after_first']:.1%} of "
                              f"{r['after_first']:.1f} s after the first batch ({r['first_batch']:.1f} s), "
                              f"{r['steady']:.1%} after every worker's first, trainer "
                              f"{r['trainer']:.1f} s; at most {r['peak_in_flight']} requests at once; peak RSS main "
                              f"{r['main_mb']:.0f} MB, workers {', '.join(f'{w:.0f}' for w in r['workers_mb'])} MB",
                              flush=True)
        print(f"\nrelay: {args.latency * 1000:.0f} ms to the first byte, {args.rate / 1e6:.0f} MB/s per connection; "
              f"trainer {args.trainer_mb:.0f} MB/s; {args.workers} workers, {args.streams or args.workers} streams, "
              f"pool_size {args.pool}, shuffle_buffer {args.buffer}")
        print("| store | shards | wdsprep | waited: after the first batch | after every worker's first | epoch / "
              "trainer (s) | first batch (s) | most requests at once | peak RSS main / workers (MB) |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (server, mb, name), rs in rows.items():
            share = statistics.median(r["waited"] / r["after_first"] for r in rs)
            steady = statistics.median(r["steady"] for r in rs)
            epoch = statistics.median(x["after_first"] for x in rs)
            first = statistics.median(x["first_batch"] for x in rs)
            print(f"| {server} | {mb} MB | {name} | {share:.1%} | {steady:.1%} | {epoch:.1f} / {rs[0]['trainer']:.1f} "
                  f"| {first:.1f} "
                  f"| {max(x['peak_in_flight'] for x in rs)} | {max(x['main_mb'] for x in rs):.0f} / "
                  f"{max(max(x['workers_mb'], default=0) for x in rs):.0f} |")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
