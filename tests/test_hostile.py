"""Hostile testing, round 4 (issue 36): crafted files, tampered packs and bad options end as one-line
errors naming the file, option or field, or as counted drops; never lost data, a hang or a traceback.
One test per item (or sub-item); every input is built here, every hang bounded by a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wdsprep.format.commit import PARTS_DIR
from wdsprep.pack.output import prepare_output


def _target(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder outside the pack, holding files an --overwrite must never touch."""
    target = tmp_path / "elsewhere"
    (target / PARTS_DIR).mkdir(parents=True)
    files = [target / "data-00000.tar", target / "index.json", target / PARTS_DIR / "00000000",
             target / "pack_report.json", target / ".w000-00000.tar"]
    for f in files:
        f.write_bytes(b"precious")
    return target, files


# -- item 1: pack --overwrite never follows a symlink inside --out ---------------------------------------


def test_item1_overwrite_refuses_a_linked_group_folder_and_deletes_nothing_in_its_target(tmp_path):
    target, files = _target(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "data-00000.tar").write_bytes(b"old")
    (out / "0_100").symlink_to(target, target_is_directory=True)
    with pytest.raises(FileExistsError, match=r"0_100 is a symbolic link.*remove the link"):
        prepare_output(out, overwrite=True)
    assert all(f.read_bytes() == b"precious" for f in files)
    assert (out / "data-00000.tar").exists()  # refused before anything changed


def test_item1_overwrite_removes_linked_files_and_parts_themselves_never_their_targets(tmp_path):
    target, files = _target(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / PARTS_DIR).symlink_to(target / PARTS_DIR, target_is_directory=True)
    (out / "data-00001.tar").symlink_to(target / "data-00000.tar")
    (out / "index.json").symlink_to(target / "index.json")
    (out / "notes.txt").write_text("kept")
    with prepare_output(out, overwrite=True):
        pass
    assert all(f.read_bytes() == b"precious" for f in files)
    assert not os.path.lexists(out / PARTS_DIR) and not os.path.lexists(out / "data-00001.tar")
    assert not os.path.lexists(out / "index.json") and (out / "notes.txt").read_text() == "kept"


def test_item19_a_planted_worker_shard_link_to_a_folder_is_removed_itself(tmp_path):
    """It gave "Cannot call rmtree on a symbolic link", naming no path."""
    target, files = _target(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".w000-00000.tar").symlink_to(target, target_is_directory=True)
    with prepare_output(out, overwrite=True):
        pass
    assert all(f.read_bytes() == b"precious" for f in files)
    assert not os.path.lexists(out / ".w000-00000.tar")


# -- item 7: verify on a pack that has not committed exits non-zero ----------------------------------------

TIMEOUT = 120


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    """A committed pack of 60 utterances in two length groups, 10 to a shard."""
    from shardsets import build

    root = tmp_path_factory.mktemp("hostile-pack")
    out, utts = build(root, n=60, utts_per_shard=10, groups=["0:150", "150:"])
    return out, utts


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def _wdsprep(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


def test_item7_verify_on_a_pack_that_did_not_commit_exits_nonzero_unless_growing(small_pack, tmp_path):
    from wdsprep.format.commit import MARKER_NAME, begin

    out = _copy(small_pack[0], tmp_path / "out")
    assert (out / "pack_plan.json").is_file()  # the plan stays after the commit: the folder can be followed
    begin(out)  # a pack killed before its commit leaves the marker
    r = _wdsprep("verify", f"{out}/*/data-*.tar")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "has not committed" in r.stdout and MARKER_NAME in r.stdout and "OK" not in r.stdout.splitlines()[-1]
    r = _wdsprep("verify", "--growing", f"{out}/*/data-*.tar")
    assert r.returncode == 0 and "OK so far" in r.stdout, r.stdout + r.stderr


# -- item 5: a local published shard changed in place (size and mtime kept) is found by its SHA-256 --------


def _corrupt_in_place(shard: Path) -> None:
    """Flip bytes in the middle of a member's data, keeping the size and the mtime (ns)."""
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    at = len(data) // 2
    data[at:at + 4] = bytes(b ^ 0xFF for b in data[at:at + 4])
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns


def test_item5_verify_finds_a_local_shard_changed_in_place(small_pack, tmp_path):
    from wdsprep import verify_shards

    out = _copy(small_pack[0], tmp_path / "out")
    shard = out / "0_150" / "data-00000.tar"
    _corrupt_in_place(shard)
    r = verify_shards(f"{out}/*/data-*.tar")
    assert not r.ok and any(p.shard == str(shard) and "SHA-256" in p.what for p in r.problems), r.format()


def test_item5_resume_refuses_a_published_shard_changed_in_place(tmp_path, monkeypatch):
    from shardsets import make_kaldi_dir

    from wdsprep import pack_data
    from wdsprep.errors import DataError
    from wdsprep.pack import output

    kd = tmp_path / "kaldi"
    make_kaldi_dir(kd, 60, seed=3)
    out = tmp_path / "out"
    args = dict(f_scps=str(kd / "feats.scp"), f_labels=str(kd / "text"), d_out=str(out), utts_per_shard=10,
                progress=False)
    real, calls = output.Publisher.publish, [0]

    def stop_after_two(self, w):
        if calls[0] == 2:
            raise RuntimeError("stopped by the test")
        calls[0] += 1
        real(self, w)

    monkeypatch.setattr(output.Publisher, "publish", stop_after_two)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        pack_data(**args)
    monkeypatch.undo()
    shard = out / "data-00001.tar"
    assert shard.exists() and not (out / "data-00002.tar").exists()
    _corrupt_in_place(shard)
    with pytest.raises(DataError, match=r"data-00001.tar: published by the pack being resumed.*SHA-256"):
        pack_data(**args, resume=True)
