"""``wdsprep dry-run``: the loader without a model, the check before a long job.

Two ways:

- ``dry-run --plan --world-size N``: the epoch's plan at N ranks, from the index alone
  (``check/planreport.py``: no feature read, no tokenizer, no torch).
- ``dry-run``: iterate the real loader.  Per epoch: steps, utterances delivered against planned,
  padding efficiency, utterances/s, dropped by reason, corrupt shards, the discarded tail, and
  the shuffle report of the planned batches (``loader.stats.shuffle``).  Works
  under ``torchrun`` (gloo on CPU): every rank iterates its share, rank 0 prints every rank's.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from typing import Any, Mapping, TextIO

import numpy as np

from wdsprep.check.planreport import corpus_shuffle_lines, merged_shuffle, shuffle_lines
from wdsprep.files import naming, open_output, write_text
from wdsprep.plan.growing import describe
from wdsprep.plan.stats import efficiency


def dry_run(*, hyper: str | None = None, trset: str | Mapping[str, str] | None = None, tokenizer: str | None = None,
            epochs: int = 1, dump_keys: str | None = None, stats_json: str | None = None, plot: str | None = None,
            out: TextIO | None = None, **loader_options: Any) -> list[dict[str, Any]]:
    """Iterate ``epochs`` epochs; returns this rank's per-epoch stats (and prints a summary on rank 0).

    ``loader_options`` go to :func:`wdsprep.make_loader` (with ``hyper``: override its options).
    ``stats_json``: rank 0 writes ``[[stats of rank r for epoch e, ...] for e]`` there, for tools
    that want the numbers rather than the printout.  ``plot`` (mixed corpora): rank 0 draws each
    corpus's realized share of the utterances, step by step over all ranks, against the schedule.
    """
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

            # --tokenizer names the file to use instead of hyper-p.json's (a CAT .tknz imported as JSON).
            loader = make_loader_from_hyper(hyper, **({"tokenizer": tokenizer} if tokenizer else {}), **loader_options)
        else:
            if trset is None or tokenizer is None:
                raise ValueError("dry-run needs --hyper FILE, or --trset (or --corpus) and --tokenizer, with "
                                 "--max-frames or --cost and --max-cost")
            loader = make_loader(trset, tokenizer, **loader_options)
        rank, world = loader.rank, loader.world_size
        mixture = loader.source.mixture
        if plot and mixture is None:
            raise ValueError("--plot draws the mixture of named corpora in training: give --corpus (or an ld object)")
        per_step: list[np.ndarray] = []  # utterances of each corpus at each step, this rank
        first_step = loader.source.global_step(loader.position()) or 0
        results = []
        every_rank: list[list[dict[str, Any]]] = []
        with ExitStack() as stack:  # the dump is written as every output is: whole, never through a link
            dump = stack.enter_context(open_output(f"{dump_keys}.rank{rank}" if world > 1 else dump_keys,
                                                   encoding="utf-8")) if dump_keys else None
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for step, batch in enumerate(loader):
                    if plot:
                        per_step.append(np.bincount(batch.corpus.numpy(), minlength=len(loader.corpora)))
                    if dump:
                        with naming(dump.name):  # a full disk: say which file
                            dump.write("".join(f"{epoch}\t{step}\t{k}\n" for k in batch.keys))
                st = loader.stats.to_dict()
                results.append(st)
                gathered = _gather(st, world)
                every_rank.append(gathered)
                if rank == 0:
                    out.write(_summary(epoch, gathered) + "\n")
                    out.flush()
        if stats_json and rank == 0:
            write_text(stats_json, json.dumps(every_rank, indent=1))
        if plot:
            from wdsprep.check.plot import plot_mixture

            steps = np.sum(_gather_array(np.array(per_step), world), axis=0)  # summed over ranks, step by step
            if rank == 0:
                plot_mixture(steps, mixture.at(first_step + np.arange(len(steps))), loader.corpora, plot,
                             first_step=first_step)
                out.write(f"mixture plot: {plot}\n")
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


def _gather_array(a: np.ndarray, world: int) -> list[np.ndarray]:
    import torch.distributed as dist

    if world == 1 or not dist.is_initialized():
        return [a]
    every: list[Any] = [None] * world
    dist.all_gather_object(every, a.tolist())  # plain lists of ints we made
    return [np.array(x) for x in every]


def _summary(epoch: int, ranks: list[dict[str, Any]]) -> str:
    utts = sum(r["utterances"] for r in ranks)
    planned = sum(r["assigned"] for r in ranks)
    secs = max(r["seconds"] for r in ranks) or float("nan")
    dropped: dict[str, int] = {}
    for r in ranks:
        for k, v in r["dropped"].items():
            dropped[k] = dropped.get(k, 0) + v
    eff = efficiency(sum(r["real_frames"] for r in ranks), sum(r["padded_frames"] for r in ranks))
    lines = [
        f"epoch {epoch}: {sum(r['steps'] for r in ranks):,} batches, {utts:,} utterances on {len(ranks)} rank(s)",
        f"  steps per rank      {[r['steps'] for r in ranks]} (planned {[r['planned_steps'] for r in ranks]})",
        f"  utterances          {utts:,} delivered of {planned:,} planned",
        f"  padding efficiency  {eff:.4f} (real/padded frames)",
        f"  utterances/s        {utts / secs:,.0f} (slowest rank {secs:.2f} s)",
        f"  dropped             {json.dumps(dropped) if dropped else 'none'}; corrupt shards "
        f"{sum(r['corrupt_shards'] for r in ranks)}",
        f"  discarded tail      {ranks[0]['discarded']:,} utterances ({ranks[0]['discarded_fraction']:.2%})",
        *([f"  shards              {describe(ranks[0]['growing'])}"] if ranks[0].get("growing") else []),
    ]
    names = list(ranks[0].get("corpora", {}))
    if names:
        per = {n: [sum(r["corpora"][n][k] for r in ranks) for k in ("utterances", "hours")] for n in names}
        epochs = {n: ranks[0]["corpora"][n]["epochs"] for n in names}  # where each corpus stands: rank-independent
        lines.append("  per corpus          " + ", ".join(
            f"{n}: {u:,} utts ({u / utts if utts else 0:.1%}), {h:.2f} h"
            + (f", {epochs[n]:.2f} epochs" if epochs[n] is not None else "")
            for n, (u, h) in per.items()))
    if all(r.get("shuffle") for r in ranks):
        lines.append(shuffle_lines(merged_shuffle([r["shuffle"] for r in ranks])))
    if names and all(r["corpora"][n].get("shuffle") for r in ranks for n in names):
        lines.append(corpus_shuffle_lines({n: merged_shuffle([r["corpora"][n]["shuffle"] for r in ranks])
                                           for n in names}))
    return "\n".join(lines)
