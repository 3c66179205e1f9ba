"""A tiny model trained by a real ``lightning.Trainer`` on wdsprep's loader, stopped mid-epoch and resumed.

``run(...)`` trains in this process (one device); under torchrun (``python -m torch.distributed.run
--nproc_per_node=N lightning_worker.py ...``) each rank trains its part with Lightning's DDP strategy
on CPU (gloo).  Every training step appends ``[epoch, batch_idx, keys]`` to
``OUT/{stop,resume,elastic}.rank{R}.jsonl``; warnings go to ``OUT/warnings.rank{R}.txt``.  The module makes
its loader in ``setup`` (the process group exists there) and sets its epoch in
``train_dataloader``, which the Trainer asks for every epoch (``reload_dataloaders_every_n_epochs=1``):
what docs/trainers.md tells users to do.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch

DIMS = 8  # the test corpus's feature dims (shardsets.make_kaldi_dir)


def _module(trset: str, tokenizer: str, out: Path, mode: str, loader_kw: dict[str, Any], early: bool) -> Any:
    import lightning as L

    from wdsprep import make_loader

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(DIMS, 1)
            self.loader = None

        def setup(self, stage: str) -> None:
            self.loader = make_loader(trset, tokenizer, **loader_kw)

        def train_dataloader(self) -> Any:
            self.loader.set_epoch(self.trainer.current_epoch)
            return self.loader

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            with open(out / f"{mode}.rank{self.global_rank}.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps([self.current_epoch, batch_idx, list(batch.keys)]) + "\n")
            frames = self.lin(batch.feats).squeeze(-1).sum(1) / batch.feat_lens
            return frames.mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            if early:  # docs/trainers.md: before Lightning sizes the resumed epoch (resuming on more ranks)
                self.loader.load_state_dict(checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0])

    return Tiny()


def run(trset: str, tokenizer: str, out: Path, *, mode: str, epochs: int, stop_at: int | None = None,
        ckpt: str | None = None, devices: int = 1, loader_kw: dict[str, Any] | None = None) -> list[str]:
    """``mode`` ``stop``: train until global step ``stop_at``, checkpointing there (ModelCheckpoint
    every ``stop_at`` steps, as a mid-epoch checkpoint is made); ``resume``: ``fit(ckpt_path=ckpt)``
    for the rest of ``epochs``; ``elastic``: the same, the module loading the loader's state in
    ``on_load_checkpoint``.  Returns the warnings raised meanwhile, as text."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    out.mkdir(parents=True, exist_ok=True)
    common = dict(accelerator="cpu", devices=devices, max_epochs=epochs, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0)
    if devices > 1:
        common["strategy"] = "ddp"
    model = _module(trset, tokenizer, out, mode, loader_kw or {}, early=mode == "elastic")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode == "stop":
            saving = ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=stop_at, save_top_k=-1)
            L.Trainer(max_steps=stop_at, callbacks=[saving], **common).fit(model)
        else:
            L.Trainer(enable_checkpointing=False, **common).fit(model, ckpt_path=ckpt)
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trset", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--stop-at", type=int, required=True, help="stop, then resume from the checkpoint at this step")
    ap.add_argument("--loader", default="{}", help="make_loader keyword arguments, as JSON")
    ap.add_argument("--elastic", help="then resume this checkpoint of a smaller world size, loading the state early")
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    kw = json.loads(args.loader)
    said = run(args.trset, args.tokenizer, args.out, mode="stop", epochs=args.epochs, stop_at=args.stop_at,
               devices=world, loader_kw=kw)
    ckpt = sorted((args.out / "ckpt").glob("*.ckpt"))
    said += run(args.trset, args.tokenizer, args.out, mode="resume", epochs=args.epochs, ckpt=str(ckpt[-1]),
                devices=world, loader_kw=kw)
    if args.elastic:
        said += run(args.trset, args.tokenizer, args.out, mode="elastic", epochs=args.epochs, ckpt=args.elastic,
                    devices=world, loader_kw=kw)
    (args.out / f"warnings.rank{os.environ.get('RANK', '0')}.txt").write_text("\n".join(said), encoding="utf-8")


if __name__ == "__main__":
    main()
