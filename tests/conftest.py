"""The demo driver (``tools/``) and the benchmark helpers (``tools/bench/``: page-cache control,
baseline batchers) live outside the library; the tests that use them import them from there."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"
for d in (TOOLS, TOOLS / "bench"):
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))


def pytest_collection_modifyitems(config, items):
    """The long tests (marker ``slow``: torchrun, whole recipes) first, keeping their order: in two
    processes, one of them started last would leave the other process idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
