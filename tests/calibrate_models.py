"""Models for the calibrate tests, built as a user's factory builds them: ``FACTORY(feat_dim=, vocab_size=)``."""

from __future__ import annotations

import torch
from torch import nn


class CTCModel(nn.Module):
    """An encoder over the frames, a linear layer to the vocabulary, CTC loss: what ``forward``
    returns is the scalar loss a training loop calls backward() on."""

    def __init__(self, encoder: nn.Module, dim: int, vocab_size: int, stride: int = 1) -> None:
        super().__init__()
        self.encoder, self.out, self.stride = encoder, nn.Linear(dim, vocab_size), stride
        self.ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    def forward(self, feats, feat_lens, labels, label_lens):
        x = self.encoder(feats)  # [B, T', dim]
        logp = self.out(x).log_softmax(-1).transpose(0, 1)  # [T', B, V]
        lens = torch.clamp(feat_lens // self.stride, max=logp.shape[0])
        return self.ctc(logp, labels, lens, label_lens)


class Transformer(nn.Module):
    def __init__(self, feat_dim: int, dim: int, layers: int, heads: int, ff: int) -> None:
        super().__init__()
        self.inp = nn.Linear(feat_dim, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, feats):
        return self.enc(self.inp(feats))


def transformer(feat_dim: int, vocab_size: int) -> nn.Module:
    """A small Transformer encoder at the full frame rate: self-attention makes its cost grow with t^2."""
    return CTCModel(Transformer(feat_dim, dim=32, layers=2, heads=2, ff=64), 32, vocab_size)


class Conv(nn.Module):
    """Two convolutions of stride 2 (frames / 4, as the encoders calibrate's subsampling stands for), then more."""

    def __init__(self, feat_dim: int, dim: int, layers: int) -> None:
        super().__init__()
        convs = [nn.Conv1d(feat_dim, dim, 5, stride=2, padding=2), nn.ReLU(),
                 nn.Conv1d(dim, dim, 5, stride=2, padding=2), nn.ReLU()]
        for _ in range(layers - 2):
            convs += [nn.Conv1d(dim, dim, 5, padding=2), nn.ReLU()]
        self.net = nn.Sequential(*convs)

    def forward(self, feats):
        return self.net(feats.transpose(1, 2)).transpose(1, 2)


def conv(feat_dim: int, vocab_size: int) -> nn.Module:
    """Convolutions only: every frame costs the same, whatever the length."""
    return CTCModel(Conv(feat_dim, dim=192, layers=4), 192, vocab_size, stride=4)


def raises(feat_dim: int, vocab_size: int) -> nn.Module:
    raise RuntimeError("hidden size 0 is not allowed")


class PerUtterance(CTCModel):
    """Forgets to reduce: returns one loss per utterance."""

    def __init__(self, feat_dim: int, vocab_size: int) -> None:
        super().__init__(Conv(feat_dim, 16, 2), 16, vocab_size, stride=4)
        self.ctc = nn.CTCLoss(blank=0, zero_infinity=True, reduction="none")


def per_utterance(feat_dim: int, vocab_size: int) -> nn.Module:
    return PerUtterance(feat_dim, vocab_size)


class MemoryLimited(nn.Module):
    """Runs out of "GPU memory" as a GPU would (torch.cuda.OutOfMemoryError, from inside forward)
    when a batch's activations, B * (T + T^2 / 100) elements, pass ``limit``."""

    def __init__(self, feat_dim: int, limit: float) -> None:
        super().__init__()
        self.lin, self.limit = nn.Linear(feat_dim, 4), limit

    @staticmethod
    def activations(size: int, frames: int) -> float:
        return size * (frames + frames * frames / 100)

    def forward(self, feats, feat_lens, labels, label_lens):
        b, t, _ = feats.shape
        if self.activations(b, t) > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.lin(feats).mean()
