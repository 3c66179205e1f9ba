#!/usr/bin/env python
"""Loader throughput against references measured in the same run, interleaved, median of N passes.

Generates once (and reuses, under ``--data``) a realistic set: 80-dim float32 features with
lognormal lengths (median ~500 frames), transcripts of ~frames/40 words, cat-layout shards with
an index, the same features as a Kaldi ark + scp, and a SentencePiece (unigram) tokenizer.  Then,
in rounds (contender order rotated every round, so slow spells of a shared machine hit all):

  raw            read every shard file's bytes (1 MiB readinto, like ``cat > /dev/null``), warm
  loader w0/w2   make_loader(..., max_frames, num_workers=0/2): read, decode, shuffle,
                 SentencePiece tokenize, bucket by max_frames, collate, the whole epoch
  loader w0 f16  the same over float16 copies of the shards (written once, only when selected)
  webdataset     wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "txt")
  kaldiio        load_scp random access (shuffled keys), what the map-style loader did
  *-cold         the same after posix_fadvise(DONTNEED) of every file read (page cache evicted)

and prints utterances/s (median), the target ratios and peak RSS for half and all of the shards
(sampled from /proc in a fresh process).

    python tools/bench_loader.py [--utts 20000] [--per-shard 2000] [--repeat 3] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

# The page-cache control and the raw read are the full benchmark's (tools/bench.py), so both
# measure the same floor the same way.
from wdsprep.bench import evict, read_files as raw_read

DIMS = 80


def make_set(d: Path, n: int, per_shard: int, seed: int = 0) -> None:
    """Shards + index, ark + scp and text with the same utterances, and an spm tokenizer."""
    import kaldiio

    from wdsprep.shards import FolderIndex, ShardWriter, write_index
    from wdsprep.tokenizer import train_tokenizer

    rng = np.random.default_rng(seed)
    frames = np.clip(rng.lognormal(np.log(500), 0.5, n), 50, 3000).astype(int)
    syll = ["ka", "to", "ri", "mu", "sen", "da", "lo", "pi", "ne", "ha", "zu", "wo", "chi", "ba", "ge"]
    vocab = sorted({"".join(rng.choice(syll, int(rng.integers(1, 4)))) for _ in range(3000)})
    (d / "shards").mkdir(parents=True, exist_ok=True)
    texts, infos = [], []
    w = None
    with kaldiio.WriteHelper(f"ark,scp:{d / 'feats.ark'},{d / 'feats.scp'}") as ark:
        for i, t in enumerate(frames):
            if i % per_shard == 0:
                if w is not None:
                    infos.append(w.close())
                w = ShardWriter(d / "shards" / f"data-{i // per_shard:05d}.tar", mtime=0.0)
            uttid = f"spk{i % 97:02d}-utt{i:06d}"
            feats = rng.standard_normal((int(t), DIMS), dtype=np.float32)
            text = " ".join(rng.choice(vocab, max(1, int(t) // 40)))
            w.write(uttid, feats, text)
            ark(uttid, feats)
            texts.append(f"{uttid} {text}\n")
    infos.append(w.close())
    write_index(d / "shards", FolderIndex("cat", DIMS, "float32", infos))
    (d / "text").write_text("".join(texts))
    train_tokenizer("sentencepiece", [d / "text"], d / "tok.json", vocab_size=500, overwrite=True)


def make_f16(d: Path) -> None:
    """float16 copies of the float32 shards (same utterances, same order), under ``d/shards-f16``, once."""
    from wdsprep.reader import iter_decoded
    from wdsprep.shards import FolderIndex, ShardWriter, write_index

    out = d / "shards-f16"
    if (out / "index.json").exists():
        return
    print(f"writing float16 copies of the shards to {out} (once)...", file=sys.stderr)
    out.mkdir(exist_ok=True)
    infos = []
    for s in shard_paths(d):
        w = ShardWriter(out / Path(s).name, mtime=0.0)
        for uttid, feats, text in iter_decoded(s):
            w.write(uttid, feats.astype(np.float16), text)
        infos.append(w.close())
    write_index(out, FolderIndex("cat", DIMS, "float16", infos))


def ensure_set(d: Path, n: int, per_shard: int) -> None:
    stamp = d / "params.json"
    want = {"utts": n, "per_shard": per_shard, "dims": DIMS, "version": 1}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    print(f"writing {n} utterances to {d} (once; reused by later runs)...", file=sys.stderr)
    make_set(d, n, per_shard)
    stamp.write_text(json.dumps(want))


def shard_paths(d: Path, sub: str = "shards") -> list[str]:
    return sorted(str(p) for p in (d / sub).glob("data-*.tar"))


def run_loader(loader, epoch: int = 0) -> int:
    loader.set_epoch(epoch)
    for _ in loader:
        pass
    return loader.stats.utterances


def _status(pid: int | str) -> dict[str, int]:
    """VmRSS, RssAnon, VmHWM... of a process in kB (Linux /proc)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS", "RssAnon", "VmHWM")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def rss_child(d: Path, nshards: int, workers: int, max_frames: int) -> None:
    """One epoch over the first ``nshards`` shards; prints peak RSS (MB) of this process + workers.

    ru_maxrss survives exec (it would report the parent bench's peak), so a thread samples /proc
    every 10 ms: the total counts the shards' page-cache pages mapped by the reader (shared,
    reclaimable) and shared-memory batches once per process; anon is private memory.
    """
    import threading

    from wdsprep.loader import make_loader

    peak = {"total": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        me = os.getpid()
        while not done.wait(0.01):
            try:
                kids = [int(p) for t in os.listdir(f"/proc/{me}/task")
                        for p in open(f"/proc/{me}/task/{t}/children").read().split()]
            except OSError:
                kids = []
            stats = [_status(me)] + [_status(k) for k in kids]
            peak["total"] = max(peak["total"], sum(s.get("VmRSS", 0) for s in stats))
            peak["anon"] = max(peak["anon"], sum(s.get("RssAnon", 0) for s in stats))

    loader = make_loader(shard_paths(d)[:nshards], str(d / "tok.json"), max_frames=max_frames,
                         num_workers=workers)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    n = run_loader(loader)
    done.set()
    th.join()
    print(json.dumps({"utts": n, "total_mb": peak["total"] / 1024, "anon_mb": peak["anon"] / 1024,
                      "hwm_mb": _status("self").get("VmHWM", 0) / 1024}))


def peak_rss(d: Path, nshards: int, workers: int, max_frames: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--data", str(d), "--max-frames", str(max_frames),
                          "--_rss", str(nshards), str(workers)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=20000)
    ap.add_argument("--per-shard", type=int, default=2000)
    ap.add_argument("--max-frames", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--data", type=Path, default=None, help="where the set is generated/reused "
                    "(default: /tmp/wdsprep-bench-loader-<utts>-<per-shard>)")
    ap.add_argument("--only", default=None, help="comma-separated contenders to run (default: all)")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    ap.add_argument("--_rss", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = args.data or Path(f"/tmp/wdsprep-bench-loader-{args.utts}-{args.per_shard}")
    if args._rss:
        rss_child(d, args._rss[0], args._rss[1], args.max_frames)
        return
    ensure_set(d, args.utts, args.per_shard)

    import kaldiio
    import webdataset as wds

    from wdsprep.loader import make_loader

    shards = shard_paths(d)
    ark = [str(d / "feats.ark")]
    n = args.utts
    keys = [line.split(None, 1)[0] for line in (d / "feats.scp").read_text().splitlines()]
    order = np.random.default_rng(1).permutation(len(keys))
    loaders = {w: make_loader(shards, str(d / "tok.json"), max_frames=args.max_frames, num_workers=w)
               for w in (0, 2)}
    want_f16 = args.only is None or "loader w0 f16" in args.only.split(",")
    if want_f16:
        make_f16(d)
        loaders["f16"] = make_loader(shard_paths(d, "shards-f16"), str(d / "tok.json"),
                                     max_frames=args.max_frames, num_workers=0)

    def wds_default() -> int:
        ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode().to_tuple("npy", "txt")
        return sum(1 for _ in ds)

    def kaldiio_random() -> int:
        table = kaldiio.load_scp(str(d / "feats.scp"))
        for i in order:
            table[keys[i]]
        return len(order)

    def cold(paths: list[str], fn: Callable[[], int]) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            evict(paths)
            t = time.perf_counter()
            return fn(), time.perf_counter() - t
        return run

    def warm(fn: Callable[[], int]) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            t = time.perf_counter()
            return fn(), time.perf_counter() - t
        return run

    contenders: dict[str, Callable[[], tuple[int, float]]] = {
        "raw": warm(lambda: raw_read(shards) and n),
        "loader w0": warm(lambda: run_loader(loaders[0])),
        "loader w2": warm(lambda: run_loader(loaders[2])),
        "loader w0 f16": warm(lambda: run_loader(loaders["f16"])),
        "webdataset": warm(wds_default),
        "kaldiio": warm(kaldiio_random),
        "raw cold": cold(shards, lambda: raw_read(shards) and n),
        "loader w0 cold": cold(shards, lambda: run_loader(loaders[0])),
        "kaldiio cold": cold(ark, kaldiio_random),
    }
    if args.only:
        contenders = {k: v for k, v in contenders.items() if k in args.only.split(",")}
    raw_read(shards + ark + (shard_paths(d, "shards-f16") if want_f16 else []))  # warm the page cache
    times: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(args.repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got, secs = contenders[name]()
            assert got == n, (name, got, n)
            times[name].append(secs)
            if not name.endswith("cold"):
                continue
            raw_read(shards + ark)  # re-warm for the warm contenders
    rate = {k: n / statistics.median(v) for k, v in times.items()}

    mb = sum(Path(s).stat().st_size for s in shards) / 1e6
    st = loaders[0].stats
    print(f"{n} utterances, {len(shards)} shards, {mb:,.0f} MB float32 x {DIMS}, max_frames {args.max_frames}, "
          f"spm unigram 500, median of {args.repeat} interleaved rounds, {os.cpu_count()} cores, "
          f"load avg {os.getloadavg()[0]:.1f}")
    print()
    print("| path | utts/s (median) | passes (s) |")
    print("| --- | ---: | --- |")
    for k, v in times.items():
        print(f"| {k} | {rate[k]:,.0f} | {' '.join(f'{x:.2f}' for x in v)} |")
    print()
    print("| target | ratio | goal | met |")
    print("| --- | ---: | ---: | --- |")

    def ratio(label: str, a: str, b: str, goal: float) -> None:
        if a in rate and b in rate:
            x = rate[a] / rate[b]
            print(f"| {label} | {x:.2f}x | >= {goal}x | {'yes' if x >= goal else 'NO'} |")

    ratio("loader w0 / raw read (warm)", "loader w0", "raw", 0.5)
    ratio("loader w0 / webdataset", "loader w0", "webdataset", 5)
    ratio("loader w0 / kaldiio random (warm)", "loader w0", "kaldiio", 1.5)
    ratio("loader w0 / kaldiio random (cold)", "loader w0 cold", "kaldiio cold", 2)
    ratio("loader w2 / loader w0", "loader w2", "loader w0", 1.0)
    ratio("loader w0 float16 / float32 shards", "loader w0 f16", "loader w0", 1.0)
    if "loader w0" in times:
        print(f"\npadding efficiency {st.padding_efficiency:.4f}, {st.steps} batches per epoch (w0)")
    if not args.no_rss:
        half = max(1, len(shards) // 2)
        for w in (0, 2):
            a, b = peak_rss(d, half, w, args.max_frames), peak_rss(d, len(shards), w, args.max_frames)
            print(f"peak RSS w{w} (main + workers): {half} shards {a['total_mb']:,.0f} MB "
                  f"(anon {a['anon_mb']:,.0f}), {len(shards)} shards {b['total_mb']:,.0f} MB (anon {b['anon_mb']:,.0f})")


if __name__ == "__main__":
    main()
