"""The text treatment applied to a transcript before it is tokenized: named steps, or the user's own.

Shards keep the raw transcript, so the treatment can change without repacking (as the tokenizer
can).  One implementation for training a tokenizer (``tokenizer train --normalize``) and for the
loader (``normalize=``, per corpus too), so a tokenizer sees at training time the text it gets
while training the model.  A treatment is a list of steps applied in order, each a name of
:data:`STEPS` (deterministic, Unicode-aware) or ``MODULE:FUNC``, a function ``str -> str`` of the
user's (a dotted module on the Python path, or a ``.py`` file): ``["nfkc", "lower",
"strip_punct", "collapse_spaces"]``.  The steps' names are what a resume state records: a resume
with another treatment is refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence


def _strip_punct(text: str) -> str:
    """Unicode punctuation (categories P*) removed: ASCII and CJK marks alike."""
    return "".join(c for c in text if not unicodedata.category(c).startswith("P"))


def _collapse_spaces(text: str) -> str:
    return " ".join(text.split())


def _remove_spaces(text: str) -> str:
    """Every whitespace removed: CJK text for a SentencePiece model trained without spaces."""
    return "".join(text.split())


# The named steps, by name.  Add a step by adding its entry here (a pure function of the text).
STEPS: dict[str, Callable[[str], str]] = {
    "nfkc": lambda t: unicodedata.normalize("NFKC", t),
    "nfc": lambda t: unicodedata.normalize("NFC", t),
    "lower": str.lower,
    "upper": str.upper,
    "strip_punct": _strip_punct,
    "collapse_spaces": _collapse_spaces,
    "remove_spaces": _remove_spaces,
    "strip": str.strip,
}


def _user_step(spec: str) -> Callable[[str], str]:
    """``MODULE:FUNC``: FUNC of a dotted module on ``sys.path`` or of a ``.py`` file."""
    module, colon, name = spec.rpartition(":")
    if not colon or not module or not name.isidentifier():
        raise ValueError(f"normalize step {spec!r}: not one of {sorted(STEPS)} nor MODULE:FUNC (e.g. "
                         f"local/text.py:clean)")
    if module.endswith(".py") or "/" in module or os.sep in module:
        path = Path(module)
        if not path.is_file():
            raise ValueError(f"normalize step {spec!r}: {path} is no file")
        mod_name = f"wdsprep_normalize_{path.stem}_{abs(hash(str(path.resolve()))):x}"
        mod = sys.modules.get(mod_name)
        if mod is None:
            found = importlib.util.spec_from_file_location(mod_name, path)
            if found is None or found.loader is None:
                raise ValueError(f"normalize step {spec!r}: {path} cannot be imported")
            mod = importlib.util.module_from_spec(found)
            sys.modules[mod_name] = mod
            try:
                found.loader.exec_module(mod)
            except Exception as e:
                del sys.modules[mod_name]
                raise ValueError(f"normalize step {spec!r}: importing {path} raised {type(e).__name__}: {e}") from e
    else:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"normalize step {spec!r}: cannot import {module} ({e})") from None
    func = getattr(mod, name, None)
    if not callable(func):
        raise ValueError(f"normalize step {spec!r}: {module} has no function {name}")
    return func


@dataclass(frozen=True)
class Normalizer:
    """A text treatment: its steps, by name, applied in order."""

    steps: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("normalize: give at least one step, or none at all (None)")
        object.__setattr__(self, "_funcs", tuple(STEPS.get(s) or _user_step(s) for s in self.steps))

    def __call__(self, text: str) -> str:
        for f in self._funcs:  # type: ignore[attr-defined]
            text = f(text)
            if not isinstance(text, str):
                raise ValueError(f"normalize: a step returned {type(text).__name__}, not str (steps "
                                 f"{list(self.steps)})")
        return text

    def batch(self, texts: Sequence[str]) -> list[str]:
        return [self(t) for t in texts]

    def to_json(self) -> list[str]:
        return list(self.steps)

    def __reduce__(self) -> tuple[Any, ...]:  # a worker rebuilds the functions (a user's module is imported there)
        return (Normalizer, (self.steps,))


def parse_normalize(spec: Normalizer | str | Sequence[str] | None) -> Normalizer | None:
    """A :class:`Normalizer` from itself, a list of steps, or one step / comma-separated steps as
    text; None for None or an empty list.  ValueError naming a step that is none."""
    if spec is None or isinstance(spec, Normalizer):
        return spec
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    steps = list(spec)
    if not all(isinstance(s, str) and s for s in steps):
        raise ValueError(f"normalize must be a list of step names (e.g. ['nfkc', 'lower']), got {spec!r}")
    return Normalizer(tuple(steps)) if steps else None
