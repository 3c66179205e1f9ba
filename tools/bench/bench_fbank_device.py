#!/usr/bin/env python
"""``wdsprep.Fbank`` (the torch module) against the numpy backend and kaldi-native-fbank, same audio, one sitting.

The audio is the bundled real-speech corpus (``egs/demo/data``, espeak-ng, 16 kHz), ``--concat``
utterances joined into one (about 5.5 s each by default) until ``--seconds`` of speech, held in
memory as the loader's readers hold waveforms (float32 in the int16 range).  The per-utterance
backends run utterance by utterance; the module runs on padded batches cut as the loader cuts
them (utterances sorted by length, each batch at most ``--max-frames`` padded frames), so its
figures include the padding's cost.

Reported, per contender: hours of audio per CPU-second (``time.process_time`` of the process, torch
and every numpy library on one thread: per core), the best of ``--repeat`` rounds with the
contenders rotated each round (other load on a shared machine only adds time), and the ratio to
the numpy backend; then each module's largest and mean difference from the numpy backend.

``--device cuda`` adds the module on the GPU: hours of audio per GPU-second (wall time of the
forward passes, synchronized, the batches already on the device; and with the host-to-device copy
of each batch), and its difference from the numpy backend there, in float64 and float32.

    python tools/bench/bench_fbank_device.py [--seconds 600] [--repeat 3] [--device cuda] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
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


def make_audio(seconds: float, concat: int) -> list[np.ndarray]:
    """``seconds`` of speech: the demo utterances, ``concat`` at a time joined (a stride varies the pairs)."""
    utts = []
    for part in ("train", "dev"):
        for line in (DEMO / part / "wav.scp").read_text().splitlines():
            utts.append(sf.read(DEMO.parent / line.split(" ", 1)[1], dtype="int16")[0])
    out, total, k = [], 0, 0
    while total < seconds * RATE:
        pcm = np.concatenate([utts[(k * concat + j * 7) % len(utts)] for j in range(concat)]).astype(np.float32)
        out.append(pcm)
        total += len(pcm)
        k += 1
    return out


def batches(waves: list[np.ndarray], max_frames: int) -> list[list[int]]:
    """Indices of the utterances in batches of at most ``max_frames`` padded frames, longest first."""
    from wdsprep.units import fbank_frames

    order = sorted(range(len(waves)), key=lambda i: -len(waves[i]))
    out: list[list[int]] = []
    for i in order:
        longest = fbank_frames(len(waves[out[-1][0]]), RATE) if out else 0
        if out and longest * (len(out[-1]) + 1) <= max_frames:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def padded(waves: list[np.ndarray], idx: list[int], dtype):
    import torch

    longest = max(len(waves[i]) for i in idx)
    audio = torch.zeros(len(idx), longest, dtype=dtype)
    for j, i in enumerate(idx):
        audio[j, :len(waves[i])] = torch.from_numpy(waves[i])
    return audio, torch.tensor([len(waves[i]) for i in idx])


@dataclass
class Contender:
    name: str
    run: Callable[[], None] | None
    why: str = ""
    seconds: list[float] = field(default_factory=list)


def per_utterance(name: str, backend: str, waves: list[np.ndarray]) -> Contender:
    from wdsprep.prep.fbank import BackendUnavailable, Fbank, FbankOptions

    try:
        fb = Fbank(FbankOptions(backend=backend))
    except BackendUnavailable as e:
        return Contender(name, None, f"skipped: {e}")
    return Contender(name, lambda: [fb(w) for w in waves] and None)


def module_cpu(name: str, waves: list[np.ndarray], groups: list[list[int]], dtype) -> Contender:
    """The module on the CPU over ready padded batches (the loader would hand them so)."""
    import torch

    from wdsprep.device import Fbank

    module = Fbank()
    ready = [padded(waves, g, dtype) for g in groups]

    def run() -> None:
        with torch.inference_mode():
            for audio, lens in ready:
                module(audio, lens)

    return Contender(name, run)


def measure(contenders: list[Contender], repeat: int, log: Callable[[str], None]) -> None:
    live = [c for c in contenders if c.run is not None]
    for c in live:  # warm: imports, FFT plans, allocator (untimed)
        c.run()
    for r in range(repeat):
        for c in live[r % len(live):] + live[:r % len(live)]:
            t = time.process_time()
            c.run()
            c.seconds.append(time.process_time() - t)
            log(f"round {r}: {c.name}: {c.seconds[-1]:.3f} CPU-s")


def differences(waves: list[np.ndarray], groups: list[list[int]], device: str) -> list[tuple[str, float, float, bool]]:
    """(dtype, max abs, mean abs, frame counts all as units.fbank_frames) of the module on ``device``
    against the numpy backend, every utterance."""
    import torch

    from wdsprep.device import Fbank
    from wdsprep.prep.fbank import Fbank as NumpyFbank
    from wdsprep.prep.fbank import FbankOptions
    from wdsprep.units import fbank_frames

    ref = NumpyFbank(FbankOptions(backend="numpy"))
    module = Fbank().to(device)
    out = []
    for dtype in (torch.float64, torch.float32):
        worst, total, count, frames_ok = 0.0, 0.0, 0, True
        for g in groups:
            audio, lens = padded(waves, g, dtype)
            feats, feat_lens = module(audio.to(device), lens.to(device))
            feats, feat_lens = feats.cpu().double().numpy(), feat_lens.cpu().numpy()
            for j, i in enumerate(g):
                frames_ok &= int(feat_lens[j]) == int(fbank_frames(len(waves[i]), RATE))
                d = np.abs(feats[j, :feat_lens[j]] - ref(waves[i]))
                worst, total, count = max(worst, float(d.max())), total + float(d.sum()), count + d.size
        out.append((str(dtype).replace("torch.", ""), worst, total / count, frames_ok))
    return out


def cuda_rates(waves: list[np.ndarray], groups: list[list[int]], repeat: int) -> list[tuple[str, float]]:
    """Seconds of GPU wall time per pass: the batches already on the GPU, and copied there each pass."""
    import torch

    from wdsprep.device import Fbank

    module = Fbank().cuda()
    host = [padded(waves, g, torch.float32) for g in groups]
    host = [(a.pin_memory(), n.pin_memory()) for a, n in host]
    ready = [(a.cuda(), n.cuda()) for a, n in host]

    def on_device() -> None:
        for audio, lens in ready:
            module(audio, lens)

    def copied() -> None:
        for audio, lens in host:
            module(audio.cuda(non_blocking=True), lens.cuda(non_blocking=True))

    out = []
    for name, fn in (("GPU, batches on the device", on_device), ("GPU, each batch copied from pinned memory", copied)):
        with torch.inference_mode():
            fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t)
        out.append((name, best))
    return out


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600, help="seconds of speech (default: %(default)s)")
    ap.add_argument("--concat", type=int, default=5, help="demo utterances joined into one (default: %(default)s)")
    ap.add_argument("--max-frames", type=int, default=20000, help="padded frames per batch (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best is reported (default: %(default)s)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: also the module on the GPU")
    ap.add_argument("--markdown", help="also write the tables here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    import torch

    torch.set_num_threads(1)
    waves = make_audio(args.seconds, args.concat)
    hours = sum(map(len, waves)) / RATE / 3600
    groups = batches(waves, args.max_frames)
    longest = [max(len(waves[i]) for i in g) for g in groups]
    padding = sum(map(len, waves)) / sum(n * len(g) for n, g in zip(longest, groups))
    log(f"audio: {len(waves)} utterances, {hours * 3600:.0f} s, {len(groups)} batches (padding efficiency "
        f"{padding:.3f}); load average {os.getloadavg()[0]:.1f}")
    contenders = [per_utterance("numpy backend (the loader's), per utterance", "numpy", waves),
                  per_utterance("kaldi-native-fbank, per utterance", "kaldi-native-fbank", waves),
                  module_cpu("wdsprep.Fbank on CPU, float32 batches", waves, groups, torch.float32),
                  module_cpu("wdsprep.Fbank on CPU, float64 batches", waves, groups, torch.float64)]
    measure(contenders, args.repeat, log)
    base = hours / min(contenders[0].seconds)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["```sh", f"python tools/bench/bench_fbank_device.py {command}", "```", "",
             f"{hours * 3600:.0f} s of speech in {len(waves)} utterances ({len(groups)} batches of <= "
             f"{args.max_frames} padded frames, padding efficiency {padding:.3f}); one thread per library; best of "
             f"{args.repeat} rounds.", "", "| fbank | hours of audio per CPU-second | x real time per core | "
             "vs numpy backend |", "| --- | ---: | ---: | ---: |"]
    for c in contenders:
        if not c.seconds:
            lines.append(f"| {c.name} | {c.why} | | |")
            continue
        h = hours / min(c.seconds)
        lines.append(f"| {c.name} | {h:.4f} | {h * 3600:,.0f} | {h / base:.2f}x |")
    if args.device == "cuda":
        lines += ["", f"GPU: {torch.cuda.get_device_name()}", "", "| wdsprep.Fbank, float32 | hours of audio per "
                  "GPU-second | x real time | vs numpy backend per CPU-second |", "| --- | ---: | ---: | ---: |"]
        for name, seconds in cuda_rates(waves, groups, args.repeat):
            lines.append(f"| {name} | {hours / seconds:.2f} | {hours * 3600 / seconds:,.0f} | "
                         f"{hours / seconds / base:.0f}x |")
    devices = ["cpu"] + (["cuda"] if args.device == "cuda" else [])
    lines += ["", "| against the numpy backend | dtype | max abs | mean abs | frame counts = units.fbank_frames |",
              "| --- | --- | ---: | ---: | --- |"]
    for device in devices:
        for dtype, worst, mean, ok in differences(waves, groups, device):
            lines.append(f"| wdsprep.Fbank on {device} | {dtype} | {worst:.2e} | {mean:.2e} | "
                         f"{'yes' if ok else 'NO'} |")
    text = "\n".join(lines) + "\n"
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
