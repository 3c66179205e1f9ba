"""Test shard sets built the way users build them: kaldiio arks -> ``pack_data`` -> tar shards.

Shared by the loader tests and by ``ddp_worker.py`` (torchrun runs it in separate processes).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import kaldiio
import numpy as np

WORDS = ["the", "cat", "sat", "on", "a", "mat", "speech", "data", "shard", "loader", "ni", "hao", "好", "世界"]


def make_kaldi_dir(d: Path, n: int, *, seed: int, dims: int = 8, lo: int = 20, hi: int = 400,
                   prefix: str = "") -> dict[str, tuple[np.ndarray, str]]:
    """Random features of varied lengths and transcripts; a few speed-perturbed (dotted) ids."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    utts: dict[str, tuple[np.ndarray, str]] = {}
    with kaldiio.WriteHelper(f"ark,scp:{d}/feats.ark,{d}/feats.scp") as w, open(d / "text", "w", encoding="utf-8") as t:
        for i in range(n):
            uttid = f"{prefix}sp1.1-spk{i % 7}-utt{i}" if i % 5 == 0 else f"{prefix}spk{i % 7}-utt{i}"
            frames = int(rng.integers(lo, hi))
            feats = rng.standard_normal((frames, dims)).astype(np.float32)
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 8))))
            w(uttid, feats)
            t.write(f"{uttid} {text}\n")
            utts[uttid] = (feats, text)
    return utts


def build(root: Path, *, n: int = 300, utts_per_shard: int = 23, layout: str = "cat", dtype: str = "float32",
          seed: int = 0, groups: list[str] | None = None, prefix: str = "") -> tuple[Path, dict]:
    """Pack a random data dir; returns (shard dir, {uttid: (feats, text)})."""
    from wdsprep.pack import pack_data

    kd = root / f"kaldi-{layout}-{seed}"
    utts = make_kaldi_dir(kd, n, seed=seed, prefix=prefix)
    out = root / f"shards-{layout}-{dtype}-{seed}"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "cat(-v3)? layout with float16", UserWarning)  # tested in test_pack
        pack_data(kd / "feats.scp", kd / "text", out, filter_group=groups, utts_per_shard=utts_per_shard,
                  layout=layout, dtype=dtype, progress=False)
    return out, utts


def train_char_tokenizer(root: Path, text_file: Path) -> Path:
    from wdsprep.tokenizer import train_tokenizer

    path = root / "char.tok.json"
    if not path.exists():
        train_tokenizer("char", [text_file], path)
    return path


def strip_index(shard_dir: Path, dest: Path) -> Path:
    """A copy of a shard folder without its index.json (as CAT-written shards come)."""
    shutil.copytree(shard_dir, dest)
    for p in dest.rglob("index.json"):
        os.remove(p)
    return dest
