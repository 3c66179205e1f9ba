#!/usr/bin/env python
"""Audio shards against feature shards and against Lhotse's on-the-fly fbank, on the same audio, in one run.

The audio is the bundled real-speech corpus (``egs/demo/data``, espeak-ng speech, 16 kHz FLAC),
``--concat`` consecutive utterances joined into one (about 5.5 s each by default, nearer what ASR
corpora hold than the demo's 1.1 s) until ``--hours`` of speech; written once under ``--work`` as
FLAC files with a Kaldi ``wav.scp``/``text``.  From it:

- **storage**: the same utterances as wdsprep FLAC and WAV shards (the format's writer, what
  ``pack-audio --store flac|wav`` writes), and as float32 and float16 fbank shards (``wdsprep
  fbank`` + ``pack``): bytes per hour of speech;
- **throughput**, hours of audio per CPU-second of the whole process (``time.process_time``: every
  thread, the reader's C thread included), one process (``num_workers=0``), torch and every numpy
  library on one thread, median of ``--repeat`` passes over the corpus, contenders rotated each
  round:

  wdsprep FLAC          make_loader over the FLAC shards: read, decode, fbank (numpy backend),
                        tokenize (characters), batch (max_frames 20,000 = 200 s), collate
  wdsprep FLAC + aug    the same with speed 0.9/1.0/1.1 (drawn by the plan) and SpecAugment
  wdsprep waveform      make_loader(features="waveform") over the FLAC shards: read, decode, pad
                        (fbank left to wdsprep.Fbank on the device); and with speed 0.9/1.0/1.1
  wdsprep WAV           the same over WAV shards: no decoding (the share FLAC's decoder takes)
  wdsprep features      make_loader over the float32 fbank shards (no feature computation)
  Lhotse                CutSet of the FLAC files, DynamicBucketingSampler(max_duration=200),
                        K2SpeechRecognitionDataset(OnTheFlyFeatures(Fbank(num_mel_bins=80)))
  Lhotse + aug          the same with PerturbSpeed(0.9, 1.1, p=2/3) and SpecAugment

  (Lhotse is not a dependency of wdsprep: ``pip install -c constraints.txt lhotse`` into the
  venv; without it those rows say "skipped".)

    python tools/bench/bench_audio.py [--hours 0.5] [--repeat 3] [--work exp/bench_audio] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # per core: one thread each
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "egs" / "demo" / "data"
RATE = 16000
MAX_FRAMES = 20000  # 200 s of audio per batch; Lhotse's max_duration alike
AUGMENT = {"speed": {"factors": [0.9, 1.0, 1.1]}, "specaugment": {}}


def make_corpus(work: Path, hours: float, concat: int) -> tuple[Path, float]:
    """``hours`` of speech as FLAC files of ``concat`` joined demo utterances, with wav.scp, text and utt2spk;
    reused when already there.  Returns (data dir, hours)."""
    d = work / "data"
    if (d / "done").exists() and (d / "done").read_text() == f"{hours} {concat}":
        return d, float((d / "hours").read_text())
    (d / "audio").mkdir(parents=True, exist_ok=True)
    utts = []
    for part in ("train", "dev"):
        texts = dict(line.split(" ", 1) for line in (DEMO / part / "text").read_text(encoding="utf-8").splitlines())
        for line in (DEMO / part / "wav.scp").read_text().splitlines():
            uttid, path = line.split(" ", 1)
            utts.append((sf.read(DEMO.parent / path, dtype="int16")[0], texts[uttid]))
    scp, text, total, k = [], [], 0, 0
    while total < hours * 3600 * RATE:
        parts = [utts[(k * concat + j * 7) % len(utts)] for j in range(concat)]  # a stride: varied pairs
        pcm = np.concatenate([p for p, _ in parts])
        uttid = f"spk{k % 40:02d}-utt{k:06d}"
        sf.write(d / "audio" / f"{uttid}.flac", pcm, RATE, subtype="PCM_16")
        scp.append(f"{uttid} {d / 'audio' / uttid}.flac\n")
        text.append(f"{uttid} {' '.join(t for _, t in parts)}\n")
        total += len(pcm)
        k += 1
    (d / "wav.scp").write_text("".join(scp))
    (d / "text").write_text("".join(text), encoding="utf-8")
    (d / "utt2spk").write_text("".join(f"{line.split()[0]} {line.split('-')[0]}\n" for line in scp))  # Lhotse wants it
    (d / "hours").write_text(str(total / RATE / 3600))
    (d / "done").write_text(f"{hours} {concat}")
    return d, total / RATE / 3600


def audio_shards(data: Path, out: Path, per_shard: int, fmt: str = "flac") -> Path:
    """The corpus as wdsprep audio shards in one folder, with its index (the writer pack-audio --store calls)."""
    from wdsprep.format.index import AudioIndex, FolderIndex, write_index
    from wdsprep.format.writer import write_audio_shard

    if (out / "index.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    texts = dict(line.split(" ", 1) for line in (data / "text").read_text(encoding="utf-8").splitlines())
    scp = [line.split(" ", 1) for line in (data / "wav.scp").read_text().splitlines()]
    infos, sizes, mtimes = [], [], []
    for s in range(0, len(scp), per_shard):
        path = out / f"data-{s // per_shard:05d}.tar"
        infos.append(write_audio_shard(path, [(u, sf.read(p, dtype="int16")[0], texts[u])
                                              for u, p in scp[s:s + per_shard]], layout=fmt, sample_rate=RATE))
        st = path.stat()
        sizes.append(st.st_size)
        mtimes.append(st.st_mtime_ns)
    write_index(out, FolderIndex.from_shards(fmt, 80, "float32", infos, sizes=sizes, mtimes=mtimes,
                                             audio=AudioIndex(fmt, RATE)))
    return out


def feature_shards(data: Path, work: Path, per_shard: int) -> dict[str, Path]:
    """float32 and float16 fbank shards of the corpus (wdsprep fbank + pack, no shuffle: same order)."""
    from wdsprep import compute_fbank, pack_data

    out = {dt: work / f"feats-{dt}" for dt in ("float32", "float16")}
    if all((p / "index.json").exists() for p in out.values()):
        return out
    compute_fbank(data / "wav.scp", work / "fbank", backend="numpy", nj=2, progress=False)
    for dt, p in out.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # float16 for CAT: said once in pack's docs
            pack_data(work / "fbank" / "feats.scp", data / "text", p, utts_per_shard=per_shard, dtype=dt,
                      shuffle=False, overwrite=True, progress=False)
    return out


def shard_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.tar"))


@dataclass
class Contender:
    name: str
    run: Callable[[int], int] | None  # epoch -> utterances delivered; None: skipped
    why: str = ""
    aug: bool = False  # augmented: compared with Lhotse's augmented pipeline
    lhotse: bool = False
    seconds: list[float] = field(default_factory=list)  # CPU seconds per pass


def wdsprep_contender(name: str, shards: Path, tok: Path, **kw) -> Contender:
    """The wdsprep loader over ``shards`` (``kw``: make_loader's), one process."""
    from wdsprep import make_loader

    loader = make_loader(f"{shards}/data-*.tar", tok, max_frames=MAX_FRAMES, seed=0, **kw)

    def run(epoch: int) -> int:
        loader.set_epoch(epoch)
        return sum(len(b.keys) for b in loader)

    return Contender(name, run, aug="augment" in kw)


def lhotse_contenders(data: Path) -> list[Contender]:
    names = ["Lhotse, FLAC files, OnTheFlyFeatures(Fbank)", "Lhotse + PerturbSpeed(0.9, 1.1, p=2/3) + SpecAugment"]
    try:
        import lhotse  # noqa: F401
    except ImportError as e:
        why = f"skipped: lhotse is not installed ({e.__class__.__name__}); pip install -c constraints.txt lhotse"
        return [Contender(n, None, why, aug=a, lhotse=True) for n, a in zip(names, (False, True))]
    import torch
    from lhotse import CutSet, Fbank, FbankConfig
    from lhotse.dataset import (
        DynamicBucketingSampler,
        K2SpeechRecognitionDataset,
        OnTheFlyFeatures,
        PerturbSpeed,
        SpecAugment,
    )
    from lhotse.kaldi import load_kaldi_data_dir

    torch.set_num_threads(1)
    recordings, supervisions, _ = load_kaldi_data_dir(data, sampling_rate=RATE)
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    out = []
    for name, aug in zip(names, (False, True)):
        ds = K2SpeechRecognitionDataset(
            cut_transforms=[PerturbSpeed(factors=[0.9, 1.1], p=2 / 3)] if aug else None,
            input_transforms=[SpecAugment(time_warp_factor=0)] if aug else None,
            input_strategy=OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80, dither=0.0))))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an eager CutSet: fine for a corpus this size
            sampler = DynamicBucketingSampler(cuts, max_duration=MAX_FRAMES / 100, shuffle=True,
                                              num_buckets=min(10, len(cuts)))
        dl = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=0)

        def run(epoch: int, sampler=sampler, dl=dl) -> int:
            sampler.set_epoch(epoch)
            return sum(int(b["inputs"].shape[0]) for b in dl)

        out.append(Contender(name, run, aug=aug, lhotse=True))
    return out


def measure(contenders: list[Contender], repeat: int, utts: int, log: Callable[[str], None]) -> None:
    """``repeat`` rounds, each contender once per round (order rotated), CPU seconds per pass."""
    live = [c for c in contenders if c.run is not None]
    for c in live:  # warm: page cache, imports, lazily built tables (untimed)
        c.run(10_000)
    for r in range(repeat):
        for c in live[r % len(live):] + live[:r % len(live)]:
            t = time.process_time()
            n = c.run(r)
            c.seconds.append(time.process_time() - t)
            if n != utts:
                raise RuntimeError(f"{c.name}: {n} utterances delivered, the corpus has {utts}")
            log(f"round {r}: {c.name}: {c.seconds[-1]:.2f} CPU-s")


def report(hours: float, sizes: dict[str, int], contenders: list[Contender], argv: str) -> str:
    lines = ["```sh", argv, "```", "", f"{hours:.3f} h of speech (espeak-ng, 16 kHz), one process, one thread per "
             f"library, median of {len(next((c.seconds for c in contenders if c.seconds), []))} passes.",
             "", "| storage | bytes per hour | vs float32 fbank |", "| --- | ---: | ---: |"]
    for name, n in sizes.items():
        lines.append(f"| {name} | {n / hours / 1e6:,.1f} MB | {n / sizes['float32 fbank shards']:.2f} |")
    base = {c.name: hours / statistics.median(c.seconds) for c in contenders if c.seconds}
    refs = {c.aug: base[c.name] for c in contenders if c.lhotse and c.seconds}
    lines += ["", "| loader | hours of audio per CPU-second | x real time per core | vs Lhotse (same augmentation) |",
              "| --- | ---: | ---: | ---: |"]
    for c in contenders:
        if not c.seconds:
            lines.append(f"| {c.name} | {c.why} | | |")
            continue
        h = base[c.name]
        ref = refs.get(c.aug)
        vs = f"{h / ref:.2f}x" if ref and not c.lhotse else ""
        lines.append(f"| {c.name} | {h:.4f} | {h * 3600:,.0f} | {vs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=0.5, help="hours of speech (default: %(default)s)")
    ap.add_argument("--concat", type=int, default=5, help="demo utterances joined into one (default: %(default)s)")
    ap.add_argument("--per-shard", type=int, default=200, help="utterances per shard (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="passes per contender; the median is reported")
    ap.add_argument("--work", default="exp/bench_audio", help="corpus and shards, reused (default: %(default)s)")
    ap.add_argument("--markdown", help="also write the tables here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    work = Path(args.work)
    data, hours = make_corpus(work, args.hours, args.concat)
    utts = len((data / "wav.scp").read_text().splitlines())
    log(f"corpus: {utts} utterances, {hours:.3f} h")
    flac = audio_shards(data, work / "flac", args.per_shard)
    wav = audio_shards(data, work / "wav", args.per_shard, "wav")
    feats = feature_shards(data, work, args.per_shard)
    sizes = {"FLAC shards (16-bit)": shard_bytes(flac), "WAV shards (16-bit)": shard_bytes(wav),
             "float32 fbank shards": shard_bytes(feats["float32"]),
             "float16 fbank shards": shard_bytes(feats["float16"])}
    from wdsprep.tokenizer import train_tokenizer

    tok = work / "char.json"
    if not tok.exists():
        train_tokenizer("char", [data / "text"], tok)
    contenders = [wdsprep_contender("wdsprep, FLAC shards, fbank on the fly", flac, tok),
                  wdsprep_contender("wdsprep, FLAC shards + speed 0.9/1.0/1.1 + SpecAugment", flac, tok,
                                    augment=AUGMENT),
                  wdsprep_contender("wdsprep, FLAC shards, features=\"waveform\" (no fbank: on the device)", flac,
                                    tok, features="waveform"),
                  wdsprep_contender("wdsprep, FLAC shards + speed 0.9/1.0/1.1, features=\"waveform\"", flac, tok,
                                    features="waveform", augment={"speed": AUGMENT["speed"]}),
                  wdsprep_contender("wdsprep, WAV shards (no decoding), fbank on the fly", wav, tok),
                  wdsprep_contender("wdsprep, float32 features shards", feats["float32"], tok),
                  *lhotse_contenders(data)]
    measure(contenders, args.repeat, utts, log)
    text = report(hours, sizes, contenders, "python tools/bench/bench_audio.py " + " ".join(argv or sys.argv[1:]))
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
