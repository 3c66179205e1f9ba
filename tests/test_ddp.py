"""Multi-rank behaviour for real: torchrun with the gloo backend on CPU, under a timeout.

A hang (e.g. one rank waiting in the quit-flag all-reduce forever) fails the test through
``subprocess.run(timeout=...)`` instead of stalling CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from shardsets import build, train_char_tokenizer

HERE = Path(__file__).resolve().parent
TIMEOUT = 150


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Two length groups with different shard sizes: 11 shards of uneven frame totals."""
    root = tmp_path_factory.mktemp("ddp")
    out, utts = build(root, n=260, utts_per_shard=29, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return root, out, utts, tok


def run_torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    """torchrun in its own session, so a hang kills the whole process group (ranks and workers)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / "ddp_worker.py"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun --nproc_per_node={nproc} {' '.join(args)} hung for {TIMEOUT}s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int, out: Path, trset: str, tok: Path, *extra: str) -> list[dict]:
    proc = run_torchrun(nproc, "--trset", trset, "--tokenizer", str(tok), "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_train(ranks: list[dict], utts: dict) -> None:
    nproc = len(ranks)
    for e in range(len(ranks[0]["epochs"])):
        epochs = [r["epochs"][e] for r in ranks]
        steps = [ep["steps"] for ep in epochs]
        assert len(set(steps)) == 1 and steps[0] > 0, f"epoch {e}: unequal steps per rank {steps}"
        assert all(len(ep["batches"]) == ep["steps"] for ep in epochs)
        seen = Counter(k for ep in epochs for b in ep["batches"] for k in b)
        assert max(seen.values()) == 1, f"epoch {e}: utterances on two ranks: {[k for k, c in seen.items() if c > 1][:5]}"
        assert set(seen) <= set(utts)
        # The early stop's loss is reported, identically on every rank, and adds up.
        discarded = {ep["stats"]["discarded"] for ep in epochs}
        assert len(discarded) == 1
        (d,) = discarded
        assert d == len(utts) - len(seen)
        assert {ep["stats"]["discarded_fraction"] for ep in epochs} == {d / len(utts)}
        assert d < len(utts) / 2, f"early stop discarded {d} of {len(utts)}: ranks were not balanced"
    # The shard assignment changes between epochs, so does what the early stop discards.
    if nproc > 1 and len(ranks[0]["epochs"]) > 1:
        first = {k for b in ranks[0]["epochs"][0]["batches"] for k in b}
        second = {k for b in ranks[0]["epochs"][1]["batches"] for k in b}
        assert first != second


@pytest.mark.parametrize("nproc,workers", [(3, 0), (3, 2), (2, 2)])
def test_train_ranks_end_together(uneven, tmp_path, nproc, workers):
    _, out, utts, tok = uneven
    ranks = torchrun(nproc, tmp_path / "o", f"{out}/{{0_150,150_inf}}/data-*.tar", tok,
                     "--num-workers", str(workers), "--epochs", "2")
    check_train(ranks, utts)


def test_train_is_deterministic_across_runs(uneven, tmp_path):
    _, out, utts, tok = uneven
    a = torchrun(2, tmp_path / "a", f"{out}/*/data-*.tar", tok, "--epochs", "1")
    b = torchrun(2, tmp_path / "b", f"{out}/*/data-*.tar", tok, "--epochs", "1")
    assert [r["epochs"][0]["batches"] for r in a] == [r["epochs"][0]["batches"] for r in b]


def test_every_rank_resumes_from_rank_0s_state(uneven, tmp_path):
    """A checkpoint holds rank 0's state_dict(); loaded on every rank of a new job, each rank yields
    exactly the batches it had left, and all still stop together with the epoch's stats whole."""
    _, out, utts, tok = uneven
    trset = f"{out}/*/data-*.tar"
    a = torchrun(2, tmp_path / "a", trset, tok, "--epochs", "1", "--num-workers", "2", "--save-at", "5")
    saved = a[0]["epochs"][0]["saved"]
    assert (saved["epoch"], saved["step"], saved["complete"]) == (0, 5, False)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(saved))
    b = torchrun(2, tmp_path / "b", trset, tok, "--epochs", "1", "--num-workers", "2", "--resume", str(state))
    for before, after in zip(a, b):
        full, rest = before["epochs"][0], after["epochs"][0]
        assert len(full["batches"]) > 8 and rest["batches"] == full["batches"][5:]
        assert rest["steps"] == full["steps"]
        for k in ("utterances", "read", "dropped", "real_frames", "padded_frames", "discarded"):
            assert rest["stats"][k] == full["stats"][k], k


def test_dev_mode_reads_each_utterance_once(uneven, tmp_path):
    _, out, utts, tok = uneven
    ranks = torchrun(3, tmp_path / "o", f"{out}/*/data-*.tar", tok, "--dev", "--epochs", "1", "--num-workers", "2")
    seen = Counter(k for r in ranks for b in r["epochs"][0]["batches"] for k in b)
    assert set(seen) == set(utts) and max(seen.values()) == 1


def test_fewer_shards_than_ranks_is_a_clear_error(uneven, tmp_path):
    _, out, utts, tok = uneven
    proc = run_torchrun(3, "--trset", f"{out}/150_inf/data-0000{{0,1}}.tar", "--tokenizer", str(tok),
                        "--out", str(tmp_path))
    assert proc.returncode != 0
    assert "2 shards" in proc.stderr and "3 ranks" in proc.stderr and "--utts-per-shard" in proc.stderr
