"""``wdsprep dry-run``: the loader without a model, the check before a long job.

Two ways:

- ``dry-run --plan --world-size N``: the epoch's plan at N ranks, from the index alone (no
  feature is read, no tokenizer needed): steps per rank, utterances and hours, padding
  efficiency, what the plan leaves out, the discarded tail and how random the batches are
  (speakers per batch against a random draw, speaker recurrence, lag-1 length correlation:
  ``loading/quality.py``).
- ``dry-run``: iterate the real loader.  Per epoch: steps, utterances delivered against planned,
  padding efficiency, utterances/s, dropped by reason, corrupt shards, the discarded tail, and
  the shuffle report of the planned batches (``loader.stats.shuffle``).  Works
  under ``torchrun`` (gloo on CPU): every rank iterates its share, rank 0 prints every rank's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping, TextIO

import numpy as np

from wdsprep.files import naming, write_text
from wdsprep.loading.stats import BatchTally, efficiency
from wdsprep.units import hours


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
            if trset is None or tokenizer is None or loader_options.get("max_frames") is None:
                raise ValueError("dry-run needs --hyper FILE, or --trset, --tokenizer and --max-frames")
            loader = make_loader(trset, tokenizer, **loader_options)
        rank, world = loader.rank, loader.world_size
        mixture = getattr(getattr(loader.dataset, "mix", None), "mixture", None)
        if plot and mixture is None:
            raise ValueError("--plot draws the mixture of named corpora in training: give --corpus (or an ld object)")
        per_step: list[np.ndarray] = []  # utterances of each corpus at each step, this rank
        first_step = loader.position().global_step if mixture is not None else 0
        dump = open(f"{dump_keys}.rank{rank}" if dump_keys and world > 1 else dump_keys, "w",
                    encoding="utf-8") if dump_keys else None
        results = []
        every_rank: list[list[dict[str, Any]]] = []
        try:
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
        finally:
            if dump:
                dump.close()
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
        lines.append(_shuffle_lines(_merged([r["shuffle"] for r in ranks])))
    if names and all(r["corpora"][n].get("shuffle") for r in ranks for n in names):
        lines.append(_corpus_shuffle_lines({n: _merged([r["corpora"][n]["shuffle"] for r in ranks]) for n in names}))
    return "\n".join(lines)


def _merged(shuffles: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranks' shuffle reports as one (their sums add up)."""
    from wdsprep.loading.quality import ShuffleQuality

    q = ShuffleQuality.from_dict(shuffles[0])
    for other in shuffles[1:]:
        q.merge(ShuffleQuality.from_dict(other))
    return q.to_dict()


MIXING = ("weights", "temperature", "schedule", "steps_per_epoch")


def plan_report(trset: Any, *, world_size: int = 1, num_workers: int = 0, epochs: int = 1, seed: int = 0,
                out: TextIO | None = None, **plan_options: Any) -> list[dict[str, Any]]:
    """The plan of ``epochs`` epochs at ``world_size`` ranks, from the index alone; printed, and
    returned per epoch as numbers.  ``plan_options`` are :class:`~wdsprep.loading.plan.PlanOptions`'
    (``max_frames`` and any of the batching options ``make_loader`` takes), and for named corpora
    (``trset`` a mapping) the mixing options too."""
    from wdsprep.loading.assign import epoch_assignment, rank_order
    from wdsprep.loading.plan import PlanOptions, plan_epoch
    from wdsprep.loading.quality import plan_quality, shard_speakers
    from wdsprep.loading.shardset import indexed_shards, union

    out = out or sys.stdout
    mixing = {k: plan_options.pop(k) for k in MIXING if plan_options.get(k) is not None}
    if isinstance(trset, Mapping):
        shards = union({name: indexed_shards(p) for name, p in trset.items()})
        if plan_options.get("train", True) and (len(shards.corpora) > 1 or mixing):
            return mix_report(shards, PlanOptions(**plan_options), world_size=world_size, num_workers=num_workers,
                              epochs=epochs, seed=seed, out=out, speakers=shard_speakers(shards), **mixing)
    elif mixing:
        raise ValueError(f"{', '.join(mixing)} mix named corpora: give them with --corpus NAME=PATTERN")
    else:
        shards = indexed_shards(trset)
    options = PlanOptions(**plan_options)
    speakers = shard_speakers(shards)
    reports = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        plan = plan_epoch(shards.utts, shards.frames, options, seed=seed, epoch=epoch,
                          speakers=None if speakers is None else speakers.ids)
        a = epoch_assignment(plan.counts, [], world_size, num_workers, equal=options.train)
        seconds = time.perf_counter() - t0
        ranks = []
        for r in range(world_size):
            tally = BatchTally()
            for s, j in rank_order(a, r):
                tally.add(shards.frames[plan.streams[s].batch(j)], options.max_frames)
            ranks.append(tally)
        left = BatchTally()
        for t in a.discarded:
            for j in range(t.start, t.stop):
                left.add(shards.frames[plan.streams[t.stream].batch(j)])
        total = BatchTally()
        for t in ranks:
            total.merge(t)
        dropped = {**plan.dropped, **({"unreadable": int(shards.lost.sum())} if shards.lost.any() else {})}
        report = {"epoch": epoch, "world_size": world_size, "num_workers": num_workers, "streams": len(plan.streams),
                  "steps_per_rank": [t.batches for t in ranks], "utterances": total.utterances,
                  "hours": round(hours(total.real_frames), 4), "padding_efficiency": total.padding_efficiency,
                  "dropped": dropped, "discarded_batches": left.batches, "discarded_utterances": left.utterances,
                  "planning_seconds": round(seconds, 3)}
        if speakers is not None:
            report["shuffle"] = plan_quality(plan, a, speakers.ids, shards.frames, ranks=range(world_size),
                                             source=speakers.source).to_dict()
        reports.append(report)
        out.write(_plan_summary(report, shards.num_utts) + "\n")
    return reports


def mix_report(shards: Any, options: Any, *, world_size: int, num_workers: int, epochs: int, seed: int,
               out: TextIO, windows: int = 8, speakers: Any = None, **mixing: Any) -> list[dict[str, Any]]:
    """The mixed plan of ``epochs`` loader epochs: per step range, each corpus's scheduled share
    of the utterances against the planned one (and its share of hours), how far each corpus is
    through its own epochs at the end, and each corpus's shuffle report (with ``speakers``)."""
    from wdsprep.loading.mixing import MixedPlan, mixture_for

    steps_per_epoch = mixing.pop("steps_per_epoch", None)
    mixture = mixture_for(shards, **mixing)
    planned_speakers = None if speakers is None or options.max_utts_per_speaker is None else speakers.ids
    mix = MixedPlan(shards, options, seed=seed, mixture=mixture, steps_per_epoch=steps_per_epoch,
                    world_size=world_size, num_workers=num_workers, speakers=planned_speakers)
    names = mixture.names
    reports = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        start = mix.epoch_start(epoch)
        run = mix.run(epoch)
        seconds = time.perf_counter() - t0
        # Per step: utterances and frames of each corpus, over all ranks.
        utts = np.zeros((run.steps, len(names)))
        frames = np.zeros((run.steps, len(names)))
        padded = real = 0
        for r in range(world_size):
            for k, ref in enumerate(run.rank_order(r)):
                f = shards.frames[mix.rows_of(ref)]
                utts[k, ref[0]] += len(f)
                frames[k, ref[0]] += f.sum()
                real += int(f.sum())
                padded += len(f) * int(f.max(initial=0))
        rows = []
        for part in np.array_split(np.arange(run.steps), min(windows, max(1, run.steps))):
            if not len(part):
                continue
            g = start.global_step + part
            rows.append({"steps": [int(start.step + part[0]), int(start.step + part[-1])],
                         "global_steps": [int(g[0]), int(g[-1])],
                         "scheduled": mixture.at(g).mean(axis=0).round(4).tolist(),
                         "planned": _shares(utts[part].sum(axis=0)), "hours_share": _shares(frames[part].sum(axis=0))})
        report = {"epoch": epoch, "world_size": world_size, "num_workers": num_workers, "steps_per_rank": run.steps,
                  "corpora": list(names), "mixture": mixture.describe(), "ranges": rows,
                  "utterances": dict(zip(names, utts.sum(axis=0).astype(int).tolist())),
                  "hours": dict(zip(names, [round(hours(x), 4) for x in frames.sum(axis=0)])),
                  "corpus_epochs": dict(zip(names, [round(x, 3) for x in mix.progress(run.end)])),
                  "padding_efficiency": efficiency(real, padded), "planning_seconds": round(seconds, 3)}
        if speakers is not None:
            report["shuffle"] = mix.shuffle_quality(run, speakers, ranks=range(world_size))
        reports.append(report)
        out.write(_mix_summary(report) + "\n")
    return reports


def _shares(x: np.ndarray) -> list[float]:
    total = float(x.sum())
    return [round(float(v) / total, 4) if total else 0.0 for v in x]


def _mix_summary(r: dict[str, Any]) -> str:
    names = r["corpora"]
    width = max(8, *(len(n) for n in names))
    lines = [f"epoch {r['epoch']} mixed for {r['world_size']} rank(s) x {max(1, r['num_workers'])} reader(s): "
             f"{r['steps_per_rank']:,} steps per rank ({r['planning_seconds']:.2f} s, no feature read)",
             f"  mixture             {r['mixture']}",
             f"  padding efficiency  {r['padding_efficiency']:.4f}",
             "  share of utterances per step range, scheduled -> planned (share of hours):",
             "    " + f"{'steps':>17}  " + "  ".join(f"{n:>{width + 12}}" for n in names)]
    for row in r["ranges"]:
        a, b = row["global_steps"]
        cells = [f"{s:.3f}->{p:.3f} ({h:.3f})" for s, p, h in zip(row["scheduled"], row["planned"], row["hours_share"])]
        lines.append("    " + f"{a:>8}-{b:<8}  " + "  ".join(f"{c:>{width + 12}}" for c in cells))
    lines.append("  per corpus          " + ", ".join(
        f"{n}: {r['utterances'][n]:,} utts, {r['hours'][n]:.2f} h, {r['corpus_epochs'][n]:.2f} epochs" for n in names))
    lines.append(_corpus_shuffle_lines(r.get("shuffle")))
    return "\n".join(lines)


def _corpus_shuffle_lines(shuffles: dict[str, dict[str, Any]] | None) -> str:
    """Each corpus's shuffle report, its "steps" that corpus's batches on a rank."""
    if shuffles is None:
        return "  speakers            unknown (shards in no index)"
    return "\n".join(f"  shuffle of {name} (steps: its own batches)\n" + _shuffle_lines(q, indent="    ")
                     for name, q in shuffles.items())


def _plan_summary(r: dict[str, Any], num_utts: int) -> str:
    steps = r["steps_per_rank"]
    shown = steps if len(steps) <= 16 else f"{steps[:8]} ... ({len(steps)} ranks)"
    return "\n".join([
        f"epoch {r['epoch']} planned for {r['world_size']} rank(s) x {max(1, r['num_workers'])} reader(s), "
        f"{r['streams']} streams ({r['planning_seconds']:.2f} s, no feature read)",
        f"  steps per rank      {shown}",
        f"  utterances          {r['utterances']:,} of {num_utts:,} indexed, {r['hours']:.2f} hours",
        f"  padding efficiency  {r['padding_efficiency']:.4f}",
        f"  left out by plan    {json.dumps(r['dropped']) if r['dropped'] else 'none'}",
        f"  discarded tail      {r['discarded_batches']} batch(es), {r['discarded_utterances']:,} utterances "
        f"(at most one batch per rank)",
        _shuffle_lines(r.get("shuffle")),
    ])


def _shuffle_lines(shuffle: dict[str, Any] | None, indent: str = "  ") -> str:
    from wdsprep.loading.quality import ShuffleQuality

    if shuffle is None:
        return f"{indent}speakers            unknown (shards in no index)"
    return ShuffleQuality.from_dict(shuffle).format(indent)

