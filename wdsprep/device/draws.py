"""Each utterance's draw key, as a batch carries it to the trainer's device: (corpus seed, corpus epoch, row).

The loader draws an utterance's augmentation (SpecAugment's masks, the fbank's dither, noise and
reverberation) from a Philox generator keyed by its corpus's (seed, epoch) at a counter set by its
row in that corpus (:class:`~wdsprep.plan.augment.Draws`).  Those three integers are the whole
key: a batch that carries them as an int64 tensor ``[B, 3]`` (``batch.draw_keys``) lets a module
on the device draw exactly what the loader's readers would, whichever rank and reader made the
batch.  The draws themselves are a few numbers per utterance, made here with numpy on the CPU
(keep the keys there: reading them back from a GPU would wait for it); what the module computes
from them runs batched on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wdsprep.plan.augment import Draws

KEY_FIELDS = ("seed", "epoch", "row")


def draw_keys(seed: int, epoch: int, rows: Any) -> np.ndarray:
    """The keys of utterances ``rows`` (their rows in their corpus) of one corpus epoch: int64 [B, 3]."""
    rows = np.asarray(rows, np.int64).reshape(-1)
    out = np.empty((len(rows), 3), np.int64)
    out[:, 0], out[:, 1], out[:, 2] = seed, epoch, rows
    return check_keys(out)


def check_keys(keys: Any, batch: int | None = None) -> np.ndarray:
    """``keys`` (a tensor or array [B, 3]) as an int64 numpy array; ValueError naming what is wrong."""
    if hasattr(keys, "detach"):  # a torch tensor: the keys are a few bytes; a GPU's would be copied back
        keys = keys.detach().cpu().numpy()
    keys = np.asarray(keys)
    if keys.ndim != 2 or keys.shape[1] != len(KEY_FIELDS) or keys.dtype.kind not in "iu":
        raise ValueError(f"draw_keys must be integers [B, 3] ({', '.join(KEY_FIELDS)} per utterance), got "
                         f"{keys.dtype} {tuple(keys.shape)}")
    if batch is not None and len(keys) != batch:
        raise ValueError(f"draw_keys has {len(keys)} rows for a batch of {batch} utterances")
    if keys.size and keys.min() < 0:
        raise ValueError(f"draw_keys holds {int(keys.min())}: seeds, epochs and rows are >= 0")
    return keys.astype(np.int64, copy=False)


def corpus_draws(keys: np.ndarray) -> list[Draws]:
    """Each utterance's :class:`Draws` (one per distinct corpus epoch in the batch, shared)."""
    made: dict[tuple[int, int], Draws] = {}
    out = []
    for seed, epoch in keys[:, :2].tolist():
        d = made.get((seed, epoch))
        if d is None:
            d = made[(seed, epoch)] = Draws(seed, epoch)
        out.append(d)
    return out


def uniforms(keys: np.ndarray, n: int, stream: int = 0) -> np.ndarray:
    """Each utterance's first ``n`` uniforms of ``stream`` (float64 [B, n]): what ``Draws.uniforms``
    gives its reader."""
    out = np.empty((len(keys), n))
    for i, (d, row) in enumerate(zip(corpus_draws(keys), keys[:, 2].tolist())):
        out[i] = d.uniforms(row, n, stream)
    return out


def dither_noise(keys: np.ndarray, frames: np.ndarray, window: int, total: int) -> np.ndarray:
    """Each utterance's dither noise as the ``numpy`` fbank backend draws it (its own generator,
    ``Draws.dither``, a standard normal per sample of each of its frames): float64 [B, total,
    window], zero past each utterance's ``frames``."""
    out = np.zeros((len(keys), total, window))
    for i, (d, row) in enumerate(zip(corpus_draws(keys), keys[:, 2].tolist())):
        n = int(frames[i])
        if n:
            out[i, :n] = d.dither(row).standard_normal((n, window))
    return out
