"""The package's layout holds: the layering contracts, torch-free stages, the 0.1 module paths."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from wdsprep import _moved

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    """pyproject.toml's [tool.importlinter] contracts: layers along the data flow, no torch in the stages."""
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_the_code_lints_clean():
    """pyproject.toml's [tool.ruff.lint]: no undefined or unused names, sorted imports, 120 columns."""
    ruff = Path(sys.executable).with_name("ruff")
    r = subprocess.run([str(ruff), "check", "--no-cache", "wdsprep", "tests", "tools", "egs"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_the_numpy_stages_and_the_format_run_without_torch(tmp_path):
    code = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
import numpy as np
from wdsprep.format.samples import iter_decoded
from wdsprep.loading.assign import assign, rank_order
from wdsprep.loading.plan import PlanOptions, plan_epoch
from wdsprep.loading.stages import filter_ctc, planned_batches, read_batches, tokenize
from wdsprep.loading.shardset import shard_set
plan = plan_epoch(np.array([5, 4]), np.arange(10, 19, dtype=np.int32), PlanOptions(max_frames=40), seed=0, epoch=0)
a = assign(plan.counts, 2, 0)
yielded = sum(len(plan.streams[s].batch(j)) for r in range(2) for s, j in rank_order(a, r))
left = sum(len(plan.streams[t.stream].batch(j)) for t in a.discarded for j in range(t.start, t.stop))
print(yielded + left)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "9"  # every utterance of the plan: in a rank's batches or the discarded tail


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_module_paths_still_import_with_a_warning(old):
    sys.modules.pop(f"wdsprep.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"wdsprep.{old} moved to"):
        mod = importlib.import_module(f"wdsprep.{old}")
    new = [importlib.import_module(f"wdsprep.{h}") for h in _moved.MOVED[old]]
    # Every public name of the new homes is reachable through the old path, as the same object.
    for home in new:
        for name in [n for n in vars(home) if not n.startswith("_")][:20]:
            assert getattr(mod, name) is next(getattr(h, name) for h in new if hasattr(h, name))


def test_names_that_left_wdsprep_loader_still_resolve():
    import wdsprep.loader
    from wdsprep.loading.collate import collate
    from wdsprep.loading.stages import tokenize

    with pytest.warns(DeprecationWarning, match="wdsprep.loading.collate.collate"):
        assert wdsprep.loader.collate is collate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from wdsprep.loader import tokenize as old  # noqa: F401
    assert old is tokenize
    with pytest.raises(AttributeError):
        wdsprep.loader.no_such_name  # noqa: B018
