#!/usr/bin/env python
"""Loader throughput and padding, as ratios against references measured in the same run.

Writes a synthetic shard set with realistic lengths (lognormal frames, median ~400, 80 dims),
then times, warm page cache, one process:
  raw        reading every shard's bytes (the I/O limit)
  webdataset wds.WebDataset(...).decode() -- the default path CAT used
  loader     wdsprep.make_loader (read, decode, shuffle, tokenize, bucket, collate)
and prints utterances/s, the ratios and the loader's padding efficiency.

    python tools/bench_loader.py [--utts 1500] [--max-frames 20000] [--workers 0] [--dtype float32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def write_set(d: Path, n: int, per_shard: int, dtype: str, seed: int = 0) -> tuple[list[str], Path]:
    from wdsprep.shards import FolderIndex, ShardWriter, write_index

    rng = np.random.default_rng(seed)
    frames = np.clip(rng.lognormal(np.log(400), 0.5, n), 50, 2000).astype(int)
    words = ["alpha", "beta", "gamma", "delta", "speech", "shard", "frame", "token"]
    shards, infos, texts = [], [], []
    w = None
    for i, t in enumerate(frames):
        if i % per_shard == 0:
            if w is not None:
                infos.append(w.close())
            shards.append(str(d / f"data-{len(shards):05d}.tar"))
            w = ShardWriter(shards[-1], mtime=0.0)
        text = " ".join(rng.choice(words, 12))
        texts.append(f"utt{i} {text}\n")
        w.write(f"utt{i}", rng.standard_normal((int(t), 80)).astype(dtype), text)
    infos.append(w.close())
    write_index(d, FolderIndex("cat", 80, dtype, infos))
    (d / "text").write_text("".join(texts))
    return shards, d / "text"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utts", type=int, default=1500)
    ap.add_argument("--per-shard", type=int, default=150)
    ap.add_argument("--max-frames", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each path")
    args = ap.parse_args()

    from wdsprep.loader import make_loader
    from wdsprep.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        shards, text = write_set(d, args.utts, args.per_shard, args.dtype)
        tok = train_tokenizer("char", [text], d / "tok.json")
        n = args.utts

        def raw() -> None:
            for s in shards:
                with open(s, "rb") as f:
                    f.read()

        def wds_default() -> None:
            import webdataset as wds

            for _ in wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode():
                pass

        loader = make_loader(shards, tok, max_frames=args.max_frames, num_workers=args.workers)

        def ours() -> None:
            loader.set_epoch(0)
            for _ in loader:
                pass

        raw()  # warm the page cache
        t_raw = min(timed(raw) for _ in range(args.repeat))
        t_wds = min(timed(wds_default) for _ in range(max(1, args.repeat - 1)))
        t_ours = min(timed(ours) for _ in range(args.repeat))
        st = loader.stats
        assert st.utterances == n, st
        mb = sum(Path(s).stat().st_size for s in shards) / 1e6
        print(f"{n} utterances, {len(shards)} shards, {mb:.0f} MB ({args.dtype}), max_frames {args.max_frames}, "
              f"workers {args.workers}")
        print(f"  raw read          {n / t_raw:10,.0f} utts/s")
        print(f"  webdataset decode {n / t_wds:10,.0f} utts/s")
        print(f"  wdsprep loader    {n / t_ours:10,.0f} utts/s")
        print(f"  loader / raw read      {t_raw / t_ours:.2f}x  (target >= 0.5)")
        print(f"  loader / webdataset    {t_wds / t_ours:.2f}x  (target >= 5)")
        print(f"  padding efficiency     {st.padding_efficiency:.4f}  (target >= 0.97), {st.steps} batches")


if __name__ == "__main__":
    main()
