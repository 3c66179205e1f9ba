"""Build the training loader from a CAT ``hyper-p.json`` (``train:option``), old or current keys.

Keys are read as CAT reads them: ``-`` and ``_`` are the same (CAT's ``parse_args_from_var``
does ``k.replace("-", "_")``), so ``"large-dataset"`` is ``large_dataset`` and ``"bucket-size"``
is ``bucket_size`` (:func:`normalize_keys`, applied to the whole ``train:option`` mapping).

Current CAT keys: ``ld`` (shard pattern), ``tokenizer``, ``batch_size``, ``batching_mode``
(``batch`` | ``bucket``), ``bucket_size`` (frames of the GLOBAL batch; CAT gives each rank
``bucket_size // world_size``), ``ld_shuffle_buffer``, ``ld_bucket_count_padding``.
Older recipes: ``large_dataset: true`` with ``trset`` as the pattern.  wdsprep's own: ``ld`` as
an object naming corpora to mix (:data:`LD_KEYS`), ``{"corpora": {"en": PATTERN, "zh": PATTERN},
"weights": {"en": 1, "zh": 3}}`` or ``"temperature": 5`` or ``"schedule": [[0, {...}], [1000,
{...}]]``, with ``"steps_per_epoch"`` optional (CAT itself reads only a pattern); either may add
``"cost"``/``"max_cost"``, ``"augment"`` (make_loader's augmentation: ``{"speed": {"factors":
[0.9, 1.0, 1.1]}, "specaugment": {...}}``, or a JSON file of it) and, to follow shards a pack is
still writing, ``"growing": true`` with ``"min_shards"``/``"min_hours"``; any other loader option
by its name (``"fields"``, ``"text_fields"``, ``"normalize"``, ``"mix_by"``...).  A corpus may be an
object with its own transforms, ``{"shards": PATTERN, "tokenizer": PATH, "normalize": [...],
"augment": {...}}``.  The tokenizer may sit in ``train:option`` or at the top level as CAT writes
it (``{"tokenizer": {"file": PATH}}``), or be one per language (``{"en": PATH, "zh": PATH}``).

Unknown keys pass through untouched (:attr:`HyperOptions.passthrough`), as CAT does.  A batching
key the loader does not act on is never dropped silently: it warns and says why.  Booleans are
parsed strictly: ``"false"`` is False here (CAT's ``bool("false")`` is True).
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from wdsprep.files import read_small
from wdsprep.options import from_ld, ld_keys
from wdsprep.options import parse_bool as _parse_bool
from wdsprep.plan.options import GROUPS, OWNER, LoaderOptions, MixOptions
from wdsprep.tokenizer import Tokenizer

# Keys this module consumes (after normalize_keys); everything else in train:option is passed through.
_KNOWN = {"ld", "trset", "large_dataset", "tokenizer", "batch_size", "batching_mode", "bucket_size",
          "ld_shuffle_buffer", "ld_bucket_count_padding", "seed", "batching_uneven", "dynamic_batch_mode"}
# batching_mode=batch without bucket_size: no frame bound, only the utterance count.
NO_FRAME_BOUND = 2**62
HYPER_LIMIT = 16 << 20  # bytes of a hyper-p.json: options and a few paths
# make_loader's options that CAT's own keys set (theirs global, divided over the ranks where a bound).
CAT_KEYS = {"max_frames": "bucket_size", "max_batch_size": "batch_size", "shuffle_buffer": "ld_shuffle_buffer",
            "seed": "seed"}


def normalize_keys(option: Mapping[str, Any], where: str = "hyper-p.json") -> dict[str, Any]:
    """``train:option`` spelled as CAT reads it: every ``-`` in a key becomes ``_``.

    CAT lets the later of two spellings of one key win without a word; here two spellings with
    different values are an error, since only one of them can be meant.
    """
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in option.items():
        norm = key.replace("-", "_")
        if norm in out and out[norm] != value:
            raise ValueError(f"{where}: train:option sets {norm!r} twice, as {spelled[norm]!r}: {out[norm]!r} and "
                             f"{key!r}: {value!r}; keep one")
        out[norm] = value
        spelled[norm] = key
    return out


def parse_bool(value: Any, key: str) -> bool:
    """A JSON boolean, 0/1 or one of true/false/yes/no/on/off (any case); anything else is an error."""
    try:
        return _parse_bool(value)
    except ValueError as e:
        raise ValueError(f"train:option {key!r} {e}") from None


def _int(opt: Mapping[str, Any], key: str, where: str) -> int:
    value = opt[key]
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: train:option {key!r} must be an integer, got {value!r}") from None


def _tokenizer_path(value: Any, where: str) -> str | dict[str, str]:
    """A tokenizer's path: a path or CAT's ``{"file": PATH}``; or one per language, ``{lang: PATH}``."""
    if isinstance(value, Mapping) and "file" not in value:
        if not value or not all(isinstance(v, (str, os.PathLike)) for v in value.values()):
            raise ValueError(f"{where}: tokenizer {value!r}: give {{\"file\": PATH}}, a path, or one per language "
                             f"{{\"en\": PATH, \"zh\": PATH}}")
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        value = value["file"]
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{where}: tokenizer must be a path or {{\"file\": PATH}}, got {value!r}")
    return str(value)


@dataclass
class HyperOptions:
    """What ``train:option`` says about the loader, resolved for one world size.

    ``ignored``: batching keys that were read but that the loader does not act on, each with why
    (each also raised a warning).
    """

    trset: str | dict[str, Any]  # a shard pattern, or named corpora (an ld object)
    tokenizer: str | dict[str, str]  # a path, or one per language
    loader_kwargs: dict[str, Any]
    passthrough: dict[str, Any] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)

    def tokenizer_file(self, hyper: str | os.PathLike) -> Path | dict[str, Path]:
        """The tokenizer's path (or each language's); recipes often give it relative to the
        experiment dir (the file's)."""
        if isinstance(self.tokenizer, dict):
            return {lang: beside(path, hyper) for lang, path in self.tokenizer.items()}
        return beside(self.tokenizer, hyper)


def beside(path: str | os.PathLike, hyper: str | os.PathLike) -> Path:
    """``path`` as given, or relative to the hyper-p.json's folder where only there it exists."""
    tok = Path(path)
    if not tok.is_absolute() and not tok.exists() and (Path(hyper).parent / tok).exists():
        return Path(hyper).parent / tok
    return tok


def train_option(hyper: Mapping[str, Any], where: str = "hyper-p.json") -> Mapping[str, Any]:
    """``train:option``: CAT nests it as ``{"train": {"bin": ..., "option": {...}}}``.

    A flat ``"train:option"`` key (written by early wdsprep recipes) is read too.
    """
    train = hyper.get("train")
    opt = train.get("option") if isinstance(train, Mapping) else hyper.get("train:option")
    if not isinstance(opt, Mapping):
        raise ValueError(f"{where}: no train:option; CAT writes it as {{\"train\": {{\"option\": {{...}}}}}}")
    return opt


# The option groups whose ``ld`` keys an ``ld`` object takes (make_loader's options of those names),
# beside the shards: one pattern (``shards``) or named corpora (``corpora``).
_LD_GROUPS = (LoaderOptions, *(cls for cls, _ in GROUPS.values()))
LD_KEYS = {"shards", "corpora", *(key for cls in _LD_GROUPS for key in ld_keys(cls))}
# The ld keys that mix named corpora (refused beside "shards").
MIXING_KEYS = set(ld_keys(MixOptions))


def _ld_object(ld: Mapping[str, Any], where: str) -> tuple[str | list | dict[str, Any], dict[str, Any]]:
    """An ``ld`` object: ``{"shards": pattern}`` or ``{"corpora": {name: pattern}, "weights" |
    "temperature" | "schedule": ..., "steps_per_epoch": N}``, either with any other option of
    :data:`LD_KEYS` (``"cost": FILE_OR_OBJECT, "max_cost": N``, ``"augment": ...``, ``"growing":
    true, "min_shards": N, ...``) -> (the trset, make_loader's keyword arguments for the rest)."""
    ld = normalize_keys(ld, f"{where}: ld")
    unknown = sorted(set(ld) - LD_KEYS)
    if unknown:
        raise ValueError(f"{where}: train:option ld has {unknown}; an ld object takes {sorted(LD_KEYS)}")
    kw: dict[str, Any] = {}
    for cls in _LD_GROUPS:
        kw.update(from_ld(cls, ld, where))
    if ("shards" in ld) == ("corpora" in ld):
        raise ValueError(f"{where}: train:option ld needs one of \"shards\": PATTERN or \"corpora\": "
                         f"{{name: shard pattern, ...}}")
    if "shards" in ld:
        mixing = sorted(MIXING_KEYS & set(ld))
        if mixing and "mix_by" not in ld:  # mix_by makes the subsets to mix of one corpus too
            raise ValueError(f"{where}: ld {mixing} mix named corpora: give \"corpora\" instead of \"shards\" (or "
                             f"\"mix_by\": FIELD to mix the subsets of one)")
        if not isinstance(ld["shards"], (str, list)) or not ld["shards"]:
            raise ValueError(f"{where}: ld shards must be a shard pattern or a list of them, got {ld['shards']!r}")
        return ld["shards"], kw
    corpora = ld["corpora"]
    if not isinstance(corpora, Mapping) or not corpora:
        raise ValueError(f"{where}: train:option ld needs \"corpora\": {{name: shard pattern, ...}}")
    for name, pattern in corpora.items():
        shards = pattern.get("shards") if isinstance(pattern, Mapping) else pattern
        if not isinstance(shards, (str, list)) or not shards:
            raise ValueError(f"{where}: ld corpus {name!r} must be a shard pattern, a list of them, or an object "
                             f"{{\"shards\": PATTERN, \"tokenizer\": ..., \"normalize\": [...], \"augment\": ...}}, "
                             f"got {pattern!r}")
    return {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in corpora.items()}, kw


def _shard_pattern(opt: Mapping[str, Any], where: str) -> str | dict[str, Any]:
    if isinstance(opt.get("ld"), Mapping):
        return opt["ld"]
    if opt.get("ld"):
        return str(opt["ld"])
    if "large_dataset" in opt and parse_bool(opt["large_dataset"], "large_dataset"):
        trset = opt.get("trset")
        if not trset:
            raise ValueError(f"{where}: large_dataset is true but train:option has neither 'ld' nor 'trset'; "
                             f"set 'ld' to the shard pattern (current CAT reads only 'ld'; 'large-dataset' "
                             f"no longer does anything)")
        if str(trset).endswith(".pkl"):
            raise ValueError(f"{where}: trset {trset!r} is CAT's pickled data, not shards; "
                             f"set 'ld' to the shard pattern")
        return str(trset)
    raise ValueError(f"{where}: train:option names no shards; set 'ld' (or, older CAT, "
                     f"'large_dataset': true with 'trset') to a shard pattern such as data/*/data-*.tar")


def loader_options(hyper: Mapping[str, Any], *, world_size: int, where: str = "hyper-p.json") -> HyperOptions:
    """Resolve CAT's keys to :func:`wdsprep.make_loader` arguments (pure: no files are opened).

    Batch bounds: ``bucket_size // world_size`` -> ``max_frames`` and ``batch_size // world_size``
    -> ``max_batch_size``.  ``batching_mode: "bucket"`` bounds by frames only (``batch_size`` is
    not used, as in CAT); ``"batch"`` needs ``batch_size`` and also applies ``bucket_size`` when
    given (CAT's ``ld`` loader would not); without ``batching_mode`` whichever is given applies.
    CAT's ``bucket_size`` of -1 (its default) means none.
    """
    opt = normalize_keys(train_option(hyper, where), where)
    trset = _shard_pattern(opt, where)
    ld_kwargs: dict[str, Any] = {}
    if isinstance(trset, Mapping):
        trset, ld_kwargs = _ld_object(trset, where)
    tok = opt.get("tokenizer", hyper.get("tokenizer"))
    if tok is None:
        raise ValueError(f"{where}: no tokenizer; set train:option 'tokenizer' or top-level "
                         f"{{\"tokenizer\": {{\"file\": PATH}}}}")

    mode = opt.get("batching_mode")
    if mode not in (None, "batch", "bucket"):
        raise ValueError(f"{where}: batching_mode must be 'batch' or 'bucket', got {mode!r}")
    kw: dict[str, Any] = {}
    ignored: dict[str, str] = {}
    bucket_size = _int(opt, "bucket_size", where) if "bucket_size" in opt else None
    if bucket_size is not None and bucket_size <= 0:
        bucket_size = None  # CAT's default -1: no frame budget
    if bucket_size is not None:
        # CAT: bucket_size is the global frame budget, each rank gets its share.
        kw["max_frames"] = bucket_size // world_size
        if kw["max_frames"] < 1:
            raise ValueError(f"{where}: bucket_size {bucket_size} split over {world_size} ranks is < 1 frame")
    if mode == "bucket":
        if bucket_size is None:
            raise ValueError(f"{where}: batching_mode 'bucket' needs bucket_size > 0 (global frames per batch)")
        if "batch_size" in opt:
            ignored["batch_size"] = ("batching_mode 'bucket' bounds batches by bucket_size only "
                                     "(so does CAT's ld loader)")
    elif "batch_size" in opt:
        kw["max_batch_size"] = max(1, _int(opt, "batch_size", where) // world_size)
    elif mode == "batch" or (bucket_size is None and not {"max_cost", "max_frames", "max_duration", "max_batch_size"}
                                                         & set(ld_kwargs)):
        raise ValueError(f"{where}: batching_mode 'batch' needs batch_size (the global batch size); "
                         f"or set batching_mode 'bucket' with bucket_size (global frames per batch)")
    if "ld_shuffle_buffer" in opt:
        kw["shuffle_buffer"] = _int(opt, "ld_shuffle_buffer", where)  # <= 1: no shuffle buffer, as CAT's <= 0
    if "seed" in opt:
        kw["seed"] = _int(opt, "seed", where)
    for option, cat_key in CAT_KEYS.items():
        if option in ld_kwargs and option in kw:
            raise ValueError(f"{where}: ld {option} and train:option {cat_key} both set {option} (CAT's {cat_key} is "
                             f"global, split over the ranks; ld's is per rank); keep one")
    if "max_duration" in ld_kwargs and "max_frames" in kw:
        raise ValueError(f"{where}: ld max_duration and train:option bucket_size both bound a batch's frames (CAT's "
                         f"bucket_size is global, split over the ranks; ld's max_duration is per rank); keep one")
    if not {"max_cost", "max_frames", "max_duration"} & set(ld_kwargs):
        kw.setdefault("max_frames", NO_FRAME_BOUND)
    if "ld_bucket_count_padding" in opt and not parse_bool(opt["ld_bucket_count_padding"], "ld_bucket_count_padding"):
        # Counting only real frames lets one long utterance among short ones blow the budget;
        # wdsprep always bounds padded frames, which bucketing keeps close to the real ones.
        warnings.warn(f"{where}: ld_bucket_count_padding=false: wdsprep always bounds padded frames "
                      f"(B x longest <= bucket_size/world); bucketing keeps padding low", UserWarning, stacklevel=2)
    if "batching_uneven" in opt and parse_bool(opt["batching_uneven"], "batching_uneven"):
        ignored["batching_uneven"] = ("CAT turns it off for ld too; wdsprep deals shards to ranks by frames and ends "
                                      "every rank's epoch at the same step")
    if "dynamic_batch_mode" in opt:
        ignored["dynamic_batch_mode"] = ("older CAT's option for pickled data, which it turned off for large datasets; "
                                         "use batching_mode and bucket_size")
    for key, why in ignored.items():
        warnings.warn(f"{where}: train:option {key}={opt[key]!r} is not used: {why}", UserWarning, stacklevel=2)
    passthrough = {k: v for k, v in opt.items() if k not in _KNOWN}
    for key in passthrough:
        _say_near_miss(key, where)
    return HyperOptions(trset, _tokenizer_path(tok, where), {**kw, **ld_kwargs}, passthrough, ignored)


def _say_near_miss(key: str, where: str) -> None:
    """Warn about a train:option key that looks meant for the loader: make_loader's own name
    (read only inside an ld object), or a near miss of a key wdsprep reads."""
    if key in OWNER:
        cat = next((c for o, c in CAT_KEYS.items() if o == key), None)
        warnings.warn(f"{where}: train:option {key!r} is not read there: make_loader's options go in an ld object, "
                      f"{{\"ld\": {{\"shards\": PATTERN, \"{key}\": ...}}}}"
                      + (f", or give CAT's {cat!r}" if cat else ""), UserWarning, stacklevel=3)
        return
    close = difflib.get_close_matches(key, sorted(_KNOWN | set(OWNER)), n=1, cutoff=0.85)
    if close:
        warnings.warn(f"{where}: train:option {key!r} is not a key wdsprep reads (it is passed on to CAT as is): "
                      f"did you mean {close[0]!r}?", UserWarning, stacklevel=3)


def read_hyper(path: str | os.PathLike) -> Any:
    """The JSON a ``hyper-p.json`` holds; a FIFO, a device or a huge file there is refused unread,
    and an error names the file."""
    p = Path(path)
    try:
        return json.loads(read_small(p, HYPER_LIMIT, "a hyper-p.json").decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such hyper-p.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


def make_loader_from_hyper(path: str | os.PathLike, *, world_size: int | None = None,
                           tokenizer: Tokenizer | str | os.PathLike | None = None, **overrides: Any):
    """The training loader a CAT ``hyper-p.json`` describes; ``overrides`` go to :func:`make_loader`.

    ``tokenizer`` (a path or a tokenizer) replaces the one the file names, e.g. the JSON that
    ``wdsprep tokenizer import-cat`` made from the ``.tknz`` CAT's ``tokenizer.file`` points at.
    When the file's top-level ``tokenizer`` records ``|V|`` (CAT's output classes), the tokenizer
    must have that many ids.  ``world_size`` defaults to torch.distributed's (1 without it); rank likewise.
    """
    from wdsprep.loader import make_loader
    from wdsprep.loading.collectives import dist_info
    from wdsprep.tokenizer import as_tokenizer

    p = Path(path)
    hyper = read_hyper(p)
    if world_size is None:
        world_size = dist_info()[1]
    o = loader_options(hyper, world_size=world_size, where=str(p))
    tok = as_tokenizer(o.tokenizer_file(p) if tokenizer is None else tokenizer)
    if isinstance(o.trset, dict):  # a corpus's own tokenizer, relative to the file's folder as the loader's is
        for corpus in o.trset.values():
            if isinstance(corpus, dict) and isinstance(corpus.get("tokenizer"), (str, os.PathLike)):
                corpus["tokenizer"] = beside(corpus["tokenizer"], p)
            elif isinstance(corpus, dict) and isinstance(corpus.get("tokenizer"), Mapping):
                corpus["tokenizer"] = {k: beside(v, p) for k, v in corpus["tokenizer"].items()}
    classes = hyper.get("tokenizer", {}).get("|V|") if isinstance(hyper.get("tokenizer"), Mapping) else None
    if classes is not None and int(classes) != tok.vocab_size:
        raise ValueError(f"{p}: tokenizer '|V|' is {classes} (the model's output classes) but the tokenizer has "
                         f"{tok.vocab_size} ids; use the tokenizer the model was trained with")
    return make_loader(o.trset, tok, **{**o.loader_kwargs, "world_size": world_size, **overrides})
