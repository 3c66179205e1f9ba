#!/usr/bin/env python3
"""Pack throughput and memory against plainly reading the same arks, measured in the same run.

    python tools/bench/bench_pack.py [--utts 20000] [--work /tmp/wdsprep-bench-pack] [--repeat 3]
                                     [--cold] [--baseline DIR] [--plan-memory N]

Generates ``--utts`` utterances of 80-dim float32 fbank-like features (lognormal lengths, median
~500 frames) into kaldiio arks once, then times, interleaved over ``--repeat`` rounds:

- ``read arks``: ``kaldiio.load_scp_sequential`` over the same scp (the floor for reading);
- ``read arks, shuffled``: the same matrices in a random order (the floor for the shuffle's reads);
- ``copy arks``: ``shutil.copyfile`` of the arks into the output dir (the floor for writing the
  same bytes: pack has to read and write every feature byte);
- ``headers``: pack's first pass alone (every matrix header, in ark order);
- ``pack --no-shuffle`` and ``pack`` (shuffled, the default), ``--nj 1`` and ``--nj 2``;
- with ``--baseline DIR`` (an export of an older wdsprep, e.g. ``git archive``), its ``pack`` too.

Each pack runs in a fresh process, which reports its time and peak RSS (its own, and its worker
processes' largest).  ``--cold`` evicts the arks from the page cache before every row (no root
needed), so reads come from the disk: the shuffle's random reads against input order's sequential
ones.  Prints utterances/s, MB/s of feature data, each row's time against both floors (medians)
CPU seconds (user + system, the pack's process and its workers: steadier than time on a shared
machine) and peak RSS.

``--plan-memory N`` instead measures what the shuffle's plan holds for N utterances (no features:
ids, ark offsets, transcripts as pack holds them), with tracemalloc: the bytes per utterance that
tell what 10M+ utterances need.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import kaldiio
import numpy as np

BENCH = Path(__file__).resolve().parent


def make_data(work: Path, utts: int, seed: int = 0) -> tuple[Path, Path]:
    """Arks + scp + text under ``work`` (reused when already there)."""
    scp, text, stamp = work / "feats.scp", work / "text", work / f".made-{utts}-{seed}"
    if not stamp.exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(np.log(500), 0.5, utts), 20, 3000).astype(int)
        with kaldiio.WriteHelper(f"ark,scp:{work / 'feats.ark'},{scp}") as w, open(text, "w") as t:
            for i, n in enumerate(lengths):
                uttid = f"spk{i % 50:03d}-utt{i:06d}"
                w(uttid, rng.standard_normal((n, 80), dtype=np.float32))
                t.write(f"{uttid} {' '.join(rng.choice(['a', 'speech', 'shard', 'test'], 8))}\n")
        stamp.touch()
    return scp, text


def feature_bytes(scp: Path) -> int:
    return sum(m.nbytes for _, m in kaldiio.load_scp_sequential(str(scp)))


def evict_arks(work: Path) -> None:
    sys.path.insert(0, str(BENCH))
    from pagecache import evict

    evict(sorted(work.glob("*.ark")))


def time_read(scp: Path) -> float:
    t = time.perf_counter()
    for _, m in kaldiio.load_scp_sequential(str(scp)):
        m.sum()  # touch the data, as pack does when it checks for NaN/Inf
    return time.perf_counter() - t


def time_read_shuffled(scp: Path) -> float:
    """The same matrices read in a random order: the access pattern of the shuffled pack's reads."""
    entries = [line.split(maxsplit=1)[1].strip() for line in scp.read_text().splitlines()]
    order = np.random.default_rng(0).permutation(len(entries))
    fds: dict = {}
    t = time.perf_counter()
    for i in order.tolist():
        kaldiio.load_mat(entries[i], fd_dict=fds).sum()
    seconds = time.perf_counter() - t
    for f in fds.values():
        f.close()
    return seconds


def time_copy(work: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t = time.perf_counter()
    for ark in work.glob("*.ark"):
        shutil.copyfile(ark, out / ark.name)
    return time.perf_counter() - t


# Run in a fresh process: its time and peak RSS are the pack's alone.
_CHILD = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
from wdsprep import pack_data
from wdsprep.prep.kaldi import read_feats_scp
if args["what"] == "headers":
    from wdsprep.pack.from_feats import _measure_chunk
_r = resource.getrusage(resource.RUSAGE_SELF)
cpu0 = _r.ru_utime + _r.ru_stime  # the imports' CPU, not the pack's
t = time.perf_counter()
if args["what"] == "headers":
    items = [(u, e.value) for u, e in read_feats_scp([args["scp"]]).items()]
    _measure_chunk(items, 0, lambda n: None)
else:
    pack_data(args["scp"], args["text"], args["out"], filter_group=["10:500", "500:1000", "1000:"], nj=args["nj"],
              progress=False, overwrite=True, **args["options"])
seconds = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - cpu0
print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_mb": me.ru_maxrss / 1024,
                  "worker_rss_mb": kids.ru_maxrss / 1024}))
"""


def run_child(what: str, scp: Path, text: Path, out: Path, nj: int, options: dict, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    arg = json.dumps({"what": what, "scp": str(scp), "text": str(text), "out": str(out), "nj": nj, "options": options})
    # cwd outside the checkout, so PYTHONPATH decides which wdsprep is imported
    r = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, env=env, cwd="/")
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def plan_memory(n: int) -> None:
    """Bytes per utterance the shuffled pack holds besides what it held before (its item list)."""
    import tracemalloc

    from wdsprep.pack.plan import plan_shards

    tracemalloc.start()
    items = [(f"spk{i % 5000:05d}-utt{i:09d}", f"/data/train/feats.{i % 64 + 1}.ark:{i * 160_000}",
              "the quick brown fox jumps over the lazy dog " * 2) for i in range(n)]
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    frames = np.random.default_rng(0).integers(50, 3000, n).astype(np.int64)
    cols = np.full(n, 80, np.int64)
    folders = ["10_1000" if f < 1000 else "1000_inf" for f in frames.tolist()]
    planned = plan_shards([u for u, _, _ in items], folders, frames, ["10_1000", "1000_inf"], utts_per_shard=2000,
                          shuffle=True, seed=0)
    shards = [(p.folder, [items[i] for i in p.items.tolist()], frames[p.items]) for p in planned.shards]  # as pack_arks
    peak = tracemalloc.get_traced_memory()[1] - base
    del shards, planned, cols
    print(f"{n:,} utterances: the item list (held before the shuffle too) {base / n:.0f} B/utt; "
          f"the shuffle's pass-1 columns, plan and per-shard lists add at peak {peak / n:.0f} B/utt "
          f"({peak / 2**20:,.0f} MiB; x{10_000_000 / n:.0f} for 10M utterances)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=20000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-pack"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="evict the arks from the page cache before every row")
    ap.add_argument("--baseline", help="an older wdsprep's source dir, packed with too (e.g. git archive of main)")
    ap.add_argument("--plan-memory", type=int, metavar="N", help="only measure the shuffle plan's memory for N utts")
    args = ap.parse_args()
    if args.plan_memory:
        plan_memory(args.plan_memory)
        return

    scp, text = make_data(args.work, args.utts)
    mb = feature_bytes(scp) / 1e6
    out = args.work / "out"
    read, copy = "read arks (kaldiio sequential)", "copy arks (shutil.copyfile)"
    shuffled = "read arks in a random order (kaldiio)"
    packs: dict[str, tuple[str, int, dict, str | None]] = {
        "pack headers pass alone": ("headers", 1, {}, None),
        "pack --no-shuffle --nj 1": ("pack", 1, {"shuffle": False}, None),
        "pack --nj 1 (shuffle)": ("pack", 1, {}, None),
        "pack --no-shuffle --nj 2": ("pack", 2, {"shuffle": False}, None),
        "pack --nj 2 (shuffle)": ("pack", 2, {}, None),
    }
    if args.baseline:
        packs["baseline pack --nj 1 (input order, one pass)"] = ("pack", 1, {}, args.baseline)
        packs["baseline pack --nj 2"] = ("pack", 2, {}, args.baseline)
    times: dict[str, list[float]] = {read: [], shuffled: [], copy: [], **{k: [] for k in packs}}
    rss: dict[str, list[tuple[float, float]]] = {k: [] for k in packs}
    cpu: dict[str, list[float]] = {k: [] for k in packs}
    cold = (lambda: evict_arks(args.work)) if args.cold else (lambda: None)
    for _ in range(args.repeat):  # interleaved, so drift in machine speed hits every row alike
        cold()
        times[read].append(time_read(scp))
        cold()
        times[shuffled].append(time_read_shuffled(scp))
        times[copy].append(time_copy(args.work, out))
        for name, (what, nj, options, path) in packs.items():
            shutil.rmtree(out, ignore_errors=True)
            cold()
            r = run_child(what, scp, text, out, nj, options, path)
            times[name].append(r["seconds"])
            cpu[name].append(r["cpu"])
            rss[name].append((r["rss_mb"], r["worker_rss_mb"]))
    t_read, t_copy = statistics.median(times[read]), statistics.median(times[copy])
    print(f"\n{args.utts} utterances, {mb:.0f} MB of float32 features, median of {args.repeat} rounds, "
          f"{'cold' if args.cold else 'warm'} page cache")
    print("| path | utts/s | MB/s | time / read | time / copy | CPU s (all processes) | peak RSS MB (main / largest "
          "worker) |\n|---|---|---|---|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        mem, used = "", ""
        if name in cpu:
            used = f"{statistics.median(cpu[name]):.2f}"
        if name in rss:
            own, workers = max(m for m, _ in rss[name]), max(w for _, w in rss[name])
            mem = f"{own:,.0f}" + (f" / {workers:,.0f}" if workers else "")
        print(f"| {name} | {args.utts / t:,.0f} | {mb / t:,.0f} | {t / t_read:.2f} | {t / t_copy:.2f} "
              f"| {used} | {mem} |")


if __name__ == "__main__":
    main()
