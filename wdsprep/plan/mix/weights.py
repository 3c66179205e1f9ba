"""How much of each corpus: the mixture weights in force at every training step.

Three ways to give them, one shape once resolved (:class:`Mixture`, a piecewise-linear schedule):

* fixed weights, ``{"en": 1, "zh": 3}``;
* a temperature over the corpora's hours, weight ∝ hours^(1/T) (T = 1: as large as they are;
  larger T flattens towards equal shares, the usual multilingual choice is 3-5); corpora split
  into subsets (``mix_by``: by language, say) take one per level (:func:`level_mixture`): across the
  corpora by their hours, then across each corpus's subsets by theirs (ESPnet's
  ``CategoryPowerSampler``, NeMo's nested ``reweight_temperature``);
* a schedule, ``[(0, {"en": 9, "zh": 1}), (1000, {"en": 1, "zh": 1})]``: linear between points,
  constant before the first and after the last (OpenNMT's task-mix schedule).

A weight is the share of UTTERANCES drawn from a corpus.  Its share of hours is
``w_c * d_c / sum_k(w_k * d_k)`` with ``d_c`` the corpus's mean utterance duration; ``wdsprep
dry-run`` prints both.  Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from wdsprep.plan.options import MixOptions

Weights = Mapping[str, float]
SchedulePoints = Sequence[tuple[int, Weights]]


@dataclass(frozen=True)
class Mixture:
    """Per corpus (in ``names`` order) its share of the utterances at each step: ``points[k]`` holds
    from step ``steps[k]``, linearly blended into ``points[k + 1]`` until ``steps[k + 1]``."""

    names: tuple[str, ...]
    steps: tuple[int, ...]
    points: tuple[tuple[float, ...], ...]  # each sums to 1
    given: str  # how it was given, for the log: "weights", "temperature T" or "schedule"

    def at(self, steps: np.ndarray | Sequence[int]) -> np.ndarray:
        """float64 [len(steps), corpora]: the shares in force at these (global) steps."""
        steps = np.asarray(steps, np.float64)
        table = np.array(self.points, np.float64)
        if len(self.steps) == 1:
            return np.repeat(table, len(steps), axis=0)
        return np.stack([np.interp(steps, self.steps, table[:, c]) for c in range(len(self.names))], axis=1)

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "steps": list(self.steps), "points": [list(p) for p in self.points],
                "given": self.given}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Mixture:
        return cls(tuple(doc["names"]), tuple(int(s) for s in doc["steps"]),
                   tuple(tuple(float(w) for w in p) for p in doc["points"]), str(doc["given"]))

    def describe(self) -> str:
        """One line: each corpus's share, and how it moves over the schedule."""
        parts = []
        for c, name in enumerate(self.names):
            shares = [p[c] for p in self.points]
            if len(set(shares)) == 1:
                parts.append(f"{name} {shares[0]:.3g}")
            else:
                parts.append(f"{name} " + " -> ".join(f"{w:.3g}@{s}" for w, s in zip(shares, self.steps)))
        return f"{', '.join(parts)} ({self.given})"

    def changes_from(self, old: Mixture) -> str | None:
        """What differs from ``old`` (a resumed run's saved mixture), or None."""
        if old.names != self.names:
            return f"corpora {list(old.names)} -> {list(self.names)}"
        if (old.steps, old.points) == (self.steps, self.points):
            return None
        return f"{old.describe()} -> {self.describe()}"


def _shares(weights: Weights, names: Sequence[str], where: str) -> tuple[float, ...]:
    unknown = sorted(set(weights) - set(names))
    missing = [n for n in names if n not in weights]
    if unknown or missing:
        problems = [f"no corpus named {unknown}"] if unknown else []
        if missing:
            problems.append(f"no weight for {missing} (give 0 to leave one out)")
        raise ValueError(f"{where}: the corpora are {list(names)}; {'; '.join(problems)}")
    values = []
    for n in names:
        try:
            w = float(weights[n])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: the weight of {n!r} must be a number, got {weights[n]!r}") from None
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"{where}: the weight of {n!r} must be finite and >= 0, got {weights[n]!r}")
        values.append(w)
    top = max(values)
    if top <= 0:
        raise ValueError(f"{where}: every weight is 0; at least one corpus must be drawn")
    scaled = [v / top for v in values]  # first to at most 1: a sum of weights near 1e308 would overflow
    total = sum(scaled)
    return tuple(v / total for v in scaled)


def make_mixture(names: Sequence[str], mix: MixOptions, *, hours: Sequence[float] | None = None,
                 utts: Sequence[int] | None = None) -> Mixture:
    """The mixture ``mix`` gives (its one way: ``weights``, ``temperature`` or ``schedule``).

    None given: the corpora's own proportions of utterances (``utts``), as if they were one corpus.
    ``temperature`` needs ``hours`` per corpus.
    """
    names = tuple(names)
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"corpus names must be distinct and at least one, got {list(names)}")
    weights, temperature, schedule = mix.weights, mix.temperature, mix.schedule
    if schedule is not None:
        points = list(schedule)
        if not points:
            raise ValueError("the mixture schedule has no points; give [(step, {corpus: weight}), ...]")
        steps = []
        for k, point in enumerate(points):
            if not (isinstance(point, Sequence) and len(point) == 2 and isinstance(point[1], Mapping)):
                raise ValueError(f"schedule point {k} must be (step, {{corpus: weight}}), got {point!r}")
            step = point[0]
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
                raise ValueError(f"schedule point {k}: the step must be an integer >= 0, got {step!r}")
            if steps and step <= steps[-1]:
                raise ValueError(f"schedule point {k}: steps must increase, got {step} after {steps[-1]}")
            steps.append(int(step))
        shares = tuple(_shares(w, names, f"schedule point {k} (step {s})")
                       for k, (s, (_, w)) in enumerate(zip(steps, points)))
        return Mixture(names, tuple(steps), shares, "schedule")
    if temperature is not None:
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
        if hours is None or len(hours) != len(names):
            raise ValueError("a temperature mixture needs every corpus's hours")
        raw = {n: float(h) ** (1.0 / float(temperature)) if h > 0 else 0.0 for n, h in zip(names, hours)}
        shares = _shares(raw, names, f"temperature {temperature}")
        return Mixture(names, (0,), (shares,), f"temperature {temperature:g}")
    if weights is None:
        if utts is None or len(utts) != len(names):
            raise ValueError("without weights, temperature or schedule the mixture needs every corpus's utterances")
        weights = dict(zip(names, (float(u) for u in utts)))
        return Mixture(names, (0,), (_shares(weights, names, "the corpora's sizes"),), "natural sizes")
    return Mixture(names, (0,), (_shares(weights, names, "weights"),), "weights")


def level_mixture(names: Sequence[str], hours: Sequence[Sequence[float]], temperatures: Sequence[float], *,
                  by: str) -> Mixture:
    """The mixture of corpora split into subsets (``names``: every subset, corpus after corpus;
    ``hours``: per corpus, its subsets' hours) with a temperature per level: corpus ``c``'s share ∝
    ``H_c^(1/T1)`` (``H_c`` its hours), and within it each subset's ∝ ``h^(1/T2)``; a subset's weight is
    the product."""
    t1, t2 = (float(t) for t in temperatures)
    for t in (t1, t2):
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be a number > 0, got {t!r}")
    if sum(len(h) for h in hours) != len(names):
        raise ValueError(f"{len(names)} subsets but hours for {sum(len(h) for h in hours)}")
    totals = [sum(h) for h in hours]
    top = [t ** (1.0 / t1) if t > 0 else 0.0 for t in totals]
    weights: dict[str, float] = {}
    k = 0
    for share, subsets in zip(top, hours):
        inner = [h ** (1.0 / t2) if h > 0 else 0.0 for h in subsets]
        total = sum(inner) or 1.0
        for w in inner:
            weights[names[k]] = share * w / total
            k += 1
    shares = _shares(weights, names, f"temperature {t1:g}, {t2:g}")
    given = f"temperature {t1:g}" if t1 == t2 else f"temperature {t1:g} across corpora, {t2:g} across {by}"
    return Mixture(tuple(names), (0,), (shares,), given + f" (mix_by {by})")


def draw_probabilities(shares: np.ndarray, utts_per_batch: Sequence[float]) -> np.ndarray:
    """Per step, the chance each corpus's batch is drawn so that the corpora's shares of UTTERANCES
    are ``shares``: a corpus whose batches hold fewer utterances is drawn more often."""
    per = np.maximum(np.asarray(utts_per_batch, np.float64), 1e-9)
    p = shares / per
    return p / p.sum(axis=1, keepdims=True)
