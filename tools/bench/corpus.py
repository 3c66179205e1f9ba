"""The benchmark corpus: synthetic utterances written once as a Kaldi data dir and packed.

Lognormal lengths, 80-dim fbank-like features, random transcripts of pseudo-words; the same
utterances as Kaldi arks (for the map-style references) and as float32 and float16 shards
(``wdsprep.pack_data``).  A work dir is reused when it holds the same :class:`DataSpec`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from wdsprep.units import hours

GROUPS = ("0:500", "500:")  # two length groups of about equal size at median 500 frames
GROUP_DIRS = ("0_500", "500_inf")
SPEC_FILE = "bench_spec.json"




@dataclass(frozen=True)
class DataSpec:
    """Everything the generated corpus depends on; a work dir is reused only if this matches."""

    utts: int = 20_000
    dims: int = 80
    seed: int = 0
    median_frames: float = 500.0
    sigma: float = 0.5
    min_frames: int = 20
    max_frames: int = 3000
    utts_per_shard: int = 2000
    arks: int = 4  # Kaldi writes one ark per feature-extraction job; 4 is a small recipe
    groups: tuple[str, ...] = GROUPS
    vocab_words: int = 600
    version: int = 1  # bump when generation changes

    def lengths(self) -> np.ndarray:
        """Frames per utterance: lognormal around the median, clipped."""
        rng = np.random.default_rng([self.seed, 1])
        x = rng.lognormal(math.log(self.median_frames), self.sigma, self.utts)
        return np.clip(np.rint(x), self.min_frames, self.max_frames).astype(np.int64)


@dataclass
class Corpus:
    """Paths and sizes of a prepared work dir."""

    work: Path
    spec: DataSpec
    lengths: np.ndarray
    scp: Path
    text: Path
    arks: list[Path]
    shards32: list[Path]
    shards16: list[Path]
    tokenizer: Path | None = None

    @property
    def pattern32(self) -> str:
        return f"{self.work}/shards-f32/{{{','.join(GROUP_DIRS)}}}/data-*.tar"

    @property
    def pattern16(self) -> str:
        return f"{self.work}/shards-f16/{{{','.join(GROUP_DIRS)}}}/data-*.tar"

    @property
    def hours(self) -> float:
        return hours(self.lengths.sum())


def _vocabulary(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct pronounceable pseudo-words (1-3 CV syllables), so SentencePiece has structure to learn."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(1, 4))
        words.add("".join(cons[rng.integers(len(cons))] + vows[rng.integers(len(vows))] for _ in range(k)))
    return sorted(words)


def generate_kaldi(spec: DataSpec, d: Path) -> None:
    """Write ``d/{feats.scp,text,utt2num_frames,feats.N.ark}`` for ``spec``."""
    import kaldiio

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([spec.seed, 2])
    lens = spec.lengths()
    vocab = np.array(_vocabulary(rng, spec.vocab_words))
    # Zipf-ish word frequencies, like real text; speaking rate ~2.5 words/s.
    p = 1.0 / np.arange(1, len(vocab) + 1)
    p /= p.sum()
    # fbank-like: per-dim mean rising over the mel bins, unit-ish spread; float32 as Kaldi writes it.
    mu = np.linspace(4.0, 14.0, spec.dims, dtype=np.float32)
    ids = [f"spk{i % 97:03d}-utt{i:06d}" for i in range(spec.utts)]
    scp_lines: list[str] = []
    per_ark = math.ceil(spec.utts / spec.arks)
    with open(d / "text", "w", encoding="utf-8") as ftext, open(d / "utt2num_frames", "w") as fnf:
        for a in range(spec.arks):
            lo, hi = a * per_ark, min(spec.utts, (a + 1) * per_ark)
            ark, scp = d / f"feats.{a + 1}.ark", d / f"feats.{a + 1}.scp"
            with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as w:
                for i in range(lo, hi):
                    t = int(lens[i])
                    feats = rng.standard_normal((t, spec.dims), dtype=np.float32) * 2.0 + mu
                    w(ids[i], feats)
                    nw = max(1, int(rng.poisson(t / 100 * 2.5)))
                    ftext.write(f"{ids[i]} {' '.join(rng.choice(vocab, nw, p=p))}\n")
                    fnf.write(f"{ids[i]} {t}\n")
            scp_lines.append(scp.read_text())
    (d / "feats.scp").write_text("".join(scp_lines))


def _tar_list(root: Path) -> list[Path]:
    return sorted(p for g in GROUP_DIRS for p in (root / g).glob("data-*.tar"))


def prepare(spec: DataSpec, work: Path, *, nj: int = 2, log: Callable[[str], None] = print) -> Corpus:
    """Generate and pack the corpus into ``work``, or reuse it when ``work`` holds the same spec."""
    work = work.resolve()
    spec_json = json.dumps(asdict(spec), sort_keys=True)
    marker = work / SPEC_FILE
    kd = work / "kaldi"
    if not (marker.is_file() and marker.read_text() == spec_json):
        from wdsprep import pack_data

        log(f"[bench] generating {spec.utts} utterances into {work} (reused on the next run)")
        # Everything derived from the generated corpus (the demo-* dirs are not, and are kept).
        for p in [*(work / sub for sub in ("kaldi", "shards-f32", "shards-f16", "x4")),
                  *work.glob("tokenizer-spm*.json")]:
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
        t0 = time.perf_counter()
        generate_kaldi(spec, kd)
        log(f"[bench] kaldi data dir written in {time.perf_counter() - t0:.1f} s")
        for dtype, out in (("float32", "shards-f32"), ("float16", "shards-f16")):
            t0 = time.perf_counter()
            with warnings.catch_warnings():  # float16 on purpose: it times wdsprep's loader, not CAT's
                warnings.filterwarnings("ignore", "cat layout with float16", UserWarning)
                pack_data(kd / "feats.scp", kd / "text", work / out, filter_group=list(spec.groups),
                          utts_per_shard=spec.utts_per_shard, dtype=dtype, nj=nj, progress=False)
            log(f"[bench] packed {dtype} in {time.perf_counter() - t0:.1f} s")
        marker.write_text(spec_json)  # last: an interrupted preparation is redone
    c = Corpus(work, spec, spec.lengths(), kd / "feats.scp", kd / "text", sorted(kd.glob("feats.*.ark")),
               _tar_list(work / "shards-f32"), _tar_list(work / "shards-f16"))
    if not c.shards32 or len(c.shards32) != len(c.shards16):
        raise RuntimeError(f"{work}: shards missing; delete {marker} to regenerate")
    return c


def x4_shards(c: Corpus) -> list[str]:
    """4N utterances without 4x the disk: four folders of symlinks to the same shards (+ indexes)."""
    root = c.work / "x4"
    out: list[str] = []
    for k in range(4):
        for g in GROUP_DIRS:
            d = root / f"copy{k}" / g
            d.mkdir(parents=True, exist_ok=True)
            src = c.work / "shards-f32" / g
            for p in [*src.glob("data-*.tar"), *src.glob("index.*")]:
                link = d / p.name
                if p.exists() and not link.exists():
                    link.symlink_to(p)
            out.extend(str(p) for p in sorted(d.glob("data-*.tar")))
    return out


def train_tokenizer_once(c: Corpus, vocab_size: int) -> Path:
    """SentencePiece on the corpus transcripts, cached in the work dir."""
    from wdsprep import train_tokenizer

    out = c.work / f"tokenizer-spm{vocab_size}.json"
    if not out.is_file():
        train_tokenizer("sentencepiece", [c.text], out, vocab_size=vocab_size)
    return out
