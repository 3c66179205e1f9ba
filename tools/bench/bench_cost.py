#!/usr/bin/env python3
"""Batches sized by what a training step costs, against batches sized by padded frames.

    python tools/bench/bench_cost.py [--utts 200000] [--world-size 8] [--plan-utts 15000000]

The corpus of issue 27: ``--utts`` utterances, lognormal lengths (median 600 frames, sigma 0.5,
clipped to [50, 3000]), shards of 2,000, planned for ``--world-size`` ranks of 2 readers.  The
step's cost is ``B x t x (512 + t)`` with ``t`` = longest frames / 4: a subsampled encoder's linear
part plus self-attention (``{"subsampling": 4, "per_frame": 512, "per_frame2": 1}``).

- **frames plan**: ``max_frames`` 20,000 (per rank), as today;
- **cost plan**: ``max_cost`` alone, set to the frames plan's largest batch cost, so the peak
  memory is the same.

Printed for both: the time every DDP step waits for its slowest rank (sum over steps of the
slowest rank's cost / sum of the ranks' mean cost, minus 1), the largest batch cost over the
median, steps per epoch, padding efficiency, the utterances planned (each once), and the time to
plan an epoch of ``--plan-utts`` utterances (one rank's whole plan, as the loader's main process
makes it).  All from the index alone, with the loader's own epoch source and plan report.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from wdsprep.check.planreport import epoch_report
from wdsprep.loading.cost import CostModel
from wdsprep.loading.plan import PlanOptions
from wdsprep.loading.shardset import ShardSet
from wdsprep.loading.source import epoch_source

ATTENTION = CostModel(subsampling=4, per_frame=512, per_frame2=1)


def corpus(n: int, per_shard: int = 2000, seed: int = 0) -> ShardSet:
    """Synthetic shards: only what the plan reads (no file exists)."""
    frames = np.clip(np.random.default_rng(seed).lognormal(np.log(600), 0.5, n), 50, 3000).astype(np.int32)
    utts = np.full(n // per_shard, per_shard, np.int64)
    utts[-1] += n - int(utts.sum())
    names = [f"bench/{i:05d}.tar" for i in range(len(utts))]
    return ShardSet(names, utts, frames, [""] * len(utts), np.full(len(utts), -1, np.int64))


def figures(shards: ShardSet, options: PlanOptions, world_size: int, workers: int) -> dict:
    """The plan's step figures under the attention cost, from the loader's own plan report."""
    source = epoch_source(shards, options, seed=0, world_size=world_size, num_workers=workers)
    t0 = time.perf_counter()
    r = epoch_report(source, options, 0, judge=ATTENTION)
    seconds = time.perf_counter() - t0
    planned = [b for rank in range(world_size) for w in source.run(source.start(0)).windows(rank) for b in w.refs]
    rows = np.concatenate([source.rows(b) for b in planned] +
                          [source.rows(b) for b in source.run(source.start(0)).discarded()])
    once = len(rows) == len(np.unique(rows)) == shards.num_utts - sum(r["dropped"].values())
    return {"steps": r["steps_per_rank"][0],
            "padding": r["padding_efficiency"], "once": once, "report_seconds": seconds, **r["cost"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utts", type=int, default=200_000)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-frames", type=int, default=20_000)
    p.add_argument("--plan-utts", type=int, default=15_000_000, help="0: skip the planning time")
    args = p.parse_args()

    shards = corpus(args.utts)
    by_frames = PlanOptions(max_frames=args.max_frames)
    frames = figures(shards, by_frames, args.world_size, args.workers)
    # The frames plan's costliest batch: the cost plan's budget (the same peak memory).
    by_cost = PlanOptions(cost=ATTENTION, max_cost=frames["largest"])
    cost = figures(shards, by_cost, args.world_size, args.workers)

    print(f"{args.utts:,} utterances (lognormal, median 600 frames), {args.world_size} ranks x {args.workers} readers; "
          f"step cost {ATTENTION.to_json()}")
    print("| plan | step wait | cost largest/median | steps per rank | padding efficiency | each utterance once |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, f in ((f"frames (max_frames {args.max_frames:,})", frames),
                    (f"cost (max_cost {frames['largest']:.4g})", cost)):
        print(f"| {name} | {f['step_wait']:.1%} | {f['largest_over_median']:.2f} | {f['steps']:,} | "
              f"{f['padding']:.3f} | {'yes' if f['once'] else 'NO'} |")
    print(f"steps per epoch: {frames['steps'] / cost['steps']:.2f}x fewer with the cost plan")

    if args.plan_utts:
        for name, options in (("frames", by_frames), ("cost", by_cost)):
            big = corpus(args.plan_utts, seed=1)
            t0 = time.perf_counter()
            source = epoch_source(big, options, seed=0, world_size=1, num_workers=0)  # plans epoch 0 whole
            n = int(source.corpus.counts(0).sum())
            print(f"plan {args.plan_utts:,} utterances by {name}: {time.perf_counter() - t0:.2f} s ({n:,} batches)")


if __name__ == "__main__":
    main()
