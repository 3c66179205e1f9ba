"""The loader's resume state: one format for every epoch source, checked before anything uses it.

``Loader.state_dict()`` returns::

    {"version": 3, "kind": "corpus" | "mixture", "seed": int, "epoch": int, "step": int,
     "complete": bool, "global_step": int | None, "position": {...}, "mixture": {...} | None,
     "options": {...}, "fingerprint": str, "plan_revision": int[, "published": {folder: shards}]
     [, "normalize": [...]]}

``position`` is where the epoch source stands (``epochs.CorpusPosition``: the epoch's runs so far; a
mixture's ``mix.epochs.MixPosition`` adds where its epoch started: every corpus's cursor, the
schedule's clock and the items each corpus gives the epoch), a few numbers; the other fields
repeat what follows from it (epoch, step, complete, global step) for people and tools, and must
agree with it.  A state is read by :func:`read_state` and the source's ``position`` parser, which
check every field's type and range against the plan before the loader uses any of it: an edited
or damaged state is refused with the field named, never a hang, an allocation of its say-so or
silently different batches.  Version 2 states (``runs`` or ``position`` at the top) still load.

``published`` (a growing loader's only: ``make_loader(..., growing=True)``) is the shard set the
epoch was planned over, in short: per folder a pack was still writing, how many of its shards were
published (shards publish in order, so the number says which); :func:`read_published` checks it.
A loader rebuilds that shard set before it holds the state's fingerprint against it.

``normalize`` (a loader with a text treatment only): each corpus's steps (None where it has
none); a resume with another treatment is refused, naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

STATE_VERSION = 3
READABLE_VERSIONS = (2, 3)
# Bounds no real run comes near; past them a state is refused before anything is sized by it.
MAX_WORLD_SIZE = 1 << 20
MAX_WORKERS = 1024
MAX_RUNS = 64  # resumes within one epoch
MAX_EPOCH = 1 << 40
MAX_FOLDERS = 1 << 16  # growing folders a state may name
MAX_SHARDS = (1 << 31) - 1
# What a state's kind says, for messages.
KINDS = {"corpus": "a single-corpus loader (one corpus, or named corpora read once)",
         "mixture": "a mixed loader (named corpora mixed)"}


class StateError(ValueError):
    """A loader state that cannot be resumed from; the message names the field and what to do."""


def need_int(doc: Mapping[str, Any], key: str, *, lo: int = 0, hi: int | None = None, where: str = "") -> int:
    """``doc[key]`` as an int in ``[lo, hi]`` (not a bool, not a float), else StateError naming it."""
    value = need(doc, key, where=where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(f"the loader state's {where}{key} must be an integer, not {_show(value)}: was it edited?")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise StateError(f"the loader state's {where}{key} is {value}; it must be {bound}: "
                         f"the state is damaged or was edited")
    return value


def need_list(doc: Mapping[str, Any], key: str, *, most: int, where: str = "") -> list[Any]:
    value = need(doc, key, where=where)
    if not isinstance(value, list):
        raise StateError(f"the loader state's {where}{key} must be a list, not {_show(value)}: was it edited?")
    if len(value) > most:
        raise StateError(f"the loader state's {where}{key} has {len(value):,} entries, at most {most:,} are possible "
                         f"here: the state is damaged or was edited")
    return value


def need(doc: Mapping[str, Any], key: str, *, where: str = "") -> Any:
    if not isinstance(doc, Mapping):
        raise StateError(f"the loader state's {where.rstrip('.') or 'top level'} must be an object, not {_show(doc)}")
    if key not in doc:
        raise StateError(f"the loader state is missing {where}{key}: it is not a complete state from "
                         f"Loader.state_dict()")
    return doc[key]


def ints(value: Any, n: int, *, where: str) -> list[int]:
    """A list of exactly ``n`` ints >= 0 (a run, a held chunk), else StateError naming ``where``."""
    if (not isinstance(value, list) or len(value) != n
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in value)):
        raise StateError(f"the loader state's {where} must be {n} integers >= 0, not {_show(value)}: was it edited?")
    return list(value)


def _show(value: Any) -> str:
    """A short description of a value for a message, never its whole repr (a state may be huge)."""
    text = repr(value) if isinstance(value, (int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _value(value: Any, plain: str, limit: int = 160) -> str:
    """An option's value for a message: an object's or a list's JSON (a cost model's coefficients,
    not ``dict``), cut to ``limit`` characters; ``plain`` for anything else."""
    if not isinstance(value, (Mapping, list)):
        return plain
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return plain
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class SavedState:
    """A state's envelope, checked against the loader reading it; ``position`` is the source's to read."""

    epoch: int
    step: int
    complete: bool
    global_step: int | None
    position: Mapping[str, Any]
    mixture: Mapping[str, Any] | None


def read_state(state: Any, *, kind: str, seed: int, options: Mapping[str, Any], fingerprint: str,
               revision: int, text: Mapping[str, Any] | None = None) -> SavedState:
    """The envelope of ``state``, refused (StateError naming the field) unless it was saved by a
    loader of this ``kind`` with this seed, these plan options, this text treatment (``text``:
    ``{"normalize": [...]}`` where set) and this fingerprint, by a wdsprep that plans by the rules
    of ``revision``."""
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict from Loader.state_dict(), not {_show(state)}")
    version = need_int(state, "version", lo=0)
    if version not in READABLE_VERSIONS:
        raise StateError(f"the loader state has version {version}; this wdsprep reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))}: save it again with a matching wdsprep")
    if version == 2:  # runs (one corpus) or position (a mixture) at the top
        saved_kind = "mixture" if "position" in state else "corpus"
        position = state["position"] if saved_kind == "mixture" else {"runs": need(state, "runs")}
    else:
        saved_kind = need(state, "kind")
        position = need(state, "position")
    if saved_kind != kind:
        said = KINDS.get(saved_kind, "") if isinstance(saved_kind, str) else ""
        raise StateError(f"the loader state was saved by {said or f'a loader of no known kind ({_show(saved_kind)})'}; "
                         f"this is {KINDS[kind]}: resume with the trset (and mixture) it was saved with")
    saved_seed = need_int(state, "seed", lo=-(1 << 63), hi=(1 << 64) - 1)
    if saved_seed != seed:
        raise StateError(f"the loader state was saved with seed={saved_seed} (this loader: {seed}): the batches "
                         f"depend on it; build the loader with the saved seed to resume")
    saved_options = need(state, "options")
    if not isinstance(saved_options, Mapping):
        raise StateError(f"the loader state's options must be an object, not {_show(saved_options)}")
    differ = [f"{k}={_value(v, _show(v))} (this loader: {_value(options.get(k), str(options.get(k)))})"
              for k, v in saved_options.items() if options.get(k) != v]
    if differ:
        raise StateError(f"the loader state was saved with {', '.join(differ)}: the planned batches depend on "
                         f"these, so build the loader with the saved values to resume (a CAT bucket_size is split "
                         f"over the world size: pass max_frames as saved)")
    saved_text = state.get("normalize")
    if saved_text != (text or {}).get("normalize"):
        raise StateError(f"the loader state was saved with normalize={_steps(saved_text)} (this loader: "
                         f"{_steps((text or {}).get('normalize'))}): the labels depend on the text treatment; build "
                         f"the loader with the saved normalize to resume")
    if need(state, "fingerprint") != fingerprint:
        saved_revision = state.get("plan_revision", 1)
        if saved_revision != revision:
            epoch = state.get("epoch")
            nxt = epoch + 1 if isinstance(epoch, int) else "EPOCH + 1"
            raise StateError(f"the loader state was saved by a wdsprep that cut its plans by other rules (plan "
                             f"revision {_show(saved_revision)}, this one {revision}): its epoch cannot be planned "
                             f"again to resume it; start from the next epoch instead (loader.set_epoch({nxt}) "
                             f"without load_state_dict)")
        # An option this loader's plan has and the saved one's had not: a loader without it, or a
        # wdsprep of the same plan revision whose plan did not decide it (ctc_subsampling, which its
        # readers alone applied).
        added = [f"{k}={_show(v)}" for k, v in options.items() if k not in saved_options]
        epoch = state.get("epoch")
        nxt = epoch + 1 if isinstance(epoch, int) else "EPOCH + 1"
        why = (f"; this loader's plan has {', '.join(added)} and the saved plan had not (a loader without it, or an "
               f"older wdsprep whose readers applied it: its batches differ): resume with the options and wdsprep "
               f"that saved it, or start from the next epoch (loader.set_epoch({nxt}) without load_state_dict)"
               if added else "")
        raise StateError("the loader state was saved for other shards, index, tokenizer, batching options or "
                         f"augmentation (its options, or the bytes of its noise or impulse-response files) "
                         f"(fingerprint differs): resuming would not continue the same epoch{why}")
    complete = need(state, "complete")
    if not isinstance(complete, bool):
        raise StateError(f"the loader state's complete must be true or false, not {_show(complete)}: was it edited?")
    global_step = state.get("global_step")
    if global_step is not None:
        global_step = need_int(state, "global_step")
    mixture = state.get("mixture")
    if mixture is not None and not isinstance(mixture, Mapping):
        raise StateError(f"the loader state's mixture must be an object, not {_show(mixture)}")
    if not isinstance(position, Mapping):
        raise StateError(f"the loader state's position must be an object, not {_show(position)}")
    return SavedState(need_int(state, "epoch", hi=MAX_EPOCH), need_int(state, "step"), complete, global_step,
                      position, mixture)


def _steps(value: Any) -> str:
    """A state's normalize steps for a message: per corpus, or one list for all."""
    if value is None:
        return "none"
    if isinstance(value, list) and all(v is None or isinstance(v, list) for v in value):
        shown = ["none" if v is None else "[" + ", ".join(map(str, v)) + "]" for v in value]
        return shown[0] if len(set(shown)) == 1 else "(" + "; ".join(shown) + " per corpus)"
    return _show(value)


def read_published(state: Any) -> dict[str, int] | None:
    """A state's ``published`` field: None (a loader that does not follow growing folders), or folder
    paths with their published shard counts; anything else is a StateError naming it."""
    if not isinstance(state, Mapping):
        raise StateError(f"a loader state is a dict from Loader.state_dict(), not {_show(state)}")
    value = state.get("published")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StateError(f"the loader state's published must be an object of folder: shards, not {_show(value)}: "
                         f"was it edited?")
    if len(value) > MAX_FOLDERS:
        raise StateError(f"the loader state's published names {len(value):,} folders, at most {MAX_FOLDERS:,} are "
                         f"possible: the state is damaged or was edited")
    out = {}
    for folder, n in value.items():
        if not isinstance(folder, str) or not folder or "\0" in folder:
            raise StateError(f"the loader state's published has a key {_show(folder)}, not a folder path: "
                             f"was it edited?")
        out[folder] = need_int(value, folder, hi=MAX_SHARDS, where="published.")
    return out


def agree(saved: SavedState, *, epoch: int, step: int, complete: bool, global_step: int | None = None) -> None:
    """Refuse a state whose envelope says otherwise than its position."""
    said = {"epoch": (saved.epoch, epoch), "step": (saved.step, step), "global_step": (saved.global_step, global_step)}
    for name, (got, want) in said.items():
        if got is not None and want is not None and got != want:
            raise StateError(f"the loader state says {name} {got}, its position {want}: the state was edited")
    if saved.complete and not complete:
        raise StateError(f"the loader state says epoch {epoch} is complete, but its position has steps left on the "
                         f"topology it was saved on: the state was edited")
