"""``wdsprep calibrate``: the cost model of a training step, fitted to the user's own model.

The plan can size batches by what a step costs (:mod:`wdsprep.plan.cost`): ``B * c(t, u)``
with ``t`` the subsampled frames and ``u`` the label tokens.  This module measures ``c`` on the
model that will train: it builds the model from the user's factory, times forward + backward + an
optimizer step on synthetic batches over a grid of shapes covering the corpus's lengths (from the
shards' index), fits the six coefficients by non-negative least squares on relative error, checks
the fit on shapes it did not fit, and writes the JSON file the loader takes (``cost=``).  On CUDA
it also searches, per length, the largest batch that trains without running out of memory (as
NeMo's OOMptimizer does) and turns that into the largest safe ``max_cost``.

The grid: ``costfit.LENGTHS`` lengths from the 5th to the 99.9th percentile of the corpus's frames,
spaced geometrically, three label lengths at each (the most tokens a label of that length is
expected to hold, a third and a ninth of that, so the token terms are told apart from the frame
terms and from each other), and a batch size that keeps ``B * T`` near one frame budget, as the
plan's batches are; the budget is chosen from a pilot step so that the whole grid fits
``max_seconds``.  Where not even one utterance a batch at the longest length lets it fit, a smaller
grid is timed within the time (fewer lengths, fewer rounds: ``SMALLER_GRIDS``), the file says so
(``fit.grid``) with the error to expect of the model (``fit.expected_error``: the held-out
shapes'); only a time not even the smallest grid fits is refused, saying how much it needs.
Every other length is held out of the fit and tells its error.  Shapes are timed in rounds, each
round in a new random order, so a machine that slows down for a while slows every shape alike; a
shape's time is the fastest of its rounds: other work on the machine only ever adds time to a step.
Given the ``max_frames`` a corpus would otherwise train with, the costliest batch of that plan
under the fitted cost is the ``max_cost`` suggested (``costfit.frames_budget``).

This module is the torch side (the model, the training step, the timing, the CUDA probes); the
grid, the fit and the memory search are plain numbers in ``check/costfit.py``.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from wdsprep.check.costfit import (
    FRAME_QUANTILES,
    LABEL_DIVISORS,
    LENGTHS,
    TERMS,
    FramesBudget,
    MemorySearch,
    Shape,
    Timing,
    bar_disabled,
    fit_cost,
    frames_budget,
    grid_labels,
    label_tokens,
    length_grid,
    search_memory,
    timing_noise,
)
from wdsprep.errors import MeasurementError
from wdsprep.files import not_regular, write_text
from wdsprep.loading.rehearsal import out_of_memory
from wdsprep.plan.compose import load_shards
from wdsprep.plan.cost import COEFFICIENTS, CostModel
from wdsprep.plan.shardset import ShardSet
from wdsprep.tokenizer import load_tokenizer
from wdsprep.tokenizer.base import Tokenizer

# Label tokens per input frame the grid times at most, unless told (tokens_per_frame=): the 95th
# percentile of the corpus's own labels, counted with the tokenizer (and kept beside the index for
# the loader: plan/tokens.py).  On the bundled demo corpus a character tokenizer gives 0.10
# tokens a frame overall and 0.19 at the 95th percentile, a 200-piece sentencepiece model 0.07 and
# 0.13; the grid's shorter label lengths (a third, a ninth) cover the shorter labels.
TOKENS_QUANTILE = 0.95
MAX_BATCH_FRAMES = 50_000  # the frame budget of a timed batch is at most this (B * T)
# Rounds of the grid: one warm-up, then at least MIN, as many as the budget allows up to MAX; the
# batch size is chosen for TARGET rounds (more, smaller steps average a noisy machine out better).
WARMUP, MIN_ROUNDS, TARGET_ROUNDS, MAX_ROUNDS = 1, 3, 7, 11
# Smaller grids, largest first, for a time the full grid does not fit: (lengths, timed rounds at
# least).  Five lengths still hold three out, and fit the six coefficients on nine shapes.
SMALLER_GRIDS = ((LENGTHS, 2), (7, 2), (7, 1), (5, 1))
OOM_BUCKETS = 5  # lengths the memory search runs at, up to the corpus's longest utterance
OPTIMIZERS = ("adamw", "sgd")


class ModelError(ValueError):
    """The user's model, factory or step cannot be used as given; the message says which and what to do."""


@dataclass
class Calibration:
    """What ``calibrate`` measured and fitted; ``to_json`` is the file it writes."""

    cost: CostModel
    device: str
    threads: int
    timings: list[Timing]
    seconds: float
    frames: dict[str, float]  # the corpus's length range
    tokens_per_frame: float
    max_tokens: int | None
    batch_frames: int  # the frame budget B * T of the timed batches
    model: str
    step: str | None
    optimizer: str
    memory: MemorySearch | None = None
    budget: FramesBudget | None = None  # the costliest batch of the frames plan max_frames cuts
    # The grid timed: its lengths (of the full grid's), timed rounds, what the full grid would have
    # needed and the time given; ``reduced``: a smaller grid, to fit the time.
    grid: dict[str, Any] | None = None

    @property
    def noise(self) -> float:
        """The timings' noise (:func:`~wdsprep.check.costfit.timing_noise`): terms that explain less are not fitted."""
        return timing_noise(self.timings)

    def errors(self, held_out: bool) -> np.ndarray:
        """Relative error of the fitted cost against the measured time, on the held-out or the fitted shapes."""
        ts = [t for t in self.timings if t.held_out == held_out]
        if not ts:
            return np.zeros(0)
        pred = self.cost.batch([t.shape.size for t in ts], [t.shape.frames for t in ts], [t.shape.tokens for t in ts])
        return pred / np.array([t.seconds for t in ts]) - 1

    @property
    def max_cost(self) -> float | None:
        """The budget the file holds as a note: the memory search's on CUDA, else the frames plan's."""
        if self.memory is not None and self.memory.max_cost is not None:
            return self.memory.max_cost
        return None if self.budget is None else self.budget.cost

    def to_json(self) -> dict[str, Any]:
        held, fitted = self.errors(True), self.errors(False)
        fit: dict[str, Any] = {
            "device": self.device, "threads": self.threads, "torch": torch.__version__, "model": self.model,
            "step": self.step, "optimizer": self.optimizer, "seconds": round(self.seconds, 1),
            "frames": self.frames, "tokens_per_frame": self.tokens_per_frame,
            "max_tokens": self.max_tokens, "batch_frames": self.batch_frames,
            "held_out_error": _summary(held), "fitted_error": _summary(fitted), "noise": round(self.noise, 4),
            # What to expect of the model on shapes it was not fitted to: the held-out shapes' error.
            "expected_error": _summary(held), **({"grid": self.grid} if self.grid is not None else {}),
            "shapes": [{"batch": t.shape.size, "frames": t.shape.frames, "tokens": t.shape.tokens,
                        "seconds": t.seconds, "held_out": t.held_out} for t in self.timings],
        }
        if self.memory is not None:
            fit["memory"] = {"margin": self.memory.margin,
                             "buckets": [{"frames": s.frames, "tokens": s.tokens, "max_batch": s.size, "cost": c}
                                         for s, c in self.memory.buckets]}
        if self.budget is not None:
            b = self.budget
            fit["frames_budget"] = {"max_frames": b.max_frames, "seed": b.seed, "epoch": b.epoch,
                                    "batches": b.batches, "cost": b.cost,
                                    "costliest": {"batch": b.costliest.size, "frames": b.costliest.frames,
                                                  "tokens": b.costliest.tokens}}
        doc: dict[str, Any] = self.cost.to_json()
        if self.max_cost is not None:
            doc["max_cost"] = self.max_cost
        doc["fit"] = fit
        return doc

    def format(self) -> str:
        """The report ``wdsprep calibrate`` prints."""
        c, ts = self.cost, self.timings
        frames = sorted({t.shape.frames for t in ts})
        tokens = sorted({t.shape.tokens for t in ts})
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        lines = [f"timed {len(ts)} shapes on {self.device} ({threads}) in {self.seconds:.1f} s: "
                 f"{len(frames)} lengths {frames[0]}..{frames[-1]} frames, labels {tokens[0]}..{tokens[-1]} tokens, "
                 f"batches of about {self.batch_frames:,} frames",
                 f"cost of an utterance, seconds (t = frames / {c.subsampling}, u = tokens): "
                 + " + ".join(f"{getattr(c, n):.4g}{term}" for n, term in zip(COEFFICIENTS, TERMS, strict=True))]
        med = self.frames["median"]
        u = label_tokens(int(med), tokens_per_frame=self.tokens_per_frame, max_tokens=self.max_tokens,
                         subsampling=c.subsampling)
        shares = _shares(c, med, u)
        lines.append(f"at the median length ({med:.0f} frames, {u} tokens): "
                     + ", ".join(f"{name} {share:.0%}" for name, share in shares.items()))
        held, fitted = self.errors(True), self.errors(False)
        g = self.grid
        if g is not None and g["reduced"]:
            lines.append(f"a smaller grid, to fit --max-seconds {g['max_seconds']:g} (the full one needs about "
                         f"{g['full_seconds']:.0f} s): {g['lengths']} of {g['of']} lengths, {g['rounds']} timed "
                         f"round{'s' if g['rounds'] != 1 else ''}; expected error, as on the shapes it held out: "
                         f"median {np.median(np.abs(held)):.1%}, max {np.abs(held).max():.1%}")
        lines.append(f"fit error on {len(held)} held-out shapes: median {np.median(np.abs(held)):.1%}, max "
                     f"{np.abs(held).max():.1%} (on the {len(fitted)} fitted: median {np.median(np.abs(fitted)):.1%}, "
                     f"max {np.abs(fitted).max():.1%}); timing noise {self.noise:.1%} (a quadratic term that "
                     f"explains less is left out)")
        if self.memory is not None:
            m = self.memory
            lines.append("memory search, the largest batch that trained at each length:")
            for s, cost in m.buckets:
                if s.size == 0:
                    lines.append(f"  {s.frames} frames, {s.tokens} tokens: not even one utterance")
                    continue
                capped = " (the search's cap: more may fit)" if s.size >= m.cap else ""
                lines.append(f"  {s.frames} frames, {s.tokens} tokens: {s.size}{capped}, cost {cost:.4g}")
            if m.max_cost is not None:
                lines.append(f"max_cost {m.max_cost:.4g}: the smallest of those, less a margin of {m.margin:.0%}")
        if self.budget is not None:
            lines.append(self._budget_line())
        return "\n".join(lines)

    def _budget_line(self) -> str:
        b = self.budget
        assert b is not None
        s = b.costliest
        line = (f"max_cost {b.cost:.4g} keeps the peak of the frames plan: the costliest of the {b.batches:,} batches "
                f"max_frames {b.max_frames:,} cuts (epoch {b.epoch}, seed {b.seed}) holds {_utterances(s.size)} of up "
                f"to {s.frames} frames and {s.tokens} tokens; batches cut by cost within it cost no more")
        m = self.memory
        if m is None:
            return line + " (written as max_cost)"
        if m.max_cost is not None and m.max_cost < b.cost:
            return line + (f"; that is more than the memory search allows ({m.max_cost:.4g}): the frames plan "
                           f"would run out of memory, so max_cost {m.max_cost:.4g} is written")
        return line + " (the memory search's is written)"


def _utterances(n: int) -> str:
    return f"{n} utterance{'s' if n != 1 else ''}"


def _summary(errors: np.ndarray) -> dict[str, float] | None:
    if not len(errors):
        return None
    a = np.abs(errors)
    return {"median": round(float(np.median(a)), 4), "max": round(float(a.max()), 4)}


def _shares(cost: CostModel, frames: float, tokens: float) -> dict[str, float]:
    """Each term's share of ``c(t, u)`` at one length."""
    t = frames / cost.subsampling
    terms = {"per utterance": cost.per_utt, "frames": cost.per_frame * t, "frames^2": cost.per_frame2 * t * t,
             "tokens": cost.per_token * tokens, "tokens^2": cost.per_token2 * tokens * tokens,
             "frames x tokens": cost.per_frame_token * t * tokens}
    total = sum(terms.values()) or 1.0
    return {k: v / total for k, v in terms.items()}


# --- the user's model ---------------------------------------------------------------------------

def load_callable(spec: str, option: str) -> Callable:
    """``MODULE:NAME``: ``NAME`` of a dotted module on ``sys.path`` or of a ``.py`` file.

    A file's folder goes first on ``sys.path`` (as when Python runs the file), so a model file
    may import the modules beside it."""
    module, colon, name = spec.rpartition(":")
    if not colon or not module or not name.isidentifier():
        raise ModelError(f"{option} {spec!r}: expected MODULE:NAME, e.g. mypkg.model:build or path/to/model.py:build")
    path = Path(module)
    if module.endswith(".py") or os.sep in module or "/" in module:
        if not path.is_file():
            kind = not_regular(path)
            if kind is not None:  # a FIFO would wait for a writer forever, a device never end
                raise ModelError(f"{option}: {path} is {kind}, not a regular file: give the .py file of the module")
            raise FileNotFoundError(f"{path}: no such file ({option} takes MODULE:NAME, MODULE a dotted module on "
                                    f"the Python path or the path of a .py file)")
        mod_name = f"wdsprep_user_{path.stem}_{abs(hash(str(path.resolve()))):x}"
        spec_ = importlib.util.spec_from_file_location(mod_name, path)
        if spec_ is None or spec_.loader is None:
            raise ModelError(f"{option}: {path} cannot be imported as a Python module")
        mod = importlib.util.module_from_spec(spec_)
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        sys.modules[mod_name] = mod  # classes defined in it must find their module (dataclasses, pickling)
        try:
            spec_.loader.exec_module(mod)
        except (Exception, SystemExit) as e:
            del sys.modules[mod_name]
            raise ModelError(f"{option}: importing {path} raised {_raised(e)} (fix the module; 'python {path}' shows "
                             f"where)") from e
        where = str(path)
    else:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
                raise ModelError(f"{option}: no module named {module!r} on the Python path: install it, add its "
                                 f"folder to PYTHONPATH, or give the path of its .py file") from None
            raise ModelError(f"{option}: importing {module} failed: {_first_line(e)} (a module it imports is not "
                             f"installed)") from e
        except (Exception, SystemExit) as e:
            raise ModelError(f"{option}: importing {module} raised {_raised(e)} (fix the module; 'python -c \"import "
                             f"{module}\"' shows where)") from e
        where = module
    try:
        func = getattr(mod, name)
    except AttributeError:
        raise ModelError(f"{option}: {where} has no {name!r}: name a function defined in it") from None
    if not callable(func):
        raise ModelError(f"{option}: {where}:{name} is a {type(func).__name__}, not a function")
    return func


def _raised(e: BaseException) -> str:
    """What the user's code raised, for a message: ``sys.exit`` said as such."""
    if isinstance(e, SystemExit):
        return f"SystemExit (it called sys.exit({e.code!r}))"
    return f"{type(e).__name__}: {_first_line(e)}"


def build_model(factory: Callable, spec: str, *, feat_dim: int, vocab_size: int) -> torch.nn.Module:
    """``factory(feat_dim=, vocab_size=)``, checked to be a module with parameters."""
    try:
        model = factory(feat_dim=feat_dim, vocab_size=vocab_size)
    except (Exception, SystemExit) as e:
        raise ModelError(f"--model {spec}: calling it with feat_dim={feat_dim}, vocab_size={vocab_size} raised "
                         f"{_raised(e)} (the factory must take those two keyword arguments and return the "
                         f"model)") from e
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"--model {spec}: returned a {type(model).__name__}, not a torch.nn.Module: the factory must "
                         f"return the model")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(f"--model {spec}: the model has no trainable parameters, so there is no training step to time")
    return model


class TrainStep:
    """One training step as a loop runs it: the forward call (or the user's step), backward, the
    optimizer's step.  Raises :class:`ModelError` when the call fails or does not return a scalar
    loss; running out of memory (``loading.rehearsal.out_of_memory``) goes through as it is."""

    def __init__(self, model: torch.nn.Module, *, device: torch.device, optimizer: str, step: Callable | None,
                 model_spec: str, step_spec: str | None) -> None:
        self.model, self.device = model, device
        self.call = step if step is not None else (lambda m, *batch: m(*batch))
        self.what = f"--step {step_spec}" if step_spec else f"the forward of --model {model_spec}"
        self.hint = ("return the loss as a scalar tensor" if step_spec else
                     "reduce it to a scalar in forward, or give --step MODULE:FUNC that returns the loss")
        params = [p for p in model.parameters() if p.requires_grad]
        # The learning rate is tiny, not zero: some optimizers skip work at lr 0.
        if optimizer == "adamw":
            self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-8)
        else:
            self.optimizer = torch.optim.SGD(params, lr=1e-8)

    def __call__(self, batch: tuple[torch.Tensor, ...]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss = self.call(self.model, *batch)
        except (Exception, SystemExit) as e:  # a step calling sys.exit(3) ended the command with no word
            if out_of_memory(e) or isinstance(e, MeasurementError):  # the step's time ran out: not its fault
                raise
            feats = batch[0]
            raise ModelError(f"{self.what} raised {_raised(e)} on a batch of "
                             f"feats {list(feats.shape)} and labels {list(batch[2].shape)} (the loader's batch: "
                             f"feats, feat_lens, labels, label_lens; fix the model, or give --step MODULE:FUNC "
                             f"that calls it)") from e
        if not isinstance(loss, torch.Tensor):
            raise ModelError(f"{self.what} returned a {type(loss).__name__}, not a scalar loss tensor: {self.hint}")
        if loss.numel() != 1:
            raise ModelError(f"{self.what} returned a tensor of shape {list(loss.shape)}, not a scalar loss: "
                             f"{self.hint}")
        if not loss.requires_grad:
            raise ModelError(f"{self.what} returned a loss that does not depend on the model's parameters "
                             f"(requires_grad is False): return the loss the training loop calls backward() on")
        try:
            loss.reshape(()).backward()
            self.optimizer.step()
        except Exception as e:
            if out_of_memory(e) or isinstance(e, MeasurementError):
                raise
            raise ModelError(f"the backward pass of the loss {self.what} returned raised {type(e).__name__}: "
                             f"{_first_line(e)}") from e

    def release(self) -> None:
        """Drop the gradients (after a step that ran out of memory, they may be half made)."""
        self.optimizer.zero_grad(set_to_none=True)


def _first_line(e: BaseException) -> str:
    """An exception's message, on one line (the CLI prints one)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def make_batch(shape: Shape, *, feat_dim: int, vocab_size: int, device: torch.device,
               generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A batch as the loader gives it (feats float32 [B,T,D], feat_lens int64 [B], labels int64
    [B,U] padded with 0, label_lens int64 [B]), every utterance as long as the longest: the padded
    batch is what the step computes on."""
    b, t, u = shape.size, shape.frames, shape.tokens
    feats = torch.randn(b, t, feat_dim, generator=generator)
    # Ids from 2 on: 0 is the blank/padding and 1 <unk> (CAT's convention).
    low = 2 if vocab_size > 2 else 1
    labels = torch.randint(low, max(low + 1, vocab_size), (b, u), generator=generator)
    lens = torch.full((b,), t, dtype=torch.int64), torch.full((b,), u, dtype=torch.int64)
    return tuple(x.to(device) for x in (feats, lens[0], labels, lens[1]))


# --- the timing --------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(device: torch.device) -> Callable[[], float]:
    """What a step's seconds are read from: on CUDA the wall clock (the step ends when the kernels
    it queued are done); on CPU the process's CPU time, which other processes of a shared machine
    do not inflate (with several torch threads it counts each, as the machine pays them)."""
    return time.perf_counter if device.type == "cuda" else time.process_time


@contextmanager
def bounded(seconds: float, why: str) -> Iterator[None]:
    """A block that ends within ``seconds`` from now; one that runs past (a step too slow for the
    budget, or one that never returns) is stopped by SIGALRM and raises MeasurementError saying
    ``why`` (main thread only: elsewhere it is not bounded).  ``calibrate`` and ``rehearse`` bound
    the user's steps with it."""
    main = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")

    def expire(*_: object) -> None:
        raise MeasurementError(why)

    if not main:
        yield
        return
    # An alarm set before (a test runner's timeout) is put back afterwards, less the time spent.
    old = signal.signal(signal.SIGALRM, expire)
    t0 = time.monotonic()
    before, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if before:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, before - (time.monotonic() - t0)))


def _timed(step: TrainStep, batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[float, float]:
    """Seconds of one step by :func:`_clock`, and by the wall clock (what the time budget counts)."""
    clock = _clock(device)
    _sync(device)
    t0, w0 = clock(), time.perf_counter()
    step(batch)
    _sync(device)
    return clock() - t0, time.perf_counter() - w0


def _free(step: TrainStep) -> None:
    """After a step ran out of GPU memory: its gradients dropped, the young reference cycles
    collected (a traceback's frames may hold the step's tensors; a full collection takes ~0.5 s
    with torch loaded), the allocator's cache given back."""
    step.release()
    gc.collect(1)
    torch.cuda.empty_cache()


def _time_shape(step: TrainStep, batch: Callable[[Shape], tuple], x: Timing,
                device: torch.device) -> tuple[float, float]:
    """:func:`_timed` on ``x``'s shape.  When the GPU runs out of memory the batch is halved (and
    the rounds timed so far dropped: they timed another shape), down to one utterance."""
    while True:
        try:
            return _timed(step, batch(x.shape), device)
        except torch.cuda.OutOfMemoryError:
            pass
        _free(step)
        if x.shape.size == 1:
            raise ModelError(f"one utterance of {x.shape.frames} frames (a label of {x.shape.tokens} tokens) does not "
                             f"train in the memory of {device}: calibrate on a larger GPU, or give --step MODULE:FUNC "
                             f"that trains as you will (e.g. under torch.autocast)")
        x.shape = replace(x.shape, size=x.shape.size // 2)
        x.rounds.clear()


# --- the memory probe --------------------------------------------------------------------------

def oom_guard(run: Callable[[Shape], None], on_oom: Callable[[], None]) -> Callable[[Shape], bool]:
    """``run`` as a probe: True when the step ran, False when it raised ``torch.cuda.OutOfMemoryError``
    (then ``on_oom`` frees what it can, outside the ``except`` so the traceback's frames, which hold
    the step's tensors, are gone)."""
    def fits(shape: Shape) -> bool:
        try:
            run(shape)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        on_oom()
        return False
    return fits


# --- the whole calibration -----------------------------------------------------------------------

def calibrate(model: str, trset: str | Sequence[str], tokenizer: str | os.PathLike, out: str | os.PathLike, *,
              device: str = "cpu", step: str | None = None, max_seconds: float = 120.0, subsampling: int = 4,
              seed: int = 0, tokens_per_frame: float | None = None, max_tokens: int | None = None,
              optimizer: str = "adamw", oom_margin: float = 0.1, max_frames: int | None = None,
              max_error: float = 0.25, overwrite: bool = False, progress: bool | None = None) -> Calibration:
    """Fit the cost model of a training step of ``model`` and write it to ``out`` (JSON).

    Args:
        model: ``MODULE:FACTORY``; ``FACTORY(feat_dim=, vocab_size=)`` returns the model, whose
            ``forward(feats, feat_lens, labels, label_lens)`` returns the scalar loss.  ``MODULE`` is
            a dotted module on the Python path or a ``.py`` file.
        trset: the training shards (pattern or list); their index gives the feature dims and lengths.
        tokenizer: the tokenizer file; gives ``vocab_size``.
        device: ``cpu``, ``cuda`` or ``cuda:N``.  On CUDA the largest safe ``max_cost`` is searched too.
        step: ``MODULE:FUNC`` called as ``FUNC(model, feats, feat_lens, labels, label_lens) -> loss``
            instead of the forward call (e.g. to run it under ``torch.autocast``).
        max_seconds: time for the timing, from the first step on (importing and building the model, and
            the CUDA memory search, come on top); a smaller grid is timed where the full one does not fit.
        subsampling: the encoder's frame rate reduction: ``t = frames / subsampling``.
        seed: seeds the model's initialisation, the synthetic batches and the timing order.
        tokens_per_frame, max_tokens: the longest label the grid times at a length, ``tokens_per_frame
            * frames`` at most ``max_tokens`` (also at most the subsampled frames); by default the
            rate of the corpus's own labels (their 95th percentile of tokens per frame).
        optimizer: ``adamw`` (its state counts in the memory search) or ``sgd``.
        oom_margin: the share of the largest batch that fit kept free (CUDA).
        max_frames: the frame budget the corpus would otherwise train with: the costliest batch of
            its plan (epoch 0, ``seed``), under the fitted cost, is the ``max_cost`` suggested, and
            written as the file's ``max_cost`` where no memory search gives one (CPU).
        max_error: the largest relative error on a held-out shape a model may have and be written;
            above it :class:`~wdsprep.errors.MeasurementError` says why and nothing is written (the
            timings were too noisy to trust, or the step's cost is not of the model's form).
        overwrite: replace ``out`` if it exists.
        progress: bars on stderr; None shows them on a terminal only.

    Threads: torch's (``torch.set_num_threads``, ``OMP_NUM_THREADS``), as they are.
    """
    t_start = time.perf_counter()
    _check_options(max_seconds=max_seconds, subsampling=subsampling, tokens_per_frame=tokens_per_frame,
                   max_tokens=max_tokens, optimizer=optimizer, oom_margin=oom_margin, max_frames=max_frames,
                   seed=seed, max_error=max_error)
    out = _output(out, overwrite)
    dev = device_of(device)
    factory = load_callable(model, "--model")
    step_func = load_callable(step, "--step") if step is not None else None
    tok = load_tokenizer(tokenizer)
    vocab_size = tok.vocab_size
    # The labels' lengths: the grid's default rate, and the label of each batch of a frames plan.
    shards = _lengths(trset, tok if tokens_per_frame is None or max_frames is not None else None)
    frames = np.asarray(shards.frames)
    if tokens_per_frame is None:
        assert shards.tokens is not None
        tokens_per_frame = max(1e-3, float(np.quantile(shards.tokens / np.maximum(frames, 1), TOKENS_QUANTILE)))
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        net = build_model(factory, model, feat_dim=shards.dims, vocab_size=vocab_size).to(dev).train()
        train_step = TrainStep(net, device=dev, optimizer=optimizer, step=step_func, model_spec=model,
                               step_spec=step)
        gen = torch.Generator().manual_seed(seed)
        rng = np.random.default_rng(seed)

        def batch(shape: Shape) -> tuple[torch.Tensor, ...]:
            return make_batch(shape, feat_dim=shards.dims, vocab_size=vocab_size, device=dev, generator=gen)

        def tokens(t: int) -> int:
            return label_tokens(t, tokens_per_frame=tokens_per_frame, max_tokens=max_tokens, subsampling=subsampling)

        timings, grid, grid_note = _bounded_timing(train_step, batch, frames, tokens, dev, rng=rng,
                                                   max_seconds=max_seconds, progress=progress)
        cost = fit_cost([t for t in timings if not t.held_out], subsampling)
        budget = None if max_frames is None else frames_budget(cost, shards, max_frames, seed=seed)
        memory = None
        if dev.type == "cuda":
            memory = _cuda_memory(train_step, batch, frames, tokens, cost, dev, margin=oom_margin,
                                  progress=progress)
    result = Calibration(cost=cost, device=str(dev), threads=torch.get_num_threads(), timings=timings,
                         seconds=time.perf_counter() - t_start, frames=_frame_summary(frames),
                         tokens_per_frame=tokens_per_frame, max_tokens=max_tokens, batch_frames=grid.batch_frames,
                         model=model, step=step, optimizer=optimizer, memory=memory, budget=budget, grid=grid_note)
    _check_fit(result, max_error, out)
    write_text(out, json.dumps(result.to_json(), indent=1) + "\n")
    return result


def _output(out: str | os.PathLike, overwrite: bool) -> Path:
    """Where the calibration goes, checked now, not after minutes of timing."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite=True (CLI: --overwrite) to replace it")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"{out.parent}: no such folder for {out}; make it first")
    return out


def _lengths(trset: str | Sequence[str], tok: Tokenizer | None) -> ShardSet:
    """The training shards' lengths (labels' too, with ``tok``) and feature dims, from their index."""
    shards = load_shards(trset, tokenizer=tok)
    if shards.num_utts == 0:
        raise ValueError(f"{trset}: the shards hold no utterance to take lengths from")
    if shards.dims is None:
        raise ValueError(f"{trset}: the shards' feature dims are unknown (their index says none, or they differ): "
                         f"run wdsprep index on them")
    return shards


def _check_fit(result: Calibration, max_error: float, out: Path) -> None:
    """A cost model that misses a held-out shape by more than ``max_error`` is not written."""
    held = np.abs(result.errors(True))
    if held.max() > max_error:
        raise MeasurementError(
            f"calibrate: the cost model misses {held.max():.0%} on a held-out shape (median {np.median(held):.0%}, "
            f"timing noise {result.noise:.1%}), over max_error={max_error:g}: {out} not written. Timing noise (give "
            f"more --max-seconds, run with the machine's other work stopped) or a step whose cost is not "
            f"a + b*t + c*t^2 + d*u + e*u^2 + f*t*u")


def _bounded_timing(step: TrainStep, batch: Callable[[Shape], tuple], frames: np.ndarray,
                    tokens: Callable[[int], int], dev: torch.device, *, rng: np.random.Generator, max_seconds: float,
                    progress: bool | None) -> tuple[list[Timing], Grid, dict[str, Any]]:
    """The first step (does the model run at all, on a batch too small to be slow), then the grid
    that fits ``max_seconds`` timed within it (:func:`_plan_grid`, :func:`_time_grid`), every step
    bounded; the timings, the grid and what the file says of it."""
    # The grid's rounds stop within max_seconds; a step may run past it, and no step past twice it.
    bound = 2 * max_seconds + 10
    with bounded(bound, f"calibrate: a training step ran past the {bound:.0f} s its --max-seconds allows (a step "
                        f"this slow, or one that never returns): nothing was written; give more --max-seconds, "
                        f"or check that the step returns"):
        shortest = int(length_grid(frames)[0])
        _time_shape(step, batch, Timing(Shape(2, shortest, tokens(shortest)), 0.0), dev)
        t0 = time.perf_counter()  # max_seconds counts from here: loading and building are the user's
        grid = _plan_grid(step, batch, frames, tokens, dev, budget=max_seconds)
        timings, rounds = _time_grid(step, batch, grid, tokens, dev, rng=rng,
                                     budget=max_seconds - (time.perf_counter() - t0), progress=progress)
        timed = time.perf_counter() - t0
    note = {"lengths": len(grid.lengths), "of": LENGTHS, "rounds": rounds, "full_seconds": round(grid.full_seconds, 1),
            "max_seconds": max_seconds, "timing_seconds": round(timed, 2), "reduced": grid.reduced}
    return timings, grid, note


def _check_options(*, max_seconds: float, subsampling: int, tokens_per_frame: float | None, max_tokens: int | None,
                   optimizer: str, oom_margin: float, max_frames: int | None, seed: int = 0,
                   max_error: float = 0.25) -> None:
    if not (isinstance(max_error, (int, float)) and max_error > 0):  # NaN too
        raise ValueError(f"max_error must be > 0 (a share, e.g. 0.25), got {max_error!r}")
    if not (isinstance(max_seconds, (int, float)) and 0 < max_seconds < math.inf):
        raise ValueError(f"max_seconds must be a finite number > 0, got {max_seconds!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:  # what torch's seeds hold
        raise ValueError(f"seed must be a whole number in [0, 2^63), got {seed!r}")
    if isinstance(subsampling, bool) or not isinstance(subsampling, int) or subsampling < 1:
        raise ValueError(f"subsampling must be an integer >= 1, got {subsampling!r}")
    if tokens_per_frame is not None and not (isinstance(tokens_per_frame, (int, float)) and tokens_per_frame > 0
                                             and math.isfinite(tokens_per_frame)):
        raise ValueError(f"tokens_per_frame must be > 0, got {tokens_per_frame!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not (isinstance(oom_margin, (int, float)) and 0 <= oom_margin < 1):
        raise ValueError(f"oom_margin must be in [0, 1), got {oom_margin!r}")
    if max_frames is not None and (isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 1):
        raise ValueError(f"max_frames must be an integer >= 1, got {max_frames!r}")


def device_of(device: str) -> torch.device:
    """The torch device ``--device`` names: cpu or cuda (an index filled in); ValueError naming what to give."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"--device {device!r}: not a device torch knows ({e}); give cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: the model runs on cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: torch sees no GPU here (torch.cuda.is_available() is False): run on "
                             f"a machine with one, or give --device cpu")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _frame_summary(frames: np.ndarray) -> dict[str, float]:
    q = np.quantile(frames.astype(np.float64), [FRAME_QUANTILES[0], 0.5, FRAME_QUANTILES[1]])
    return {"p5": round(float(q[0]), 1), "median": round(float(q[1]), 1), "p99.9": round(float(q[2]), 1),
            "max": float(frames.max())}


@dataclass(frozen=True)
class Grid:
    """The grid that fits the time given: its lengths, the rounds each shape is timed at least, the
    frame budget ``B * T`` of its batches; and what the full grid would have needed (seconds)."""

    lengths: np.ndarray
    min_rounds: int
    batch_frames: int
    full_seconds: float

    @property
    def reduced(self) -> bool:
        return len(self.lengths) < LENGTHS or self.min_rounds < MIN_ROUNDS


def _plan_grid(step: TrainStep, batch: Callable[[Shape], tuple], frames: np.ndarray, tokens: Callable[[int], int],
               device: torch.device, *, budget: float) -> Grid:
    """The largest grid whose rounds fit ``budget`` seconds (wall clock), from a pilot step at the
    full grid's shortest and longest length (the faster of two, after a warm-up: one stall of a busy
    machine must not shrink every batch), which gives seconds per frame at each, taken as linear in
    the length in between (a quadratic cost per utterance).  The full grid with batches sized for
    ``TARGET_ROUNDS`` rounds when it fits, else the first of :data:`SMALLER_GRIDS` that does with
    one utterance a batch at the longest length; :class:`MeasurementError` when not even the last
    does, saying how much time it needs."""
    t0 = time.perf_counter()
    full = length_grid(frames)
    lo, hi = int(full[0]), int(full[-1])
    pilot = max(hi, 1000)
    per_frame = []
    for t in (lo, hi):
        x = Timing(Shape(max(1, round(pilot / t)), t, tokens(t)), 0.0)
        _time_shape(step, batch, x, device)  # warm-up: first calls at a shape allocate
        wall = min(_time_shape(step, batch, x, device)[1] for _ in range(2))
        per_frame.append(wall / (x.shape.size * t))
    slope = (per_frame[1] - per_frame[0]) / max(1, hi - lo)
    pilot_seconds = time.perf_counter() - t0
    left = budget - pilot_seconds

    def seconds_per_frame(lengths: np.ndarray) -> float:
        """Seconds of one batch of one frame at each length, summed over the grid's label lengths."""
        each = np.maximum(per_frame[0] + slope * (lengths - lo), min(per_frame))
        return len(LABEL_DIVISORS) * float(each.sum())

    full_seconds = pilot_seconds + (WARMUP + MIN_ROUNDS) * hi * seconds_per_frame(full) / 0.9
    batch_frames = 0.9 * left / ((WARMUP + TARGET_ROUNDS) * seconds_per_frame(full))
    if batch_frames >= hi:
        return Grid(full, MIN_ROUNDS, int(min(MAX_BATCH_FRAMES, batch_frames)), full_seconds)
    for count, rounds in SMALLER_GRIDS:
        lengths = length_grid(frames, count)
        per_round = seconds_per_frame(lengths)
        if (WARMUP + rounds) * hi * per_round / 0.9 <= left:
            fits = 0.9 * left / ((WARMUP + rounds) * per_round)
            return Grid(lengths, rounds, int(min(MAX_BATCH_FRAMES, max(hi, fits))), full_seconds)
    count, rounds = SMALLER_GRIDS[-1]
    need = pilot_seconds + (WARMUP + rounds) * hi * seconds_per_frame(length_grid(frames, count)) / 0.9
    raise MeasurementError(f"calibrate: even the smallest grid ({count} lengths, {rounds} timed round, one utterance a "
                           f"batch at the longest length, {hi} frames) takes about {need:.0f} s, more than "
                           f"--max-seconds {budget:g} (the pilot steps took {pilot_seconds:.1f} s of it): nothing was "
                           f"written; give --max-seconds {math.ceil(need * 1.2)} or more")


def _time_grid(step: TrainStep, batch: Callable[[Shape], tuple], grid: Grid, tokens: Callable[[int], int],
               device: torch.device, *, rng: np.random.Generator, budget: float,
               progress: bool | None) -> tuple[list[Timing], int]:
    """Every shape timed in rounds (a warm-up round first), each round in a new random order,
    until ``grid.min_rounds`` rounds are done and the next would pass ``budget`` (or ``MAX_ROUNDS``).
    Once every shape is timed once, no step starts that would end past ``budget``: the rounds go as
    far as the time allows.  The timings, and the timed rounds begun."""
    from tqdm import tqdm

    timings = []
    for i, t in enumerate(int(x) for x in grid.lengths):
        u = tokens(t)
        for tok in grid_labels(u):
            timings.append(Timing(Shape(max(1, round(grid.batch_frames / t)), t, tok), 0.0, held_out=i % 2 == 1))
    t0 = time.perf_counter()
    rounds, longest = 0, 0.0
    with tqdm(total=(WARMUP + grid.min_rounds) * len(timings), desc="calibrate", unit="step",
              disable=bar_disabled(progress)) as bar:
        while True:
            for k in rng.permutation(len(timings)):
                x = timings[k]
                if rounds > WARMUP and time.perf_counter() - t0 + longest > budget:
                    break  # every shape has a timing: what is left of the time does not hold another step
                seconds, wall = _time_shape(step, batch, x, device)
                longest = max(longest, wall)
                if rounds >= WARMUP:
                    x.rounds.append(seconds)
                bar.update()
            else:
                rounds += 1
                if rounds < WARMUP + grid.min_rounds:
                    continue
                if rounds >= WARMUP + MAX_ROUNDS or (time.perf_counter() - t0) * (rounds + 1) / rounds > budget:
                    break
                bar.total += len(timings)
                bar.refresh()
                continue
            rounds += 1  # a round cut short by the time
            break
    # The fastest round, not the median: interference (another process, a cache flushed by it)
    # only adds time. Beside a memory-bound process on the other core, the held-out error of
    # the fit fell from 9-15% max to 3-12% (median 3-9% to 1-4%).
    for x in timings:
        x.seconds = float(np.min(x.rounds))
    return timings, rounds - WARMUP


def _cuda_memory(step: TrainStep, batch: Callable[[Shape], tuple], frames: np.ndarray, tokens: Callable[[int], int],
                 cost: CostModel, device: torch.device, *, margin: float, progress: bool | None) -> MemorySearch:
    """The memory search on the GPU: each probe is a whole training step; running out of memory
    is caught, the step's gradients dropped and the allocator's cache emptied.  The buckets run
    from the 5th percentile of lengths to the longest utterance (whose batch the plan makes too).
    A copy of the parameters stays allocated throughout, standing for DDP's gradient buckets."""
    lo = max(1.0, float(np.quantile(frames, FRAME_QUANTILES[0])))
    hi = float(frames.max())
    lengths = sorted({int(round(x)) for x in np.geomspace(lo, max(hi, lo), OOM_BUCKETS)})
    buckets = [(t, tokens(t)) for t in lengths]

    def run(shape: Shape) -> None:
        b = batch(shape)
        step(b)
        _sync(device)

    ddp_buckets = torch.empty(sum(p.numel() for p in step.model.parameters()), dtype=torch.float32, device=device)
    try:
        memory = search_memory(oom_guard(run, lambda: _free(step)), buckets, cost, margin=margin, progress=progress)
    finally:
        del ddp_buckets
        step.release()
        torch.cuda.empty_cache()
    too_long = [s.frames for s, _ in memory.buckets if s.size == 0]
    if too_long:
        warnings.warn(f"one utterance of {too_long[0]} frames does not train in this GPU's memory: leave the longest "
                      f"out (max_utt_frames) or train on a larger GPU", UserWarning, stacklevel=3)
    return memory
