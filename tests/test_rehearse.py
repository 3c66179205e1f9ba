"""The rehearsal (issue 37): ``Loader.rehearse`` and ``wdsprep rehearse`` run the epoch's costliest
planned batches, every rank's, with their real data, through a training step before training; a
step that runs out of memory names its batch and the budget that fits; training afterwards yields
the batches of a loader that never rehearsed, bit for bit."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from shardsets import build, train_char_tokenizer

from wdsprep.check.planreport import plan_report
from wdsprep.cli import main
from wdsprep.loader import make_loader
from wdsprep.loading.rehearsal import out_of_memory
from wdsprep.plan.cost import load_cost
from wdsprep.tokenizer import load_tokenizer

MODELS = Path(__file__).parent / "calibrate_models.py"
# A transducer's step: a joint network's t·u, a decoder's u², the encoder's t.
COST = {"subsampling": 4, "per_utt": 10.0, "per_frame": 1.0, "per_frame_token": 0.5, "per_token2": 0.2}
PLANS = [dict(max_frames=1200), dict(cost=COST, max_cost=3000.0)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 utterances of 20..400 frames (kaldiio arks packed into 14 shards) and a character tokenizer."""
    root = tmp_path_factory.mktemp("rehearse")
    out, utts = build(root, n=300)
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return f"{out}/data-*.tar", tok, utts


def planned(trset, tok, tmp_path: Path, epoch: int, **options) -> dict[tuple[int, int], list[str]]:
    """dry-run --plan's batches of ``epoch``, every rank's: {(rank, step): keys}."""
    dump = tmp_path / "keys.tsv"
    plan_report(trset, tok, epochs=epoch + 1, dump_keys=dump, out=io.StringIO(), **options)
    batches: dict[tuple[int, int], list[str]] = defaultdict(list)
    for line in dump.read_text(encoding="utf-8").splitlines():
        e, step, rank, key = line.split("\t")
        if int(e) == epoch:
            batches[int(rank), int(step)].append(key)
    return batches


@pytest.mark.parametrize("options", PLANS, ids=["frames", "cost"])
def test_it_runs_the_k_costliest_planned_batches_of_every_rank_with_their_real_data(corpus, tmp_path, options):
    trset, tok, utts = corpus
    t = load_tokenizer(tok)
    kw = dict(seed=3, world_size=3, **options)
    batches = planned(trset, tok, tmp_path, 1, **kw)
    model = load_cost(COST) if "cost" in options else None

    def cost(keys: list[str]) -> float:  # from the arks and transcripts, not from the loader
        frames = max(utts[k][0].shape[0] for k in keys)
        if model is None:
            return float(len(keys) * frames)
        return float(model.batch(len(keys), frames, max(len(t.encode(utts[k][1])) for k in keys)))

    ranked = sorted(batches, key=lambda at: (-cost(batches[at]), at))[:5]
    loader = make_loader(trset, tok, rank=0, **kw)
    loader.set_epoch(1)
    seen = []
    result = loader.rehearse(seen.append, k=5)
    assert result.ranked == len(batches) and len(seen) == 5
    assert [(b.planned.rank, b.planned.step) for b in result.batches] == ranked  # costliest first, any rank's
    assert [b.cost for b in result.batches] == pytest.approx([cost(batches[at]) for at in ranked], rel=1e-12)
    for b, batch, at in zip(result.batches, seen, ranked):
        assert sorted(b.keys) == sorted(batch.keys) == sorted(batches[at])
        assert b.shape == (len(batch.keys), int(batch.feat_lens.max()), int(batch.label_lens.max()))
        for i, key in enumerate(batch.keys):  # their real data: the features and labels training gets
            feats, text = utts[key]
            n = feats.shape[0]
            assert int(batch.feat_lens[i]) == n and np.array_equal(batch.feats[i, :n].numpy(), feats)
            assert batch.labels[i, :int(batch.label_lens[i])].tolist() == t.encode(text)
    assert f"the 5 costliest of {len(batches)} planned batches" in result.format()


def _epoch(loader, e: int) -> list[tuple]:
    loader.set_epoch(e)
    return [(list(b.keys), b.feats.clone(), b.feat_lens.clone(), b.labels.clone(), b.label_lens.clone())
            for b in loader]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and all(torch.equal(p, q) for p, q in zip(x[1:], y[1:]))
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_training_after_a_rehearsal_yields_the_batches_of_a_loader_that_never_rehearsed(corpus, num_workers):
    trset, tok, _ = corpus
    kw = dict(cost=COST, max_cost=3000.0, seed=5, num_workers=num_workers)
    rehearsed, plain = make_loader(trset, tok, **kw), make_loader(trset, tok, **kw)
    got = []
    for e in (0, 1):  # before the first epoch, and between two (persistent workers already running)
        rehearsed.set_epoch(e)
        state, steps = rehearsed.state_dict(), len(rehearsed)
        rehearsed.rehearse(lambda batch: batch.feats.sum(), k=4)
        assert rehearsed.state_dict() == state and len(rehearsed) == steps
        got.append(_epoch(rehearsed, e))
    assert _same(got[0], _epoch(plain, 0)) and _same(got[1], _epoch(plain, 1))
    # Resumed mid-epoch, it rehearses what is left of the epoch.
    plain.set_epoch(2)
    it = iter(plain)
    done = [next(it).keys for _ in range(3)]
    state = plain.state_dict()
    del it
    resumed = make_loader(trset, tok, **kw)
    resumed.load_state_dict(state)
    left = len(resumed) - resumed.position().step  # len counts the epoch from its start
    r = resumed.rehearse(lambda batch: None, k=100)
    assert r.ranked == left and not {tuple(b.keys) for b in r.batches} & {tuple(k) for k in done}
    assert len(_epoch(resumed, 2)) == left


def test_a_step_that_runs_out_of_memory_is_named_with_the_budget_that_fits_and_the_rest_go_on(corpus):
    trset, tok, _ = corpus
    loader = make_loader(trset, tok, max_frames=1200, seed=3)
    costs = [b.cost for b in loader.rehearse(lambda batch: None, k=6).batches]
    limit = next(c for prev, c in zip(costs, costs[1:]) if c < prev)  # the batches above it run out of memory
    errors = iter([torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError(),
                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")])
    ran = []

    def step(batch):
        ran.append(batch.keys)
        if len(batch.keys) * int(batch.feat_lens.max()) > limit:
            raise next(errors)

    r = loader.rehearse(step, k=6)
    assert len(ran) == len(r.batches) == 6  # it went on after each
    failed = r.failed
    assert [b.cost for b in failed] == [c for c in costs if c > limit] and failed
    assert r.fits == limit == r.fitted(failed[-1].cost)
    text = r.format()
    assert f"out of memory on {len(failed)} of 6:" in text
    for b in failed:
        line = r.problem(b)
        assert line in text and b.keys[0] in line
        assert f"a batch of {b.shape[0]} utterances of up to {b.shape[1]:,} frames" in line
        assert f"planned cost {b.cost:,.0f}" in line and f"max_frames {limit:,.0f} would have fitted" in line
    assert "OutOfMemoryError: CUDA out of memory" in text
    # Any other error is the step's own, and goes through.
    with pytest.raises(ValueError, match="a shape the model cannot take"):
        loader.rehearse(lambda batch: (_ for _ in ()).throw(ValueError("a shape the model cannot take")), k=2)
    assert out_of_memory(MemoryError()) and not out_of_memory(RuntimeError("CUDA error: illegal memory access"))
    # The loader trains its epoch as planned after all that.
    assert len(list(loader)) == len(loader)


def test_the_command_rehearses_a_model_built_as_calibrate_builds_it(corpus, capsys):
    trset, tok, _ = corpus
    base = ["rehearse", "--trset", trset, "--tokenizer", str(tok), "--world-size", "2", "--epoch", "1", "--k", "3"]
    assert main([*base, "--model", f"{MODELS}:transducer", "--cost", str(_cost_file(corpus)), "--max-cost",
                 "3000", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "rehearsal of epoch 1: the 3 costliest of" in out and "every step ran" in out
    rows = [line for line in out.splitlines() if line.startswith("  ") and not line.lstrip().startswith("rank")]
    assert len(rows) == 3
    # A model that runs out of host memory on the costliest batches: named, and exit status 1.
    assert main([*base, "--model", "calibrate_models:host_limited", "--max-frames", "1200", "--k", "12"]) == 1
    out = capsys.readouterr().out
    assert "out of memory on" in out and "DefaultCPUAllocator: can't allocate memory" in out
    assert "would have fitted" in out
    assert main([*base, "--model", "calibrate_models:conv", "--max-frames", "1200", "--device", "cuda"]) == 2
    assert "torch sees no GPU" in capsys.readouterr().err


def _cost_file(corpus) -> Path:
    import json

    path = Path(corpus[0]).parent.parent / "cost.json"
    path.write_text(json.dumps(COST))
    return path
