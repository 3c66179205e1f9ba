#!/usr/bin/env python3
"""Growing packs: pack-audio's memory, disk and time to the first trainable shard; the choices behind them.

    python tools/bench/bench_growing.py [--work /tmp/wdsprep-bench-growing] [--copies 2] [--json FILE]

Three measurements, each in the same run:

1. ``pack-audio`` on the bundled corpus (``egs/demo/data/train``, 173 utterances) repeated
   ``--copies`` times (N utterances) and 4x that (4N), in a fresh process each: wall time, the
   time the first shard was published (a loader with ``growing=True`` can start then), peak RSS of
   the pack's process (``ru_maxrss``), and the peak bytes under its output directory (polled every
   20 ms).  Beside it, the features' bytes: what the temporary ark of the pack-audio before it
   held on disk before writing its first shard.
2. How a folder's index follows its shards as they are published: one index entry per shard
   (what pack does: written, synced and renamed into place) against rewriting the folder's whole
   index after every shard (what the alternative costs: O(shards^2) bytes), for S shards of 2,000
   utterances; and reading S entries (a loader's first epoch) and one more (each epoch after).
3. A long recording with many segments, read in shuffled order (a shuffled pack meets them in many
   shards): each segment read alone from the file (what pack-audio does for PCM and FLAC at the
   target rate) against decoding the whole recording per segment (what a cache that cannot hold
   the corpus's recordings amounts to) and against a cache that holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "egs" / "demo"

PACK = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import wdsprep
kw = json.loads(sys.argv[1])
wdsprep.pack_audio(**kw)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "children_max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def corpus(work: Path, copies: int) -> tuple[Path, Path]:
    """wav.scp and text of the demo train set repeated ``copies`` times (new ids, the same audio)."""
    d = work / f"data-x{copies}"
    d.mkdir(parents=True, exist_ok=True)
    wav = [line.split(maxsplit=1) for line in (DEMO / "data/train/wav.scp").read_text().splitlines()]
    text = dict(line.split(maxsplit=1) for line in (DEMO / "data/train/text").read_text().splitlines())
    with open(d / "wav.scp", "w") as w, open(d / "text", "w") as t:
        for c in range(copies):
            for uttid, path in wav:
                w.write(f"c{c:03d}-{uttid} {DEMO / path}\n")
                t.write(f"c{c:03d}-{uttid} {text[uttid]}\n")
    return d / "wav.scp", d / "text"


def tree_bytes(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def pack_run(work: Path, copies: int, nj: int) -> dict:
    from wdsprep.format.commit import published_count

    wav, text = corpus(work, copies)
    out = work / f"out-x{copies}-nj{nj}"
    shutil.rmtree(out, ignore_errors=True)
    kw = {"wav_scp": str(wav), "f_labels": str(text), "d_out": str(out), "filter_group": [":80", "80:200", "200:"],
          "utts_per_shard": 16, "nj": nj, "progress": False}
    peak, first = [0], [None]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PACK, json.dumps(kw)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def watch() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_bytes(out) if out.exists() else 0)
            if first[0] is None and out.exists() and any(
                    published_count(p) for p in [out, *(q for q in out.iterdir() if q.is_dir())]):
                first[0] = time.perf_counter() - t0
            time.sleep(0.02)

    w = threading.Thread(target=watch)
    w.start()
    stdout, _ = proc.communicate()
    w.join()
    if proc.returncode:
        raise SystemExit(f"pack-audio failed ({proc.returncode})")
    total = time.perf_counter() - t0
    r = json.loads(stdout.strip().splitlines()[-1])
    feats = sum(int(np.sum(np.load(p, mmap_mode="r"))) for p in out.glob("*/index.frames.npy")) * 80 * 4
    return {"utterances": copies * 173, "nj": nj, "seconds": round(total, 2),
            "first_shard_seconds": None if first[0] is None else round(first[0], 2),
            "peak_rss_mb": round(max(r["max_rss_mb"], r["children_max_rss_mb"]), 1),
            "peak_out_mb": round(peak[0] / 1e6, 2), "final_out_mb": round(tree_bytes(out) / 1e6, 2),
            "features_mb": round(feats / 1e6, 2)}


def index_strategies(work: Path, shards: int, utts: int = 2000) -> dict:
    """Per-shard entries against a folder index rewritten after each shard."""
    from wdsprep.format.index import FolderIndex, ShardInfo, read_index, write_entry, write_index

    rng = np.random.default_rng(0)
    infos = [ShardInfo(f"data-{s:05d}.tar", [f"spk{s % 97:03d}-utt{s:05d}-{i:05d}" for i in range(utts)],
                       rng.integers(100, 2000, utts).tolist(), rng.integers(5, 200, utts).tolist())
             for s in range(shards)]
    parts = work / "parts"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    t0 = time.perf_counter()
    for k, info in enumerate(infos):
        write_entry(parts, k, FolderIndex.from_shards("cat", 80, "float32", [info], sizes=[10**9], mtimes=[1]),
                   {"plan_shard": k, "report": {"dropped": {}, "flagged": {}}})
    per_part = (time.perf_counter() - t0) / shards
    part_bytes = tree_bytes(parts)
    t0 = time.perf_counter()
    read_index(parts)
    read_all = time.perf_counter() - t0
    t0 = time.perf_counter()
    read_index(parts)  # nothing new: the entries read before are kept
    read_again = time.perf_counter() - t0
    rewrite = work / "rewrite"
    shutil.rmtree(rewrite, ignore_errors=True)
    rewrite.mkdir()
    written = 0
    t0 = time.perf_counter()
    for k in range(1, shards + 1):
        write_index(rewrite, FolderIndex.from_shards("cat", 80, "float32", infos[:k], sizes=[10**9] * k,
                                                     mtimes=[1] * k))
        written += tree_bytes(rewrite)
    rewrite_s = time.perf_counter() - t0
    return {"shards": shards, "utts_per_shard": utts,
            "entry_per_shard": {"seconds_per_shard": round(per_part, 4), "bytes_written": part_bytes,
                                "read_all_seconds": round(read_all, 3), "read_again_seconds": round(read_again, 4)},
            "rewrite_after_each_shard": {"seconds": round(rewrite_s, 2), "bytes_written": written,
                                         }}


def long_recording(work: Path, minutes: float = 20.0, segments: int = 300) -> dict:
    """Segments of one long recording, shuffled: read alone, decoded whole each time, or cached."""
    import soundfile as sf

    from wdsprep.prep.audio import Utterance, WaveSource, probe_recording

    rate = 16000
    rng = np.random.default_rng(1)
    n = int(minutes * 60 * rate)
    wave = (rng.standard_normal(n) * 3000).astype(np.int16)
    out = {}
    for fmt in ("wav", "flac"):
        path = work / f"long.{fmt}"
        sf.write(path, wave, rate, subtype="PCM_16")
        rec = probe_recording(str(path))
        starts = sorted(rng.uniform(0, minutes * 60 - 4, segments).tolist())
        utts = [Utterance(f"s{i:04d}", "long", str(path), "bench", s, s + 3.0) for i, s in enumerate(starts)]
        random.Random(0).shuffle(utts)
        row = {}
        for name, cache, seekable in (("segment read alone", 256 << 20, True),
                                      ("whole recording decoded per segment", 0, False),
                                      ("whole recording, cached", 1 << 30, False)):
            src = WaveSource(sample_rate=rate, channel=0, min_samples=400, cache_bytes=cache)
            r = rec if seekable else type(rec)(rec.samples, rec.rate, rec.channels, False)
            t0 = time.perf_counter()
            for u in utts[:60] if cache == 0 else utts:
                src.waveform(u, r)
            per = (time.perf_counter() - t0) / (60 if cache == 0 else len(utts))
            row[name] = {"ms_per_segment": round(per * 1000, 2), "decoded": src.decoded}
        out[fmt] = row
    out["recording"] = {"minutes": minutes, "segments": segments}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "wdsprep-bench-growing"))
    p.add_argument("--copies", type=int, default=2, help="N = 173 x copies utterances (4N is measured too)")
    p.add_argument("--index-shards", type=int, default=150)
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {"pack_audio": [pack_run(work, c, 1) for c in (args.copies, 4 * args.copies)]}
    results["pack_audio"].append(pack_run(work, 4 * args.copies, 2))
    for r in results["pack_audio"]:
        print(f"pack-audio {r['utterances']:>5} utts nj={r['nj']}: {r['seconds']:6.1f} s, first shard after "
              f"{r['first_shard_seconds']} s, peak RSS {r['peak_rss_mb']} MB, peak disk {r['peak_out_mb']} MB "
              f"(final {r['final_out_mb']} MB; the features alone: {r['features_mb']} MB)")
    results["index"] = index_strategies(work, args.index_shards)
    i = results["index"]
    e, w = i["entry_per_shard"], i["rewrite_after_each_shard"]
    print(f"index, {i['shards']} shards of {i['utts_per_shard']}: an entry per shard "
          f"{e['seconds_per_shard'] * 1000:.1f} ms/shard, {e['bytes_written'] / 1e6:.1f} MB in all, read all "
          f"{e['read_all_seconds']} s, again {e['read_again_seconds']} s; rewritten after each shard: "
          f"{w['seconds']} s, {w['bytes_written'] / 1e6:.0f} MB written")
    results["long_recording"] = long_recording(work)
    for fmt in ("wav", "flac"):
        for name, row in results["long_recording"][fmt].items():
            print(f"{fmt:>4} 20-min recording, 300 segments shuffled: {name:<38} "
                  f"{row['ms_per_segment']:8.2f} ms/segment ({row['decoded']} whole decodes)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
