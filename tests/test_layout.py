"""The package's layout holds: the layering contracts, no import cycle, torch-free planning and stages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
from wdsprep.plan.assign import assign, rank_order
from wdsprep.plan.streams import PlanOptions, plan_epoch
from wdsprep.loading.stages import filter_ctc, read_batches, tokenize
from wdsprep.plan.shardset import shard_set
plan = plan_epoch(np.array([5, 4]), np.arange(10, 19, dtype=np.int32), PlanOptions(max_frames=40), seed=0, epoch=0)
a = assign(plan.counts, 2, 0)
yielded = sum(len(plan.streams[s].batch(j)) for r in range(2) for s, j in rank_order(a, r))
left = sum(len(plan.streams[t.stream].batch(j)) for t in a.discarded for j in range(t.start, t.stop))
print(yielded + left)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "9"  # every utterance of the plan: in a rank's batches or the discarded tail


def test_dry_run_plan_of_a_mixture_runs_without_torch(tmp_path):
    """The planning side (epoch source, mixture, plan report) is pure: dry-run --plan of two named
    corpora mixed on a schedule, with every import of torch failing."""
    from shardsets import build

    en, _ = build(tmp_path, n=120, utts_per_shard=20, seed=1)
    zh, _ = build(tmp_path, n=60, utts_per_shard=20, seed=2)
    code = f"""
import sys
sys.modules["torch"] = None  # any import of torch now fails
from wdsprep.cli import main
status = main(["dry-run", "--plan", "--corpus", "en={en}/data-*.tar", "--corpus", "zh={zh}/data-*.tar",
               "--max-frames", "1500", "--schedule", "0:en=9,zh=1", "30:en=1,zh=1", "--world-size", "2"])
assert "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
sys.exit(status)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "share of utterances per step range" in r.stdout and "en 0.9@0 -> 0.5@30" in r.stdout


def test_url_schemes_are_compared_in_the_stores_alone():
    """What a URL's scheme can do is its store's (``remote/stores.py``): no other module compares a
    string with a scheme (``url.startswith("s3://")``, ``kind == "http"``, ``url[len("pipe:"):]``),
    so a new scheme is one store class and one entry in ``STORES``."""
    from wdsprep.remote.stores import STORES

    schemes = {p.rstrip(":/") for s in STORES for p in s.prefixes} | {s.name for s in STORES}
    schemes |= {"local", "other"}  # and the kinds a scheme-naming function would answer for the rest
    found = []
    for path in sorted((REPO / "wdsprep").rglob("*.py")):
        if path.relative_to(REPO).as_posix() == "wdsprep/remote/stores.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "removeprefix"))
                    or (isinstance(node.func, ast.Name) and node.func.id == "len")):
                operands = node.args
            else:
                continue
            for c in (n for op in operands for n in ast.walk(op) if isinstance(n, ast.Constant)):
                if isinstance(c.value, str) and c.value.rstrip(":/") in schemes:
                    found.append(f"{path.relative_to(REPO)}:{c.lineno}: {c.value!r}")
    assert not found, found
