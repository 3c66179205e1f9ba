"""SpecAugment of a padded feature batch on its device, with the loader's masks for each utterance's draws.

:class:`SpecAugmentModule` applies :func:`wdsprep.plan.augment.spec_augment` (the loader's,
options :class:`~wdsprep.plan.augment.SpecAugment`) to every utterance of a batch at once: the
same time warp, the same bands and stretches, the same fill, from the same uniforms, which it
draws from each utterance's key (``device/draws.py``) as the loader's readers draw them.  So a
trainer that computes features on its GPU gets the loader's augmentation, topology-free.
"""

from __future__ import annotations

from typing import Any

import torch

from wdsprep.device.draws import check_keys, uniforms
from wdsprep.plan.augment import Augment, SpecAugment


class SpecAugmentModule(torch.nn.Module):
    """The loader's SpecAugment on ``[B, T, D]`` features, batched on their device.

    ``SpecAugmentModule(SpecAugment(freq_masks=2, ...))`` or ``SpecAugmentModule(freq_masks=2, ...)``.

    ``forward(feats, feat_lens, draw_keys)``: ``feats`` float [B, T, D], ``feat_lens`` [B] frames
    of each utterance, ``draw_keys`` int64 [B, 3] (corpus seed, corpus epoch, row: the keys the
    loader draws each utterance's augmentation from).  Returns new features: each utterance
    warped and masked as :func:`~wdsprep.plan.augment.spec_augment` does it with the
    uniforms of its key, frames past its length 0.  The masks (which bins and frames) are the
    loader's exactly; a ``"mean"`` fill is the utterance's mean computed in float64 (the loader's
    is numpy's float32 mean: they differ in the last bits, ~1e-6 relative).  Deterministic: the
    module draws nothing but what the keys say, in ``eval()`` mode too (leave it out of the
    model for evaluation, as the loader's ``train=False``).
    """

    def __init__(self, opts: SpecAugment | None = None, **options: Any) -> None:
        super().__init__()
        if opts is not None and options:
            raise ValueError("give SpecAugmentModule either a SpecAugment or its options, not both")
        self.opts = opts if opts is not None else SpecAugment(**options)
        # The effect's slots do not move when other effects are on (Augment.layout), so these are the
        # loader's whatever else it augments with.
        self.slots = Augment(specaugment=self.opts).layout()["specaugment"]

    def extra_repr(self) -> str:
        return repr(self.opts)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, draw_keys: Any) -> torch.Tensor:
        if feats.ndim != 3:
            raise ValueError(f"SpecAugmentModule takes features [B, T, D], got shape {tuple(feats.shape)}")
        batch, total, dims = feats.shape
        keys = check_keys(draw_keys, batch)
        device, o = feats.device, self.opts
        slots = self.slots
        u = torch.from_numpy(uniforms(keys, slots.stop, slots.stream)[:, slots.start:]).to(device)  # float64 [B, n]
        t = feat_lens.to(device=device, dtype=torch.int64)
        frame = torch.arange(total, device=device)
        valid = frame[None, :] < t[:, None]  # [B, T]
        out = feats.masked_fill(~valid[:, :, None], 0.0)
        if o.time_warp:  # the warp fills frames past each length: zero them again before the mean
            out = self._warp(out, t, u, frame).masked_fill_(~valid[:, :, None], 0.0)
        if o.fill == "mean":
            fill = (out.to(torch.float64).sum((1, 2)) / (t.clamp(min=1) * dims)).to(feats.dtype)
        else:
            fill = out.new_zeros(batch)
        k = 2
        bins = torch.arange(dims, device=device)
        masked = torch.zeros(batch, total, dims, dtype=torch.bool, device=device)
        for _ in range(o.freq_masks):
            width = _floor(u[:, k] * (o.freq_width + 1)).clamp(max=min(o.freq_width, dims))
            start = torch.minimum(_floor(u[:, k + 1] * (dims - width + 1)), dims - width)
            masked |= ((bins[None, :] >= start[:, None]) & (bins[None, :] < (start + width)[:, None]))[:, None, :]
            k += 2
        most = torch.clamp(_floor(o.max_time_ratio * t.to(torch.float64)), max=o.time_width)
        for _ in range(o.time_masks):
            width = torch.minimum(_floor(u[:, k] * (most + 1).to(torch.float64)), most)
            start = torch.minimum(_floor(u[:, k + 1] * (t - width + 1).to(torch.float64)), t - width)
            masked |= ((frame[None, :] >= start[:, None]) & (frame[None, :] < (start + width)[:, None]))[:, :, None]
            k += 2
        out = torch.where(masked, fill[:, None, None], out)
        return out.masked_fill_(~valid[:, :, None], 0.0)

    def _warp(self, feats: torch.Tensor, t: torch.Tensor, u: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """Each utterance's frames ``[0, center)`` stretched onto ``[0, moved)`` and the rest onto
        ``[moved, t)`` by linear interpolation, where its draws move a frame (``augment._warp``)."""
        w = self.opts.time_warp
        span = (t - 2 * w).clamp(min=1)
        center = w + torch.minimum(_floor(u[:, 0] * span.to(torch.float64)), span - 1)
        moved = center + _floor(u[:, 1] * (2 * w + 1)).clamp(max=2 * w) - w
        warp = (t > 2 * w + 1) & (moved != center)
        pos = frame.to(torch.float64)[None, :]
        c, m, last = center[:, None].to(torch.float64), moved[:, None], (t - 1)[:, None]
        # float64 with the loader's order of operations, so the source positions are the same numbers
        left = pos * (c / m.clamp(min=1).to(torch.float64))
        right = c + (pos - m.to(torch.float64)) * ((last - center[:, None]).to(torch.float64)
                                                   / (last - m).clamp(min=1).to(torch.float64))
        src = torch.where(pos < m.to(torch.float64), left, right)
        lo = torch.minimum(src.floor().to(torch.int64).clamp(min=0), last.clamp(min=0))
        hi = torch.minimum(lo + 1, last.clamp(min=0))
        frac = (src - lo.to(torch.float64))[:, :, None]
        x = feats.to(torch.float64)
        dims = feats.shape[2]
        lo_f = torch.gather(x, 1, lo[:, :, None].expand(-1, -1, dims))
        hi_f = torch.gather(x, 1, hi[:, :, None].expand(-1, -1, dims))
        warped = ((1 - frac) * lo_f + frac * hi_f).to(feats.dtype)
        return torch.where(warp[:, None, None], warped, feats)


def _floor(x: torch.Tensor) -> torch.Tensor:
    """``int()`` of non-negative float64s, as the loader truncates its draws: int64."""
    return x.floor().to(torch.int64)
