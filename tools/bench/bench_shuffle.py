#!/usr/bin/env python3
"""Shuffle quality of a pack from a sorted Kaldi data dir: pack in input order vs pack-time shuffle.

    python tools/bench/bench_shuffle.py [--utts 24000] [--speakers 60] [--utts-per-shard 500]
                                        [--max-frames 20000] [--epochs 2] [--work /tmp/wdsprep-bench-shuffle]

Writes a Kaldi data dir sorted by utterance id, hence by speaker (``spkNNN-uttNNNNNN``, every
speaker ``utts / speakers`` utterances, lengths lognormal around 600 frames with a per-speaker
offset, as speakers differ in speaking rate and turn length) with tiny 4-dim features (the plan
reads only the index), packs it with ``--no-shuffle`` and with the default shuffle, and prints
for each, from the epoch plan of the default loader options (``dry-run --plan``): distinct
speakers per batch against a fully random draw of the same sizes, the speaker recurrence within
1 and 4 steps (random in brackets), the lag-1 correlation of batch mean lengths and the padding
efficiency (the epochs' mean); then the same for ``max_utts_per_speaker`` 1, 2 and 4 on the
shuffled pack.  ``--filter-group`` packs into length groups, ``--world-size`` plans for N ranks
(each rank's batches a sequence; the figures pool them).
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

import kaldiio
import numpy as np

from wdsprep import pack_data
from wdsprep.check.planreport import plan_report


def make_sorted_dir(d: Path, utts: int, speakers: int, seed: int = 0) -> tuple[Path, Path, Path]:
    """feats.scp, text and utt2spk of a data dir sorted by speaker, as Kaldi keeps it."""
    scp, text, utt2spk = d / "feats.scp", d / "text", d / "utt2spk"
    stamp = d / f".made-{utts}-{speakers}-{seed}"
    if stamp.exists():
        return scp, text, utt2spk
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    offset = rng.normal(0.0, 0.2, speakers)  # per-speaker log-length offset
    with kaldiio.WriteHelper(f"ark,scp:{d / 'feats.ark'},{scp}") as w, open(text, "w") as t, open(utt2spk, "w") as u:
        for i in range(utts):
            s = i * speakers // utts
            uttid = f"spk{s:03d}-utt{i:06d}"
            n = int(np.clip(rng.lognormal(np.log(600) + offset[s], 0.5), 50, 3000))
            w(uttid, np.zeros((n, 4), np.float32))
            t.write(f"{uttid} words\n")
            u.write(f"{uttid} spk{s:03d}\n")
    stamp.touch()
    return scp, text, utt2spk


def row(name: str, r: dict) -> str:
    q = r["shuffle"]
    return (f"| {name} | {q['speakers_per_batch']:.1f} | {q['speakers_per_batch_random']:.1f} | "
            f"{q['speakers_ratio']:.2f} | {q['recurrence']['1']:.2f} ({q['recurrence_random']['1']:.2f}) | "
            f"{q['recurrence']['4']:.2f} ({q['recurrence_random']['4']:.2f}) | {q['lag1_length_corr']:+.2f} | "
            f"{r['padding_efficiency']:.4f} | {sum(r['steps_per_rank']):,} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=24000)
    ap.add_argument("--speakers", type=int, default=60)
    ap.add_argument("--utts-per-shard", type=int, default=500)
    ap.add_argument("--max-frames", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--filter-group", nargs="*", metavar="LO:HI", help="length groups to pack into (default: none)")
    ap.add_argument("--world-size", type=int, default=1, help="ranks the plan is made for (default: %(default)s)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-shuffle"))
    args = ap.parse_args()

    scp, text, utt2spk = make_sorted_dir(args.work / "data", args.utts, args.speakers)
    packs = {}
    for name, shuffle in (("input order (--no-shuffle)", False), ("pack shuffle (default)", True)):
        out = args.work / ("shuffled" if shuffle else "sorted")
        pack_data(scp, text, out, filter_group=args.filter_group, utts_per_shard=args.utts_per_shard,
                  shuffle=shuffle, utt2spk=utt2spk, overwrite=True, progress=False)
        packs[name] = out
    print(f"\n{args.utts:,} utterances of {args.speakers} speakers, sorted by id; shards of {args.utts_per_shard}; "
          f"loader defaults (shuffle_buffer 2000, pool_size 4000), max_frames {args.max_frames:,}; "
          f"epochs 0..{args.epochs - 1} pooled, {args.world_size} rank(s), groups {args.filter_group or 'none'}")
    print("| pack | speakers/batch | random | ratio | recurs in 1 step (random) | in 4 steps (random) | "
          "lag-1 len corr | padding eff | batches |\n|---|---|---|---|---|---|---|---|---|")
    settings = [(name, out, None) for name, out in packs.items()]
    settings += [(f"pack shuffle, max_utts_per_speaker {c}", packs["pack shuffle (default)"], c) for c in (1, 2, 4)]
    for name, out, cap in settings:
        pattern = f"{out}/*/data-*.tar" if args.filter_group else f"{out}/data-*.tar"
        reports = plan_report(pattern, epochs=args.epochs, max_frames=args.max_frames, world_size=args.world_size,
                              max_utts_per_speaker=cap, out=io.StringIO())
        print(row(name, pooled(reports)))


def pooled(reports: list[dict]) -> dict:
    """The epochs' reports as one: shuffle sums merged, padding over all batches."""
    from wdsprep.plan.quality import ShuffleQuality

    q = ShuffleQuality.from_dict(reports[0]["shuffle"])
    for r in reports[1:]:
        q.merge(ShuffleQuality.from_dict(r["shuffle"]))
    steps = [sum(x) for x in zip(*(r["steps_per_rank"] for r in reports))]
    eff = float(np.mean([r["padding_efficiency"] for r in reports]))  # the epochs' mean
    return {"shuffle": q.figures(), "padding_efficiency": eff, "steps_per_rank": steps}


if __name__ == "__main__":
    main()
