"""Encodes per second: ``encode`` in a Python loop vs ``encode_batch``, for each tokenizer kind.

    python tools/bench/bench_tokenizer.py [--n 20000] [--batch 256] [--num-threads 1]

Trains small tokenizers on a synthetic English+Mandarin Kaldi text (seeded) in a temp dir and
prints numbers only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from wdsprep.tokenizer import SubwordSampling, Tokenizer, train_tokenizer

WORDS = ("speech recognition model training data shard loader token subword unit noisy room speaker "
         "phone the a of with over quick brown fox lazy dog").split()
HANZI = "我们今天去北京开会天气很好公园语音识别是一个有趣的问题数据模型训练"


def corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))))
        else:
            out.append("".join(rng.choice(HANZI) for _ in range(rng.randint(8, 30))))
    return out


def rate(fn, n: int) -> float:
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def bench(name: str, tok: Tokenizer, texts: list[str], batch: int, sampling: SubwordSampling | None) -> None:
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    tok.seed(0)
    if sampling is None:
        loop = rate(lambda: [tok.encode(t) for t in texts], len(texts))
    else:  # encode() never samples: the per-item loop is encode_batch of one
        loop = rate(lambda: [tok.encode_batch([t], sampling=sampling) for t in texts], len(texts))
    batched = rate(lambda: [tok.encode_batch(b, sampling=sampling) for b in batches], len(texts))
    print(f"{name:<28} loop {loop:>10,.0f}/s   batch({batch}) {batched:>10,.0f}/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="transcripts to encode")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--num-threads", type=int, default=1, help="sentencepiece threads per batched call")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    texts = corpus(args.n, args.seed)
    with tempfile.TemporaryDirectory() as d:
        text = Path(d) / "text"
        text.write_text("".join(f"u{i:06d} {t}\n" for i, t in enumerate(corpus(5000, args.seed + 1))), encoding="utf-8")
        toks = {
            "char": train_tokenizer("char", [text], Path(d) / "c.json"),
            "jieba": train_tokenizer("jieba", [text], Path(d) / "j.json"),
            "sentencepiece": train_tokenizer("sentencepiece", [text], Path(d) / "s.json", vocab_size=200,
                                             character_coverage=1.0),
        }
    toks["sentencepiece"].num_threads = args.num_threads  # type: ignore[attr-defined]
    print(f"{args.n} transcripts, mean {sum(map(len, texts)) / len(texts):.0f} chars")
    for kind, tok in toks.items():
        bench(kind, tok, texts, args.batch, None)
    bench("sentencepiece +sampling", toks["sentencepiece"], texts, args.batch, SubwordSampling(alpha=0.1))


if __name__ == "__main__":
    main()
