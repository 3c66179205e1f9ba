"""``wdsprep calibrate``: the cost model fitted on real models timed on CPU, the CUDA memory search
driven by an injected memory limit, the command end to end on real shards, and bad input.

Timing on a shared 2-core machine is noisy: torch runs one thread here, a step is timed by the
process's CPU time, every shape is the fastest of its rounds and the batches are thousands of
frames, so noise stays small next to the differences the assertions look at.
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from calibrate_models import MemoryLimited
from shardsets import build, train_char_tokenizer

from wdsprep.check import calibrate as cal_module
from wdsprep.check.calibrate import ModelError, TrainStep, calibrate, make_batch, oom_guard
from wdsprep.check.costfit import Shape, Timing
from wdsprep.check.planreport import plan_report
from wdsprep.cli import main
from wdsprep.errors import MeasurementError
from wdsprep.plan.compose import load_shards
from wdsprep.plan.cost import CostModel, load_cost
from wdsprep.tokenizer import load_tokenizer

pytestmark = pytest.mark.serial  # the fits are judged on timings: alone on the machine

MODELS = Path(__file__).parent / "calibrate_models.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 utterances of 20..400 frames (8 dims) in indexed shards, and a character tokenizer."""
    root = tmp_path_factory.mktemp("calibrate")
    shards, _ = build(root, n=300)
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return root, f"{shards}/data-*.tar", tok


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _quadratic_share(cal) -> float:
    """per_frame2 * t^2 as a share of c(t, u) at the corpus's median length and its label length."""
    c = cal.cost
    med = cal.frames["median"]
    u = max(1, math.ceil(cal.tokens_per_frame * med))
    t = med / c.subsampling
    return c.per_frame2 * t * t / float(c.per_utterance(med, u))


def _calibrated(model: str, corpus, out: Path, max_seconds: float, good, **options):
    """``calibrate`` once, and once more (another seed) if ``good`` fails: the held-out errors are
    measured against noisy times too, and on a busy shared machine every round of one shape can be
    slowed by a burst of other work (the largest held-out error seen here: 8-25% with the median
    round, 3-12% with the fastest; median 1-9%).
    A fit that is wrong fails both."""
    _, trset, tok = corpus
    for seed in (0, 1):
        try:
            cal = calibrate(model, trset, tok, out, max_seconds=max_seconds, seed=seed, overwrite=True, **options)
        except MeasurementError as e:  # too noisy to write: the next seed, or the test fails on it
            if seed:
                raise
            print(e)
            continue
        print(cal.format())
        if good(cal):
            break
    return cal


def _held_out_max(cal) -> float:
    return float(np.abs(cal.errors(held_out=True)).max())


def _joint_share(cal) -> float:
    """per_frame_token * t * u as a share of c(t, u) at the corpus's median length and its label length."""
    c = cal.cost
    med = cal.frames["median"]
    u = max(1, math.ceil(cal.tokens_per_frame * med))
    return c.per_frame_token * (med / c.subsampling) * u / float(c.per_utterance(med, u))


@pytest.mark.timeout(150)
def test_a_transducer_gets_a_frames_times_tokens_term_and_a_max_cost_from_max_frames(corpus, one_thread):
    """A transducer's joint network, [B, T, U, V], costs t x u: the fit finds that term, the largest
    share at the median length, and holds on shapes it did not fit.  With max_frames, the max_cost
    written is the costliest batch of that frames plan under the fitted cost, as dry-run --plan
    judges it."""
    root, trset, tok = corpus
    out = root / "transducer.json"
    # Labels of 0.1 tokens a frame: the largest joint tensors timed stay in the CPU's cache (at 0.2
    # the longest shapes ran ~20% slower than any polynomial in t and u says: the cache, not the model).
    cal = _calibrated("calibrate_models:transducer", corpus, out, 15,
                      lambda c: _held_out_max(c) <= 0.20 and _joint_share(c) > 0.3, tokens_per_frame=0.1,
                      max_frames=3000)
    assert cal.cost.per_frame_token > 0 and _held_out_max(cal) <= 0.20, cal.format()
    assert _joint_share(cal) > 0.3, cal.format()  # 55-83% seen on a loaded machine: the largest term
    text = cal.format()
    assert "frames x tokens" in text and "*t*u" in text
    doc = json.loads(out.read_text())
    assert load_cost(out) == cal.cost and doc["per_frame_token"] == cal.cost.per_frame_token
    # The suggested max_cost: the frames plan's costliest batch, as dry-run --plan finds it.
    b = cal.budget
    assert b is not None and b.max_frames == 3000 and doc["max_cost"] == b.cost
    assert doc["fit"]["frames_budget"]["costliest"]["batch"] == b.costliest.size
    assert f"max_cost {b.cost:.4g} keeps the peak of the frames plan" in text and "(written as max_cost)" in text
    report = plan_report(trset, tok, cost=str(out), max_frames=3000, seed=b.seed, out=io.StringIO())[0]
    assert report["cost"]["largest"] == pytest.approx(b.cost, rel=1e-12)
    assert b.costliest.size * b.costliest.frames <= 3000 or b.costliest.size == 1


@pytest.mark.timeout(150)
def _burn(stop) -> None:
    a = np.random.default_rng(0).standard_normal(4_000_000)
    while not stop.is_set():
        a = a[::-1] * 1.0000001  # memory-bound: what slows a timed step most


@pytest.fixture
def busy_machine():
    """Every other core busy with memory-bound work while the test runs."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(max(1, (os.cpu_count() or 2) - 1))]
    for p in procs:
        p.start()
    yield
    stop.set()
    for p in procs:
        p.join(10)


def _quadratic_at(cal, frames: int = 750) -> float:
    """The t^2 term as a share of the t term at ``frames`` frames."""
    c = cal.cost
    t = frames / c.subsampling
    return c.per_frame2 * t / c.per_frame if c.per_frame else math.inf


@pytest.mark.timeout(240)
def test_convolutions_get_no_quadratic_term_on_a_busy_machine_and_attention_keeps_its(corpus, one_thread,
                                                                                      busy_machine):
    """With every other core busy, a convolution-only model's fit keeps t^2 under a quarter of its t
    term at 750 frames (a busy machine slows long shapes more: fitted as cost, that was 47-120%;
    with the noise rule, up to 16% in 9 runs here, the highest where the slowdown of long shapes was
    steady enough to beat the noise); the Transformer's self-attention is still found, and its fit
    holds on shapes it did not fit."""
    root, _, _ = corpus
    # Labels of a subword tokenizer's length (0.05 tokens a frame): CTC's lattice, t x u, is a real
    # quadratic cost of the step, not the encoder's.
    conv = _calibrated("calibrate_models:conv", corpus, root / "conv.json", 20,
                       lambda c: _quadratic_at(c) < 0.25 and _held_out_max(c) <= 0.25, tokens_per_frame=0.05)
    assert _quadratic_at(conv) < 0.25, conv.format()
    assert _held_out_max(conv) <= 0.25, conv.format()
    # The Transformer, on shapes it did not fit too.
    _, trset, _ = corpus
    out = root / "transformer.json"
    cal = _calibrated("calibrate_models:transformer", corpus, out, 22,
                      lambda c: _held_out_max(c) <= 0.20 and _quadratic_share(c) > 0.15, tokens_per_frame=0.2)
    held = np.abs(cal.errors(held_out=True))
    assert len(held) == 12 and len(cal.timings) == 27  # 9 lengths x 3 label lengths, every other length held out
    assert held.max() <= 0.20, cal.format()
    # Self-attention: a clear t^2 term, a large share of the cost at the median length (CTC's
    # lattice, t x u, goes to the t*u term: 20-32% of it here).
    assert cal.cost.per_frame2 > 0
    assert _quadratic_share(cal) > 0.15, cal.format()
    # The grid covers the corpus's lengths: the 5th to the 99.9th percentile of frames.
    frames = sorted({t.shape.frames for t in cal.timings})
    p5, p999 = np.quantile(load_shards(trset).frames, [0.05, 0.999])
    assert frames[0] == math.floor(p5) and frames[-1] == math.ceil(p999)
    # The file is the model the loader reads, with the fit's notes beside it.
    doc = json.loads(out.read_text())
    assert load_cost(out) == cal.cost
    assert doc["subsampling"] == 4 and "max_cost" not in doc
    assert doc["fit"]["device"] == "cpu" and doc["fit"]["threads"] == 1 and doc["fit"]["noise"] >= 0
    assert doc["fit"]["held_out_error"]["max"] == pytest.approx(held.max(), abs=1e-4)
    assert len(doc["fit"]["shapes"]) == 27


def test_only_running_out_of_memory_counts_as_not_fitting():
    """The CUDA probe: a step that runs out of memory does not fit, and what it held is freed
    after it; any other error is the model's, and goes through."""
    freed = []

    def step(s: Shape) -> None:
        if s.size > 10:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    fits = oom_guard(step, lambda: freed.append(1))
    assert fits(Shape(10, 100, 5)) and not freed
    assert not fits(Shape(11, 100, 5)) and freed == [1]

    def broken(s: Shape) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        oom_guard(broken, lambda: None)(Shape(1, 10, 1))


def test_gpu_search_wiring_on_cpu_with_a_model_that_runs_out_of_memory(monkeypatch):
    """The CUDA path's own pieces, run on CPU: the real training step lets the model's out-of-memory
    error through (not as a ModelError), the probe frees and empties the cache after it, the
    search finds each length's largest batch; and a timed shape too big is halved until it fits."""
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    cpu = torch.device("cpu")
    model = MemoryLimited(8, limit=50_000)
    step = TrainStep(model, device=cpu, optimizer="adamw", step=None, model_spec="m:f", step_spec=None)
    gen = torch.Generator().manual_seed(0)

    def batch(s: Shape):
        return make_batch(s, feat_dim=8, vocab_size=10, device=cpu, generator=gen)

    frames = np.array([100, 150, 200, 300, 400])
    cost = CostModel(subsampling=4, per_frame=1.0, per_frame2=0.01)
    m = cal_module._cuda_memory(step, batch, frames, lambda t: t // 10, cost, cpu, margin=0.1, progress=False)
    # From the 5th percentile of lengths to the longest utterance.
    assert m.buckets[0][0].frames == round(np.quantile(frames, 0.05)) and m.buckets[-1][0].frames == 400
    for s, _ in m.buckets:
        true = int(50_000 // MemoryLimited.activations(1, s.frames))
        assert 0.95 * true <= s.size <= true, (s, true)
    assert emptied and m.max_cost == pytest.approx(0.9 * min(c for _, c in m.buckets))

    x = Timing(Shape(1000, 400, 40), 0.0, rounds=[0.1, 0.2])
    cal_module._time_shape(step, batch, x, cpu)
    # 2,000 activations an utterance of 400 frames: 1000 -> 500 -> ... -> 31 (62,000) -> 15 (30,000) fits.
    assert x.shape == Shape(15, 400, 40) and x.rounds == []  # the rounds timed another shape
    with pytest.raises(ModelError, match="one utterance of 3000 frames .* does not train in the memory of cpu"):
        cal_module._time_shape(step, batch, Timing(Shape(4, 3000, 40), 0.0), cpu)


@pytest.mark.timeout(60)
def test_a_budget_the_full_grid_does_not_fit_times_a_smaller_grid_within_it(corpus, one_thread, capsys):
    """A step of known wall-clock cost (asleep for nearly all of it): the full grid needs about twice
    --max-seconds, so fewer lengths and rounds are timed, within the time, and the model is written
    with the error to expect of it; a budget that not even the smallest grid fits is refused, saying
    how much it needs."""
    root, trset, tok = corpus
    out = root / "sleepy.json"
    cal = calibrate("calibrate_models:sleepy", trset, tok, out, max_seconds=1.5, max_error=1e9, overwrite=True,
                    tokens_per_frame=0.1)
    grid = cal.grid
    assert grid["reduced"] and grid["full_seconds"] > 1.5 and grid["lengths"] < 9, grid
    assert grid["timing_seconds"] <= 1.5 + 1.0, grid  # the time given, and at most a step (and scheduling) more
    assert len({t.shape.frames for t in cal.timings}) == grid["lengths"]
    doc = json.loads(out.read_text())
    assert doc["fit"]["expected_error"] == doc["fit"]["held_out_error"] and doc["fit"]["grid"] == grid
    assert "a smaller grid, to fit --max-seconds 1.5" in cal.format() and "expected error" in cal.format()
    argv = ["calibrate", "--model", "calibrate_models:sleepy", "--trset", trset, "--tokenizer", str(tok), "--out",
            str(root / "never.json"), "--max-seconds", "0.6", "--tokens-per-frame", "0.1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "even the smallest grid (5 lengths, 1 timed round" in err and "give --max-seconds" in err, err
    assert not (root / "never.json").exists()


# --- the command ---------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_cli_writes_a_cost_model_the_loader_reads(corpus, one_thread, capsys):
    root, trset, tok = corpus
    out = root / "cli.json"
    argv = ["calibrate", "--model", f"{MODELS}:conv", "--trset", trset, "--tokenizer", str(tok), "--out", str(out),
            "--max-seconds", "4", "--subsampling", "2", "--max-tokens", "12", "--optimizer", "sgd",
            "--max-frames", "2500"]
    # A fit that misses a held-out shape by more than --max-error is not written, saying why.
    assert main([*argv, "--max-error", "1e-6"]) == 1
    err = capsys.readouterr().err
    assert "over max_error=1e-06" in err and f"{out} not written" in err and "timing noise" in err, err
    assert not out.exists()
    argv += ["--max-error", "1"]  # a 4-second timing: judged by the fits above, not here
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "held-out shapes: median" in captured.out and f"wrote {out}" in captured.out
    assert "keeps the peak of the frames plan: the costliest of the" in captured.out
    assert "%|" not in captured.err  # no progress bar where nobody watches a terminal
    cost = load_cost(out)
    doc = json.loads(out.read_text())
    assert cost.subsampling == 2 and doc["fit"]["optimizer"] == "sgd" and doc["fit"]["max_tokens"] == 12
    assert max(s["tokens"] for s in doc["fit"]["shapes"]) == 12
    # No --tokens-per-frame: the rate of the corpus's own labels, counted with the tokenizer.
    shards = load_shards(trset, tokenizer=load_tokenizer(tok))
    rate = float(np.quantile(shards.tokens / shards.frames, 0.95))
    assert doc["fit"]["tokens_per_frame"] == pytest.approx(rate) and 0.02 < rate < 1
    assert doc["fit"]["model"] == f"{MODELS}:conv"
    budget = doc["fit"]["frames_budget"]
    assert doc["max_cost"] == budget["cost"] > 0 and budget["max_frames"] == 2500
    # Written once: a second run needs --overwrite, and with it shows its progress when asked.
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(argv + ["--overwrite", "--progress"]) == 0
    assert "calibrate: 100%|" in capsys.readouterr().err


def test_bad_input_is_one_line_naming_what_and_what_to_do(corpus, capsys, tmp_path):
    root, trset, tok = corpus
    (tmp_path / "broken.py").write_text("import torch\nraise ImportError('needs flash_attn')\n")
    (tmp_path / "steps.py").write_text("def pair(model, *batch):\n    return model(*batch), 0\n")
    (root / "taken.json").write_text("{}")
    base = ["--trset", trset, "--tokenizer", str(tok), "--out", str(tmp_path / "c.json")]
    cases = [
        (["--model", "no_such_module_here:build"], 2, ["no module named 'no_such_module_here'", "PYTHONPATH"]),
        (["--model", f"{tmp_path}/missing.py:build"], 2, ["missing.py: no such file", "MODULE:NAME"]),
        (["--model", "calibrate_models"], 2, ["expected MODULE:NAME"]),
        (["--model", "calibrate_models:nothing"], 2, ["calibrate_models has no 'nothing'"]),
        (["--model", f"{tmp_path}/broken.py:build"], 2, ["broken.py raised ImportError: needs flash_attn"]),
        (["--model", "calibrate_models:raises"], 2,
         ["calibrate_models:raises", "feat_dim=8, vocab_size=", "raised RuntimeError: hidden size 0 is not allowed",
          "must take those two keyword arguments"]),
        (["--model", "calibrate_models:per_utterance"], 2,
         ["forward of --model calibrate_models:per_utterance returned a tensor of shape [2], not a scalar loss",
          "--step MODULE:FUNC"]),
        (["--model", "calibrate_models:conv", "--step", f"{tmp_path}/steps.py:pair"], 2,
         ["steps.py:pair returned a tuple, not a scalar loss tensor"]),
        (["--model", "calibrate_models:conv", "--device", "cuda"], 2, ["torch sees no GPU", "--device cpu"]),
        (["--model", "calibrate_models:conv", "--subsampling", "0"], 2, ["subsampling must be an integer >= 1"]),
    ]
    for extra, status, words in cases:
        assert main(["calibrate", *base, *extra]) == status, extra
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        for w in words:
            assert w in err, (extra, err)
    assert not (tmp_path / "c.json").exists()
    taken = ["--trset", trset, "--tokenizer", str(tok), "--out", str(root / "taken.json")]
    assert main(["calibrate", *taken, "--model", "calibrate_models:conv"]) == 2
    assert "taken.json: exists" in capsys.readouterr().err
    with pytest.raises(ModelError, match="not a scalar loss"):
        calibrate("calibrate_models:per_utterance", trset, tok, tmp_path / "d.json")
