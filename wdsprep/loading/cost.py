"""What a training step costs: a cost model of the batch's shape, fitted to the user's own model.

A batch of ``B`` utterances whose longest has ``T`` frames and whose longest label has ``u``
tokens costs ``B * c(t, u)``, with ``t = T / subsampling`` the encoder's frames and::

    c(t, u) = per_utt + per_frame * t + per_frame2 * t**2 + per_token * u + per_token2 * u**2

(coefficients >= 0): a Conformer or Transformer encoder spends a share of every layer on
self-attention (``t**2``), a decoder or transducer loss adds terms in the label length.  The units
are the user's: seconds when ``wdsprep calibrate`` fitted them, or any scale, since only the
budget ``max_cost`` compares to them.  The model is given as a small JSON file or a dict with
these keys; ``calibrate`` writes the file (with the fit's figures under ``"fit"``, which the plan
ignores).  Pure: no I/O but reading that file, no torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

COEFFICIENTS = ("per_utt", "per_frame", "per_frame2", "per_token", "per_token2")


@dataclass(frozen=True)
class CostModel:
    """``B * c(t, u)`` of a batch: see the module's docstring."""

    subsampling: int = 1
    per_utt: float = 0.0
    per_frame: float = 0.0
    per_frame2: float = 0.0
    per_token: float = 0.0
    per_token2: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.subsampling, bool) or not isinstance(self.subsampling, int) or self.subsampling < 1:
            raise ValueError(f"the cost model's subsampling must be an integer >= 1, got {self.subsampling!r}")
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"the cost model's {name} must be a finite number >= 0, got {value!r}")
        if not any(getattr(self, name) for name in COEFFICIENTS):
            raise ValueError("the cost model has every coefficient 0: every batch would cost nothing")

    @property
    def uses_tokens(self) -> bool:
        """Whether the cost depends on the labels' length in tokens."""
        return bool(self.per_token or self.per_token2)

    def per_utterance(self, frames: np.ndarray | float, tokens: np.ndarray | float = 0) -> np.ndarray:
        """``c(t, u)``: what one utterance of a batch costs, padded to ``frames`` and ``tokens``
        (float64, elementwise)."""
        t = np.asarray(frames, np.float64) / self.subsampling
        u = np.asarray(tokens, np.float64)
        return self.per_utt + t * (self.per_frame + self.per_frame2 * t) + u * (self.per_token + self.per_token2 * u)

    def batch(self, size: np.ndarray | int, frames: np.ndarray | float, tokens: np.ndarray | float = 0) -> np.ndarray:
        """``B * c(t, u)`` of batches of ``size`` utterances padded to ``frames`` and ``tokens``."""
        return np.asarray(size, np.float64) * self.per_utterance(frames, tokens)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "the cost model") -> CostModel:
        """From a dict with the model's keys; other keys (``"fit"``, ``"max_cost"``) are the file's notes."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where} must be an object with {', '.join(('subsampling', *COEFFICIENTS))}, "
                             f"not {type(doc).__name__}")
        kw = {k: doc[k] for k in ("subsampling", *COEFFICIENTS) if k in doc}
        if not kw:
            raise ValueError(f"{where} has none of subsampling, {', '.join(COEFFICIENTS)}")
        try:
            return cls(**kw)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def load_cost(cost: CostModel | Mapping[str, Any] | str | os.PathLike) -> CostModel:
    """A cost model as given: the model itself, a dict, or the path of its JSON file."""
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, Mapping):
        return CostModel.from_json(cost)
    path = Path(cost)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such cost model file (wdsprep calibrate writes one)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a cost model in JSON ({e})") from None
    return CostModel.from_json(doc, where=str(path))
