#!/usr/bin/env python3
"""Hold what a stopped and resumed Lightning run trained on against the loader's plan.

    python local/check_resume.py --shards S --tokenizer T --exp-dir E --world-size 2 --epochs 4

Reads ``E/steps.rankR.tsv`` (``epoch<TAB>step<TAB>keys`` per training step, both runs appended) and
plans every epoch with plain loaders, one per rank (no data read): each rank's steps must be the
plan's batches in the plan's order, every step once, and each epoch must hold every utterance it
plans once.  Prints one line per epoch; exit 1 on a difference.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from train_lightning import loader_kwargs

import wdsprep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--bucket-size", type=int, default=1000)
    args = ap.parse_args(argv)
    world, ok = args.world_size, True
    logged = []
    for rank in range(world):
        lines = (Path(args.exp_dir) / f"steps.rank{rank}.tsv").read_text(encoding="utf-8").splitlines()
        logged.append([(int(e), int(s), k.split()) for e, s, k in (line.split("\t") for line in lines)])
    # One loader per rank, every epoch set on it, as a training run does (and what it says of the plan, once).
    loaders = [wdsprep.make_loader(args.shards, args.tokenizer, rank=rank, world_size=world,
                                   **loader_kwargs(args, world)) for rank in range(world)]
    for epoch in range(args.epochs):
        keys: Counter[str] = Counter()
        planned: Counter[str] = Counter()
        for rank, loader in enumerate(loaders):
            loader.set_epoch(epoch)
            plan = [list(b.keys) for b in loader]
            got = [(s, k) for e, s, k in logged[rank] if e == epoch]
            if got != list(enumerate(plan)):
                ok = False
                print(f"epoch {epoch} rank {rank}: the steps trained are not the plan's ({len(got)} steps logged, "
                      f"{len(plan)} planned)")
            keys.update(k for _, b in got for k in b)
            planned.update(k for b in plan for k in b)
        once = keys == planned and set(keys.values()) <= {1}
        ok = ok and once
        print(f"epoch {epoch}: {sum(keys.values())} utterances trained on, "
              f"{'each once, in the planned batches' if once else 'NOT the plan: see above'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
