"""inspect: numbers equal what the Kaldi arks hold, with and without an index, and the plot is a PNG."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from shard_helpers import GROUPS, cat_members, kaldi_data, npy, packed, write_tar

from wdsprep import inspect_shards
from wdsprep.format.keys import encode_key
from wdsprep.pack.groups import Groups

MF = (50, 300, 1000)  # small max_frames: the test utterances are 10..299 frames


def expected_groups(feats: dict[str, np.ndarray], texts: dict[str, str]) -> dict[str, dict]:
    """Per group, straight from the arks: utterance count, frames and transcript lengths."""
    groups = Groups(GROUPS)
    out: dict[str, dict] = {}
    for uttid, m in feats.items():
        g = out.setdefault(groups.find(m.shape[0]).folder, {"frames": [], "text": []})
        g["frames"].append(m.shape[0])
        g["text"].append(len(texts[uttid]))
    return out


def assert_matches(result, feats, texts) -> None:
    want = expected_groups(feats, texts)
    assert [g.name for g in result.groups] == [Groups(GROUPS).groups[i].folder for i in range(3)]
    for g in result.groups:
        w = want[g.name]
        assert g.utts == len(w["frames"])
        assert (g.frames.min(), np.median(g.frames), g.frames.max()) == \
               (min(w["frames"]), np.median(w["frames"]), max(w["frames"]))
        assert sorted(g.text_lens.tolist()) == sorted(w["text"])
        assert g.hours == pytest.approx(sum(w["frames"]) / 360_000)
        assert sum(s.utts for s in g.shards) == g.utts
    assert result.utts == len(feats)


@pytest.fixture(scope="module")
def pack_dir(tmp_path_factory):
    return packed(tmp_path_factory.mktemp("inspect"))


def test_inspect_with_index_matches_the_arks(pack_dir):
    d, feats, texts = pack_dir
    r = inspect_shards(f"{d}/*/data-*.tar", max_frames_list=())
    assert_matches(r, feats, texts)
    assert {s.source for s in r.shards} == {"index"} and {s.layout for s in r.shards} == {"cat"}
    assert r.ok
    table = r.format()
    for g in r.groups:
        assert g.name in table
    assert "data-00002.tar" in table and "data-00002.tar" not in r.format(per_shard=False)


def test_inspect_with_index_does_not_read_the_tars(tmp_path, monkeypatch):
    d, feats, texts = packed(tmp_path)
    for tar in d.glob("*/*.tar"):
        tar.write_bytes(b"garbage, not a tar")
    opened = []
    monkeypatch.setattr(tarfile, "open", lambda *a, **k: opened.append(a) or pytest.fail("inspect opened a tar"))
    r = inspect_shards(f"{d}/{{0_60,60_150,150_inf}}/data-*.tar", max_frames_list=())
    assert_matches(r, feats, texts)
    assert opened == [] and r.ok


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_inspect_cat_tars_without_index(tmp_path, monkeypatch, layout):
    """Tars as CAT writes them (no index.json): frames from the .npy header, the matrix is not decoded."""
    _, _, feats, texts = kaldi_data(tmp_path / "kaldi")
    groups = Groups(GROUPS)
    by_group: dict[str, dict] = {}
    for uttid, m in feats.items():
        by_group.setdefault(groups.find(m.shape[0]).folder, {})[uttid] = m
    for folder, fs in by_group.items():
        items = list(fs)
        for i in range(0, len(items), 5):
            write_tar(tmp_path / "cat" / folder / f"data-{i // 5:05d}.tar",
                      cat_members({u: fs[u] for u in items[i:i + 5]}, texts, layout))
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("inspect decoded a whole matrix"))
    r = inspect_shards(str(tmp_path / "cat/*/*.tar"), max_frames_list=())
    assert_matches(r, feats, texts)
    assert {s.source for s in r.shards} == {"tar"} and {s.layout for s in r.shards} == {layout}
    assert r.ok, r.problems


def test_inspect_reads_a_shard_the_index_does_not_list(tmp_path):
    d, feats, _ = packed(tmp_path)
    extra = {"late-utt": np.zeros((77, 4), np.float32)}
    write_tar(d / "60_150" / "data-00099.tar", cat_members(extra, {"late-utt": "hi"}, "cat"))
    r = inspect_shards(f"{d}/60_150/*.tar", max_frames_list=())
    extra_stats = [s for s in r.shards if s.path.endswith("data-00099.tar")][0]
    assert extra_stats.source == "tar" and extra_stats.frames.tolist() == [77]
    assert r.groups[0].utts == 1 + sum(60 <= m.shape[0] < 150 for m in feats.values())
    assert any("data-00099.tar" in p and "not listed" in p for p in r.problems)


def test_inspect_counts_what_the_loader_reads_and_names_the_rest(tmp_path):
    good = {"a": np.zeros((20, 4), np.float32), "b": np.zeros((30, 4), np.float32)}
    members = cat_members(good, {"a": "x", "b": "y"}, "cat")
    members = [m for m in members if m[0] != "b.txt"] + [("c.npy", b"\x93NUMPY garbage"), ("c.txt", b"z")]
    write_tar(tmp_path / "g" / "x.tar", members)
    r = inspect_shards(str(tmp_path / "g/x.tar"), max_frames_list=())
    assert r.shards[0].frames.tolist() == [20]  # 'b' (no transcript) and 'c' (garbage) are left out, each alone
    assert any("'b'" in p and "transcript" in p and "leaves this sample out" in p for p in r.problems)
    assert any("'c.npy'" in p and "leaves this sample out" in p for p in r.problems)


def test_inspect_names_a_truncated_tar(tmp_path):
    feats = {"a": np.zeros((20, 4), np.float32), "b": np.zeros((20, 4), np.float32)}
    m = cat_members(feats, {"a": "x", "b": "y"}, "cat")
    write_tar(tmp_path / "g" / "x.tar", m)
    data = (tmp_path / "g" / "x.tar").read_bytes()
    # Cut right after the second member: tarfile itself reads this silently as a one-sample tar.
    with tarfile.open(tmp_path / "g" / "x.tar") as tf:
        cut = [t for t in tf][1]
    (tmp_path / "g" / "x.tar").write_bytes(data[:cut.offset_data + 512 * (-(-cut.size // 512))])
    r = inspect_shards(str(tmp_path / "g/x.tar"), max_frames_list=())
    assert any(p.startswith(f"{tmp_path / 'g' / 'x.tar'}: truncated at byte") for p in r.problems), r.problems


def test_plot_and_padding_efficiency(pack_dir, tmp_path):
    d, _, _ = pack_dir
    png = tmp_path / "inspect.png"
    r = inspect_shards(f"{d}/*/data-*.tar", plot=png, max_frames_list=MF)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp"))
    assert set(r.efficiency) == {"0_60", "60_150", "150_inf", "all"}
    for curve in r.efficiency.values():
        assert list(curve) == list(MF) and all(0 < e <= 1 for e in curve.values())
    # Below the shortest utterance every sample is a batch of its own: no padding at all.
    assert r.efficiency["150_inf"][50] == 1.0
    # Mixing all groups in one batcher pads more than within the short group at a roomy max_frames.
    assert r.efficiency["all"][1000] < 1.0
    assert "padding efficiency" in r.format()
    # Same seed, same curve.
    assert inspect_shards(f"{d}/*/data-*.tar", max_frames_list=MF).efficiency == r.efficiency


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True)


def test_cli_inspect(pack_dir, tmp_path):
    d, feats, _ = pack_dir
    js = tmp_path / "i.json"
    p = run_cli("inspect", f"{d}/{{0_60,150_inf}}/data-*.tar", "--json", str(js),
                "--max-frames", "100", "1000")
    assert p.returncode == 0, p.stderr
    assert "0_60" in p.stdout and "150_inf" in p.stdout and "60_150" not in p.stdout
    j = json.loads(js.read_text())
    assert j["utterances"] == sum(m.shape[0] < 60 or m.shape[0] >= 150 for m in feats.values())
    assert set(j["padding_efficiency"]["all"]) == {"100", "1000"}
    assert run_cli("inspect", str(tmp_path / "nothing-*.tar")).returncode == 2


def test_inspect_problem_exit_code(tmp_path):
    shutil.rmtree(tmp_path / "g", ignore_errors=True)
    write_tar(tmp_path / "g" / "x.tar", [(f"{encode_key('a')}.npy", npy(np.zeros((3, 2), np.float32)))])
    p = run_cli("inspect", str(tmp_path / "g/x.tar"), "--max-frames")
    assert p.returncode == 1 and "no transcript member" in p.stdout


def test_import_is_cheap():
    code = "import sys, wdsprep; print(sorted(m for m in ('matplotlib', 'torch', 'webdataset') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
