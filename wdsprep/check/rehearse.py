"""``wdsprep rehearse``: the epoch's costliest batches through a training step of the user's model, before training.

The loader is the one ``make_loader`` builds with the options given (on ``world_size`` ranks: the
batches of all of them are ranked), the model the one ``calibrate`` builds (``MODULE:FACTORY``,
the same training step: the forward call or ``--step``, backward, the optimizer's step); the
rehearsal itself is ``Loader.rehearse`` (``loading/rehearsal.py``).  Look before you train: a
batch that runs out of memory here names itself and the budget that fits, instead of stopping a
run hours in.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from wdsprep.check.calibrate import TrainStep, bounded, build_model, device_of, load_callable
from wdsprep.loader import make_loader
from wdsprep.loading.rehearsal import Rehearsal
from wdsprep.plan.source import Trset
from wdsprep.tokenizer import Tokenizer


def rehearse(model: str, trset: Trset, tokenizer: Tokenizer | str | os.PathLike, *, k: int = 8, epoch: int = 0,
             device: str = "cpu", step: str | None = None, optimizer: str = "adamw", world_size: int = 1,
             max_seconds: float = 600.0, **loader_options: Any) -> Rehearsal:
    """Run a training step of ``model`` on the ``k`` costliest batches of ``epoch``, every rank's.

    Args:
        model: ``MODULE:FACTORY``, as :func:`~wdsprep.check.calibrate.calibrate` takes it; the
            factory gets the loader's ``feat_dim`` and the tokenizer's ``vocab_size``.
        trset, tokenizer, loader_options: :func:`~wdsprep.make_loader`'s (``max_frames``, or ``cost``
            and ``max_cost``, ...); rank 0 of ``world_size``.
        k: the batches rehearsed.
        epoch: the epoch whose plan they come from.
        device: ``cpu``, ``cuda`` or ``cuda:N``; on CUDA each step's peak memory is measured.
        step: ``MODULE:FUNC`` called as ``FUNC(model, feats, feat_lens, labels, label_lens) -> loss``
            instead of the forward call.
        optimizer: ``adamw`` (its state counts in the memory) or ``sgd``.
        max_seconds: the time the rehearsal's steps may take, all ``k`` together (reading the batches
            included): past it, the step running is stopped and a MeasurementError says so (a step
            that never returns would hold the command forever).
    """
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not 0 < max_seconds < math.inf:
        raise ValueError(f"max_seconds must be a finite number of seconds > 0, got {max_seconds!r}")
    dev = device_of(device)
    factory = load_callable(model, "--model")
    step_func = load_callable(step, "--step") if step is not None else None
    loader = make_loader(trset, tokenizer, rank=0, world_size=world_size, **loader_options)
    shards = loader.source.shards
    if shards.dims is None:
        raise ValueError(f"{trset}: the shards' feature dims are unknown (their index says none, or they differ): "
                         f"run wdsprep index on them")
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(loader.dataset.cfg.seed)
        net = build_model(factory, model, feat_dim=shards.dims, vocab_size=loader.tokenizer.vocab_size)
    train = TrainStep(net.to(dev).train(), device=dev, optimizer=optimizer, step=step_func, model_spec=model,
                      step_spec=step)
    loader.set_epoch(epoch)
    with bounded(max_seconds, f"rehearse: the steps ran past --max-seconds {max_seconds:g} (a step this slow, or "
                              f"one that never returns): give more --max-seconds or fewer --k, or check that the "
                              f"step returns"):
        return loader.rehearse(lambda batch: train(tuple(x.to(dev) for x in batch[:4])), k=k)
