"""``wdsprep dry-run --plan``: the epochs' plan at N ranks, from the index alone.

No feature is read, no tokenizer is needed and torch is never imported: the plan comes from the
same epoch source the loader iterates (``loading/source.py``).  Per epoch: steps per rank,
utterances and hours, padding efficiency, what the plan leaves out, the discarded tail and how
random the batches are (speakers per batch against a random draw, speaker recurrence, lag-1
length correlation: ``loading/quality.py``); for named corpora mixed, each corpus's scheduled
against planned share of the utterances per step range, and how far each is through its epochs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any, Mapping, TextIO

import numpy as np

from wdsprep.files import naming
from wdsprep.loading.augment import Augment, parse_augment
from wdsprep.loading.cost import CostModel, load_cost
from wdsprep.loading.growing import coverage, describe, observe
from wdsprep.loading.plan import PlanOptions
from wdsprep.loading.quality import ShuffleQuality
from wdsprep.loading.shardset import ShardSet, row_keys
from wdsprep.loading.source import EpochSource, Trset, epoch_source, load_shards
from wdsprep.loading.stats import BatchTally, LoaderStats, StepCosts
from wdsprep.remote.fetch import MIN_RATE, RetryPolicy
from wdsprep.tokenizer import Tokenizer, load_tokenizer
from wdsprep.units import hours

# make_loader's options that mix named corpora
MIXING = ("weights", "temperature", "schedule", "steps_per_epoch")


def plan_report(trset: Trset, *, world_size: int = 1, num_workers: int = 0, epochs: int = 1, seed: int = 0,
                out: TextIO | None = None, windows: int = 8, tokenizer: Tokenizer | str | os.PathLike | None = None,
                dump_keys: str | os.PathLike | None = None, growing: bool = False, retries: int = 5,
                retry_backoff: float = 1.0, min_rate: float = MIN_RATE,
                augment: Augment | Mapping[str, Any] | str | os.PathLike | None = None,
                **plan_options: Any) -> list[dict[str, Any]]:
    """The plan of ``epochs`` epochs at ``world_size`` ranks, from the index alone; printed, and
    returned per epoch as numbers.  ``plan_options`` are :class:`~wdsprep.loading.plan.PlanOptions`'
    (``max_frames``, ``cost`` and ``max_cost`` and any of the batching options ``make_loader``
    takes), and for named corpora (``trset`` a mapping) the mixing options too; a mixture's shares
    are shown in ``windows`` step ranges.  Steps are judged by ``cost`` (padded frames without);
    ``cost`` without ``max_cost`` judges a plan cut by frames (what ``max_cost`` keeps its peak?).
    ``tokenizer`` is needed by a cost model that counts label tokens.  ``dump_keys``: every rank's
    planned batches written there, one ``epoch<TAB>step<TAB>rank<TAB>uttid`` line per utterance,
    from the index's keys.  ``growing``: folders a pack is still writing are planned over the
    shards published now, and the report says how much of the final corpus that is.  ``retries``,
    ``retry_backoff``, ``min_rate``: fetching remote indexes, as the loader does.  ``augment``:
    make_loader's; its speed perturbation changes the plan (the lengths are the perturbed ones), the
    rest does not."""
    out = out or sys.stdout
    mixing = {k: plan_options.pop(k) for k in MIXING if plan_options.get(k) is not None}
    if plan_options.get("cost") is not None:
        plan_options["cost"] = load_cost(plan_options["cost"])
    judge = plan_options.get("cost")
    if plan_options.get("max_cost") is None:  # a cost model alone judges a plan cut by frames: what max_cost to give?
        plan_options["cost"] = None
    aug = parse_augment(augment)
    options = PlanOptions(**plan_options, speed=None if aug is None else aug.speed)
    tokens = judge is not None and judge.uses_tokens
    if tokens and tokenizer is None:
        raise ValueError("the cost model counts label tokens: give the tokenizer (--tokenizer) to count them")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    policy = RetryPolicy(retries=retries, backoff=retry_backoff, min_rate=min_rate)
    view = observe(trset) if growing else None
    shards = load_shards(trset, policy=policy, derive_speakers=True, tokenizer=tokenizer if tokens else None,
                         view=view)
    covered = None if view is None else coverage(shards, view)
    source = epoch_source(shards, options, seed=seed, world_size=world_size, num_workers=num_workers,
                          named=isinstance(trset, Mapping), **mixing)
    keys = row_keys(shards, policy=policy) if dump_keys is not None else None
    dump = open(dump_keys, "w", encoding="utf-8") if dump_keys is not None else None
    reports = []
    try:
        for epoch in range(epochs):
            reports.append(epoch_report(source, options, epoch, windows=windows, keys=keys, dump=dump, judge=judge))
            if covered is not None:
                reports[-1]["growing"] = covered
            out.write(plan_summary(reports[-1], shards.num_utts) + "\n")
    finally:
        if dump is not None:
            dump.close()
    return reports


def epoch_report(source: EpochSource, options: PlanOptions, epoch: int, *, windows: int = 8,
                 keys: list[str] | None = None, dump: TextIO | None = None,
                 judge: CostModel | None = None) -> dict[str, Any]:
    """One epoch of :func:`plan_report` from its epoch source (``keys``: every row's id, for
    ``dump``); step costs under ``judge`` (default: the plan's cost model, else padded frames)."""
    judge = judge or options.cost
    shards, names, world_size = source.shards, source.corpora, source.world_size
    t0 = time.perf_counter()
    at = source.start(epoch)
    run = source.run(at)
    seconds = time.perf_counter() - t0
    steps = [run.steps(r) for r in range(world_size)]
    # Per step (over all ranks): each corpus's utterances and frames; every rank's batches' tally and cost.
    utts = np.zeros((max(steps, default=0), len(names)))
    frames = np.zeros_like(utts)
    costs = np.full((world_size, max(steps, default=0)), np.nan)
    total = BatchTally()
    planned: list[LoaderStats] = []
    dropped: Counter[str] = Counter()
    for r in range(world_size):
        k = 0
        for window in run.windows(r):
            dropped += window.dropped
            for bid in window.refs:
                rows = source.rows(bid)
                f = source.planned_frames(bid)
                total.add(f, options.max_frames)
                utts[k, bid[0]] += len(f)  # a mixture's batch holds one corpus, bid[0]
                frames[k, bid[0]] += f.sum()
                costs[r, k] = _cost(judge, shards, rows, f)
                if dump is not None and keys is not None:
                    with naming(dump.name):  # a full disk: say which file
                        dump.write("".join(f"{epoch}\t{k}\t{r}\t{keys[i]}\n" for i in rows.tolist()))
                k += 1
        planned.append(run.planned_stats(r))
    left = BatchTally()
    for bid in run.discarded():
        left.add(source.planned_frames(bid))
    report: dict[str, Any] = {
        "epoch": epoch, "world_size": world_size, "num_workers": source.num_workers, "steps_per_rank": steps,
        "utterances": total.utterances, "hours": round(hours(total.real_frames), 4),
        "padding_efficiency": total.padding_efficiency, "dropped": dict(dropped), "discarded_batches": left.batches,
        "discarded_utterances": left.utterances, "streams": source.num_streams,
        "planning_seconds": round(seconds, 3),
        "cost": StepCosts(costs, "padded frames (B x longest)" if judge is None else _describe(judge)).to_dict()}
    if source.mixture is None:
        if shards.speakers is not None:
            report["shuffle"] = merged_shuffle([st.shuffle for st in planned])
    else:
        mixture = source.mixture
        g0 = source.global_step(at) or 0
        rows_ = []
        for part in np.array_split(np.arange(len(utts)), min(windows, max(1, len(utts)))):
            if not len(part):
                continue
            g = g0 + part
            rows_.append({"steps": [int(at.step + part[0]), int(at.step + part[-1])],
                          "global_steps": [int(g[0]), int(g[-1])],
                          "scheduled": mixture.at(g).mean(axis=0).round(4).tolist(),
                          "planned": _shares(utts[part].sum(axis=0)),
                          "hours_share": _shares(frames[part].sum(axis=0))})
        progress = source.progress(run.after(0, run.steps(0))) or []
        per_corpus = {n: {"utterances": int(u), "hours": round(hours(h), 4), "epochs": round(e, 3)}
                      for n, u, h, e in zip(names, utts.sum(axis=0), frames.sum(axis=0), progress)}
        report.update({"corpora": list(names), "mixture": mixture.describe(), "ranges": rows_,
                       "per_corpus": per_corpus})
        if shards.speakers is not None:
            report["shuffle"] = {n: merged_shuffle([st.corpora[n].shuffle for st in planned]) for n in names}
    return report


def _cost(model: CostModel | None, shards: ShardSet, rows: np.ndarray, frames: np.ndarray) -> float:
    """What a batch costs: under the cost model when there is one, else its padded frames."""
    if not len(frames):
        return 0.0
    longest = int(frames.max())
    if model is None:
        return float(len(frames) * longest)
    tokens = int(shards.tokens[rows].max()) if shards.tokens is not None else 0
    return float(model.batch(len(frames), longest, tokens))


def _describe(cost: CostModel) -> str:
    terms = [f"{v:g}{unit}" for v, unit in ((cost.per_utt, ""), (cost.per_frame, " t"), (cost.per_frame2, " t^2"),
                                              (cost.per_token, " u"), (cost.per_token2, " u^2")) if v]
    return f"B x ({' + '.join(terms)}), t = frames/{cost.subsampling}"


def merged_shuffle(shuffles: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Ranks' shuffle reports as one (their sums add up)."""
    q = ShuffleQuality.from_dict(shuffles[0])  # type: ignore[arg-type]
    for other in shuffles[1:]:
        q.merge(ShuffleQuality.from_dict(other))  # type: ignore[arg-type]
    return q.to_dict()


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1%}"


def _shares(x: np.ndarray) -> list[float]:
    total = float(x.sum())
    return [round(float(v) / total, 4) if total else 0.0 for v in x]


def plan_summary(r: dict[str, Any], num_utts: int) -> str:
    """The printed form of one epoch's :func:`plan_report`."""
    steps = r["steps_per_rank"]
    shown = steps if len(steps) <= 16 else f"{steps[:8]} ... ({len(steps)} ranks)"
    lines = [
        f"epoch {r['epoch']} planned for {r['world_size']} rank(s) x {max(1, r['num_workers'])} reader(s), "
        f"{r['streams']} streams ({r['planning_seconds']:.2f} s, no feature read)",
        f"  steps per rank      {shown}",
        f"  utterances          {r['utterances']:,} of {num_utts:,} indexed, {r['hours']:.2f} hours",
        *([f"  shards              {describe(r['growing'])}"] if "growing" in r else []),
        f"  padding efficiency  {r['padding_efficiency']:.4f}",
        f"  left out by plan    {json.dumps(r['dropped']) if r['dropped'] else 'none'}",
        f"  discarded tail      {r['discarded_batches']} batch(es), {r['discarded_utterances']:,} utterances "
        f"(at most one batch per rank)",
        f"  step cost           every step waits {_pct(r['cost']['step_wait'])} for its slowest rank; the costliest "
        f"batch is {r['cost']['largest_over_median']:.2f}x the median (cost: {r['cost']['model']})",
    ]
    if "mixture" not in r:
        lines.append(shuffle_lines(r.get("shuffle")))
        return "\n".join(lines)
    names = r["corpora"]
    width = max(8, *(len(n) for n in names))
    lines += [f"  mixture             {r['mixture']}",
              "  share of utterances per step range, scheduled -> planned (share of hours):",
              "    " + f"{'steps':>17}  " + "  ".join(f"{n:>{width + 12}}" for n in names)]
    for row in r["ranges"]:
        a, b = row["global_steps"]
        cells = [f"{s:.3f}->{p:.3f} ({h:.3f})" for s, p, h in zip(row["scheduled"], row["planned"], row["hours_share"])]
        lines.append("    " + f"{a:>8}-{b:<8}  " + "  ".join(f"{c:>{width + 12}}" for c in cells))
    lines.append("  per corpus          " + ", ".join(
        f"{n}: {c['utterances']:,} utts, {c['hours']:.2f} h, {c['epochs']:.2f} epochs"
        for n, c in r["per_corpus"].items()))
    lines.append(corpus_shuffle_lines(r.get("shuffle")))
    return "\n".join(lines)


def corpus_shuffle_lines(shuffles: dict[str, dict[str, Any]] | None) -> str:
    """Each corpus's shuffle report, its "steps" that corpus's batches on a rank."""
    if shuffles is None:
        return "  speakers            unknown (shards in no index)"
    return "\n".join(f"  shuffle of {name} (steps: its own batches)\n" + shuffle_lines(q, indent="    ")
                     for name, q in shuffles.items())


def shuffle_lines(shuffle: dict[str, Any] | None, indent: str = "  ") -> str:
    if shuffle is None:
        return f"{indent}speakers            unknown (shards in no index)"
    return ShuffleQuality.from_dict(shuffle).format(indent)
