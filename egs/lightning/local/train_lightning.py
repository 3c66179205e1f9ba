#!/usr/bin/env python3
"""Train egs/demo's CTC model with a Lightning Trainer fed by wdsprep's loader; stop mid-epoch, resume.

    python local/train_lightning.py --shards S --dev-shards D --tokenizer T --exp-dir E --stop-epoch 1 --stop-step 7
    python local/train_lightning.py --shards S --dev-shards D --tokenizer T --exp-dir E --resume E/ckpt/mid.ckpt
    torchrun --standalone --nproc_per_node=2 local/train_lightning.py ...   # Lightning's DDP on CPU (gloo)

What the loader asks of a LightningModule (docs/trainers.md):

- make it in ``setup()``, where the process group exists under DDP (every rank takes its share);
- set its epoch in ``train_dataloader()`` and give ``Trainer(reload_dataloaders_every_n_epochs=1)``:
  epochs differ in length by a few batches, and Lightning sizes an epoch when it asks for the loader;
- nothing for checkpoints: Lightning saves ``loader.state_dict()`` in each one and, resuming, loads
  it before iterating; the resumed epoch goes on with the batch after the checkpoint.

Each training step appends ``epoch<TAB>step<TAB>keys`` to ``EXP/steps.rankR.tsv``
(``local/check_resume.py`` holds it against the loader's plan).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from train import SUBSAMPLING, CTCModel, ctc_sums  # egs/demo's model (local/train.py is its symlink)

import wdsprep

# wdsprep's len(loader) is exact with any num_workers; Lightning warns because loader.dataset is an IterableDataset.
warnings.filterwarnings("ignore", "Your `IterableDataset` has `__len__` defined")
# Lightning's own pytree helper builds a LeafSpec, which this torch deprecates: said by every
# process at every loader, with Lightning's file and line in front; nothing the recipe can change.
warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def loader_kwargs(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The training loader's options, the same in the planning check (local/check_resume.py)."""
    return dict(max_frames=args.bucket_size // world, seed=0, shuffle_buffer=100, ctc_subsampling=SUBSAMPLING)


def build(args: argparse.Namespace) -> Any:
    import lightning as L

    class DemoCTC(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            # A dev loader reads each utterance once: with few dev shards a rank may get none.
            self.allow_zero_length_dataloader_with_multiple_devices = True
            vocab = wdsprep.load_tokenizer(args.tokenizer).vocab_size
            self.model = CTCModel(80, vocab, dropout=0.0)
            self.ctc = nn.CTCLoss(zero_infinity=True, reduction="sum")
            self.dev_sums = torch.zeros(2)

        def setup(self, stage: str) -> None:
            world = self.trainer.world_size
            self.train_loader = wdsprep.make_loader(args.shards, args.tokenizer, **loader_kwargs(args, world))
            self.dev_loader = wdsprep.make_loader(args.dev_shards, args.tokenizer,
                                                  max_frames=args.bucket_size // world, train=False,
                                                  ctc_subsampling=SUBSAMPLING)

        def train_dataloader(self) -> Any:
            self.train_loader.set_epoch(self.trainer.current_epoch)
            return self.train_loader

        def val_dataloader(self) -> Any:
            return self.dev_loader

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            with open(Path(args.exp_dir) / f"steps.rank{self.global_rank}.tsv", "a", encoding="utf-8") as f:
                f.write(f"{self.current_epoch}\t{batch_idx}\t{' '.join(batch.keys)}\n")
            loss, tokens = ctc_sums(self.model, batch, self.ctc, self.device)
            self.log("loss", loss / max(tokens, 1), batch_size=len(batch.keys), prog_bar=True)
            return loss / max(tokens, 1)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            loss, tokens = ctc_sums(self.model, batch, self.ctc, self.device)
            self.dev_sums += torch.tensor([float(loss), float(tokens)])

        def on_train_epoch_end(self) -> None:
            # The ranks ran different numbers of dev steps (a rank with none skips the validation
            # hooks): they meet here, after the epoch's validation, every rank every epoch.
            total = self.trainer.strategy.reduce(self.dev_sums.clone().to(self.device), reduce_op="sum")
            self.dev_sums.zero_()
            if self.global_rank == 0 and total[1] > 0:
                print(f"epoch {self.current_epoch}: dev loss per token {float(total[0] / total[1]):.3f}", flush=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return DemoCTC()


def steps_before(args: argparse.Namespace, epoch: int, rank: int, world: int) -> int:
    """Steps of the epochs before ``epoch``, from the loader's plan (no data read)."""
    loader = wdsprep.make_loader(f"{args.shards}/*/data-*.tar", args.tokenizer, rank=rank, world_size=world,
                                 **loader_kwargs(args, world))
    total = 0
    for e in range(epoch):
        loader.set_epoch(e)
        total += len(loader)
    return total


def main(argv: list[str] | None = None) -> int:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True, help="the train shards' folder (length groups below it)")
    ap.add_argument("--dev-shards", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--bucket-size", type=int, default=1000, help="frames per step over all ranks")
    ap.add_argument("--stop-epoch", type=int, help="stop (as a killed job would) in this epoch ...")
    ap.add_argument("--stop-step", type=int, help="... after this many of its steps, with a checkpoint there")
    ap.add_argument("--resume", help="a checkpoint to resume from (Trainer.fit(ckpt_path=...))")
    args = ap.parse_args(argv)
    if (args.stop_epoch is None) == (args.resume is None):
        ap.error("give --stop-epoch and --stop-step (the run that stops), or --resume CKPT")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    Path(args.exp_dir).mkdir(parents=True, exist_ok=True)
    common = dict(accelerator="cpu", devices=world, max_epochs=args.epochs, logger=False, enable_model_summary=False,
                  enable_progress_bar=False, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                  gradient_clip_val=5.0)
    if world > 1:
        common["strategy"] = "ddp"
    torch.manual_seed(0)
    model = build(args)
    if args.resume is None:
        stop = steps_before(args, args.stop_epoch, rank, world) + args.stop_step
        mid = ModelCheckpoint(dirpath=Path(args.exp_dir) / "ckpt", filename="mid", every_n_train_steps=stop)
        L.Trainer(max_steps=stop, callbacks=[mid], **common).fit(model)
        if rank == 0:
            print(f"stopped at step {args.stop_step} of epoch {args.stop_epoch} (global step {stop}); checkpoint "
                  f"{mid.best_model_path or mid.last_model_path}", flush=True)
    else:
        L.Trainer(enable_checkpointing=False, **common).fit(model, ckpt_path=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
