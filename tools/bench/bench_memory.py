#!/usr/bin/env python3
"""Memory from the plan, on a model of the size people train: calibrate, rehearse, and an epoch
with frames-sized against cost-sized batches (issue 37).

    python tools/bench/bench_memory.py --device cuda [--model rnnt|ctc] [--utts 20000] [--dim 256]
        [--layers 12] [--max-frames 20000] [--max-seconds 120] [--k 8] [--work /tmp/wdsprep-bench-memory]
    python tools/bench/bench_memory.py --device cpu --utts 300 --median-frames 120 --dim 32 --layers 1 \\
        --heads 2 --vocab 60 --max-frames 1500 --max-seconds 10 --k 3  # a tiny run that shows it works

The corpus is the benchmark's (``tools/bench/corpus.py``: lognormal lengths, 80-dim fbank-like
features, pseudo-word transcripts, packed once into ``--work``), with a SentencePiece tokenizer of
``--vocab`` pieces.  The model: a Conformer encoder (convolution subsampling x4, ``--layers``
blocks of feed-forward, self-attention, convolution, feed-forward at width ``--dim``) with an
RNN-T loss (an LSTM prediction network and a joint network: the ``B x T x U x V`` tensor) or a
CTC loss.  The RNN-T loss is torchaudio's where it imports (CUDA builds), else the pure-torch one
of ``tests/calibrate_models.py``.

Three steps, each printed:

1. ``calibrate`` (``--device``): the fitted cost, its error on held-out shapes, on CUDA the memory
   search's largest batch per length and its ``max_cost``, and the ``max_cost`` that keeps the
   frames plan's peak (``--max-frames``);
2. ``rehearse`` of the cost plan's ``--k`` costliest batches of epoch 0 (seconds, peak memory,
   headroom);
3. one epoch of training (AdamW) with the frames plan (``max_frames``) and with the cost plan
   (``max_cost``: the frames plan's peak under the fitted cost), each from the same initial
   weights: steps, wall seconds, seconds a step, utterances, padding, peak memory.

What only a GPU can tell: whether the wall-clock fit holds there, whether the memory search's
``max_cost`` trains a whole epoch without running out of memory, and the wall time the cost plan
saves.  On CPU the figures only show the script works (timings of a shared machine).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # the pure-torch RNN-T loss of the calibrate tests
sys.path.insert(0, str(Path(__file__).resolve().parent))  # corpus.py

ENV = "WDSPREP_BENCH_MEMORY"  # the model's size, for the factories calibrate and rehearse import


# --- the model ------------------------------------------------------------------------------------

class FeedForward(nn.Sequential):
    def __init__(self, dim: int) -> None:
        super().__init__(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))


class ConvModule(nn.Module):
    """Pointwise convolution and GLU, a depthwise convolution over time, pointwise back."""

    def __init__(self, dim: int, kernel: int = 15) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Conv1d(dim, 2 * dim, 1), nn.Conv1d(dim, dim, 1)
        self.dw = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, x):
        y = nn.functional.glu(self.pw1(self.norm(x).transpose(1, 2)), dim=1)
        return self.pw2(nn.functional.silu(self.bn(self.dw(y)))).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ff1, self.ff2 = FeedForward(dim), FeedForward(dim)
        self.attn_norm, self.out_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.conv = ConvModule(dim)

    def forward(self, x, pad):
        x = x + 0.5 * self.ff1(x)
        y = self.attn_norm(x)
        x = x + self.attn(y, y, y, key_padding_mask=pad, need_weights=False)[0]
        x = x + self.conv(x)
        return self.out_norm(x + 0.5 * self.ff2(x))


class Conformer(nn.Module):
    """Two stride-2 convolutions (frames / 4), then Conformer blocks."""

    def __init__(self, feat_dim: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, dim, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(dim, dim, 3, stride=2, padding=1), nn.ReLU())
        self.proj = nn.Linear(dim * ((feat_dim + 3) // 4), dim)
        self.blocks = nn.ModuleList(ConformerBlock(dim, heads) for _ in range(layers))

    def forward(self, feats, feat_lens):
        x = self.sub(feats.unsqueeze(1))  # [B, dim, T/4, D/4]
        x = self.proj(x.permute(0, 2, 1, 3).flatten(2))
        lens = torch.clamp((feat_lens + 3) // 4, max=x.shape[1])
        pad = torch.arange(x.shape[1], device=x.device)[None] >= lens[:, None]
        for block in self.blocks:
            x = block(x, pad)
        return x, lens


class CTC(nn.Module):
    def __init__(self, feat_dim: int, vocab_size: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.encoder, self.out = Conformer(feat_dim, dim, layers, heads), nn.Linear(dim, vocab_size)

    def forward(self, feats, feat_lens, labels, label_lens):
        x, lens = self.encoder(feats, feat_lens)
        logp = self.out(x).log_softmax(-1).transpose(0, 1)
        return nn.functional.ctc_loss(logp, labels, lens, label_lens, zero_infinity=True)


class RNNT(nn.Module):
    """The encoder, an LSTM prediction network over the labels (blank first), and the joint network."""

    def __init__(self, feat_dim: int, vocab_size: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.encoder = Conformer(feat_dim, dim, layers, heads)
        self.embed = nn.Embedding(vocab_size, dim)
        self.pred = nn.LSTM(dim, dim, batch_first=True)
        self.enc_proj, self.pred_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, feats, feat_lens, labels, label_lens):
        x, lens = self.encoder(feats, feat_lens)
        p, _ = self.pred(self.embed(nn.functional.pad(labels, (1, 0))))
        logits = self.out(torch.tanh(self.enc_proj(x)[:, :, None] + self.pred_proj(p)[:, None]))  # [B, T, U+1, V]
        return rnnt_loss()(logits, labels, lens, label_lens)


@functools.cache
def rnnt_loss():
    """The RNN-T loss of logits [B, T, U+1, V] (blank 0), mean over the batch: torchaudio's fused one
    where its compiled ops load (its Linux wheels are CUDA builds), else the pure-torch lattice sum
    of the tests."""
    try:
        from torchaudio.functional import rnnt_loss as fused

        torch.ops.torchaudio.rnnt_loss_forward  # noqa: B018 (the compiled op, absent without the extension)
    except (ImportError, OSError, AttributeError):
        from calibrate_models import rnnt_loss as lattice

        return lambda logits, labels, lens, label_lens: lattice(logits.log_softmax(-1), labels, lens, label_lens)
    return lambda logits, labels, lens, label_lens: fused(logits, labels.int(), lens.int(), label_lens.int(), blank=0)


def _size() -> dict:
    return json.loads(os.environ.get(ENV, '{"dim": 256, "layers": 12, "heads": 4}'))


def rnnt(feat_dim: int, vocab_size: int) -> nn.Module:
    return RNNT(feat_dim, vocab_size, **_size())


def ctc(feat_dim: int, vocab_size: int) -> nn.Module:
    return CTC(feat_dim, vocab_size, **_size())


# --- the three steps ------------------------------------------------------------------------------

def train_epoch(model_spec: str, trset: str, tok: Path, device: torch.device, seed: int, limit: int | None,
                **options) -> dict:
    """One epoch (AdamW) of a fresh model (seeded) on the loader ``options`` make: its figures."""
    from wdsprep import make_loader
    from wdsprep.check.calibrate import TrainStep, build_model, load_callable

    loader = make_loader(trset, tok, seed=seed, **options)
    torch.manual_seed(seed)
    net = build_model(load_callable(model_spec, "--model"), model_spec, feat_dim=loader.source.shards.dims,
                      vocab_size=loader.tokenizer.vocab_size).to(device).train()
    step = TrainStep(net, device=device, optimizer="adamw", step=None, model_spec=model_spec, step_spec=None)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    loader.set_epoch(0)
    steps = utts = 0
    t0 = time.perf_counter()
    for batch in loader:
        step(tuple(x.to(device, non_blocking=True) for x in batch[:4]))
        steps, utts = steps + 1, utts + len(batch.keys)
        if limit is not None and steps >= limit:
            break
    if cuda:
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    return {"steps": steps, "planned_steps": len(loader), "utterances": utts, "wall": wall,
            "per_step": wall / max(1, steps), "padding": loader.stats.padding_efficiency,
            "label_padding": loader.stats.label_padding_efficiency,
            "peak": torch.cuda.max_memory_allocated(device) if cuda else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", choices=["rnnt", "ctc"], default="rnnt")
    ap.add_argument("--utts", type=int, default=20_000)
    ap.add_argument("--median-frames", type=float, default=500.0, help="the corpus's median length")
    ap.add_argument("--vocab", type=int, default=500, help="SentencePiece pieces")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max-frames", type=int, default=20_000, help="the frames plan's budget (per rank)")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="calibrate's timing budget")
    ap.add_argument("--k", type=int, default=8, help="batches rehearsed")
    ap.add_argument("--epoch-steps", type=int, help="stop each epoch after this many steps (a quick run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/wdsprep-bench-memory"))
    args = ap.parse_args()
    warnings.simplefilter("ignore", UserWarning)
    os.environ[ENV] = json.dumps({"dim": args.dim, "layers": args.layers, "heads": args.heads})

    from corpus import DataSpec, prepare, train_tokenizer_once

    from wdsprep.check.calibrate import calibrate, device_of
    from wdsprep.check.rehearse import rehearse

    device = device_of(args.device)
    args.work.mkdir(parents=True, exist_ok=True)
    c = prepare(DataSpec(utts=args.utts, median_frames=args.median_frames,
                         utts_per_shard=min(2000, max(20, args.utts // 16))), args.work)
    tok = train_tokenizer_once(c, args.vocab)
    spec = f"{Path(__file__).resolve()}:{args.model}"
    print(f"{args.model} on {device}: Conformer {args.layers} x {args.dim} ({args.heads} heads), {args.utts:,} "
          f"utterances ({c.hours:.1f} h), {args.vocab} pieces, torch {torch.__version__}")

    print("\n== 1. calibrate")
    t0 = time.perf_counter()
    out = args.work / f"cost-{args.model}-{device.type}.json"
    cal = calibrate(spec, c.pattern32, tok, out, device=str(device), max_seconds=args.max_seconds, seed=args.seed,
                    max_frames=args.max_frames, overwrite=True, progress=False)
    print(cal.format())
    print(f"({time.perf_counter() - t0:.0f} s; written to {out})")
    assert cal.budget is not None
    budget = cal.budget.cost  # the frames plan's peak, under the fitted cost
    cost_plan = {"cost": str(out), "max_cost": budget}

    print(f"\n== 2. rehearse: the {args.k} costliest batches of the cost plan's epoch 0 (max_cost {budget:.4g})")
    r = rehearse(spec, c.pattern32, tok, k=args.k, device=str(device), seed=args.seed, **cost_plan)
    print(r.format())

    print("\n== 3. one epoch of training, the same initial weights")
    rows = [("frames", train_epoch(spec, c.pattern32, tok, device, args.seed, args.epoch_steps,
                                   max_frames=args.max_frames)),
            ("cost", train_epoch(spec, c.pattern32, tok, device, args.seed, args.epoch_steps, **cost_plan))]
    print(f"  {'plan':<7} {'steps':>11} {'wall s':>8} {'s/step':>7} {'utts':>7} {'padding':>8} {'labels':>7} "
          f"{'peak memory':>12}")
    for name, f in rows:
        peak = "-" if f["peak"] is None else f"{f['peak'] / 2 ** 30:.2f} GiB"
        print(f"  {name:<7} {f['steps']:>5}/{f['planned_steps']:<5} {f['wall']:>8.1f} {f['per_step']:>7.3f} "
              f"{f['utterances']:>7} {f['padding']:>8.3f} {f['label_padding']:>7.3f} {peak:>12}")
    frames, cost = rows[0][1], rows[1][1]
    if not args.epoch_steps:
        print(f"  the cost plan: {frames['planned_steps'] / max(1, cost['planned_steps']):.2f}x fewer steps, "
              f"{frames['wall'] / max(1e-9, cost['wall']):.2f}x the frames plan's speed")


if __name__ == "__main__":
    main()
