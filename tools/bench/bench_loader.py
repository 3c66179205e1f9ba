#!/usr/bin/env python
"""Loader throughput against references measured in the same run, interleaved, median of N passes.

Uses the benchmark corpus (``corpus.py``, generated once under ``--data`` and reused) with a
SentencePiece (unigram) tokenizer: quick to iterate on the read path; ``bench.py`` is the full
report.  In rounds (contender order rotated every round, so slow spells of a shared machine hit all):

  raw            read every shard file's bytes (1 MiB readinto, like ``cat > /dev/null``), warm
  loader w0/w2   make_loader(..., max_frames, num_workers=0/2): read, decode, shuffle,
                 SentencePiece tokenize, bucket by max_frames, collate, the whole epoch
  loader w0 f16  the same over float16 copies of the shards (written once, only when selected)
  webdataset     wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "txt")
  kaldiio        load_scp random access (shuffled keys), what the map-style loader did
  *-cold         the same after posix_fadvise(DONTNEED) of every file read (page cache evicted)

and prints utterances/s (median), the target ratios and peak RSS for half and all of the shards
(sampled from /proc in a fresh process).

    python tools/bench/bench_loader.py [--utts 20000] [--per-shard 2000] [--repeat 3] [--data DIR]
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
from typing import Callable

import numpy as np
from corpus import DataSpec, prepare, train_tokenizer_once
from pagecache import evict
from pagecache import read_files as raw_read

DIMS = DataSpec.dims


def run_loader(loader, epoch: int = 0) -> int:
    loader.set_epoch(epoch)
    for _ in loader:
        pass
    return loader.stats.utterances


def _status(pid: int | str) -> dict[str, int]:
    """VmRSS, RssAnon, VmHWM... of a process in kB (Linux /proc)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS", "RssAnon", "VmHWM")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def rss_child(shards: list[str], tok: Path, workers: int, max_frames: int) -> None:
    """One epoch over the first ``nshards`` shards; prints peak RSS (MB) of this process + workers.

    ru_maxrss survives exec (it would report the parent bench's peak), so a thread samples /proc
    every 10 ms: the total counts the shards' page-cache pages mapped by the reader (shared,
    reclaimable) and shared-memory batches once per process; anon is private memory.
    """
    import threading

    from wdsprep.loader import make_loader

    peak = {"total": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        me = os.getpid()
        while not done.wait(0.01):
            try:
                kids = [int(p) for t in os.listdir(f"/proc/{me}/task")
                        for p in open(f"/proc/{me}/task/{t}/children").read().split()]
            except OSError:
                kids = []
            stats = [_status(me)] + [_status(k) for k in kids]
            peak["total"] = max(peak["total"], sum(s.get("VmRSS", 0) for s in stats))
            peak["anon"] = max(peak["anon"], sum(s.get("RssAnon", 0) for s in stats))

    loader = make_loader(shards, str(tok), max_frames=max_frames, num_workers=workers)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    n = run_loader(loader)
    done.set()
    th.join()
    print(json.dumps({"utts": n, "total_mb": peak["total"] / 1024, "anon_mb": peak["anon"] / 1024,
                      "hwm_mb": _status("self").get("VmHWM", 0) / 1024}))


def peak_rss(shards: list[str], tok: Path, workers: int, max_frames: int) -> dict:
    arg = json.dumps({"shards": shards, "tok": str(tok), "workers": workers})
    out = subprocess.run([sys.executable, __file__, "--max-frames", str(max_frames), "--_rss", arg],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=20000)
    ap.add_argument("--per-shard", type=int, default=2000)
    ap.add_argument("--max-frames", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--data", type=Path, default=None, help="where the set is generated/reused "
                    "(default: /tmp/wdsprep-bench-loader-<utts>-<per-shard>)")
    ap.add_argument("--vocab-size", type=int, default=200, help="SentencePiece vocabulary (default 200, as bench.py)")
    ap.add_argument("--only", default=None, help="comma-separated contenders to run (default: all)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    ap.add_argument("--_rss", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._rss:
        a = json.loads(args._rss)
        rss_child(a["shards"], Path(a["tok"]), a["workers"], args.max_frames)
        return
    d = args.data or Path(f"/tmp/wdsprep-bench-loader-{args.utts}-{args.per_shard}")
    c = prepare(DataSpec(utts=args.utts, utts_per_shard=args.per_shard), d, log=lambda s: print(s, file=sys.stderr))
    tok = train_tokenizer_once(c, args.vocab_size)

    import kaldiio
    import webdataset as wds

    from wdsprep.loader import make_loader

    shards = [str(p) for p in c.shards32]
    shards16 = [str(p) for p in c.shards16]
    ark = [str(p) for p in c.arks]
    n = args.utts
    keys = [line.split(None, 1)[0] for line in c.scp.read_text().splitlines()]
    order = np.random.default_rng(1).permutation(len(keys))
    loaders = {w: make_loader(shards, tok, max_frames=args.max_frames, num_workers=w) for w in (0, 2)}
    loaders["f16"] = make_loader(shards16, tok, max_frames=args.max_frames, num_workers=0)

    def wds_default() -> int:
        ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode().to_tuple("npy", "txt")
        return sum(1 for _ in ds)

    def kaldiio_random() -> int:
        table = kaldiio.load_scp(str(c.scp))
        for i in order:
            table[keys[i]]
        return len(order)

    def cold(paths: list[str], fn: Callable[[], int]) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            evict(paths)
            t = time.perf_counter()
            return fn(), time.perf_counter() - t
        return run

    def warm(fn: Callable[[], int]) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            t = time.perf_counter()
            return fn(), time.perf_counter() - t
        return run

    contenders: dict[str, Callable[[], tuple[int, float]]] = {
        "raw": warm(lambda: raw_read(shards) and n),
        "loader w0": warm(lambda: run_loader(loaders[0])),
        "loader w2": warm(lambda: run_loader(loaders[2])),
        "loader w0 f16": warm(lambda: run_loader(loaders["f16"])),
        "webdataset": warm(wds_default),
        "kaldiio": warm(kaldiio_random),
        "raw cold": cold(shards, lambda: raw_read(shards) and n),
        "loader w0 cold": cold(shards, lambda: run_loader(loaders[0])),
        "kaldiio cold": cold(ark, kaldiio_random),
    }
    if args.only:
        contenders = {k: v for k, v in contenders.items() if k in args.only.split(",")}
    raw_read(shards + ark + shards16)  # warm the page cache
    times: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got, secs = contenders[name]()
            assert got == n, (name, got, n)
            times[name].append(secs)
            if not name.endswith("cold"):
                continue
            raw_read(shards + ark)  # re-warm for the warm contenders
    rate = {k: n / statistics.median(v) for k, v in times.items()}

    mb = sum(Path(s).stat().st_size for s in shards) / 1e6
    st = loaders[0].stats
    print(f"{n} utterances, {len(shards)} shards, {mb:,.0f} MB float32 x {DIMS}, max_frames {args.max_frames}, "
          f"spm unigram {args.vocab_size}, median of {args.repeat} interleaved rounds, {os.cpu_count()} cores, "
          f"load avg {os.getloadavg()[0]:.1f}")
    print()
    print("| path | utts/s (median) | passes (s) |")
    print("| --- | ---: | --- |")
    for k, v in times.items():
        print(f"| {k} | {rate[k]:,.0f} | {' '.join(f'{x:.2f}' for x in v)} |")
    print()
    print("| target | ratio | goal | met |")
    print("| --- | ---: | ---: | --- |")

    def ratio(label: str, a: str, b: str, goal: float) -> None:
        if a in rate and b in rate:
            x = rate[a] / rate[b]
            print(f"| {label} | {x:.2f}x | >= {goal}x | {'yes' if x >= goal else 'NO'} |")

    ratio("loader w0 / raw read (warm)", "loader w0", "raw", 0.5)
    ratio("loader w0 / webdataset", "loader w0", "webdataset", 5)
    ratio("loader w0 / kaldiio random (warm)", "loader w0", "kaldiio", 1.5)
    ratio("loader w0 / kaldiio random (cold)", "loader w0 cold", "kaldiio cold", 2)
    ratio("loader w2 / loader w0", "loader w2", "loader w0", 1.0)
    ratio("loader w0 float16 / float32 shards", "loader w0 f16", "loader w0", 1.0)
    if "loader w0" in times:
        print(f"\npadding efficiency {st.padding_efficiency:.4f}, {st.steps} batches per epoch (w0)")
    if not args.no_rss:
        half = max(1, len(shards) // 2)
        for w in (0, 2):
            a, b = peak_rss(shards[:half], tok, w, args.max_frames), peak_rss(shards, tok, w, args.max_frames)
            print(f"peak RSS w{w} (main + workers): {half} shards {a['total_mb']:,.0f} MB "
                  f"(anon {a['anon_mb']:,.0f}), {len(shards)} shards {b['total_mb']:,.0f} MB "
                  f"(anon {b['anon_mb']:,.0f})")


if __name__ == "__main__":
    main()
