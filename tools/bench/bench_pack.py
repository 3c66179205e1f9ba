#!/usr/bin/env python3
"""Pack throughput against plainly reading the same arks, measured in the same run.

    python tools/bench/bench_pack.py [--utts 20000] [--work /tmp/wdsprep-bench-pack] [--repeat 3]

Generates ``--utts`` utterances of 80-dim float32 fbank-like features (lognormal lengths, median
~500 frames) into kaldiio arks once, then times, interleaved over ``--repeat`` rounds:

- ``read arks``: ``kaldiio.load_scp_sequential`` over the same scp (the floor for reading);
- ``copy arks``: ``shutil.copyfile`` of the arks into the output dir (the floor for writing the
  same bytes: pack has to read and write every feature byte);
- ``pack --nj 1`` and ``pack --nj 2``.

Prints utterances/s, MB/s of feature data and each row's time against both floors (medians).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import kaldiio
import numpy as np

from wdsprep import pack_data


def make_data(work: Path, utts: int, seed: int = 0) -> tuple[Path, Path]:
    """Arks + scp + text under ``work`` (reused when already there)."""
    scp, text, stamp = work / "feats.scp", work / "text", work / f".made-{utts}-{seed}"
    if not stamp.exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(np.log(500), 0.5, utts), 20, 3000).astype(int)
        with kaldiio.WriteHelper(f"ark,scp:{work / 'feats.ark'},{scp}") as w, open(text, "w") as t:
            for i, n in enumerate(lengths):
                uttid = f"spk{i % 50:03d}-utt{i:06d}"
                w(uttid, rng.standard_normal((n, 80), dtype=np.float32))
                t.write(f"{uttid} {' '.join(rng.choice(['a', 'speech', 'shard', 'test'], 8))}\n")
        stamp.touch()
    return scp, text


def feature_bytes(scp: Path) -> int:
    return sum(m.nbytes for _, m in kaldiio.load_scp_sequential(str(scp)))


def time_read(scp: Path) -> float:
    t = time.perf_counter()
    for _, m in kaldiio.load_scp_sequential(str(scp)):
        m.sum()  # touch the data, as pack does when it checks for NaN/Inf
    return time.perf_counter() - t


def time_copy(work: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t = time.perf_counter()
    for ark in work.glob("*.ark"):
        shutil.copyfile(ark, out / ark.name)
    return time.perf_counter() - t


def time_pack(scp: Path, text: Path, out: Path, nj: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    pack_data(scp, text, out, filter_group=["10:500", "500:1000", "1000:"], nj=nj, progress=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=20000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-pack"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    scp, text = make_data(args.work, args.utts)
    mb = feature_bytes(scp) / 1e6
    read, copy = "read arks (kaldiio sequential)", "copy arks (shutil.copyfile)"
    times: dict[str, list[float]] = {read: [], copy: [], "pack --nj 1": [], "pack --nj 2": []}
    for _ in range(args.repeat):  # interleaved, so drift in machine speed hits every row alike
        times[read].append(time_read(scp))
        times[copy].append(time_copy(args.work, args.work / "out"))
        times["pack --nj 1"].append(time_pack(scp, text, args.work / "out", 1))
        times["pack --nj 2"].append(time_pack(scp, text, args.work / "out", 2))
    t_read, t_copy = statistics.median(times[read]), statistics.median(times[copy])
    print(f"\n{args.utts} utterances, {mb:.0f} MB of float32 features, median of {args.repeat} rounds")
    print("| path | utts/s | MB/s | time / read | time / copy |\n|---|---|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {args.utts / t:,.0f} | {mb / t:,.0f} | {t / t_read:.2f} | {t / t_copy:.2f} |")


if __name__ == "__main__":
    main()
