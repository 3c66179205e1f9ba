#!/usr/bin/env python3
"""What the epoch plan costs, and what it leaves unread.

    python tools/bench/bench_plan.py [--utts 15000000] [--index-utts 2000000] [--work DIR]

1. **Planning**: ``plan_epoch`` over ``--utts`` synthetic utterances (lognormal lengths, median
   500 frames, 2,000 per shard, ``max_frames`` 20,000, default options), in a fresh process: the
   seconds, and the peak RSS (VmHWM) against the process's RSS with the inputs already in memory.
2. **Building a loader** over an indexed folder of ``--index-utts`` utterances in 1,000 shards:
   the index as ``pack`` writes it, beside sparse files of the indexed sizes (the stale check
   sees what it expects; no byte is read). In fresh processes: ``shard_set`` (what every process
   that builds a loader loads), and ``make_loader`` to its first plan (torch imported before,
   as in a trainer); seconds and peak RSS growth. The index files' sizes too.
3. **The discarded tail**: the uneven corpus of ``tests/test_ddp.py`` (260 utterances, 29 per
   shard in two length groups), planned for 1-3 ranks and 0 and 2 workers.

Every figure is one run: the plan is deterministic, its time varies with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def fresh(code: str) -> dict:
    """Run ``code`` in a fresh Python; it prints one JSON line, which is returned."""
    prelude = textwrap.dedent('''
        import json, time
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        def reset_hwm():
            # Peak RSS from here on: what came before (making the inputs, imports) does not count.
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return hwm()
    ''')
    out = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_planning(utts: int) -> dict:
    return fresh(f'''
        import numpy as np
        from wdsprep.plan.streams import PlanOptions, plan_epoch
        rng = np.random.default_rng(0)
        frames = np.clip(rng.lognormal(np.log(500), 0.5, {utts}), 20, 3000).astype(np.int32)
        utts = np.full({utts} // 2000, 2000, np.int64)
        before = reset_hwm()
        t = time.perf_counter()
        plan = plan_epoch(utts, frames, PlanOptions(max_frames=20000), seed=0, epoch=1)
        seconds = time.perf_counter() - t
        print(json.dumps({{"utterances": {utts}, "seconds": seconds, "streams": len(plan.streams),
                          "batches": plan.num_batches, "rss_before_mb": before, "peak_mb": hwm()}}))
    ''')


def make_index(folder: Path, utts: int, shards: int = 1000) -> None:
    """An indexed folder of ``utts`` utterances in ``shards`` sparse shard files."""
    from wdsprep.format.index import FolderIndex, write_index

    stamp = folder / f".made-cat-{utts}-{shards}"  # "cat": read_index refuses a layout no reader knows
    if stamp.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    per = np.full(shards, utts // shards, np.int64)
    per[: utts - int(per.sum())] += 1
    frames = np.clip(rng.lognormal(np.log(500), 0.5, utts), 20, 3000).astype(np.int32)
    text_lens = rng.integers(5, 120, utts).astype(np.int32)
    names, sizes, mtimes = [], [], []
    starts = np.concatenate([[0], np.cumsum(per)])
    for i in range(shards):
        name = f"data-{i:05d}.tar"
        path = folder / name
        size = int(frames[starts[i]:starts[i + 1]].sum()) * 80 * 4 + int(per[i]) * 2048
        with open(path, "wb") as f:
            f.truncate(size)  # sparse: the size the index records, no bytes on disk
        names.append(name)
        sizes.append(size)
        mtimes.append(os.stat(path).st_mtime_ns)
    keys = [f"spk{i % 5000:04d}-utt{i:08d}" for i in range(utts)]
    index = FolderIndex("cat", 80, "float32", names, per, frames, text_lens, sizes=np.array(sizes),
                        mtimes=np.array(mtimes), keys=keys)
    write_index(folder, index)
    stamp.touch()


def bench_index(folder: Path, tokenizer: Path) -> dict:
    files = {p.name: p.stat().st_size for p in folder.iterdir() if p.name.startswith("index")}
    load = fresh(f'''
        from wdsprep.format.shardlist import expand_shards
        from wdsprep.plan.shardset import shard_set
        urls = expand_shards("{folder}/data-*.tar")
        before = reset_hwm()
        t = time.perf_counter()
        s = shard_set(urls)
        print(json.dumps({{"seconds": time.perf_counter() - t, "utterances": s.num_utts, "rss_before_mb": before,
                          "peak_mb": hwm()}}))
    ''')
    build = fresh(f'''
        import wdsprep
        import wdsprep.loader  # torch: a trainer has it loaded before it builds a loader
        tok = wdsprep.load_tokenizer("{tokenizer}")
        before = reset_hwm()
        t = time.perf_counter()
        loader = wdsprep.make_loader("{folder}/data-*.tar", tok, max_frames=20000)
        seconds = time.perf_counter() - t
        print(json.dumps({{"seconds": seconds, "len": len(loader), "rss_before_mb": before, "peak_mb": hwm()}}))
    ''')
    return {"files_bytes": files, "shard_set": load, "make_loader": build}


def bench_tail(work: Path) -> list[dict]:
    """tests/test_ddp.py's uneven corpus (two length groups of different shard sizes) at 1-3 ranks."""
    sys.path.insert(0, str(REPO / "tests"))
    from shardsets import build  # the test fixture's corpus, packed as users pack

    from wdsprep.check.planreport import plan_report

    shutil.rmtree(work / "uneven", ignore_errors=True)
    out, _ = build(work / "uneven", n=260, utts_per_shard=29, groups=["0:150", "150:"])
    rows = []
    for world in (1, 2, 3):
        for workers in (0, 2):
            with open(os.devnull, "w") as sink:
                r = plan_report(f"{out}/*/data-*.tar", world_size=world, num_workers=workers, max_frames=3000,
                                shuffle_buffer=50, seed=7, out=sink)[0]
            rows.append({"world_size": world, "num_workers": workers, "steps_per_rank": r["steps_per_rank"],
                         "discarded_batches": r["discarded_batches"],
                         "discarded_utterances": r["discarded_utterances"], "utterances": r["utterances"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--utts", type=int, default=15_000_000, help="utterances to plan (default: %(default)s)")
    ap.add_argument("--index-utts", type=int, default=2_000_000, help="utterances indexed (default: %(default)s)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-plan"))
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    plan = bench_planning(args.utts)
    grew = plan["peak_mb"] - plan["rss_before_mb"]
    print(f"plan: {plan['utterances']:,} utterances, {plan['streams']} streams, {plan['batches']:,} batches in "
          f"{plan['seconds']:.2f} s; peak RSS {plan['peak_mb']:.0f} MB ({grew:+.0f} MB over the process with its "
          f"inputs, {plan['rss_before_mb']:.0f} MB)")

    folder = args.work / f"index-{args.index_utts}"
    make_index(folder, args.index_utts)
    tokenizer = args.work / "char.json"
    if not tokenizer.exists():
        from wdsprep.tokenizer import train_tokenizer

        (args.work / "text").write_text("u1 a b c\n")
        train_tokenizer("char", [args.work / "text"], tokenizer)
    index = bench_index(folder, tokenizer)
    files = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(index["files_bytes"].items()))
    for what in ("shard_set", "make_loader"):
        r = index[what]
        print(f"{what}: {args.index_utts:,} indexed utterances in 1,000 shards: {r['seconds']:.2f} s, peak RSS "
              f"{r['peak_mb']:.0f} MB ({r['peak_mb'] - r['rss_before_mb']:+.0f} MB)")
    print(f"index files: {files}")

    tail = bench_tail(args.work)
    print("the uneven corpus of tests/test_ddp.py (260 utterances, two length groups), max_frames 3000:")
    for r in tail:
        print(f"  {r['world_size']} rank(s) x {max(1, r['num_workers'])} reader(s): steps {r['steps_per_rank']}, "
              f"discarded {r['discarded_batches']} batch(es), {r['discarded_utterances']} utterances "
              f"({r['discarded_utterances'] / (r['utterances'] + r['discarded_utterances']):.1%})")
    if args.json:
        args.json.write_text(json.dumps({"plan": plan, "index": index, "tail": tail}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
