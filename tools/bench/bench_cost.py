#!/usr/bin/env python3
"""Batches sized by what a training step costs, against batches sized by padded frames; and, with
a cost that counts label tokens, pools ordered by frames and tokens against pools sorted by frames.

    python tools/bench/bench_cost.py [--utts 200000] [--world-size 8] [--tokens-per-frame 0.1]
                                     [--plan-utts 15000000]

The corpus of issues 27 and 37: ``--utts`` utterances, lognormal lengths (median 600 frames,
sigma 0.5, clipped to [50, 3000]), a text rate that varies per utterance (lognormal tokens per
frame, median ``--tokens-per-frame``, sigma 0.5), shards of 2,000, planned for ``--world-size``
ranks of 2 readers.

**1D** (issue 27): the step's cost is ``B x t x (512 + t)`` with ``t`` = longest frames / 4, a
subsampled encoder's linear part plus self-attention (``{"subsampling": 4, "per_frame": 512,
"per_frame2": 1}``):

- **frames plan**: ``max_frames`` 20,000 (per rank), as today;
- **cost plan**: ``max_cost`` alone, set to the frames plan's largest batch cost, so the peak
  memory is the same.

**2D** (issue 37): the cost adds a transducer's joint tensor and a decoder's labels,
``c = t x (512 + t) + 2 t u + u^2`` (``u`` the longest label in tokens), ``max_cost`` the frames
plan's largest batch cost under it; the cost plan with pools sorted by frames only (the plan
before issue 37: its pools and streams, or this plan's) against pools ordered by frames and tokens.

Printed for each: the time every DDP step waits for its slowest rank (sum over steps of the
slowest rank's cost / sum of the ranks' mean cost, minus 1), the largest batch cost over the
median, steps per epoch, frames and label padding efficiency (real / padded), streams, the
utterances planned (each once), and the time to plan an epoch of ``--utts`` and ``--plan-utts``
utterances (one rank's whole plan, as the loader's main process makes it).  All from the index
alone, with the loader's own epoch source and plan report.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager, nullcontext
from typing import Iterator

import numpy as np

import wdsprep.plan.batching as batching
import wdsprep.plan.streams as plan
from wdsprep.check.planreport import epoch_report
from wdsprep.plan.cost import CostModel
from wdsprep.plan.shardset import ShardSet
from wdsprep.plan.source import epoch_source
from wdsprep.plan.stats import BatchTally
from wdsprep.plan.streams import PlanOptions, describe_rates, token_rates

ATTENTION = CostModel(subsampling=4, per_frame=512, per_frame2=1)
TRANSDUCER = CostModel(subsampling=4, per_frame=512, per_frame2=1, per_frame_token=2, per_token2=1)


def corpus(n: int, per_shard: int = 2000, seed: int = 0, tokens_per_frame: float | None = None) -> ShardSet:
    """Synthetic shards: only what the plan reads (no file exists).  The frames are those of
    issue 27's corpus whatever the text rate (drawn from a generator of its own)."""
    frames = np.clip(np.random.default_rng(seed).lognormal(np.log(600), 0.5, n), 50, 3000).astype(np.int32)
    tokens = None
    if tokens_per_frame is not None:
        rate = np.random.default_rng([seed, 37]).lognormal(np.log(tokens_per_frame), 0.5, n)
        tokens = np.maximum(1, np.round(frames * rate)).astype(np.int32)
    utts = np.full(n // per_shard, per_shard, np.int64)
    utts[-1] += n - int(utts.sum())
    names = [f"bench/{i:05d}.tar" for i in range(len(utts))]
    return ShardSet(names, utts, frames, [""] * len(utts), np.full(len(utts), -1, np.int64), tokens=tokens)


@contextmanager
def frames_sorted_pools(same_pools: bool) -> Iterator[None]:
    """Plans that count tokens as before issue 37: pools sorted by frames only; ``same_pools``:
    in this plan's pools and streams, else in those of frames-only plans."""
    saved = batching.band_order, plan.TOKEN_POOL_BATCHES
    batching.band_order = lambda order, lens, tokens: order
    if not same_pools:
        plan.TOKEN_POOL_BATCHES = 0  # pool_size and the default streams, as a plan by frames has
    try:
        yield
    finally:
        batching.band_order, plan.TOKEN_POOL_BATCHES = saved


def figures(shards: ShardSet, options: PlanOptions, world_size: int, workers: int, judge: CostModel) -> dict:
    """The plan's step figures under ``judge``, from the loader's own plan report, and its label padding."""
    t0 = time.perf_counter()
    source = epoch_source(shards, options, seed=0, world_size=world_size, num_workers=workers)
    r = epoch_report(source, options, 0, judge=judge)
    seconds = time.perf_counter() - t0
    run = source.run(source.start(0))
    planned = [b for rank in range(world_size) for w in run.windows(rank) for b in w.refs]
    rows = np.concatenate([source.rows(b) for b in planned] + [source.rows(b) for b in run.discarded()])
    once = len(rows) == len(np.unique(rows)) == shards.num_utts - sum(r["dropped"].values())
    labels = BatchTally()
    if shards.tokens is not None:
        for b in planned:
            batch = source.rows(b)
            labels.add(shards.frames[batch], None, shards.tokens[batch])
    return {"steps": r["steps_per_rank"][0], "streams": source.num_streams, "padding": r["padding_efficiency"],
            "labels": labels.label_padding_efficiency, "once": once, "report_seconds": seconds, **r["cost"]}


def table(rows: list[tuple[str, dict]]) -> None:
    print("| plan | step wait | cost largest/median | steps per rank | frames padding | label padding | streams "
          "| each utterance once |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, f in rows:
        labels = "-" if f["labels"] != f["labels"] else f"{f['labels']:.3f}"
        print(f"| {name} | {f['step_wait']:.1%} | {f['largest_over_median']:.2f} | {f['steps']:,} | "
              f"{f['padding']:.3f} | {labels} | {f['streams']} | {'yes' if f['once'] else 'NO'} |")


def plan_seconds(shards: ShardSet, options: PlanOptions) -> tuple[float, int]:
    """Seconds to plan an epoch whole (one rank, as the loader's main process), and its batches."""
    t0 = time.perf_counter()
    source = epoch_source(shards, options, seed=0, world_size=1, num_workers=0)  # plans epoch 0 whole
    n = int(source.corpus.counts(0).sum())
    return time.perf_counter() - t0, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utts", type=int, default=200_000)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-frames", type=int, default=20_000)
    p.add_argument("--tokens-per-frame", type=float, default=0.1, help="the text rate's median (2D plans)")
    p.add_argument("--plan-utts", type=int, default=15_000_000, help="0: skip the planning time at that size")
    args = p.parse_args()
    ws, nw = args.world_size, args.workers

    shards = corpus(args.utts)
    by_frames = PlanOptions(max_frames=args.max_frames)
    frames = figures(shards, by_frames, ws, nw, ATTENTION)
    # The frames plan's costliest batch: the cost plan's budget (the same peak memory).
    by_cost = PlanOptions(cost=ATTENTION, max_cost=frames["largest"])
    cost = figures(shards, by_cost, ws, nw, ATTENTION)
    print(f"1D: {args.utts:,} utterances (lognormal, median 600 frames), {ws} ranks x {nw} readers; "
          f"step cost {ATTENTION.to_json()}")
    table([(f"frames (max_frames {args.max_frames:,})", frames), (f"cost (max_cost {frames['largest']:.4g})", cost)])
    print(f"steps per epoch: {frames['steps'] / cost['steps']:.2f}x fewer with the cost plan")

    labelled = corpus(args.utts, tokens_per_frame=args.tokens_per_frame)
    frames2 = figures(labelled, by_frames, ws, nw, TRANSDUCER)
    by_both = PlanOptions(cost=TRANSDUCER, max_cost=frames2["largest"])
    with frames_sorted_pools(same_pools=False):
        before = figures(labelled, by_both, ws, nw, TRANSDUCER)
    with frames_sorted_pools(same_pools=True):
        same = figures(labelled, by_both, ws, nw, TRANSDUCER)
    both = figures(labelled, by_both, ws, nw, TRANSDUCER)
    print(f"\n2D: the same frames, tokens per frame lognormal (median {args.tokens_per_frame:g}, sigma 0.5); "
          f"step cost {TRANSDUCER.to_json()}")
    print(f"tokens per second: {describe_rates(token_rates(labelled.frames, labelled.tokens))}")
    table([(f"frames (max_frames {args.max_frames:,})", frames2),
           (f"cost, pools sorted by frames (before; max_cost {frames2['largest']:.4g})", before),
           ("cost, pools sorted by frames, this plan's pools", same),
           ("cost, pools ordered by frames and tokens", both)])
    gain, gain_same = both["labels"] - before["labels"], both["labels"] - same["labels"]
    print(f"label padding efficiency: +{gain:.3f} over pools sorted by frames (+{gain_same:.3f} in the same pools); "
          f"steps per epoch {before['steps'] / both['steps']:.2f}x fewer")

    timed = [("frames", by_frames, None), ("cost 1D", by_cost, None),
             ("cost 2D, pools sorted by frames (before)", by_both, False),
             ("cost 2D, frames and tokens", by_both, True)]
    for n in [args.utts] + ([args.plan_utts] if args.plan_utts else []):
        big = labelled if n == args.utts else corpus(n, seed=1, tokens_per_frame=args.tokens_per_frame)
        line = []
        for name, options, ordered in timed:
            with frames_sorted_pools(same_pools=False) if ordered is False else nullcontext():
                seconds, batches = plan_seconds(big, options)
            line.append(f"{name} {seconds:.2f} s ({batches:,} batches)")
        print(f"plan {n:,} utterances: " + "; ".join(line))

if __name__ == "__main__":
    main()
