"""Run by ``torchrun`` in test_ddp.py: iterate the loader on every rank and dump what each saw.

Writes ``OUT/rank{R}.json`` with, per epoch, the keys of every batch, ``len(loader)``, the stats
and the state, so the test can check equal steps, the canonical plan and coverage from outside.
``--also`` runs a second loader in the same launch (each torchrun launch costs seconds): one epoch of
it, its batches with their languages and fields, stopped at its own step and resumed from its own state.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch.distributed as dist

from wdsprep.loader import make_loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trset")
    p.add_argument("--corpus", action="append", metavar="NAME=PATTERN",
                   help="named corpora to mix (instead of --trset)")
    p.add_argument("--schedule", help="a mixing schedule as JSON: [[step, {name: weight}], ...]")
    p.add_argument("--mix", help="mixing options as JSON, e.g. {\"weights\": {\"en\": 1, \"zh\": 1}}")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-frames", type=int, default=3000, help="0: none (with --cost and --max-cost)")
    p.add_argument("--cost", help="a cost model's JSON file: batches cut by it, within --max-cost")
    p.add_argument("--max-cost", type=float)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--streams", type=int, default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dev", action="store_true")
    p.add_argument("--save-at", type=int, help="record the loader's state_dict() after this many steps, and stop there")
    p.add_argument("--record-at", type=int, help="record the loader's state_dict() after this many steps, and go on")
    p.add_argument("--resume", help="a state_dict() (JSON file) to load before the first epoch")
    p.add_argument("--hang-rank", type=int, help="this rank stops stepping (sleeps) before its last batch")
    p.add_argument("--collective-timeout", type=float, default=300.0)
    p.add_argument("--read-ahead", type=int, default=2)
    p.add_argument("--retry-backoff", type=float, default=1.0)
    p.add_argument("--cache-dir")
    p.add_argument("--growing", action="store_true", help="follow a folder a pack is still writing")
    p.add_argument("--min-shards", type=int)
    p.add_argument("--until-complete", action="store_true",
                   help="with --growing: epochs until the pack is complete, then one more (--epochs: at most)")
    p.add_argument("--augment", help="make_loader's augment, as JSON")
    p.add_argument("--digests", action="store_true", help="record a digest of every utterance's features")
    p.add_argument("--also", help="a second loader, as JSON: {trset, tokenizer, kwargs, save_at, resume}")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trset = dict(c.split("=", 1) for c in args.corpus) if args.corpus else args.trset
    mixing = {"schedule": [tuple(p) for p in json.loads(args.schedule)]} if args.schedule else {}
    mixing.update(json.loads(args.mix) if args.mix else {})
    growing = {"growing": True, "min_shards": args.min_shards, "wait_timeout": 120} if args.growing else {}
    loader = make_loader(trset, args.tokenizer, max_frames=args.max_frames or None, cost=args.cost,
                         max_cost=args.max_cost, num_workers=args.num_workers,
                         seed=7, shuffle_buffer=50, train=not args.dev, streams=args.streams,
                         collective_timeout=args.collective_timeout, read_ahead=args.read_ahead,
                         retry_backoff=args.retry_backoff, cache_dir=args.cache_dir, augment=args.augment,
                         **mixing, **growing)
    epochs = []
    first = 0
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        loader.load_state_dict(state)
        first = state["epoch"]
    for epoch in range(first, first + args.epochs):
        loader.set_epoch(epoch)
        planned = loader.state_dict()  # where the epoch starts, and (growing) the shards it is planned over
        if rank == 0:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"epoch{epoch}.planned").write_text(json.dumps(planned))
        epoch_len = len(loader)  # counted from the epoch's start
        length = epoch_len - loader.position().step  # what this run yields: a resumed epoch's rest
        batches, corpora, digests, saved = [], [], {}, None
        for b in loader:
            batches.append(list(b.keys))
            corpora.append(b.corpus.tolist())
            if args.digests:  # each utterance's features, bit for bit
                for i, k in enumerate(b.keys):
                    row = b.feats[i, :int(b.feat_lens[i])].numpy()
                    digests[k] = hashlib.blake2b(row.tobytes() + str(row.shape).encode(), digest_size=16).hexdigest()
            if args.hang_rank == rank and len(batches) == length - 1:
                time.sleep(3600)  # alive, but no longer stepping
            if len(batches) == args.save_at:
                saved = loader.state_dict()
                break
            if len(batches) == args.record_at:
                saved = loader.state_dict()
        epochs.append({"batches": batches, "corpora": corpora, "digests": digests, "len": length,
                       "epoch_len": epoch_len, "steps": loader.stats.steps, "stats": loader.stats.to_dict(),
                       "state": loader.state_dict(), "saved": saved, "planned": planned})
        if args.until_complete and loader.stats.growing["complete"]:
            break  # an epoch over the finished folder: the last one asked for
    also = run_also(json.loads(args.also), args.num_workers) if args.also else None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": dist.get_world_size(),
                                                                  "pid": os.getpid(), "epochs": epochs,
                                                                  "also": also}))
    dist.barrier()
    dist.destroy_process_group()


def run_also(spec: dict, num_workers: int) -> dict:
    """One epoch of a second loader: its batches' keys, languages, fields and corpora, and its state
    at ``save_at`` (where it stops) or ``record_at`` (where it goes on); resumed first from
    ``resume`` (a state's JSON file)."""
    loader = make_loader(spec["trset"], spec["tokenizer"], num_workers=num_workers, **spec["kwargs"])
    epoch = 0
    if spec.get("resume"):
        state = json.loads(Path(spec["resume"]).read_text())
        loader.load_state_dict(state)
        epoch = state["epoch"]
    loader.set_epoch(epoch)
    # What this run yields: a resumed epoch's rest (len counts from the epoch's start).
    out: dict = {"len": len(loader) - loader.position().step, "batches": [], "langs": [], "fields": [], "labels": [],
                 "corpora": [], "saved": None}
    for b in loader:
        out["batches"].append(list(b.keys))
        out["langs"].append(b.lang)
        out["fields"].append(b.fields)
        out["labels"].append([b.labels[i, :int(n)].tolist() for i, n in enumerate(b.label_lens)])
        out["corpora"].append(b.corpus.tolist())
        if len(out["batches"]) == spec.get("save_at"):
            out["saved"] = loader.state_dict()
            break
        if len(out["batches"]) == spec.get("record_at"):
            out["saved"] = loader.state_dict()
    return out


if __name__ == "__main__":
    main()
