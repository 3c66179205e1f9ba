#!/usr/bin/env python3
"""Memory over weeks: the resident memory of a loader's main process and each worker over many epochs.

    python tools/bench/bench_longrun.py [--epochs 30] [--hours 1.0] [--workers 2] [--http] [--work DIR]

Audio shards (``bench_audio.py``'s corpus: the bundled espeak-ng speech, ``--hours`` of it, FLAC,
50 utterances a shard, one stream per worker) read for ``--epochs`` epochs by one loader with speed perturbation
(0.9/1.0/1.1, drawn by the plan) and SpecAugment, fbank computed by ``--workers`` persistent
workers; with ``--http`` the shards come from a web server (Python's ``http.server``, in a process
of its own), through the remote read path (downloads into reused memory buffers, read-ahead
sized to the store).  After every epoch: the resident memory (VmRSS) of the main process and of
each worker.  A loader that leaks grows epoch after epoch; the figure that matters is the growth
from the end of epoch 1 (buffers, pools and caches filled) to the end of the last (target: at
most 2%), and, since what a process holds at an epoch's end moves by a batch or two, the growth
from the median of the first five epochs after the first to the median of the last five.  One
run; the machine's other load does not move memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_audio import audio_shards, make_corpus  # noqa: E402

AUGMENT = {"speed": {"factors": [0.9, 1.0, 1.1]}, "specaugment": {}}


def rss_mb(pid: int | str = "self") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def workers_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (a loader's DataLoader workers), in order of their ids."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            found += [int(p) for p in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except OSError:
            pass
    return sorted(found)


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    """``python -m http.server`` on ``folder``, on a free port of 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--http", action="store_true", help="read the shards from a web server")
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-longrun"))
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    import wdsprep

    data, hours = make_corpus(args.work, args.hours, 5)
    shards = audio_shards(data, args.work / f"flac-{args.hours}", 50)
    n = len(list(shards.glob("data-*.tar")))
    tok = args.work / "char.json"
    if not tok.exists():
        wdsprep.train_tokenizer("char", [data / "text"], tok)
    server = None
    trset = f"{shards}/data-*.tar"
    if args.http:
        server, url = serve(shards)
        trset = f"{url}/data-{{00000..{n - 1:05d}}}.tar"
    try:
        loader = wdsprep.make_loader(trset, str(tok), max_frames=20000, seed=0, num_workers=args.workers,
                                     streams=max(1, args.workers), augment=AUGMENT)
        print(f"[longrun] {hours:.2f} h of FLAC in {n} shards{' over HTTP' if args.http else ''}, speed 0.9/1.0/1.1 "
              f"+ SpecAugment, {args.workers} workers, {args.epochs} epochs", flush=True)
        rows = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            utts = sum(len(b.keys) for b in loader)
            workers = [p for p in workers_of(os.getpid()) if server is None or p != server.pid]
            row = [rss_mb()] + [rss_mb(p) for p in workers]
            rows.append(row)
            print(f"[longrun] epoch {epoch + 1:2d}: {utts} utterances in {time.perf_counter() - t0:.1f} s; RSS main "
                  f"{row[0]:.1f} MB, workers {', '.join(f'{x:.1f}' for x in row[1:])} MB", flush=True)
        # What a process holds at an epoch's end moves by a batch or two (~10 MB), epoch to epoch: the
        # trend is read from the medians of the first and the last five epochs after the first.
        names = ["main"] + [f"worker {k}" for k in range(len(rows[-1]) - 1)]
        span = max(1, min(5, (len(rows) - 1) // 2))
        print(f"\n| process | RSS after epoch 1 (MB) | after epoch {args.epochs} (MB) | growth after epoch 1 | median "
              f"of epochs 2-{span + 1} / of the last {span} (MB) | their growth | most (MB) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for k, name in enumerate(names):
            first, last = rows[0][k], rows[-1][k]
            early = statistics.median(r[k] for r in rows[1:1 + span])
            late = statistics.median(r[k] for r in rows[-span:])
            most = max(r[k] for r in rows if k < len(r))
            print(f"| {name} | {first:.1f} | {last:.1f} | {(last - first) / first:+.2%} | {early:.1f} / {late:.1f} "
                  f"| {(late - early) / early:+.2%} | {most:.1f} |")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
