#!/usr/bin/env python
"""Opus audio shards against FLAC, WAV and fbank shards: bytes per hour, coding CPU, and the features' distance.

The audio is ``bench_audio.py``'s corpus (the bundled espeak-ng speech, ``--concat`` utterances
joined into one, until ``--hours``), written as shards through the format's writer (what
``pack-audio --store`` calls; ``opus`` at each of ``--bitrates``) and as float32 and float16 fbank
shards.  Reported:

- **storage**: bytes per hour of speech of each kind of shard (members, transcripts and tar
  headers), and of the Opus members alone;
- **lengths**: how many utterances an Opus member decodes to another sample count than was
  encoded (the index records the decoded count either way);
- **CPU**, per hour of audio: encoding (what a pack spends), and decoding as the loader's readers
  decode a member (hours of audio per CPU-second), one thread, best of ``--repeat``; each bitrate
  also through libsndfile's encoder (soundfile), which the pack used before, in the same run;
- **features**: the numpy backend's fbank of the decoded Opus against that of the lossless audio,
  every frame and mel bin of every utterance: max abs, mean abs and the 99th percentile; then
  leaving out the bins the lossless audio has at the log floor (digital silence, which synthetic
  speech has between words and recordings do not: there any codec noise is ~20 above the floor);
  and with Kaldi's dither 1.0 on both (the same noise for both), which fills that silence.

    python tools/bench/bench_opus.py [--hours 0.25] [--bitrates 16000 32000 64000] [--work exp/bench_opus]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # per core: one thread each
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
from bench_audio import RATE, audio_shards, feature_shards, make_corpus, shard_bytes  # noqa: E402


def opus_shards(data: Path, out: Path, per_shard: int, bitrate: int) -> Path:
    """The corpus as Opus shards at ``bitrate`` in one folder, with its index."""
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
        infos.append(write_audio_shard(path, [(u, sf.read(p, dtype="int16")[0], texts[u]) for u, p in
                                              scp[s:s + per_shard]], layout="opus", sample_rate=RATE, bitrate=bitrate))
        st = path.stat()
        sizes.append(st.st_size)
        mtimes.append(st.st_mtime_ns)
    write_index(out, FolderIndex.from_shards("opus", 80, "float32", infos, sizes=sizes, mtimes=mtimes,
                                             audio=AudioIndex("opus", RATE)))
    return out


def libsndfile_opus(pcm: np.ndarray, bitrate: int) -> bytes:
    """Ogg Opus from libsndfile's encoder (soundfile): its compression level sets the bitrate."""
    buf = io.BytesIO()
    sf.write(buf, pcm, RATE, format="OGG", subtype="OPUS", compression_level=(256000 - bitrate - 0.5) / 250000)
    return buf.getvalue()


def members(folder: Path, ext: str) -> list[bytes]:
    """Every ``ext`` member's bytes of a folder's shards, in order."""
    out = []
    for shard in sorted(folder.glob("data-*.tar")):
        with tarfile.open(shard) as tf:
            out += [tf.extractfile(m).read() for m in tf.getmembers() if m.name.endswith("." + ext)]
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    """CPU seconds of the fastest of ``repeat`` runs: other load on a shared machine only adds time."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=0.25, help="hours of speech (default: %(default)s)")
    ap.add_argument("--concat", type=int, default=5, help="demo utterances joined into one (default: %(default)s)")
    ap.add_argument("--bitrates", type=int, nargs="+", default=[16000, 32000, 64000], help="Opus bit/s")
    ap.add_argument("--per-shard", type=int, default=200, help="utterances per shard (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="timings: the best of this many (default: %(default)s)")
    ap.add_argument("--work", default="exp/bench_opus", help="corpus and shards, reused (default: %(default)s)")
    ap.add_argument("--markdown", help="also write the tables here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    from wdsprep.format.audio import audio_header, decode_audio, encode_audio
    from wdsprep.prep.fbank import Fbank, FbankOptions

    work = Path(args.work)
    data, hours = make_corpus(work, args.hours, args.concat)
    pcms = [sf.read(line.split(" ", 1)[1], dtype="int16")[0] for line in (data / "wav.scp").read_text().splitlines()]
    log(f"corpus: {len(pcms)} utterances, {hours:.3f} h; soundfile {sf.__version__}, libsndfile "
        f"{sf.__libsndfile_version__}")
    folders = {"FLAC (16-bit)": audio_shards(data, work / "flac", args.per_shard),
               "WAV (16-bit)": audio_shards(data, work / "wav", args.per_shard, "wav")}
    feats = feature_shards(data, work, args.per_shard)
    for b in args.bitrates:
        log(f"opus {b}")
        folders[f"Opus {b // 1000} kbit/s"] = opus_shards(data, work / f"opus-{b}", args.per_shard, b)
    sizes = {name: shard_bytes(d) for name, d in folders.items()}
    sizes |= {"float32 fbank": shard_bytes(feats["float32"]), "float16 fbank": shard_bytes(feats["float16"])}
    ref = sizes["float32 fbank"]

    fbank = Fbank(FbankOptions(backend="numpy"))
    dithered = Fbank(FbankOptions(backend="numpy", dither=1.0))
    lossless = [fbank(p.astype(np.float32)) for p in pcms]
    lossless_d = [dithered(p.astype(np.float32), np.random.default_rng(i)) for i, p in enumerate(pcms)]
    floor = float(np.log(np.finfo(np.float32).eps))

    def distance(a: list[np.ndarray], b: list[np.ndarray], keep: Callable[[np.ndarray], np.ndarray]) -> tuple:
        d = np.concatenate([np.abs(x - y)[keep(y)] for x, y in zip(a, b)])
        return float(d.max()), float(d.mean()), float(np.percentile(d, 99))

    def feature_stats(decoded: list[np.ndarray]) -> dict:
        feats = [fbank(d.astype(np.float32)) for d in decoded]
        feats_d = [dithered(d.astype(np.float32), np.random.default_rng(i)) for i, d in enumerate(decoded)]
        return {"all bins": distance(feats, lossless, lambda y: np.ones(y.shape, bool)),
                "bins above the floor": distance(feats, lossless, lambda y: y > floor + 1e-3),
                "dither 1.0 on both": distance(feats_d, lossless_d, lambda y: np.ones(y.shape, bool)),
                "moved": sum(len(d) != len(p) for d, p in zip(decoded, pcms))}

    flac = members(folders["FLAC (16-bit)"], "flac")
    rows = [("FLAC (16-bit)", best(lambda: [encode_audio(p, RATE, "flac") for p in pcms], args.repeat),
             best(lambda: [decode_audio(m, audio_header("flac", m, len(m))) for m in flac], args.repeat), None)]
    member_bytes = {"FLAC (16-bit)": sum(map(len, flac))}
    for b in args.bitrates:
        # libsndfile's encoder through soundfile, which the pack used before (complexity fixed at 10,
        # 20 ms packets): in the same run, the figures the pack's encoder is held to.
        name = f"Opus {b // 1000} kbit/s, libsndfile"
        opus = [libsndfile_opus(p, b) for p in pcms]
        decoded = [sf.read(io.BytesIO(m), dtype="int16")[0] for m in opus]
        rows.append((name, best(lambda b=b: [libsndfile_opus(p, b) for p in pcms], 1),
                     best(lambda opus=opus: [sf.read(io.BytesIO(m), dtype="int16") for m in opus], args.repeat),
                     feature_stats(decoded)))
    for b in args.bitrates:
        name = f"Opus {b // 1000} kbit/s"
        opus = members(folders[name], "opus")
        member_bytes[name] = sum(map(len, opus))
        decoded = [decode_audio(m, audio_header("opus", m, len(m))) for m in opus]
        rows.append((name, best(lambda b=b: [encode_audio(p, RATE, "opus", bitrate=b) for p in pcms], 1),
                     best(lambda opus=opus: [decode_audio(m, audio_header("opus", m, len(m))) for m in opus],
                          args.repeat), feature_stats(decoded)))
    lines = ["```sh", "python tools/bench/bench_opus.py " + " ".join(argv if argv is not None else sys.argv[1:]), "```",
             "", f"{hours:.3f} h of speech (espeak-ng, 16 kHz) in {len(pcms)} utterances; libsndfile "
             f"{sf.__libsndfile_version__}; one thread, best of {args.repeat} (encoding: 1).", "",
             "| shards | bytes per hour | vs float32 fbank | audio members alone, per hour |",
             "| --- | ---: | ---: | ---: |"]
    for name, n in sizes.items():
        alone = f"{member_bytes[name] / hours / 1e6:,.1f} MB" if name in member_bytes else ""
        lines.append(f"| {name} | {n / hours / 1e6:,.1f} MB | {n / ref:.3f} | {alone} |")
    lines += ["", "| codec | encode, CPU-s per hour of audio | decode, hours of audio per CPU-second | "
              "decoded length != encoded |", "| --- | ---: | ---: | ---: |"]
    for name, enc, dec, stats in rows:
        lines.append(f"| {name} | {enc / hours:.1f} | {hours / dec:.3f} | {stats['moved'] if stats else 0} of "
                     f"{len(pcms)} |")
    share = float(np.mean(np.concatenate([(f <= floor + 1e-3).ravel() for f in lossless])))
    lines += ["", f"fbank (numpy backend, 80 bins) of the decoded Opus against the lossless audio's; {share:.1%} of "
              f"the lossless bins are at the log floor ({floor:.2f}, digital silence).", "",
              "| codec | bins | max abs | mean abs | 99th percentile |", "| --- | --- | ---: | ---: | ---: |"]
    for name, _, _, stats in rows:
        for what, (worst, mean, p99) in ((k, v) for k, v in (stats or {}).items() if k != "moved"):
            lines.append(f"| {name} | {what} | {worst:.2f} | {mean:.3f} | {p99:.2f} |")
    text = "\n".join(lines) + "\n"
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
