"""The demo driver (``tools/``) and the benchmark helpers (``tools/bench/``: page-cache control,
baseline batchers) live outside the library; the tests that use them import them from there."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"
for d in (TOOLS, TOOLS / "bench"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
