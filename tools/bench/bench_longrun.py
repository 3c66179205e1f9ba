#!/usr/bin/env python3
"""Memory over weeks: the resident memory of a loader's main process and each worker over many epochs.

    python tools/bench/bench_longrun.py [--epochs 30] [--hours 1.0] [--workers 2] [--http] [--work DIR]

Audio shards (``bench_audio.py``'s corpus: the bundled espeak-ng speech, ``--hours`` of it, FLAC,
50 utterances a shard, one stream per worker) read for ``--epochs`` epochs by one loader with speed perturbation
(0.9/1.0/1.1, drawn by the plan) and SpecAugment, fbank computed by ``--workers`` persistent
workers; with ``--http`` the shards come from a web server (Python's ``http.server``, in a process
of its own), through the remote read path (downloads into reused memory buffers, read-ahead
sized to the store).  After every epoch: the resident memory (VmRSS) of the main process and of
each worker, split into its private memory (RssAnon: heaps, Python objects) and the shared
memory it has touched (RssShmem: a worker's pool of batch buffers, ``POOL_SLOTS`` slots of at most
1.125 batches each, touched slot by slot as the trainer's pace lets the rotation deepen; bounded by
``max_frames``, not by time).  A loader that leaks grows its private memory epoch after epoch; the
figure that matters is its growth from the end of epoch 1 to the end of the last (target: at most
2%), and, since what a process holds at an epoch's end moves by a batch or two, the growth of its
highest value over the first five epochs to the last five's.  One run; the machine's other load
does not move memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_audio import audio_shards, make_corpus  # noqa: E402

AUGMENT = {"speed": {"factors": [0.9, 1.0, 1.1]}, "specaugment": {}}


def memory_mb(pid: int | str = "self") -> dict[str, float]:
    """Resident memory of a process in MB: ``rss`` in all, ``private`` (RssAnon), ``shared`` (RssShmem)."""
    kb = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            kb[key] = int(value.split()[0])
    return {"rss": kb["VmRSS"] / 1024, "private": kb["RssAnon"] / 1024, "shared": kb["RssShmem"] / 1024}


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


def report(rows: list[list[dict[str, float]]], epochs: int) -> None:
    """The table, per process: private memory after epoch 1 and the last, and its growth; what a
    process holds at an epoch's end moves by a batch or two, so also the growth of its highest
    value over the first five epochs to the last five's (a leak raises it); the shared pool it has
    touched; its RSS in all."""
    names = ["main"] + [f"worker {k}" for k in range(len(rows[-1]) - 1)]
    span = max(1, min(5, len(rows) // 2))
    print(f"\n| process | private after epoch 1 / {epochs} (MB) | growth | highest private, epochs 1-{span} / "
          f"last {span} (MB) | growth | shared pool after epoch 1 / {epochs} (MB) | RSS after epoch 1 / {epochs} "
          "(MB) | most RSS (MB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, name in enumerate(names):
        private = [r[k]["private"] for r in rows if k < len(r)]
        first, last = rows[0][k], rows[-1][k]
        early, late = max(private[:span]), max(private[-span:])
        growth, high = (private[-1] - private[0]) / private[0], (late - early) / early
        print(f"| {name} | {private[0]:.1f} / {private[-1]:.1f} | {growth:+.2%} | {early:.1f} / {late:.1f} | "
              f"{high:+.2%} | {first['shared']:.1f} / {last['shared']:.1f} | {first['rss']:.1f} / {last['rss']:.1f} | "
              f"{max(r[k]['rss'] for r in rows if k < len(r)):.1f} |")


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
        rows: list[list[dict[str, float]]] = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            utts = sum(len(b.keys) for b in loader)
            workers = [p for p in workers_of(os.getpid()) if server is None or p != server.pid]
            row = [memory_mb()] + [memory_mb(p) for p in workers]
            rows.append(row)
            shown = ", ".join(f"{m['rss']:.1f} ({m['private']:.1f} + {m['shared']:.1f})" for m in row[1:])
            print(f"[longrun] epoch {epoch + 1:2d}: {utts} utterances in {time.perf_counter() - t0:.1f} s; RSS main "
                  f"{row[0]['rss']:.1f} MB, workers (private + shared) {shown} MB", flush=True)
        report(rows, args.epochs)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
