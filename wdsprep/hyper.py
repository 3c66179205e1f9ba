"""Build the training loader from a CAT ``hyper-p.json`` (``train:option``), old or current keys.

Current CAT keys: ``ld`` (shard pattern), ``tokenizer``, ``batch_size``, ``batching_mode``
(``batch`` | ``bucket``), ``bucket_size`` (frames of the GLOBAL batch; CAT gives each rank
``bucket_size // world_size``), ``ld_shuffle_buffer``, ``ld_bucket_count_padding``.
Older recipes: ``large_dataset: true`` with ``trset`` as the pattern.  The tokenizer may sit in
``train:option`` or at the top level as CAT writes it (``{"tokenizer": {"file": PATH}}``).

Unknown keys pass through untouched (:attr:`HyperOptions.passthrough`), as CAT does.  Booleans
are parsed strictly: ``"false"`` is False here (CAT's ``bool("false")`` is True).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}
# Keys this module consumes; everything else in train:option is passed through.
_KNOWN = {"ld", "trset", "large_dataset", "tokenizer", "batch_size", "batching_mode", "bucket_size",
          "ld_shuffle_buffer", "ld_bucket_count_padding", "seed"}
# batching_mode=batch without bucket_size: no frame bound, only the utterance count.
NO_FRAME_BOUND = 2**62


def parse_bool(value: Any, key: str) -> bool:
    """A JSON boolean, 0/1 or one of true/false/yes/no/on/off (any case); anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"train:option {key!r} must be a boolean (true/false), got {value!r}")


def _tokenizer_path(value: Any, where: str) -> str:
    if isinstance(value, Mapping):
        if "file" not in value:
            raise ValueError(f"{where}: tokenizer {value!r} has no 'file' key; give {{\"file\": PATH}} or a path")
        value = value["file"]
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{where}: tokenizer must be a path or {{\"file\": PATH}}, got {value!r}")
    return str(value)


@dataclass
class HyperOptions:
    """What ``train:option`` says about the loader, resolved for one world size."""

    trset: str
    tokenizer: str
    loader_kwargs: dict[str, Any]
    passthrough: dict[str, Any] = field(default_factory=dict)


def train_option(hyper: Mapping[str, Any], where: str = "hyper-p.json") -> Mapping[str, Any]:
    """``train:option``: CAT nests it as ``{"train": {"bin": ..., "option": {...}}}``.

    A flat ``"train:option"`` key (written by early wdsprep recipes) is read too.
    """
    train = hyper.get("train")
    opt = train.get("option") if isinstance(train, Mapping) else hyper.get("train:option")
    if not isinstance(opt, Mapping):
        raise ValueError(f"{where}: no train:option; CAT writes it as {{\"train\": {{\"option\": {{...}}}}}}")
    return opt


def loader_options(hyper: Mapping[str, Any], *, world_size: int, where: str = "hyper-p.json") -> HyperOptions:
    """Resolve CAT's keys to :func:`wdsprep.make_loader` arguments (pure: no files are opened)."""
    opt = train_option(hyper, where)
    if "ld" in opt and opt["ld"]:
        trset = opt["ld"]
    elif "large_dataset" in opt and parse_bool(opt["large_dataset"], "large_dataset"):
        if not opt.get("trset"):
            raise ValueError(f"{where}: large_dataset is true but train:option has no 'trset' shard pattern")
        trset = opt["trset"]
    else:
        raise ValueError(f"{where}: train:option names no shards; set 'ld' (or, older CAT, "
                         f"'large_dataset': true with 'trset') to a shard pattern such as data/*/data-*.tar")
    tok = opt.get("tokenizer", hyper.get("tokenizer"))
    if tok is None:
        raise ValueError(f"{where}: no tokenizer; set train:option 'tokenizer' or top-level {{\"tokenizer\": {{\"file\": PATH}}}}")

    mode = opt.get("batching_mode", "bucket" if "bucket_size" in opt else "batch")
    if mode not in ("batch", "bucket"):
        raise ValueError(f"{where}: batching_mode must be 'batch' or 'bucket', got {mode!r}")
    kw: dict[str, Any] = {}
    if "bucket_size" in opt:
        # CAT: bucket_size is the global frame budget, each rank gets its share.
        kw["max_frames"] = int(opt["bucket_size"]) // world_size
        if kw["max_frames"] < 1:
            raise ValueError(f"{where}: bucket_size {opt['bucket_size']} split over {world_size} ranks is < 1 frame")
    if mode == "batch":
        if "batch_size" not in opt:
            raise ValueError(f"{where}: batching_mode 'batch' needs batch_size (the global batch size)")
        kw["max_batch_size"] = max(1, int(opt["batch_size"]) // world_size)
        kw.setdefault("max_frames", NO_FRAME_BOUND)
    elif "max_frames" not in kw:
        raise ValueError(f"{where}: batching_mode 'bucket' needs bucket_size (global frames per batch)")
    if "ld_shuffle_buffer" in opt:
        kw["shuffle_buffer"] = int(opt["ld_shuffle_buffer"])
    if "seed" in opt:
        kw["seed"] = int(opt["seed"])
    if "ld_bucket_count_padding" in opt and not parse_bool(opt["ld_bucket_count_padding"], "ld_bucket_count_padding"):
        # Counting only real frames lets one long utterance among short ones blow the budget;
        # wdsprep always bounds padded frames, which bucketing keeps close to the real ones.
        warnings.warn(f"{where}: ld_bucket_count_padding=false: wdsprep always bounds padded frames "
                      f"(B x longest <= bucket_size/world); bucketing keeps padding low", UserWarning, stacklevel=2)
    passthrough = {k: v for k, v in opt.items() if k not in _KNOWN}
    return HyperOptions(str(trset), _tokenizer_path(tok, where), kw, passthrough)


def make_loader_from_hyper(path: str | os.PathLike, *, world_size: int | None = None, **overrides: Any):
    """The training loader a CAT ``hyper-p.json`` describes; ``overrides`` go to :func:`make_loader`.

    ``world_size`` defaults to torch.distributed's (1 without it); rank likewise.
    """
    from wdsprep.loader import make_loader
    from wdsprep.loading.collectives import dist_info

    p = Path(path)
    try:
        hyper = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such hyper-p.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if world_size is None:
        world_size = dist_info()[1]
    o = loader_options(hyper, world_size=world_size, where=str(p))
    tok = Path(o.tokenizer)
    if not tok.is_absolute() and not tok.exists() and (p.parent / tok).exists():
        tok = p.parent / tok  # recipes often give paths relative to the experiment dir
    return make_loader(o.trset, tok, **{**o.loader_kwargs, "world_size": world_size, **overrides})
