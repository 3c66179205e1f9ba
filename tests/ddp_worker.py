"""Run by ``torchrun`` in test_ddp.py: iterate the loader on every rank and dump what each saw.

Writes ``OUT/rank{R}.json`` with, per epoch, the keys of every batch, the step count and the
stats, so the test can check equal steps, disjoint ranks and coverage from outside.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from wdsprep.loader import make_loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trset", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-frames", type=int, default=3000)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dev", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = make_loader(args.trset, args.tokenizer, max_frames=args.max_frames, num_workers=args.num_workers,
                         seed=7, shuffle_buffer=50, train=not args.dev)
    epochs = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        batches = [list(b.keys) for b in loader]
        epochs.append({"batches": batches, "steps": loader.stats.steps, "stats": loader.stats.to_dict(),
                       "state": loader.state()})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": dist.get_world_size(),
                                                                  "pid": os.getpid(), "epochs": epochs}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
