#!/usr/bin/env python3
"""Train a small CTC model on wdsprep shards, one process per rank under ``torchrun``.

    torchrun --standalone --nproc_per_node=2 local/train.py --hyper exp/demo/hyper-p.json

Everything the run needs is in the CAT-style ``hyper-p.json``: the loader reads ``train:option``
(shards ``ld``, ``tokenizer``, ``bucket_size``, ...), this script reads ``model`` and the
optimisation keys (``epochs``, ``lr``, ``seed``, ...) from the same file.  Run without torchrun it
trains in a single process.

``--prompt FIELD`` (egs/multilingual): the model is also given a text field of each utterance
(``prompt``: special tokens and the speaker's previous transcript), tokenized by the loader as
the labels are (``text_fields``); its tokens' mean embedding is added to every encoder frame.
Without it the model and the loader are as before.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import wdsprep
from wdsprep.hyper import loader_options, normalize_keys, train_option

SUBSAMPLING = 4  # the conv front end's time reduction; the loader's CTC filter must agree


# ----------------------------------------------------------------------------------------- model
class Conv2dSubsampling(nn.Module):
    """Two stride-2 convolutions over (time, freq): T -> ceil(T / 4).

    Padding 1 keeps ``ceil(T/4) >= T // 4`` output frames, so every utterance the loader keeps
    under its CTC filter (``frames // 4 > label_len``) has enough frames for its labels.
    """

    def __init__(self, idim: int, odim: int, channels: int = 32):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
        )
        fdim = ((idim + 1) // 2 + 1) // 2
        # LayerNorm on the projected frames: in tuning runs on the demo corpus it got CTC off its
        # all-blank plateau in ~700 instead of ~1,000 updates.
        self.out = nn.Sequential(nn.Linear(channels * fdim, odim), nn.LayerNorm(odim))

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))  # [B, C, T', F']
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
        for _ in range(2):
            lens = (lens + 1) // 2  # ceil(T / 2) per conv, matching padding=1, kernel 3, stride 2
        return x, lens


class CTCModel(nn.Module):
    """Utterance CMVN -> conv subsampling (x4) [+ a prompt's mean token embedding] -> BiLSTM ->
    linear to the vocabulary."""

    def __init__(self, idim: int, vocab_size: int, d_model: int = 144, lstm_layers: int = 2,
                 lstm_hidden: int = 160, dropout: float = 0.1, prompt: bool = False):
        super().__init__()
        self.subsample = Conv2dSubsampling(idim, d_model)
        # A text prompt's tokens share the labels' ids: one embedding row per vocabulary entry.
        self.prompt = nn.Embedding(vocab_size, d_model) if prompt else None
        self.lstm = nn.LSTM(d_model, lstm_hidden, num_layers=lstm_layers, batch_first=True,
                            bidirectional=True, dropout=dropout if lstm_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * lstm_hidden, vocab_size)

    @staticmethod
    def normalize(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Per-utterance mean/variance normalisation over the real (unpadded) frames.

        Raw log-mel energies are far from zero-mean; normalising here converges much faster than
        leaving it to the network, and needs no global statistics file.
        """
        mask = (torch.arange(x.size(1), device=x.device)[None, :] < lens[:, None]).unsqueeze(-1)
        n = lens.clamp(min=1).view(-1, 1, 1).to(x.dtype)
        mean = (x * mask).sum(1, keepdim=True) / n
        var = (((x - mean) * mask) ** 2).sum(1, keepdim=True) / n
        return (x - mean) / (var + 1e-5).sqrt() * mask

    def forward(self, feats: torch.Tensor, lens: torch.Tensor, prompt: torch.Tensor | None = None,
                prompt_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, lens = self.subsample(self.normalize(feats, lens), lens)
        if self.prompt is not None and prompt is not None and prompt_lens is not None:
            mask = (torch.arange(prompt.size(1), device=x.device)[None, :] < prompt_lens[:, None]).unsqueeze(-1)
            mean = (self.prompt(prompt) * mask).sum(1) / prompt_lens.clamp(min=1).unsqueeze(-1)  # empty: zeros
            x = x + mean.unsqueeze(1)
        lens = lens.clamp(max=x.size(1))
        packed = nn.utils.rnn.pack_padded_sequence(x, lens.cpu(), batch_first=True, enforce_sorted=False)
        y, _ = self.lstm(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.size(1))
        return self.head(self.dropout(y)).log_softmax(-1), lens


# ------------------------------------------------------------------------------------ distributed
@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """Join the process group torchrun describes in the environment (or run alone without it)."""
    use_cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        return Dist(0, 1, 0, torch.device("cuda" if use_cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    # nccl needs GPUs; gloo runs the same collectives on CPU, which is how this is tested.
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device)


def all_sum(values: list[float], d: Dist) -> list[float]:
    """Sum a few numbers over all ranks (identity when running alone)."""
    if d.world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


# ---------------------------------------------------------------------------------------- loading
def build_loaders(hyper_path: str, hyper: dict, world: int, prompt: str | None = None,
                  **train_overrides: Any) -> tuple[Any, Any, Any]:
    """(train loader, dev loader or None, tokenizer), all from ``hyper-p.json``; with ``prompt``,
    both deliver that field tokenized (``text_fields``).

    Both drop utterances the model cannot align (``frames // 4 <= label_len``): the loader's CTC
    filter uses the same x4 the conv front end applies, so CTC never sees an impossible target
    and ``zero_infinity`` stays a safety net instead of silently zeroing real losses.
    """
    fields = {"text_fields": [prompt]} if prompt else {}
    train = wdsprep.make_loader_from_hyper(hyper_path, ctc_subsampling=SUBSAMPLING, **fields, **train_overrides)
    # The loader's own tokenizer object: the labels it makes and the output layer's size can
    # never come from two different files.
    tokenizer = train.tokenizer
    dev = None
    dev_ld = normalize_keys(train_option(hyper)).get("dev_ld")
    if dev_ld:
        # Dev mode: no shuffle, each utterance once over all ranks, same per-rank frame budget.
        max_frames = loader_options(hyper, world_size=world, where=hyper_path).loader_kwargs["max_frames"]
        dev = wdsprep.make_loader(dev_ld, tokenizer, max_frames=max_frames, train=False,
                                  ctc_subsampling=SUBSAMPLING, **fields)
    return train, dev, tokenizer


def format_stats(stats: Any) -> str:
    """The loader numbers worth watching, in one line."""
    if stats is None:
        return ""
    d = stats.to_dict()
    parts = [f"utts {d['utterances']}", f"padding efficiency {d['padding_efficiency']:.3f}"]
    if d.get("discarded"):
        parts.append(f"discarded {d['discarded']} (the tail the world size does not divide)")
    if d.get("dropped"):
        parts.append("dropped " + ",".join(f"{k}={v}" for k, v in sorted(d["dropped"].items())))
    g = d.get("growing")
    if g:  # following a pack still writing its shards (stage 6)
        final = g["shards_final"] if g["shards_final"] is not None else "?"
        parts.append(f"planned over {g['shards']} of {final} shards published"
                     + ("" if g["fraction"] is None else f" ({g['fraction']:.0%} of the utterances)"))
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------- train
def ctc_sums(model: nn.Module, batch: Any, ctc: nn.CTCLoss, device: torch.device,
             prompt: str | None = None) -> tuple[torch.Tensor, int]:
    """(summed CTC loss over the batch, number of label tokens); ``prompt``: the text field the
    model is also given."""
    if not len(batch.keys):
        # Every utterance of this planned batch was dropped after the plan (a label sampled too long
        # for CTC, say).  The step still goes through the wrapped model, on one dummy utterance: DDP's
        # gradient all-reduce runs from the forward's hooks, and a rank that skipped the model would
        # leave the others waiting in backward().  Its zero loss changes nothing.
        frames = 4 * SUBSAMPLING
        feats = torch.zeros(1, frames, batch.feats.shape[-1], device=device)
        log_probs, _ = model(feats, torch.full((1,), frames, dtype=torch.int64, device=device))
        return log_probs.sum() * 0.0, 0
    feats = batch.feats.to(device, non_blocking=True)
    feat_lens = batch.feat_lens.to(device)
    labels = batch.labels.to(device)
    label_lens = batch.label_lens.to(device)
    if prompt:
        log_probs, out_lens = model(feats, feat_lens, batch.field_tokens[prompt].to(device),
                                    batch.field_lens[prompt].to(device))
    else:
        log_probs, out_lens = model(feats, feat_lens)
    loss = ctc(log_probs.transpose(0, 1), labels, out_lens, label_lens)
    return loss, int(label_lens.sum())


def lr_at(step: int, base_lr: float, warmup: int) -> float:
    """Linear warm-up, then constant: enough for a few-minute demo run."""
    return base_lr * min(1.0, (step + 1) / max(1, warmup))


def run_epoch(model: nn.Module, loader: Iterable, ctc: nn.CTCLoss, d: Dist, *, optim: torch.optim.Optimizer | None,
              step: int, opts: dict, max_steps: int | None, prompt: str | None = None) -> tuple[float, int, int]:
    """One pass; returns (loss per token over all ranks, steps taken, global step after the pass)."""
    loss_sum, tokens, steps = 0.0, 0, 0
    train = optim is not None
    model.train(train)
    with torch.set_grad_enabled(train):
        for batch in loader:
            loss, ntok = ctc_sums(model, batch, ctc, d.device, prompt)
            if train:
                for g in optim.param_groups:
                    g["lr"] = lr_at(step, opts["lr"], opts["warmup_steps"])
                optim.zero_grad(set_to_none=True)
                (loss / max(ntok, 1)).backward()  # per-token loss; DDP averages over ranks
                nn.utils.clip_grad_norm_(model.parameters(), opts["grad_clip"])
                optim.step()
                step += 1
            loss_sum += float(loss.detach())
            tokens += ntok
            steps += 1
            if train and max_steps is not None and step >= max_steps:
                # Before asking for another batch: the loader's state then says exactly what was
                # trained.  Every rank sees the same step count, so all break here together.
                break
    loss_sum, tokens = all_sum([loss_sum, float(tokens)], d)
    return (loss_sum / tokens if tokens else math.nan), steps, step


def save_atomic(obj: Any, path: Path) -> None:
    """Write to a temporary name, then rename: a crash never leaves a half-written checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_options(hyper: dict) -> dict:
    """Optimisation settings from ``train:option`` with defaults that work for the demo.

    Keys are read as CAT reads them: ``grad-clip`` is ``grad_clip``.
    """
    o = normalize_keys(train_option(hyper))
    return {
        "epochs": int(o.get("epochs", 10)),
        "lr": float(o.get("lr", 2e-3)),
        "weight_decay": float(o.get("weight_decay", 1e-2)),
        "warmup_steps": int(o.get("warmup_steps", 50)),
        "grad_clip": float(o.get("grad_clip", 5.0)),
        "seed": int(o.get("seed", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hyper", required=True, help="CAT-style hyper-p.json")
    ap.add_argument("--exp-dir", help="where checkpoints and history.json go (default: the hyper file's folder)")
    ap.add_argument("--epochs", type=int, help="override train:option epochs")
    ap.add_argument("--max-steps", type=int, help="stop after this many optimizer steps in total (tests)")
    ap.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint: model, optimizer, step and the "
                    "loader's place in its epoch (on any number of ranks)")
    ap.add_argument("--prompt", metavar="FIELD", help="give the model this text field of each utterance too (e.g. "
                    "prompt, packed with --field): tokenized by the loader (text_fields), its mean embedding added "
                    "to the encoder's frames")
    args = ap.parse_args(argv)

    hyper = json.loads(Path(args.hyper).read_text(encoding="utf-8"))
    opts = train_options(hyper)
    if args.epochs is not None:
        opts["epochs"] = args.epochs
    exp_dir = Path(args.exp_dir or Path(args.hyper).parent)
    d = init_distributed()
    # One seed for everything random in the model: every rank builds the same initial weights.
    torch.manual_seed(opts["seed"])

    ckpt = torch.load(args.resume, map_location="cpu", weights_only=False) if args.resume else None  # our own file
    # Resumed, the per-rank batches stay as planned: CAT's bucket_size is split over the world
    # size, so on another world size max_frames is taken from the saved loader state.
    keep = {k: ckpt["loader"]["options"][k] for k in ("max_frames", "max_batch_size")} if ckpt else {}
    train_loader, dev_loader, tokenizer = build_loaders(args.hyper, hyper, d.world, args.prompt, **keep)
    m = hyper.get("model", {})
    model = CTCModel(idim=int(m.get("idim", 80)), vocab_size=tokenizer.vocab_size,
                     d_model=int(m.get("d_model", 144)), lstm_layers=int(m.get("lstm_layers", 2)),
                     lstm_hidden=int(m.get("lstm_hidden", 160)), dropout=float(m.get("dropout", 0.1)),
                     prompt=args.prompt is not None).to(d.device)
    if d.main:
        nparam = sum(p.numel() for p in model.parameters())
        print(f"model: {nparam / 1e6:.2f}M parameters, vocab {tokenizer.vocab_size}, {d.world} rank(s) "
              f"on {d.device.type}", flush=True)
    ddp = DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None) if d.world > 1 else model
    optim = torch.optim.AdamW(ddp.parameters(), lr=opts["lr"], weight_decay=opts["weight_decay"])
    ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    history: list[dict] = []
    step, first = 0, 1
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optimizer"])
        step, history = ckpt["step"], ckpt["history"]
        train_loader.load_state_dict(ckpt["loader"])  # the epoch goes on with the batches it had left
        first = ckpt["loader"]["epoch"]
    exp_dir.mkdir(parents=True, exist_ok=True)
    for epoch in range(first, opts["epochs"] + 1):
        t0 = time.time()
        train_loader.set_epoch(epoch)
        train_loss, steps, step = run_epoch(ddp, train_loader, ctc, d, optim=optim, step=step, opts=opts,
                                            max_steps=args.max_steps, prompt=args.prompt)
        # Dev on the bare module: ranks may hold different numbers of dev batches, and the DDP
        # wrapper is only needed for gradient sync; the sums are all-reduced afterwards.
        dev_loss = math.nan
        if dev_loader is not None:
            dev_loss, _, _ = run_epoch(model, dev_loader, ctc, d, optim=None, step=step, opts=opts, max_steps=None,
                                       prompt=args.prompt)
        stats = format_stats(getattr(train_loader, "stats", None))
        record = {"epoch": epoch, "train_loss": train_loss, "dev_loss": dev_loss, "steps": steps,
                  "global_step": step, "seconds": round(time.time() - t0, 1)}
        history.append(record)
        if d.main:
            ckpt = exp_dir / f"epoch{epoch}.pt"
            save_atomic({"model": model.state_dict(), "optimizer": optim.state_dict(), "epoch": epoch,
                         "step": step, "hyper": hyper, "history": history,
                         "loader": train_loader.state_dict()}, ckpt)
            tmp = exp_dir / ".history.json.tmp"
            tmp.write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, exp_dir / "history.json")
            print(f"epoch {epoch} | train loss {train_loss:.3f} | dev loss {dev_loss:.3f} | steps {steps} "
                  f"| {record['seconds']}s | {ckpt}", flush=True)
            if stats:
                print(f"epoch {epoch} | loader: {stats}", flush=True)
        if args.max_steps is not None and step >= args.max_steps:
            break
    if d.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
