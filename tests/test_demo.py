"""``wdsprep demo`` end to end on the bundled corpus: the numbers it prints add up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from demo import DEMO_DIR, pack_options

from wdsprep import cli
from wdsprep.pack.groups import Groups
from wdsprep.prep.kaldi import read_text


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_demo_runs_the_pipeline_and_its_summary_adds_up(tmp_path):
    work = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "wdsprep", "demo", "--work", str(work), "--nproc", "2"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)  # any cwd works
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wdsprep demo: summary" in r.stdout
    s = json.loads((work / "summary.json").read_text())
    train = read_text([DEMO_DIR / "data" / "train" / "text"])
    assert sum(g["utterances"] for g in s["groups"].values()) == len(train)  # nothing lost in pack
    one, two = s["dry_run"]["1"], s["dry_run"]["2"]
    assert one["utterances"] == len(train) and one["discarded_fraction"] == 0  # one rank reads everything
    assert len(set(two["steps_per_rank"])) == 1  # DDP: both ranks stop at the same step
    assert two["utterances"] + round(two["discarded_fraction"] * len(train)) == len(train)
    assert 0 < one["padding_efficiency"] <= 1
    assert (work / "shards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The recipe's packing options (egs/demo/conf/pack.conf, also read by run.sh stage 2).
    groups, _ = pack_options()
    assert list(s["groups"]) == [g.folder for g in Groups(groups)]


def test_checkout_commands_say_what_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(cli.CHECKOUT_TOOLS, "demo", ("tools/no-such-demo.py", "the demo"))
    assert cli.main(["demo", "--work", "x"]) == 2
    err = capsys.readouterr().err
    assert "no-such-demo.py not found" in err and "clone" in err
