"""The whole pipeline on the bundled real-speech corpus, summarized at a glance (``make demo``).

fbank -> pack into length groups -> train a tokenizer -> loader dry-run on 1 rank and on
``nproc`` ranks (``torchrun``, gloo on CPU) -> a summary and plots.  Every step is the public
API a user would call; nothing here is demo-only logic but the choice of settings, and the
packing options are the recipe's own (``egs/demo/conf/pack.conf``).

    python tools/demo.py [--work exp/demo] [--nproc 2] [--nj 2]     (or: wdsprep demo, from a clone)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from wdsprep import compute_fbank, inspect_shards, pack_data, train_tokenizer
from wdsprep.check.dryrun import dry_run
from wdsprep.plan.stats import efficiency

# The recipe directory: wav.scp paths in the bundled corpus are relative to it (Kaldi-style).
DEMO_DIR = Path(__file__).resolve().parent.parent / "egs" / "demo"
MAX_FRAMES = 2000  # padded frames per rank batch
PLOT_MAX_FRAMES = (500, 1000, 2000, 4000, 8000)  # the padding-efficiency curve, at this corpus's scale
VOCAB_SIZE = 200  # sentencepiece unigram over English words + Mandarin characters
DRY_RUN_TIMEOUT = 600  # seconds; a hang fails the demo instead of stalling it


def pack_options(conf: Path = DEMO_DIR / "conf" / "pack.conf") -> tuple[list[str], int]:
    """(length groups, utterances per shard) from the recipe's ``--filter-group`` / ``--utts-per-shard`` lines."""
    opts = {}
    for line in conf.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, *values = line.split()
            opts[name] = values
    return opts["--filter-group"], int(opts["--utts-per-shard"][0])


def absolute_wav_scp(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with its relative paths resolved against the recipe dir, so any cwd works."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for line in src.read_text(encoding="utf-8").splitlines():
        recid, path = line.split(maxsplit=1)
        if not path.endswith("|") and not os.path.isabs(path):
            path = str(DEMO_DIR / path)
        lines.append(f"{recid} {path}\n")
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


def _stage(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _dry_run_ranks(trset: str, tokenizer: Path, nproc: int, stats_json: Path) -> list[dict]:
    """The dry-run under torchrun on ``nproc`` ranks; returns each rank's stats of epoch 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "wdsprep", "dry-run", "--trset", trset, "--tokenizer", str(tokenizer),
           "--max-frames", str(MAX_FRAMES), "--stats-json", str(stats_json)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        subprocess.run(cmd, check=True, timeout=DRY_RUN_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {nproc}-rank dry-run did not finish in {DRY_RUN_TIMEOUT} s: {' '.join(cmd)}") from None
    return json.loads(stats_json.read_text(encoding="utf-8"))[0]


def run_demo(work: str | os.PathLike = "exp/demo", *, nproc: int = 2, nj: int = 2,
             corpus: str | os.PathLike | None = None) -> dict:
    """Run the pipeline into ``work`` (re-running replaces its outputs); returns the summary numbers."""
    work = Path(work)
    data = Path(corpus) if corpus else DEMO_DIR / "data"
    if not (data / "train" / "wav.scp").is_file():
        raise FileNotFoundError(f"no bundled corpus at {data}: egs/demo/data of the wdsprep repository")
    started = time.perf_counter()

    _stage("fbank: 80-bin Kaldi fbank for train and dev")
    feats = {}
    for part in ("train", "dev"):
        wav_scp = absolute_wav_scp(data / part / "wav.scp", work / "data" / part / "wav.scp")
        compute_fbank(wav_scp, work / "fbank" / part, nj=nj, strict=True)
        feats[part] = work / "fbank" / part / "feats.scp"

    groups, utts_per_shard = pack_options()
    _stage(f"pack: train into length groups {' '.join(groups)}, dev into one folder")
    shards = work / "shards"
    train_report = pack_data(feats["train"], data / "train" / "text", shards / "train", filter_group=groups,
                             utts_per_shard=utts_per_shard, utt2spk=data / "train" / "utt2spk", nj=nj, overwrite=True)
    pack_data(feats["dev"], data / "dev" / "text", shards / "dev", utts_per_shard=utts_per_shard,
              utt2spk=data / "dev" / "utt2spk", overwrite=True)
    folders = ",".join(name for name, g in train_report.groups.items() if g["shards"])
    trset = f"{shards / 'train'}/{{{folders}}}/data-*.tar"

    _stage(f"tokenizer: sentencepiece unigram, {VOCAB_SIZE} pieces")
    tokenizer = work / "tokenizer.json"
    tok = train_tokenizer("sentencepiece", [data / "train" / "text"], tokenizer, vocab_size=VOCAB_SIZE,
                          overwrite=True)
    print(f"{tokenizer}: vocab_size {tok.vocab_size}")

    _stage(f"inspect: lengths and padding efficiency per group -> {work / 'shards.png'}")
    inspected = inspect_shards(trset, plot=str(work / "shards.png"), max_frames_list=PLOT_MAX_FRAMES)
    print(inspected.format(per_shard=False))

    _stage(f"dry-run: the training loader over {trset}, 1 rank")
    one = dry_run(trset=trset, tokenizer=str(tokenizer), max_frames=MAX_FRAMES)[0]
    _stage(f"dry-run: {nproc} ranks under torchrun (gloo)")
    many = _dry_run_ranks(trset, tokenizer, nproc, work / f"dry_run_{nproc}ranks.json")

    summary = {
        "groups": train_report.groups,
        "trset": trset,
        "tokenizer": {"path": str(tokenizer), "vocab_size": tok.vocab_size},
        "dry_run": {"1": _rank_summary([one]), str(nproc): _rank_summary(many)},
        "plot": str(work / "shards.png"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(format_summary(summary))
    return summary


def _rank_summary(ranks: list[dict]) -> dict:
    real = sum(r["real_frames"] for r in ranks)
    padded = sum(r["padded_frames"] for r in ranks)
    seconds = max(r["seconds"] for r in ranks)
    utts = sum(r["utterances"] for r in ranks)
    return {
        "batches": sum(r["steps"] for r in ranks),
        "utterances": utts,
        "steps_per_rank": [r["steps"] for r in ranks],
        "padding_efficiency": round(efficiency(real, padded), 4),
        "utterances_per_s": round(utts / seconds) if seconds else None,
        "discarded_fraction": ranks[0]["discarded_fraction"],
    }


def format_summary(s: dict) -> str:
    """The table a person reads at a glance."""
    lines = ["", "== wdsprep demo: summary", f"{'group':<12}{'utterances':>11}{'hours':>8}{'shards':>8}"]
    for name, g in s["groups"].items():
        lines.append(f"{name:<12}{g['utterances']:>11}{g['hours']:>8.3f}{g['shards']:>8}")
    lines.append(f"tokenizer: sentencepiece, {s['tokenizer']['vocab_size']} ids ({s['tokenizer']['path']})")
    lines.append(f"{'ranks':<7}{'batches':>8}{'utts':>7}{'steps/rank':>14}{'padding eff':>13}{'utts/s':>9}"
                 f"{'discarded':>11}")
    for ranks, d in s["dry_run"].items():
        disc = "-" if d["discarded_fraction"] is None else f"{d['discarded_fraction']:.1%}"
        lines.append(f"{ranks:<7}{d['batches']:>8}{d['utterances']:>7}{str(d['steps_per_rank']):>14}"
                     f"{d['padding_efficiency']:>13.3f}{d['utterances_per_s']:>9,}{disc:>11}")
    lines.append(f"plots: {s['plot']}   numbers: {Path(s['plot']).parent / 'summary.json'}   ({s['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # `wdsprep demo` runs this script under its own name (wdsprep.cli.PROG_VARIABLE).
    p = argparse.ArgumentParser(prog=os.environ.get("WDSPREP_PROG", "python tools/demo.py"),
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="exp/demo", help="output directory, replaced on re-runs (default: %(default)s)")
    p.add_argument("--nproc", type=int, default=2, help="ranks for the multi-rank dry-run (default: %(default)s)")
    p.add_argument("--nj", type=int, default=2, help="worker processes for fbank and pack (default: %(default)s)")
    args = p.parse_args(argv)
    run_demo(args.work, nproc=args.nproc, nj=args.nj)
    return 0


if __name__ == "__main__":
    sys.exit(main())
