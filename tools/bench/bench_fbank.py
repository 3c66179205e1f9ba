#!/usr/bin/env python
"""Real-time factors of ``fbank`` and ``pack-audio`` against the bare backend call, same audio, same run.

RTF = seconds of compute / seconds of audio (lower is faster). For each backend:

* ``bare``: the backend's fbank on waveforms already in memory (no reading, resampling or writing);
* ``fbank``/``pack-audio`` at ``--nj 1`` and ``--nj 2``: the whole job (read, decode, resample,
  fbank, write arks or shards), wall clock; "per process" multiplies by nj (CPU seconds spent
  per audio second if the workers kept their cores busy), and "x bare" is per-process RTF over
  the bare RTF, i.e. what the job costs on top of the feature computation itself.

Usage: python tools/bench/bench_fbank.py [--repeat 50] [--wav-scp wav.scp]
(default audio: the test clips under tests/data/audio, listed ``--repeat`` times).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from wdsprep import compute_fbank, pack_audio
from wdsprep.prep.audio import iter_waveforms, read_utterances
from wdsprep.prep.fbank import (
    BACKENDS,
    BackendUnavailable,
    Fbank,
    FbankOptions,
    one_torch_thread,
    resolve_backend,
)
from wdsprep.report import Report

ROOT = Path(__file__).resolve().parents[2]  # the repository: its test audio is the input


def make_scp(d: Path, repeat: int) -> Path:
    clips = sorted(p for p in (ROOT / "tests" / "data" / "audio").iterdir() if p.suffix != ".sh")
    scp = d / "wav.scp"
    scp.write_text("".join(f"r{i:04d}-{p.name} {p}\n" for i in range(repeat) for p in clips))
    return scp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--wav-scp", help="benchmark your own audio instead of the test clips")
    ap.add_argument("--rounds", type=int, default=3, help="each timing is the best of this many runs")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        scp = Path(args.wav_scp) if args.wav_scp else make_scp(d, args.repeat)
        utts = read_utterances(scp, None, Report())
        waves = [w for _, w in iter_waveforms(utts, sample_rate=16000, channel=0) if not hasattr(w, "reason")]
        seconds = sum(len(w) for w in waves) / 16000
        text = d / "text"
        text.write_text("".join(f"{u.uttid} some words\n" for u in utts))
        print(f"audio: {len(waves)} utterances, {seconds:.1f} s; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f} at start")
        def best(fn) -> float:
            """RTF of the fastest of --rounds runs: the least disturbed by other load on the machine."""
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return min(times) / seconds

        read = best(lambda: sum(1 for _ in iter_waveforms(utts, sample_rate=16000, channel=0)))
        print(f"reading + decoding + resampling alone: RTF {read:.5f}")
        rows = []
        for backend in BACKENDS:
            try:
                resolve_backend(backend)
            except BackendUnavailable as e:
                print(f"{backend}: skipped ({e})")
                continue
            fb = Fbank(FbankOptions(backend=backend))
            with one_torch_thread():  # as the jobs run it
                fb(waves[0])  # warm-up (first call allocates, loads kernels)
                bare = best(lambda: [fb(w) for w in waves])
            rows.append((backend, "bare backend call", 1, bare, bare, 1.0))
            for job in ("fbank", "pack-audio"):
                for nj in (1, 2):
                    out = d / f"{backend}-{job}-{nj}"
                    if job == "fbank":
                        wall = best(lambda: compute_fbank(scp, out, backend=backend, nj=nj, progress=False))
                    else:
                        wall = best(lambda: pack_audio(scp, [text], out, backend=backend, nj=nj, progress=False,
                                                       overwrite=True))
                    rows.append((backend, job, nj, wall, wall * nj, wall * nj / bare))
        print()
        print("| backend | path | nj | RTF (wall) | RTF per process | per process / bare |")
        print("| --- | --- | --- | --- | --- | --- |")
        for backend, job, nj, wall, per, ratio in rows:
            print(f"| {backend} | {job} | {nj} | {wall:.5f} | {per:.5f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
