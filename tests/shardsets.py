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


# Three languages in three scripts: English words, Mandarin characters, Russian words.
LANG_WORDS = {
    "en": ["the", "cat", "sat", "on", "a", "mat", "speech", "data", "shard", "loader"],
    "zh": ["你好", "世界", "语音", "数据", "猫", "坐", "在", "上", "今天", "天气"],
    "ru": ["кот", "сидел", "на", "ковре", "речь", "данные", "мир", "привет", "сегодня", "погода"],
}


def make_multilingual_dir(d: Path, counts: dict[str, int], *, seed: int = 0, dims: int = 8, lo: int = 20,
                          hi: int = 200) -> dict[str, tuple[str, str, str]]:
    """A Kaldi dir of several languages (kaldiio features, every language the same length
    distribution, so hours follow ``counts``), with ``utt2lang`` and ``text.prev`` (each
    utterance's previous one of its speaker and language; empty for the first): uttid -> (language,
    transcript, previous transcript).  Ids carry the language and, one in five, a speed prefix."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, tuple[str, str, str]] = {}
    last: dict[tuple[str, int], str] = {}
    with kaldiio.WriteHelper(f"ark,scp:{d}/feats.ark,{d}/feats.scp") as w, \
            open(d / "text", "w", encoding="utf-8") as t, open(d / "utt2lang", "w", encoding="utf-8") as u, \
            open(d / "text.prev", "w", encoding="utf-8") as p, open(d / "utt2spk", "w", encoding="utf-8") as s:
        for lang, n in counts.items():
            words = LANG_WORDS[lang]
            for i in range(n):
                spk = i % 4
                uttid = f"{'sp1.1-' if i % 5 == 0 else ''}{lang}_spk{spk}-utt{i:04d}"
                sep = "" if lang == "zh" else " "
                text = sep.join(rng.choice(words, size=int(rng.integers(1, 6))))
                prev = last.get((lang, spk), "")
                last[(lang, spk)] = text
                w(uttid, rng.standard_normal((int(rng.integers(lo, hi)), dims)).astype(np.float32))
                t.write(f"{uttid} {text}\n")
                u.write(f"{uttid} {lang}\n")
                p.write(f"{uttid} {prev}\n" if prev else f"{uttid}\n")
                s.write(f"{uttid} {lang}_spk{spk}\n")
                out[uttid] = (lang, text, prev)
    return out


def language_tokenizers(root: Path, kaldi: Path, utts: dict[str, tuple[str, str, str]]) -> dict[str, Path]:
    """One tokenizer per language: characters (en, with a <space> token; zh, without) and a
    SentencePiece character model (ru), each trained on its language's transcripts."""
    from wdsprep.tokenizer import train_tokenizer

    kinds = {"en": ("char", {}), "zh": ("char", {"keep_spaces": False}),
             "ru": ("sentencepiece", {"model_type": "char"})}
    out = {}
    for lang, (kind, kw) in kinds.items():
        path = root / f"{lang}.tok.json"
        if not path.exists():
            text = root / f"text.{lang}"
            text.write_text("".join(f"{u} {t}\n" for u, (x, t, _) in utts.items() if x == lang), encoding="utf-8")
            train_tokenizer(kind, [text], path, **kw)
        out[lang] = path
    return out


def build_multilingual(root: Path, counts: dict[str, int] | None = None, *, utts_per_shard: int = 40,
                       **pack) -> tuple[Path, dict[str, tuple[str, str, str]], dict[str, Path]]:
    """``make_multilingual_dir`` packed with ``--utt2lang`` and ``--field prev_text=text.prev``:
    (shard dir, uttid -> (language, transcript, previous transcript), a tokenizer per language)."""
    from wdsprep.pack import pack_data

    counts = counts or {"en": 360, "zh": 180, "ru": 60}  # 60/30/10% of the hours
    kd = root / "kaldi-multilingual"
    utts = make_multilingual_dir(kd, counts)
    out = root / "shards-multilingual"
    pack_data(kd / "feats.scp", kd / "text", out, utts_per_shard=utts_per_shard, utt2lang=kd / "utt2lang",
              fields={"prev_text": kd / "text.prev"}, utt2spk=kd / "utt2spk", progress=False, **pack)
    return out, utts, language_tokenizers(root, kd, utts)
