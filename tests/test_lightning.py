"""Under a real ``lightning.Trainer`` the loader resumes as torchdata's StatefulDataLoader does: a run
stopped at step k of an epoch and resumed with ``Trainer.fit(..., ckpt_path=...)`` delivers, with the
first part, every batch of the epoch once, those of an uninterrupted run, on one process and on two
DDP ranks (gloo, torchrun), with no "not resumable" warning; a checkpoint of two ranks resumes on one,
and one of one process on two (its state loaded in ``on_load_checkpoint``, as docs/trainers.md says).

The uninterrupted run is the loader's plan: the batches plain loaders give each rank (``rank=``,
``world_size=``) without Lightning.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep import make_loader

pytest.importorskip("lightning")  # the [lightning] extra; `make test` installs it

HERE = Path(__file__).resolve().parent
KW = dict(max_frames=800, seed=3, shuffle_buffer=20, streams=4)
EPOCHS = 2
TIMEOUT = 240  # seconds for a torchrun launch: a hang fails the test


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("lightning")
    out, utts = build(root, n=120, utts_per_shard=20)
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return f"{out}/data-*.tar", str(tok), set(utts)


def planned(trset: str, tok: str, world: int, epoch: int, state: dict | None = None) -> list[list[list[str]]]:
    """Every rank's batches (keys) of ``epoch``: the uninterrupted run's (from ``state`` on, with one)."""
    out = []
    for rank in range(world):
        loader = make_loader(trset, tok, rank=rank, world_size=world, **KW)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(epoch)
        out.append([list(b.keys) for b in loader])
    return out


def steps(out: Path, mode: str, rank: int) -> list[tuple[int, int, list[str]]]:
    path = out / f"{mode}.rank{rank}.jsonl"
    return [tuple(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def check_resumed(out: Path, reference: list[list[list[list[str]]]], stop_at: int) -> None:
    """Each rank: the stopped run took the first ``stop_at`` batches of the plan, the resumed run the
    rest of that epoch and the next, with Lightning's batch indices running on from the stop."""
    first_len = len(reference[0][0])
    for rank, epochs in enumerate(reference):
        expected = [(e, i, keys) for e, batches in enumerate(epochs) for i, keys in enumerate(batches)]
        stopped, resumed = steps(out, "stop", rank), steps(out, "resume", rank)
        assert [tuple(s) for s in stopped] == [tuple(x) for x in expected[:stop_at]]
        assert [tuple(s) for s in resumed] == [tuple(x) for x in expected[stop_at:]], \
            f"rank {rank}: resumed at step {stop_at - first_len} of epoch 1"


def test_batch_keeps_its_corpus_when_lightning_moves_it(corpus):
    from lightning.fabric.utilities.apply_func import move_data_to_device

    trset, tok, _ = corpus
    head = trset.replace("data-*", "data-0000[0-2]")
    loader = make_loader({"a": head, "b": trset.replace("data-*", "data-0000[3-5]")}, tok, **KW)
    batch = next(b for b in loader if b.corpus.sum() > 0)  # from corpus "b": 1 each
    moved = move_data_to_device(batch, "cpu")
    assert type(moved) is type(batch) and moved.keys == batch.keys
    assert moved.corpus.equal(batch.corpus) and moved.feats.equal(batch.feats)


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory):
    """One process stopped at step 5 of epoch 1 and resumed: its folder, the plan, what it warned."""
    from lightning_worker import run

    trset, tok, _ = corpus
    out = tmp_path_factory.mktemp("one")
    reference = [[planned(trset, tok, 1, 0)[0], planned(trset, tok, 1, 1)[0]]]  # rank 0: [epoch 0, epoch 1]
    stop_at = len(reference[0][0]) + 5
    said = run(trset, tok, out, mode="stop", epochs=EPOCHS, stop_at=stop_at, loader_kw=KW)
    ckpt = sorted((out / "ckpt").glob("*.ckpt"))
    assert len(ckpt) == 1
    said += run(trset, tok, out, mode="resume", epochs=EPOCHS, ckpt=str(ckpt[0]), loader_kw=KW)
    return out, reference, stop_at, said, ckpt[0]


def test_a_run_stopped_mid_epoch_resumes_from_its_checkpoint_on_one_process(corpus, one_process):
    _, _, utts = corpus
    out, reference, stop_at, said, _ = one_process
    check_resumed(out, reference, stop_at)
    epoch1 = Counter(k for e, _, keys in steps(out, "stop", 0) + steps(out, "resume", 0) if e == 1 for k in keys)
    assert set(epoch1.values()) == {1} and set(epoch1) <= utts and len(epoch1) > 0.9 * len(utts)
    assert not [w for w in said if "not resumable" in w or "stopped asking" in w], said


def torchrun(nproc: int, out: Path, *args: str) -> subprocess.CompletedProcess:
    from test_ddp import run_torchrun

    proc = run_torchrun(nproc, "--out", str(out), *args, script="lightning_worker.py", timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def saved_state(ckpt: Path) -> dict:
    """The loader's state in a Lightning checkpoint (where Lightning 2 keeps it)."""
    import torch

    return torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


@pytest.mark.slow
def test_two_ddp_ranks_stopped_mid_epoch_resume_and_resize(corpus, one_process, tmp_path):
    """Two ranks stop at step 3 of epoch 1 and resume, then resume the one-process run's checkpoint
    (one torchrun launch; a fresh Trainer, module and loader each time); then the two ranks'
    checkpoint resumes on one process.  Each resume: the rest of the epoch, each planned batch once,
    dealt anew on another world size (onto more ranks with the state loaded in on_load_checkpoint)."""
    from lightning_worker import run

    trset, tok, _ = corpus
    reference = [[a, b] for a, b in zip(planned(trset, tok, 2, 0), planned(trset, tok, 2, 1))]
    stop_at = len(reference[0][0]) + 3
    one_ckpt = one_process[4]
    proc = torchrun(2, tmp_path / "ddp", "--trset", trset, "--tokenizer", tok, "--epochs", str(EPOCHS),
                    "--stop-at", str(stop_at), "--loader", json.dumps(KW), "--elastic", str(one_ckpt))
    check_resumed(tmp_path / "ddp", reference, stop_at)
    epoch1 = Counter(k for r in range(2) for mode in ("stop", "resume")
                     for e, _, keys in steps(tmp_path / "ddp", mode, r) if e == 1 for k in keys)
    assert set(epoch1.values()) == {1} and epoch1.keys() == {k for b in reference[0][1] + reference[1][1] for k in b}
    said = [(tmp_path / "ddp" / f"warnings.rank{r}.txt").read_text() for r in range(2)] + [proc.stderr]
    assert not [w for w in said if "not resumable" in w or "stopped asking" in w], said
    whole = Counter(tuple(b) for b in planned(trset, tok, 1, 1)[0])  # epoch 1's planned batches

    # One process's checkpoint (5 steps into epoch 1) on two ranks.
    state = saved_state(one_ckpt)
    rest = planned(trset, tok, 2, 1, state)
    grown = [[keys for e, _, keys in steps(tmp_path / "ddp", "elastic", r) if e == 1] for r in range(2)]
    assert grown == rest
    done = [keys for e, _, keys in steps(one_process[0], "stop", 0) if e == 1]
    assert len(done) == 5 and Counter(map(tuple, done + rest[0] + rest[1])) <= whole  # each once
    assert len(whole) - len(done) - 2 * len(rest[0]) < 2  # at most one planned batch per rank left over

    # The two ranks' checkpoint on one process.
    ckpt = sorted((tmp_path / "ddp" / "ckpt").glob("*.ckpt"))[-1]
    state = saved_state(ckpt)
    assert (state["epoch"], state["step"]) == (1, 3)
    said = run(trset, tok, tmp_path / "one", mode="resume", epochs=EPOCHS, ckpt=str(ckpt), loader_kw=KW)
    rest = planned(trset, tok, 1, 1, state)[0]
    assert [keys for e, _, keys in steps(tmp_path / "one", "resume", 0) if e == 1] == rest
    done = [keys for r in range(2) for e, _, keys in steps(tmp_path / "ddp", "stop", r) if e == 1]
    assert Counter(map(tuple, done + rest)) == whole  # every planned batch of the epoch, once
    assert not [w for w in said if "not resumable" in w or "stopped asking" in w], said
