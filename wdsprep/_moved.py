"""Module paths of wdsprep 0.1 that moved when the package was laid out along the data flow.

Importing an old path (``wdsprep.reader``, ``wdsprep.kaldi``...) still works for one release: it
gives a module that takes its names from the new homes, with a DeprecationWarning naming them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Sequence

# old module -> the modules its names live in now (first match wins)
MOVED: dict[str, tuple[str, ...]] = {
    "kaldi": ("prep.kaldi",),
    "audio": ("prep.audio",),
    "fbank": ("prep.fbank",),
    "parallel": ("prep.parallel",),
    "shards": ("format.keys", "format.npy", "format.index", "format.writer", "format.tar", "files"),
    "reader": ("format.shardfile", "format.samples", "format.tar", "format.npy", "loading.read"),
    "shardlist": ("format.shardlist",),
    "records": ("loading.records",),
    "groups": ("pack.groups",),
    "writer": ("pack.sink",),
    "pack_audio": ("pack.from_audio",),
    "distributed": ("loading.assign", "loading.collectives"),
    "batching": ("loading.batching", "loading.stats"),
    "inspect_shards": ("check.inspect", "check.plot"),
    "verify": ("check.verify",),
    "dryrun": ("check.dryrun",),
}
# Names the 0.1 wdsprep.loader held that moved to loading/ (wdsprep.loader is still the front).
LOADER_MOVED = ("loading.collate", "loading.stages", "loading.transport", "loading.stream", "loading.stats")


class _Alias(types.ModuleType):
    """An old module path: attribute lookups go to the new homes."""

    def __init__(self, name: str, homes: Sequence[str]) -> None:
        super().__init__(name)
        self.__homes = [importlib.import_module(f"wdsprep.{h}") for h in homes]

    def __getattr__(self, attr: str) -> Any:
        for home in self.__homes:
            if hasattr(home, attr):
                return getattr(home, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self) -> list[str]:
        return sorted({a for home in self.__homes for a in dir(home)})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        prefix, _, rest = fullname.partition(".")
        if prefix != "wdsprep" or rest not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        homes = MOVED[spec.name.partition(".")[2]]
        warnings.warn(f"{spec.name} moved to {', '.join('wdsprep.' + h for h in homes)}; the old path goes away in "
                      f"the next release", DeprecationWarning, stacklevel=2)
        return _Alias(spec.name, homes)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def moved_attribute(module: str, attr: str, homes: Sequence[str]) -> Any:
    """``attr`` of a module that no longer defines it, from its new home, with a DeprecationWarning."""
    for h in homes:
        home = importlib.import_module(f"wdsprep.{h}")
        if hasattr(home, attr):
            warnings.warn(f"{module}.{attr} moved to wdsprep.{h}.{attr}; the old path goes away in the next release",
                          DeprecationWarning, stacklevel=3)
            return getattr(home, attr)
    raise AttributeError(f"module {module!r} has no attribute {attr!r}")


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
