"""Kaldi fbank of padded waveform batches, as a torch module on the batch's device.

:class:`Fbank` computes what the loader's ``numpy`` backend computes (``prep/fbank.py``:
``compute-fbank-feats`` defaults, 25 ms povey windows every 10 ms, snip_edges, pre-emphasis 0.97,
DC removal, power spectrum, mel bins from 20 Hz to Nyquist from the same filter matrix, log
floored at float32 epsilon, energy floor 0), for every utterance of a batch at once: no Python
loop over utterances unless dither is on.  Measured against the numpy backend, every frame and mel
bin (``tests/test_device_features.py``, ``tools/bench/bench_fbank_device.py``): in float64 within
1e-6 max abs (the backend's own rounding of its result to float32); in float32 within 0.03 max
abs, mean 2e-6 (0.007 over the 206 demo utterances, 0.027 over 606 s of them joined into 5.5 s
utterances).  The float32 differences sit in the lowest mel bins (below ~100 Hz), whose energy
pre-emphasis and DC removal leave at ~1e-12 of a frame's, under float32's rounding in the FFT:
float64 input is the way to the numpy backend's figures there (``docs/audio.md``).
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import numpy as np
import torch

from wdsprep.device.draws import check_keys, dither_noise
from wdsprep.prep.fbank import FbankOptions, mel_banks
from wdsprep.units import fbank_frames, frame_samples

_PREEMPH = 0.97
# The options of the numpy backend this module computes; the backend and channel are not its to choose.
OPTIONS = tuple(f.name for f in fields(FbankOptions) if f.name not in ("backend", "channel"))


class Fbank(torch.nn.Module):
    """Kaldi fbank of padded waveforms on their device, equal to the loader's ``numpy`` backend.

    ``Fbank(num_mel_bins=80, sample_rate=16000, dither=0.0)``: the options of
    :class:`~wdsprep.prep.fbank.FbankOptions` (what an audio folder's index records).

    ``forward(audio, audio_lens, draw_keys=None)``:

    - ``audio``: float32 or float64 [B, S] in the int16 range (as the loader's waveforms and Kaldi
      take them, not [-1, 1]); int16 is taken as float32.  Computed in its dtype, on its device.
    - ``audio_lens``: [B] samples of each utterance; samples past it are never read.
    - ``draw_keys``: int64 [B, 3] (corpus seed, corpus epoch, row; ``device/draws.py``), needed
      with ``dither > 0`` only: the noise is then each utterance's own, drawn as the numpy backend
      draws it (numpy, on the CPU, one generator per utterance: exact, but a CPU cost of about
      that of the numpy fbank itself; dither 0, Kaldi's setting for reproducible features, has none).

    Returns ``(feats [B, T, num_mel_bins], feat_lens [B])``: ``feat_lens`` are Kaldi's frame
    counts, ``units.fbank_frames`` of ``audio_lens`` (what the plan counts); ``T`` is the frame
    count of ``S`` (the longest utterance's when the batch is padded to it, as the loader pads);
    frames past an utterance's length are 0.
    """

    def __init__(self, *, num_mel_bins: int = FbankOptions.num_mel_bins, sample_rate: int = FbankOptions.sample_rate,
                 dither: float = FbankOptions.dither) -> None:
        super().__init__()
        self.opts = FbankOptions(num_mel_bins=num_mel_bins, sample_rate=sample_rate, dither=dither, backend="numpy")
        self.window, self.shift = frame_samples(sample_rate)
        self.padded = 1 << (self.window - 1).bit_length()  # Kaldi's FFT size: the window up to a power of two
        n = np.arange(self.window)
        povey = (0.5 - 0.5 * np.cos(2 * np.pi * n / (self.window - 1))) ** 0.85
        # Not saved with a model's state: they follow from the options.
        self.register_buffer("povey", torch.from_numpy(povey), persistent=False)
        banks = mel_banks(num_mel_bins, sample_rate, self.padded)  # the numpy backend's own filters
        self.register_buffer("banks_t", torch.from_numpy(np.ascontiguousarray(banks.T)), persistent=False)
        self.floor = float(np.finfo(np.float32).eps)

    @classmethod
    def from_options(cls, opts: FbankOptions) -> Fbank:
        """The module for the options an audio folder's loader computes with (any backend named)."""
        return cls(**{name: getattr(opts, name) for name in OPTIONS})

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self.opts, name)}" for name in OPTIONS)

    def num_frames(self, audio_lens: torch.Tensor) -> torch.Tensor:
        """Kaldi's frame counts of ``audio_lens`` samples (int64, on their device): ``units.fbank_frames``."""
        lens = audio_lens.to(torch.int64)
        return torch.where(lens < self.window, 0, 1 + torch.div(lens - self.window, self.shift, rounding_mode="floor"))

    def forward(self, audio: torch.Tensor, audio_lens: torch.Tensor,
                draw_keys: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        if audio.ndim != 2:
            raise ValueError(f"Fbank takes padded waveforms [B, S], got a tensor of shape {tuple(audio.shape)}")
        if not audio.is_floating_point():
            audio = audio.to(torch.float32)
        batch, samples = audio.shape
        if audio_lens.shape != (batch,):
            raise ValueError(f"audio_lens must be [{batch}], got {tuple(audio_lens.shape)}")
        if audio_lens.device.type == "cpu" and batch and int(audio_lens.max()) > samples:  # free on the CPU only
            raise ValueError(f"audio_lens holds {int(audio_lens.max())} samples, the batch has {samples} per row")
        dtype, device = audio.dtype, audio.device
        feat_lens = self.num_frames(audio_lens.to(device))
        total = int(fbank_frames(samples, self.opts.sample_rate))
        if not total:
            return audio.new_zeros((batch, 0, self.opts.num_mel_bins)), feat_lens
        # Frames go straight into the FFT's zero-padded buffer: rfft(n=...) would pad a copy.
        frames = audio.new_empty((batch, total, self.padded))
        frames[..., self.window:] = 0.0
        inside = frames[..., :self.window]
        if self.opts.dither:
            self._dithered(audio, audio_lens, draw_keys, total, inside)
        else:
            self._frames(audio, total, inside)
        inside *= self.povey.to(dtype)
        spec = torch.fft.rfft(frames)
        del frames, inside
        power = spec.real.square()
        power += spec.imag.square()
        del spec
        mel = torch.matmul(power, self.banks_t.to(dtype))
        mel.clamp_(min=self.floor).log_()
        past = torch.arange(total, device=device)[None, :] >= feat_lens[:, None]
        return mel.masked_fill_(past[:, :, None], 0.0), feat_lens

    def _frames(self, audio: torch.Tensor, total: int, out: torch.Tensor) -> None:
        """Every frame with Kaldi's DC removal and pre-emphasis into ``out``, from the whole signal at
        once: a frame's pre-emphasis equals the signal's within it (its first sample differs, but the
        povey window weighs it 0), and of (frame - mean) it is that of the frame less 0.03 x its mean.
        Each frame's sum adds up blocks of gcd(window, shift) samples, as the numpy backend's does."""
        e = torch.empty_like(audio)
        e[:, 0] = 0.0
        torch.sub(audio[:, 1:], audio[:, :-1], alpha=_PREEMPH, out=e[:, 1:])
        block = math.gcd(self.window, self.shift)
        blocks = audio[:, :audio.shape[1] // block * block].unflatten(1, (-1, block)).sum(-1)
        sums = blocks.unfold(1, self.window // block, self.shift // block)[:, :total].sum(-1)
        dc = sums.mul_((1.0 - _PREEMPH) / self.window)
        torch.sub(e.unfold(1, self.window, self.shift)[:, :total], dc[..., None], out=out)

    def _dithered(self, audio: torch.Tensor, audio_lens: torch.Tensor, draw_keys: Any, total: int,
                  out: torch.Tensor) -> None:
        """Frames with each utterance's own dither (noise per sample of each frame: overlapping frames
        get noise of their own), then DC removal and pre-emphasis, as Kaldi and the numpy backend do."""
        if draw_keys is None:
            raise ValueError(f"Fbank with dither {self.opts.dither} needs draw_keys (each utterance's seed, epoch and "
                             f"row) to draw the numpy backend's noise; or use dither 0")
        keys = check_keys(draw_keys, audio.shape[0])
        counts = fbank_frames(audio_lens.detach().cpu().numpy().astype(np.int64), self.opts.sample_rate)
        noise = torch.from_numpy(dither_noise(keys, counts, self.window, total)).to(audio.device, audio.dtype)
        x = audio.unfold(1, self.window, self.shift)[:, :total] + self.opts.dither * noise
        x -= x.mean(-1, keepdim=True)
        out[..., 0] = (1.0 - _PREEMPH) * x[..., 0]
        torch.sub(x[..., 1:], x[..., :-1], alpha=_PREEMPH, out=out[..., 1:])
