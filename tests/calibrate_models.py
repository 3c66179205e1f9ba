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


def rnnt_loss(logp, labels, frame_lens, label_lens):
    """The RNN-T loss (Graves 2012) of a joint network's log-probabilities ``logp`` [B, T, U + 1, V]
    (blank id 0), summed over the lattice in torch on any device: the forward variable a label
    position at a time, each column in closed form (``alpha[t, u] = b[t] + logcumsumexp_k(alpha[k,
    u-1] + emit[k, u-1] - b[k])``, ``b`` the cumulative blank log-probabilities of column u), so the
    loop runs U + 1 times (labels are shorter than frames), not T x U.  Mean over the batch of
    -log P(labels | frames)."""
    b, t_max, _, _ = logp.shape
    blank = logp[..., 0]  # [B, T, U+1]
    emit = logp[:, :, :-1, :].gather(-1, labels[:, None, :, None].expand(b, t_max, -1, 1)).squeeze(-1)  # [B, T, U]
    zero = blank.new_zeros(b, 1)

    def before(u: int):  # the blanks of column u summed over the frames before each: [B, T]
        return torch.cat([zero, blank[:, :-1, u].cumsum(-1)], dim=-1)

    columns = [before(0)]
    for u in range(1, blank.shape[2]):
        c = before(u)
        columns.append(c + torch.logcumsumexp(columns[-1] + emit[:, :, u - 1] - c, dim=-1))
    alpha = torch.stack(columns, dim=2)  # [B, T, U+1]
    last_t = (frame_lens - 1).clamp(min=0)
    at = torch.arange(b, device=logp.device)
    return -(alpha[at, last_t, label_lens] + blank[at, last_t, label_lens]).mean()


class Transducer(nn.Module):
    """A small transducer: a convolution encoder (frames / 4) gives [B, T, H], a prediction network
    over the labels (blank first) [B, U + 1, H]; the joint network adds them for every (frame,
    label) pair, [B, T, U + 1, H] -> [B, T, U + 1, V], and the RNN-T loss sums over that lattice.
    The joint tensor is the term a transducer's memory and time are sized by: t x u."""

    def __init__(self, feat_dim: int, vocab_size: int, dim: int = 32, joint: int = 16) -> None:
        super().__init__()
        self.encoder = Conv(feat_dim, dim, 2)
        self.embed = nn.Embedding(vocab_size, dim)
        self.enc_proj, self.pred_proj = nn.Linear(dim, joint), nn.Linear(dim, joint)
        self.out = nn.Linear(joint, vocab_size)

    def forward(self, feats, feat_lens, labels, label_lens):
        enc = self.enc_proj(self.encoder(feats))  # [B, T', J]
        pred = self.pred_proj(self.embed(nn.functional.pad(labels, (1, 0))))  # [B, U+1, J]
        logp = self.out(torch.tanh(enc[:, :, None] + pred[:, None])).log_softmax(-1)  # [B, T', U+1, V]
        lens = torch.clamp((feat_lens + 3) // 4, max=logp.shape[1])
        return rnnt_loss(logp, labels, lens, label_lens)


def transducer(feat_dim: int, vocab_size: int) -> nn.Module:
    return Transducer(feat_dim, vocab_size)


class HostLimited(nn.Module):
    """Runs out of host memory as torch's CPU allocator does (a RuntimeError) when a batch holds more
    than ``limit`` padded frames: what ``rehearse`` must report and go past."""

    def __init__(self, feat_dim: int, limit: int) -> None:
        super().__init__()
        self.lin, self.limit = nn.Linear(feat_dim, 4), limit

    def forward(self, feats, feat_lens, labels, label_lens):
        b, t, _ = feats.shape
        if b * t > self.limit:
            raise RuntimeError(f"[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: "
                               f"you tried to allocate {b * t * 4096} bytes. Error code 12 (Cannot allocate memory)")
        return self.lin(feats).mean()


def host_limited(feat_dim: int, vocab_size: int) -> nn.Module:
    return HostLimited(feat_dim, limit=1180)


SLEEP_PER_FRAME = 5e-5  # seconds of wall clock a frame of a batch costs the sleepy model's step


class Sleepy(nn.Module):
    """A step that takes SLEEP_PER_FRAME seconds of wall clock per frame of its batch, asleep for
    nearly all of it: how long its grid takes is known whatever else the machine runs, and it
    costs the CPU little (a linear layer, timed by calibrate's CPU clock)."""

    def __init__(self, feat_dim: int, vocab_size: int) -> None:
        super().__init__()
        self.out = nn.Linear(feat_dim, vocab_size)

    def forward(self, feats, feat_lens, labels, label_lens):
        import time

        time.sleep(feats.shape[0] * feats.shape[1] * SLEEP_PER_FRAME)
        return self.out(feats).log_softmax(-1).mean()


def sleepy(feat_dim: int, vocab_size: int) -> nn.Module:
    return Sleepy(feat_dim, vocab_size)
