"""The loader's hot path in C (``wdsprep/_native.c``), or None: then the same Python code runs.

The C module is optional (an install without a compiler still works, ~2.5x slower in one
process); ``WDSPREP_PURE_PYTHON=1`` forces the Python path, which stays the reference the tests
compare the C with.
"""

from __future__ import annotations

import os
from typing import Any, Callable

lib: Any  # the module, or None; read at call time (``native.lib``), so tests can take it away
try:
    import wdsprep._native as lib
except ImportError:  # installed without a C compiler: the same results, slower
    lib = None
if os.environ.get("WDSPREP_PURE_PYTHON", "") not in ("", "0"):
    lib = None


def _tracked(obj: Any) -> Any:
    return obj


# FileFeats, which a caller may keep by the thousand (one per utterance it holds, its features left
# in the shard), are taken off the cyclic GC's books: tracked, they would be promoted to the oldest
# generation and trigger about one full collection per epoch, ~10% of the loader's time.  They
# cannot be part of a reference cycle: they hold strings, tuples and shard files.
untrack: Callable[[Any], Any] = lib.untrack if lib is not None else _tracked
