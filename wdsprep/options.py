"""An option's one home: a dataclass field that says how every surface spells it.

:func:`option` makes the field: its default, a line of help, how the command line writes it and
reads its text, whether ``hyper-p.json``'s ``ld`` object takes it, whether it changes the plan,
and whether the resume fingerprint holds it always or only once it is set.  The CLI's flags
(:func:`add_flags`, :func:`given`), the ``ld`` keys with their checks (:func:`from_ld`), the
fingerprint's rule (:func:`fingerprinted`) and the options table of ``docs/loader.md``
(:func:`table`) are read from the fields, so an option added to a group reaches every surface
(``plan/options.py`` groups make_loader's; ``tests/test_cli_mirror.py`` holds the signature,
the flags and the keys to them, defaults included).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import textwrap
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar


@dataclass(frozen=True)
class Kind:
    """How values of an option are written outside Python: on the command line and in JSON."""

    metavar: str | None
    from_text: Callable[[str], Any] | None  # argparse's ``type`` for one word; None: a switch
    from_json: Callable[[Any], Any]  # a JSON value -> the option's value; ValueError saying what it should be
    nargs: str | None = None  # the flag takes several words ...
    join: Callable[[list[Any]], Any] | None = None  # ... made one value by this
    choices: tuple[str, ...] | None = None
    append: bool = False  # the flag may be given again, each time one more word (joined as with nargs)
    toggle: bool = False  # a yes/no flag both ways: --NAME and --no-NAME


def _json_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ValueError(f"must be an integer, got {value!r}")
    return int(value)


def _json_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return float(value)


def _json_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def parse_bool(value: Any) -> bool:
    """A JSON boolean, 0/1 or one of true/false/yes/no/on/off (any case); else ValueError.

    Strict where CAT is not: its ``bool("false")`` is True.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"must be a boolean (true/false), got {value!r}")


def _json_object_or_file(value: Any) -> Any:
    if not isinstance(value, (Mapping, str)) or not value:
        raise ValueError(f"must be an object or the path of a JSON file, got {value!r}")
    return dict(value) if isinstance(value, Mapping) else value


def _json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"must be an object, got {value!r}")
    return dict(value)


def json_object_text(text: str) -> dict[str, Any]:
    """A JSON object given on the command line."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object ({{...}}), not {text!r}")
    return value


def named_numbers(items: list[str] | str) -> dict[str, float]:
    """NAME=NUMBER items (comma- or space-separated) as a dict."""
    out: dict[str, float] = {}
    for item in (x for part in ([items] if isinstance(items, str) else items) for x in part.split(",") if x):
        name, eq, value = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"{item!r} is not NAME=NUMBER") from None
    return out


def _json_weights(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"must be {{name: weight}}, got {value!r}")
    return {str(k): _json_number(v) for k, v in value.items()}


def schedule_point(text: str) -> tuple[int, dict[str, float]]:
    """``STEP:NAME=W,NAME=W`` as (step, weights)."""
    step, colon, weights = text.partition(":")
    if not colon or not step.strip().isdigit():
        raise ValueError(f"{text!r} is not STEP:NAME=W,NAME=W (e.g. 1000:en=1,zh=1)")
    return int(step), named_numbers(weights)


def _json_schedule(value: Any) -> list[tuple[int, dict[str, float]]]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise ValueError(f"must be [[step, {{name: weight}}], ...], got {value!r}")
    return [(p[0], p[1]) for p in value]


def _schedule_points(items: list[str]) -> list[tuple[int, dict[str, float]]]:
    return [schedule_point(p) for p in items]


def _json_paths(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a path or a list of paths, got {value!r}")
    return list(value)


def named_paths(items: list[str]) -> dict[str, str]:
    """NAME=PATH items as a dict, in order (each name once)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise ValueError(f"{item!r} is not NAME=PATH (e.g. prev_text=data/train/text.prev)")
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        out[name] = value
    return out


def _json_named_paths(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(v, str) and v for v in value.values()):
        raise ValueError(f"must be {{name: path}}, got {value!r}")
    return {str(k): v for k, v in value.items()}


INT = Kind("N", int, _json_int)
NUMBER = Kind("X", float, _json_number)
PATH = Kind("PATH", str, _json_str)
SWITCH = Kind(None, None, parse_bool)
JSON_OR_FILE = Kind("JSON_OR_FILE", str, _json_object_or_file)
FILE_OR_OBJECT = Kind("FILE", str, _json_object_or_file)  # a JSON file; in hyper-p.json also the object
JSON_OBJECT = Kind("JSON", json_object_text, _json_object)
WEIGHTS = Kind("NAME=W", str, _json_weights, nargs="+", join=named_numbers)
SCHEDULE = Kind("STEP:NAME=W,...", str, _json_schedule, nargs="+", join=_schedule_points)
# One or more files (a Kaldi table split in parts, say): several words on the command line.
FILES = Kind("FILE", str, _json_paths, nargs="+", join=list)
# NAME=PATH pairs, the flag given once per pair.
NAMED_PATHS = Kind("NAME=PATH", str, _json_named_paths, append=True, join=named_paths)
# Yes or no, both spelled on the command line (--NAME / --no-NAME); unset: the default.
TOGGLE = Kind(None, None, parse_bool, toggle=True)


def _json_names(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of names, got {value!r}")
    return list(value)


def _json_levels(value: Any) -> float | tuple[float, ...]:
    if isinstance(value, list):
        if not value:
            raise ValueError("must be a number or a list of numbers, one per level, got []")
        return tuple(_json_number(v) for v in value)
    return _json_number(value)


def _levels(items: list[float]) -> float | tuple[float, ...]:
    return items[0] if len(items) == 1 else tuple(items)


# Names (fields, normalization steps): several words on the command line, a list (or one) in JSON.
NAMES = Kind("NAME", str, _json_names, nargs="+", join=list)
# One number, or one per level: several words on the command line, a list in JSON.
LEVELS = Kind("X", float, _json_levels, nargs="+", join=_levels)


def choice(*values: str) -> Kind:
    """One of ``values``."""

    def check(value: Any) -> str:
        if value not in values:
            raise ValueError(f"must be one of {list(values)}, got {value!r}")
        return value

    return Kind(None, str, check, choices=values)


@dataclass(frozen=True)
class Spec:
    """What :func:`option` records of an option, beside its default (``field.metadata["option"]``)."""

    help: str
    kind: Kind
    flag: str | None  # the command line's flag; None: none (torchrun's rank, a derived field)
    metavar: str | None  # the flag's argument, as --help shows it
    to_value: Callable[[Any], Any] | None  # a flag's parsed value -> the option's value (e.g. ALPHA -> sampling)
    ld: bool  # hyper-p.json's ld object takes it, under the option's name
    plan: bool  # it changes the planned batches
    common: bool  # shown by --help (the rest by --help-all): what most runs set
    doc: str | None = None  # what docstrings say of it, where more than ``help``: written into them (``document``)


def option(default: Any, help: str, *, kind: Kind = INT, flag: str | bool = True, metavar: str | None = None,
           to_value: Callable[[Any], Any] | None = None, ld: bool = True, plan: bool = False,
           when_set: bool = False, common: bool = False, doc: str | None = None) -> Any:
    """A dataclass field that is an option (see the module's docstring).

    ``flag``: True: ``--name-with-dashes``; a string: that flag; False: none.  A switch
    (``kind=SWITCH``) sets the opposite of its default.  ``to_value``: what a flag's or an ``ld``
    key's value becomes (e.g. a sampling alpha, its SubwordSampling).  ``when_set``: see
    :func:`fingerprinted`.  ``common``: ``--help`` shows it (the others: ``--help-all``).  ``doc``:
    the longer text docstrings give it (:func:`document`); ``help`` where None.
    """
    s = Spec(help, kind, None if flag is False else flag, metavar or kind.metavar, to_value, ld, plan, common, doc)
    return field(default=default, metadata={"option": s, "when_set": when_set})


def spec(f: Field) -> Spec | None:
    return f.metadata.get("option")


def options_of(cls: type) -> Iterator[tuple[Field, Spec]]:
    """The option fields of a dataclass, in order."""
    for f in fields(cls):
        s = spec(f)
        if s is not None:
            yield f, s


def default(f: Field) -> Any:
    return None if f.default is MISSING else f.default


def flag_of(f: Field, s: Spec) -> str | None:
    if s.flag is None:
        return None
    return "--" + f.name.replace("_", "-") if s.flag is True else s.flag


def add_flags(group: argparse._ActionsContainer, cls: type, only: Iterable[str] | None = None,
              every_help: bool = True) -> None:
    """One flag per option of ``cls`` that has one (of those named in ``only``); unset flags leave
    their dest None.  ``every_help`` False: ``--help`` shows only the ``common`` ones."""
    for f, s in options_of(cls):
        flag = flag_of(f, s)
        if flag is None or (only is not None and f.name not in only):
            continue
        d = default(f)
        shown = "" if d is None or isinstance(d, bool) or d == () else f" (default: {d})"
        visible = every_help or s.common
        s = replace(s, help=s.help.replace("%", "%%"))  # argparse formats help with %
        if s.kind is SWITCH:
            group.add_argument(flag, dest=f.name, action="store_const", const=not d, default=None,
                               help=s.help if visible else argparse.SUPPRESS)
        elif s.kind.toggle:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                               help=s.help if visible else argparse.SUPPRESS)
        elif s.kind.append:
            group.add_argument(flag, dest=f.name, type=s.kind.from_text, action="append", default=None,
                               metavar=s.metavar, help=s.help if visible else argparse.SUPPRESS)
        else:
            group.add_argument(flag, dest=f.name, type=s.kind.from_text, nargs=s.kind.nargs, default=None,
                               metavar=s.metavar, choices=s.kind.choices,
                               help=s.help + shown.replace("%", "%%") if visible else argparse.SUPPRESS)


def given(args: argparse.Namespace, *classes: type, only: Iterable[str] | None = None) -> dict[str, Any]:
    """The options of ``classes`` (of those named in ``only``) given on the command line, as keyword
    arguments (ValueError naming the flag)."""
    out = {}
    for f, s in (fs for cls in classes for fs in options_of(cls)):
        value = getattr(args, f.name, None)
        if value is None or flag_of(f, s) is None or (only is not None and f.name not in only):
            continue
        try:
            if s.kind.join is not None:
                value = s.kind.join(value)
            out[f.name] = s.to_value(value) if s.to_value is not None else value
        except ValueError as e:
            raise ValueError(f"{flag_of(f, s)}: {e}") from None
    return out


def ld_keys(cls: type) -> list[str]:
    """The ``ld`` keys of ``cls``'s options, in order."""
    return [f.name for f, s in options_of(cls) if s.ld]


def from_ld(cls: type, ld: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``cls``'s options an ``ld`` object gives, checked and converted (ValueError naming the key)."""
    out = {}
    for f, s in options_of(cls):
        if not s.ld or f.name not in ld:
            continue
        try:
            value = s.kind.from_json(ld[f.name])
        except ValueError as e:
            raise ValueError(f"{where}: ld {f.name} {e}") from None
        try:
            out[f.name] = s.to_value(value) if s.to_value is not None else value
        except ValueError as e:  # its message names the option
            raise ValueError(f"{where}: ld {e}") from None
    return out


def fingerprinted(options: Any) -> dict[str, Any]:
    """A dataclass's fields as a resume fingerprint holds them.

    A field marked ``when_set`` (``metadata={"when_set": True}``, or :func:`option`'s argument) is
    held only when set (not None): a state that lacks it compares equal to one of the field unset.
    Every field added to a group that a fingerprint holds is marked so.
    """
    return {f.name: getattr(options, f.name) for f in fields(options)
            if not (f.metadata.get("when_set") and getattr(options, f.name) is None)}


def table(groups: Mapping[str, type]) -> str:
    """The options of ``groups`` ({title: class}) as a markdown table: option, default, flag, ld key, help."""
    rows = ["| option | default | flag | `ld` | changes the plan | what it does |",
            "| --- | --- | --- | --- | --- | --- |"]
    for title, cls in groups.items():
        rows.append(f"| **{title}** | | | | | |")
        for f, s in options_of(cls):
            flag = flag_of(f, s)
            rows.append(f"| `{f.name}` | {'' if default(f) is None else f'`{default(f)!r}`'} | "
                        f"{'' if flag is None else f'`{flag}`'} | {'yes' if s.ld else ''} | "
                        f"{'yes' if s.plan else ''} | {s.help} |")
    return "\n".join(rows)



F = TypeVar("F", bound=Callable[..., Any])


def documented(*classes: type, skip: Iterable[str] = ()) -> Callable[[F], F]:
    """Write the options of ``classes`` into a function's docstring, one entry each (its ``doc``, else
    its ``help``, and its default), before its ``Returns:`` section: the function's own text names
    no option's meaning, the homes hold it once.  Only the options the function takes are written
    (all of them where it takes ``**options``); ``skip``: options it documents itself."""
    skipped = set(skip)

    def wrap(func: F) -> F:
        params = inspect.signature(func).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        entries = []
        for cls in classes:
            for f, s in options_of(cls):
                if f.name in skipped or not (takes_any or f.name in params):
                    continue
                d = default(f)
                said = "" if d is None or d == () else f" (default: {d!r})"
                entries.append(textwrap.fill(f"{f.name}: {s.doc or s.help}{said}.", 100, initial_indent=" " * 8,
                                             subsequent_indent=" " * 12, break_on_hyphens=False))
        section = "    Options (each from its home, where the command line's flag is made too):\n" + "\n".join(entries)
        doc = func.__doc__ or ""
        at = doc.find("    Returns:")
        func.__doc__ = (doc[:at] + section + "\n\n" + doc[at:]) if at >= 0 else doc.rstrip() + "\n\n" + section + "\n"
        return func

    return wrap
