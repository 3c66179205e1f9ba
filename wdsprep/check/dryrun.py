"""``wdsprep dry-run``: iterate the training loader with no model, the check before a long job.

Reports per epoch: batches (steps), utterances, padding efficiency, utterances/s, dropped by
reason, corrupt shards and the fraction the DDP early stop discarded.  Works under ``torchrun``
(gloo on CPU): every rank iterates its share and rank 0 prints the summary of all ranks.
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from wdsprep.files import write_text
from wdsprep.loading.stats import efficiency


def dry_run(*, hyper: str | None = None, trset: str | None = None, tokenizer: str | None = None,
            max_frames: int | None = None, epochs: int = 1, dump_keys: str | None = None,
            num_workers: int = 0, seed: int = 0, stats_json: str | None = None,
            out: TextIO | None = None) -> list[dict[str, Any]]:
    """Iterate ``epochs`` epochs; returns this rank's per-epoch stats (and prints a summary on rank 0).

    ``stats_json``: rank 0 writes ``[[stats of rank r for epoch e, ...] for e]`` there, for tools
    that want the numbers rather than the printout.
    """
    import sys

    import torch.distributed as dist

    from wdsprep.loader import make_loader

    out = out or sys.stdout
    started = False
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")  # launched by torchrun: join the group it set up
        started = True
    try:
        if hyper is not None:
            from wdsprep.hyper import make_loader_from_hyper

            loader = make_loader_from_hyper(hyper, num_workers=num_workers)
        else:
            if trset is None or tokenizer is None or max_frames is None:
                raise ValueError("dry-run needs --hyper FILE, or --trset, --tokenizer and --max-frames")
            loader = make_loader(trset, tokenizer, max_frames=max_frames, num_workers=num_workers, seed=seed)
        rank, world = loader.dataset.rank, loader.dataset.world_size
        dump = open(f"{dump_keys}.rank{rank}" if dump_keys and world > 1 else dump_keys, "w",
                    encoding="utf-8") if dump_keys else None
        results = []
        every_rank: list[list[dict[str, Any]]] = []
        try:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for step, batch in enumerate(loader):
                    if dump:
                        dump.write("".join(f"{epoch}\t{step}\t{k}\n" for k in batch.keys))
                st = loader.stats.to_dict()
                results.append(st)
                gathered = _gather(st, world)
                every_rank.append(gathered)
                if rank == 0:
                    out.write(_summary(epoch, gathered) + "\n")
                    out.flush()
        finally:
            if dump:
                dump.close()
        if stats_json and rank == 0:
            write_text(stats_json, json.dumps(every_rank, indent=1))
        return results
    finally:
        if started:
            dist.destroy_process_group()


def _gather(st: dict[str, Any], world: int) -> list[dict[str, Any]]:
    import torch.distributed as dist

    if world == 1 or not dist.is_initialized():
        return [st]
    all_stats: list[Any] = [None] * world
    dist.all_gather_object(all_stats, st)  # rank stats are plain dicts of numbers we produced
    return all_stats


def _summary(epoch: int, ranks: list[dict[str, Any]]) -> str:
    utts = sum(r["utterances"] for r in ranks)
    real = sum(r["real_frames"] for r in ranks)
    padded = sum(r["padded_frames"] for r in ranks)
    secs = max(r["seconds"] for r in ranks) or float("nan")
    dropped: dict[str, int] = {}
    for r in ranks:
        for k, v in r["dropped"].items():
            dropped[k] = dropped.get(k, 0) + v
    disc = ranks[0]["discarded_fraction"]
    lines = [
        f"epoch {epoch}: {sum(r['steps'] for r in ranks):,} batches, {utts:,} utterances on {len(ranks)} rank(s)",
        f"  steps per rank      {[r['steps'] for r in ranks]}",
        f"  padding efficiency  {efficiency(real, padded):.4f} (real/padded frames)",
        f"  utterances/s        {utts / secs:,.0f} (slowest rank {secs:.2f} s)",
        f"  dropped             {json.dumps(dropped) if dropped else 'none'}; corrupt shards "
        f"{sum(r['corrupt_shards'] for r in ranks)}",
        "  discarded by early stop  " + ("unknown (no index)" if disc is None else f"{disc:.2%}"),
    ]
    return "\n".join(lines)
