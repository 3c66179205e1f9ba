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
    p.add_argument("--save-at", type=int, help="also record the loader's state_dict() after this many steps")
    p.add_argument("--resume", help="a state_dict() (JSON file) to load before the first epoch")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = make_loader(args.trset, args.tokenizer, max_frames=args.max_frames, num_workers=args.num_workers,
                         seed=7, shuffle_buffer=50, train=not args.dev)
    epochs = []
    first = 0
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        loader.load_state_dict(state)
        first = state["epoch"]
    for epoch in range(first, first + args.epochs):
        loader.set_epoch(epoch)
        batches, saved = [], None
        for b in loader:
            batches.append(list(b.keys))
            if len(batches) == args.save_at:
                saved = loader.state_dict()
        epochs.append({"batches": batches, "steps": loader.stats.steps, "stats": loader.stats.to_dict(),
                       "state": loader.state_dict(), "saved": saved})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": dist.get_world_size(),
                                                                  "pid": os.getpid(), "epochs": epochs}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
