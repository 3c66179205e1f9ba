"""``wdsprep dry-run --plan``: the epochs' plan at N ranks, from the index alone.

No feature is read, no tokenizer is needed and torch is never imported: the plan comes from the
same epoch source the loader iterates (``plan/source.py``).  Per epoch: steps per rank,
utterances and hours, padding efficiency, what the plan leaves out, the discarded tail and how
random the batches are (speakers per batch against a random draw, speaker recurrence, lag-1
length correlation: ``plan/quality.py``); for named corpora mixed, each corpus's scheduled
against planned share of the utterances per step range, and how far each is through its epochs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any, TextIO

import numpy as np

from wdsprep.files import naming, open_output, write_text
from wdsprep.plan.compose import build_source
from wdsprep.plan.cost import CostModel, batch_cost, load_cost
from wdsprep.plan.growing import describe
from wdsprep.plan.options import LoaderOptions
from wdsprep.plan.quality import ShuffleQuality
from wdsprep.plan.shardset import row_keys, row_text_lens
from wdsprep.plan.source import EpochSource, Trset
from wdsprep.plan.stats import BatchTally, LoaderStats, StepCosts
from wdsprep.plan.streams import PlanOptions, describe_rates, token_rates
from wdsprep.tokenizer import TokenizerSpec, as_tokenizer
from wdsprep.units import hours


def plan_report(trset: Trset, tokenizer: TokenizerSpec | None = None, *, epochs: int = 1,
                out: TextIO | None = None, windows: int = 8, dump_keys: str | os.PathLike | None = None,
                stats_json: str | os.PathLike | None = None, plot: str | os.PathLike | None = None,
                count_tokens: bool = False, **loader_options: Any) -> list[dict[str, Any]]:
    """The plan of ``epochs`` epochs, from the index alone; printed, and returned per epoch as numbers.

    ``loader_options`` are :func:`~wdsprep.make_loader`'s, and the plan is the one a loader with
    them makes (the same composition, ``plan/compose.py``), at ``world_size`` ranks of
    ``num_workers`` readers; those that do not change the plan play no part.  Steps are judged by
    ``cost`` (padded frames without); ``cost`` without ``max_cost`` judges a plan cut by frames
    (what ``max_cost`` keeps its peak?).  ``tokenizer`` is needed by a cost model that counts label
    tokens; with ``count_tokens`` the labels are counted for the report even where the plan does not
    need them (label padding, the distribution of tokens per second that label filters are chosen
    from; counted once per index folder and tokenizer).  A mixture's shares are shown in ``windows``
    step ranges.  ``dump_keys``: every rank's
    planned batches written there, one ``epoch<TAB>step<TAB>rank<TAB>uttid`` line per utterance,
    from the index's keys.  ``stats_json``: the returned reports written there as JSON.  ``plot``
    (named corpora mixed): each corpus's planned share of the utterances, step by step over all
    ranks, against the schedule.  Folders a pack is still writing (``growing``) are planned over the
    shards published now, and the report says how much of the final corpus that is."""
    out = out or sys.stdout
    judge = None
    if loader_options.get("cost") is not None and loader_options.get("max_cost") is None:
        judge = load_cost(loader_options.pop("cost"))  # it judges a plan cut by frames
    options = LoaderOptions.of(**loader_options)
    judge = judge or options.plan.cost
    if tokenizer is not None:
        tokenizer = as_tokenizer(tokenizer)
    source = build_source(trset, options, tokenizer=tokenizer, derive_speakers=True,
                          count_tokens=count_tokens or (judge is not None and judge.uses_tokens))
    if plot and source.mixture is None:
        raise ValueError("--plot draws the mixture of named corpora in training: give --corpus (or an ld object)")
    shards = source.shards
    planned = LoaderStats()
    source.annotate(planned)
    keys = row_keys(shards, policy=options.fetch.policy()) if dump_keys is not None else None
    # Subword sampling lengthens labels past what the plan counted: the readers' CTC rule may then
    # empty a batch.  A sampled segmentation has at most a piece per character, and one more for a
    # word-start mark (sentencepiece without byte fallback).
    sampled = options.plan.train and options.read.subword_sampling is not None and options.plan.ctc_subsampling
    longest_labels = row_text_lens(shards, policy=options.fetch.policy()) + 1 if sampled else None
    reports = []
    per_step: list[np.ndarray] = []  # each corpus's utterances at each step, over all ranks
    with ExitStack() as stack:  # the dump is written as every output is: whole, never through a link
        dump = stack.enter_context(open_output(dump_keys, encoding="utf-8")) if dump_keys is not None else None
        for epoch in range(epochs):
            reports.append(epoch_report(source, options.plan, epoch, windows=windows, keys=keys, dump=dump,
                                        judge=judge, per_step=per_step, longest_labels=longest_labels))
            if planned.growing is not None:
                reports[-1]["growing"] = planned.growing
            out.write(plan_summary(reports[-1], shards.num_utts) + "\n")
    if stats_json is not None:
        write_text(stats_json, json.dumps(reports, indent=1))
    if plot is not None and source.mixture is not None:
        from wdsprep.check.plot import plot_mixture

        steps = np.concatenate(per_step) if per_step else np.zeros((0, len(source.corpora)))
        first = source.global_step(source.start(0)) or 0
        plot_mixture(steps, source.mixture.at(first + np.arange(len(steps))), source.corpora, plot, first_step=first,
                     what="planned")
        out.write(f"mixture plot: {plot}\n")
    return reports


def epoch_report(source: EpochSource, options: PlanOptions, epoch: int, *, windows: int = 8,
                 keys: list[str] | None = None, dump: TextIO | None = None, judge: CostModel | None = None,
                 per_step: list[np.ndarray] | None = None, longest_labels: np.ndarray | None = None) -> dict[str, Any]:
    """One epoch of :func:`plan_report` from its epoch source (``keys``: every row's id, for
    ``dump``); step costs under ``judge`` (default: the plan's cost model, else padded frames);
    each corpus's utterances per step appended to ``per_step``.  ``longest_labels``: every row's
    longest label under subword sampling; the batches whose every utterance the readers' CTC rule
    could then drop are counted (``may_end_empty``)."""
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
    may_end_empty = 0
    several = 0  # batches holding more than one corpus
    for r in range(world_size):
        k = 0
        for window in run.windows(r):
            dropped += window.dropped
            for bid in window.refs:
                rows = source.rows(bid)
                f = source.planned_frames(bid)
                total.add(f, options.max_frames, None if shards.tokens is None else shards.tokens[rows])
                corpora = source.origins(bid)[0]
                if corpora is None:  # one corpus: as the shards say
                    corpora = shards.corpus[shards.shard_of(rows)]
                several += len(np.unique(corpora)) > 1
                np.add.at(utts[k], corpora, 1)
                np.add.at(frames[k], corpora, f)
                costs[r, k] = batch_cost(judge, f, None if shards.tokens is None else shards.tokens[rows])
                if longest_labels is not None and options.ctc_subsampling and len(rows):
                    may_end_empty += bool((f // options.ctc_subsampling <= longest_labels[rows]).all())
                if dump is not None and keys is not None:
                    with naming(dump.name):  # a full disk: say which file
                        dump.write("".join(f"{epoch}\t{k}\t{r}\t{keys[i]}\n" for i in rows.tolist()))
                k += 1
        planned.append(run.planned_stats(r))
    if per_step is not None:
        per_step.append(utts)
    left = BatchTally()
    for bid in run.discarded():
        left.add(source.planned_frames(bid))
    report: dict[str, Any] = {
        "epoch": epoch, "world_size": world_size, "num_workers": source.num_workers, "steps_per_rank": steps,
        "utterances": total.utterances, "hours": round(hours(total.real_frames), 4),
        "padding_efficiency": total.padding_efficiency,
        "label_padding_efficiency": total.label_padding_efficiency if shards.tokens is not None else None,
        "tokens_per_second": None if shards.tokens is None else token_rates(shards.frames, shards.tokens),
        "dropped": dict(dropped), "may_end_empty": None if longest_labels is None else may_end_empty,
        "discarded_batches": left.batches,
        "discarded_utterances": left.utterances, "streams": source.num_streams,
        "planning_seconds": round(seconds, 3),
        "cost": StepCosts(costs, "padded frames (B x longest)" if judge is None else judge.describe()).to_dict()}
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
        report.update({"corpora": list(names), "mixture": mixture.describe(), "mix_unit": source.mix_unit,
                       "mixed_batches": round(several / max(1, sum(steps)), 4), "ranges": rows_,
                       "per_corpus": per_corpus})
        if shards.speakers is not None:
            report["shuffle"] = {n: merged_shuffle([st.corpora[n].shuffle for st in planned]) for n in names}
    return report


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
        f"  padding efficiency  {r['padding_efficiency']:.4f}"
        + ("" if r.get("label_padding_efficiency") is None else f" (labels {r['label_padding_efficiency']:.4f})"),
        *([f"  tokens per second   {describe_rates(r['tokens_per_second'])}"] if r.get("tokens_per_second") else []),
        f"  left out by plan    {json.dumps(r['dropped']) if r['dropped'] else 'none'}",
        *([f"  may end empty       {r['may_end_empty']} batch(es): subword sampling can lengthen every label of "
           f"each past the CTC rule (at most a piece per character, and one more), and the readers then drop "
           f"them; the step still comes, with an empty batch"] if r.get("may_end_empty") is not None else []),
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
    mixed = (f"mixed by utterance: {r['mixed_batches']:.1%} of the batches hold several corpora"
             if r["mix_unit"] == "utterance" else "mixed by batch: each batch holds one corpus")
    lines += [f"  mixture             {r['mixture']}, {mixed}",
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
    """Each corpus's shuffle report, its "steps" the batches on a rank that hold the corpus."""
    if shuffles is None:
        return "  speakers            unknown (shards in no index)"
    return "\n".join(f"  shuffle of {name} (steps: the batches holding it, its utterances in each)\n"
                     + shuffle_lines(q, indent="    ") for name, q in shuffles.items())


def shuffle_lines(shuffle: dict[str, Any] | None, indent: str = "  ") -> str:
    if shuffle is None:
        return f"{indent}speakers            unknown (shards in no index)"
    return ShuffleQuality.from_dict(shuffle).format(indent)
