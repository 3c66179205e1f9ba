"""What a training step costs: a cost model of the batch's shape, fitted to the user's own model.

A batch of ``B`` utterances whose longest has ``T`` frames and whose longest label has ``u``
tokens costs ``B * c(t, u)``, with ``t = T / subsampling`` the encoder's frames and::

    c(t, u) = per_utt + per_frame * t + per_frame2 * t**2 + per_token * u + per_token2 * u**2
              + per_frame_token * t * u

(coefficients >= 0): a Conformer or Transformer encoder spends a share of every layer on
self-attention (``t**2``), a decoder adds terms in the label length, and a transducer's joint
network (a ``B x t x u x V`` tensor) or an attention decoder's cross-attention grows with
``t * u``.  The units are the user's: seconds when ``wdsprep calibrate`` fitted them, or any scale,
since only the budget ``max_cost`` compares to them.  The model is given as a small JSON file or a
dict with these keys; ``calibrate`` writes the file (with the fit's figures under ``"fit"`` and
the budget it measured as ``"max_cost"``: notes the plan does not read).  Any other key is
refused, so a misspelt coefficient cannot silently count as 0.  Pure: no I/O but reading that
file, no torch.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from wdsprep.files import read_small

# per_frame_token last: a fit's coefficients are listed in this order.
COEFFICIENTS = ("per_utt", "per_frame", "per_frame2", "per_token", "per_token2", "per_frame_token")
TOKEN_TERMS = ("per_token", "per_token2", "per_frame_token")
# Keys a cost file may hold that are no coefficient: calibrate's figures and the budget it measured.
NOTES = ("fit", "max_cost")
COST_LIMIT = 1 << 20  # bytes of a cost model's JSON file: a few coefficients and calibrate's figures
# Coefficients a cost file may leave out at 0 and that JSON leaves out then: older files and
# states (fingerprints) stay as they were.
ADDED = ("per_frame_token",)


@dataclass(frozen=True)
class CostModel:
    """``B * c(t, u)`` of a batch: see the module's docstring."""

    subsampling: int = 1
    per_utt: float = 0.0
    per_frame: float = 0.0
    per_frame2: float = 0.0
    per_token: float = 0.0
    per_token2: float = 0.0
    per_frame_token: float = 0.0

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
        return any(getattr(self, name) for name in TOKEN_TERMS)

    def per_utterance(self, frames: np.ndarray | float, tokens: np.ndarray | float = 0) -> np.ndarray:
        """``c(t, u)``: what one utterance of a batch costs, padded to ``frames`` and ``tokens``
        (float64, elementwise)."""
        t = np.asarray(frames, np.float64) / self.subsampling
        u = np.asarray(tokens, np.float64)
        return (self.per_utt + t * (self.per_frame + self.per_frame2 * t)
                + u * (self.per_token + self.per_token2 * u + self.per_frame_token * t))

    def batch(self, size: np.ndarray | int, frames: np.ndarray | float, tokens: np.ndarray | float = 0) -> np.ndarray:
        """``B * c(t, u)`` of batches of ``size`` utterances padded to ``frames`` and ``tokens``."""
        return np.asarray(size, np.float64) * self.per_utterance(frames, tokens)

    def describe(self) -> str:
        """The model in one line, its nonzero terms: ``B x (512 t + 1 t^2), t = frames/4``."""
        terms = [f"{v:g}{unit}" for v, unit in ((self.per_utt, ""), (self.per_frame, " t"), (self.per_frame2, " t^2"),
                                                  (self.per_token, " u"), (self.per_token2, " u^2"),
                                                  (self.per_frame_token, " t·u")) if v]
        return f"B x ({' + '.join(terms)}), t = frames/{self.subsampling}"

    def to_json(self) -> dict[str, Any]:
        """The model's keys; a coefficient in :data:`ADDED` only when it is not 0."""
        return {k: v for k, v in asdict(self).items() if k not in ADDED or v}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "the cost model") -> CostModel:
        """From a dict with the model's keys and, at most, the file's notes (``"fit"``, ``"max_cost"``)."""
        keys = ("subsampling", *COEFFICIENTS)
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where} must be an object with {', '.join(keys)}, not {type(doc).__name__}")
        for k in doc:
            if k not in keys and k not in NOTES:
                near = difflib.get_close_matches(str(k), keys, n=1)
                raise ValueError(f"{where}: unknown key {k!r}{f' (did you mean {near[0]!r}?)' if near else ''}; a "
                                 f"cost model has {', '.join(keys)} (and the notes {', '.join(NOTES)})")
        note = doc.get("max_cost")
        if note is not None and (isinstance(note, bool) or not isinstance(note, (int, float))):
            raise ValueError(f"{where}: max_cost must be a number, got {note!r}")
        if "fit" in doc and not isinstance(doc["fit"], Mapping):
            raise ValueError(f"{where}: fit must be an object (calibrate's figures), got {doc['fit']!r}")
        kw = {k: doc[k] for k in keys if k in doc}
        if not kw:
            raise ValueError(f"{where} has none of {', '.join(keys)}")
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
        doc = json.loads(read_small(path, COST_LIMIT, "a cost model").decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such cost model file (wdsprep calibrate writes one)") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: not a cost model in JSON ({type(e).__name__}: {str(e)[:200]})") from None
    except ValueError as e:  # a FIFO, a device, a huge file
        raise ValueError(f"cost: {e}") from None
    except OSError as e:
        raise ValueError(f"{path}: the cost model cannot be read ({e.strerror})") from None
    return CostModel.from_json(doc, where=str(path))


def batch_cost(model: CostModel | None, frames: np.ndarray, tokens: np.ndarray | None = None) -> float:
    """What a batch of utterances of ``frames`` (and labels of ``tokens``) costs: ``B * c(t, u)`` of
    its longest under ``model``, else its padded frames (B x longest); 0 for no utterance."""
    frames = np.asarray(frames)
    if not len(frames):
        return 0.0
    longest = int(frames.max())
    if model is None:
        return float(len(frames) * longest)
    u = int(np.max(tokens)) if tokens is not None and len(tokens) else 0
    return float(model.batch(len(frames), longest, u))
