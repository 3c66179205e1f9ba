"""A pack is a commit: killed or out of disk at any point, it never leaves a folder that reads as complete.

The kills are real (SIGKILL of a pack process at a chosen file operation), the full disks are
real where a tmpfs can be mounted, and what is checked is what a user would run next: the loader,
``inspect``, ``verify``, and the pack again (``--resume`` keeps the shards published before the
stop; ``--overwrite`` redoes it).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shard_helpers import fill, small_fs
from shardsets import make_kaldi_dir, train_char_tokenizer

from wdsprep import inspect_shards, pack_data, verify_shards
from wdsprep.format.commit import MARKER_NAME, UncommittedPackError
from wdsprep.format.index import INDEX_FILES

GROUPS = ["0:150", "150:300", "300:"]
N = 300

# Runs pack_data in a process of its own that SIGKILLs itself just before the n-th call of
# os.<op> (replace or unlink) on a file whose name matches the pattern.
KILL_AT = r"""
import fnmatch, json, os, signal, sys
op, pattern, n, kwargs = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
real, calls = getattr(os, op), [0]
def deadly(*args, **kw):
    target = args[1] if op == "replace" else args[0]
    if fnmatch.fnmatch(os.path.basename(os.fspath(target)), pattern):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kw)
setattr(os, op, deadly)
from wdsprep import pack_data
pack_data(**kwargs)
"""


@pytest.fixture(scope="module")
def kaldi(tmp_path_factory):
    root = tmp_path_factory.mktemp("commit")
    utts = make_kaldi_dir(root / "kaldi", N, seed=3)
    return root, root / "kaldi", utts, train_char_tokenizer(root, root / "kaldi" / "text")


def pack_args(kd: Path, out: Path, **kw) -> dict:
    return dict(f_scps=str(kd / "feats.scp"), f_labels=str(kd / "text"), d_out=str(out), filter_group=GROUPS,
                utts_per_shard=23, progress=False, **kw)


def killed_pack(kd: Path, out: Path, op: str, pattern: str, n: int, **kw) -> None:
    args = pack_args(kd, out, **kw)
    r = subprocess.run([sys.executable, "-c", KILL_AT, op, pattern, str(n), json.dumps(args)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, f"the pack was not killed where the test meant: {r.returncode} {r.stderr[-2000:]}"


def read_all(pattern: str, tok: Path) -> list[str]:
    from wdsprep.loader import make_loader

    return [k for b in make_loader(pattern, tok, max_frames=4000, train=False) for k in b.keys]


def assert_refused(out: Path, tok: Path) -> None:
    """The loader refuses the folder as a complete corpus, naming it and saying what to do; inspect
    and verify show what a pack that planned (and so publishes in order) published so far, and
    refuse a folder of one that did not."""
    pattern = f"{out}/*/data-*.tar"
    with pytest.raises(UncommittedPackError, match="did not finish") as e:
        read_all(pattern, tok)
    assert str(out) in str(e.value) and "--overwrite" in str(e.value)
    if (out / "pack_plan.json").exists():  # shards published in order: a growing loader could follow them
        assert "growing=True" in str(e.value) and "--resume" in str(e.value)
        assert any("still being packed" in n for n in inspect_shards(pattern).notes)
        r = verify_shards(pattern, growing=True)
        assert r.ok and any("still being packed" in n.what for n in r.notes), r.format()
        r = verify_shards(pattern)  # not committed: a script taking verify's word must not take it as finished
        assert not r.ok and any("has not committed" in p.what for p in r.problems), r.format()
        return
    with pytest.raises(UncommittedPackError, match=MARKER_NAME):
        inspect_shards(pattern)
    r = verify_shards(pattern)
    assert not r.ok and any(MARKER_NAME in p.what and "loader refuses" in p.what for p in r.problems), r.format()
    cli = subprocess.run([sys.executable, "-m", "wdsprep", "verify", pattern], capture_output=True, text=True)
    assert cli.returncode == 1 and "did not finish" in cli.stdout


def assert_complete(out: Path, utts: dict, tok: Path) -> None:
    pattern = f"{out}/*/data-*.tar"
    assert sorted(read_all(pattern, tok)) == sorted(utts)
    assert verify_shards(pattern).ok
    assert not (out / MARKER_NAME).exists()
    assert json.loads((out / "pack_report.json").read_text())["written"]["utterances"] == len(utts)


# Where the kill lands: mid-way through the shard renames; everything written but the commit itself.
@pytest.mark.parametrize("op,pattern,n", [("replace", "data-*.tar", 9), ("unlink", MARKER_NAME, 1)])
def test_pack_killed_in_its_finalize_is_refused_until_overwrite_completes_it(kaldi, op, pattern, n):
    root, kd, utts, tok = kaldi
    out = root / f"out-{op}"
    killed_pack(kd, out, op, pattern, n)
    assert list(out.glob("*/data-*.tar")), "the kill should have left final-named shards"
    assert_refused(out, tok)
    with pytest.raises(FileExistsError, match="did not finish.*--resume"):
        pack_data(**pack_args(kd, out))
    pack_data(**pack_args(kd, out, overwrite=True))
    assert_complete(out, utts, tok)


@pytest.mark.parametrize("op,pattern,n", [("replace", "data-*.tar", 9), ("unlink", MARKER_NAME, 1),
                                          ("replace", "pack_report.json", 1)])
def test_pack_killed_anywhere_is_finished_by_resume(kaldi, op, pattern, n):
    root, kd, utts, tok = kaldi
    out = root / f"out-resume-{op}-{pattern}"
    killed_pack(kd, out, op, pattern, n)
    assert_refused(out, tok)
    pack_data(**pack_args(kd, out, resume=True))
    assert_complete(out, utts, tok)


def test_overwrite_killed_while_removing_the_old_pack_is_refused(kaldi):
    root, kd, utts, tok = kaldi
    out = root / "out-overwrite"
    pack_data(**pack_args(kd, out))
    assert_complete(out, utts, tok)
    killed_pack(kd, out, "unlink", "data-*.tar", 3, overwrite=True)  # old shards half removed, indexes left
    assert_refused(out, tok)
    pack_data(**pack_args(kd, out, overwrite=True))
    assert_complete(out, utts, tok)


def test_pack_killed_before_any_shard_is_named_leaves_nothing_to_read(kaldi):
    root, kd, utts, tok = kaldi
    out = root / "out-early"
    killed_pack(kd, out, "replace", "pack_plan.json", 1)
    assert not list(out.glob("*/data-*.tar"))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        read_all(f"{out}/*/data-*.tar", tok)
    pack_data(**pack_args(kd, out, overwrite=True))
    assert_complete(out, utts, tok)


def test_disk_full_in_finalize_keeps_the_shards_and_resume_completes_it(kaldi, tmp_path, monkeypatch):
    """A real full file system (tmpfs) when the second folder's index is written at the end: the
    error names the file, the published shards stay (refused as a complete corpus), and --resume
    after space was freed completes the pack without rewriting them."""
    from wdsprep.pack import output

    root, kd, utts, tok = kaldi
    with small_fs(tmp_path / "fs", "4m") as fs:
        out = fs / "out"
        real, calls = output.write_index, []

        def fill_then_write(folder, index):
            calls.append(folder)
            if len(calls) == 2:
                fill(fs)
            return real(folder, index)

        monkeypatch.setattr(output, "write_index", fill_then_write)
        with pytest.raises(OSError) as e:
            pack_data(**pack_args(kd, out))
        # The error names the index file that did not fit (its columns are written first).
        assert e.value.errno == errno.ENOSPC and e.value.filename in {str(calls[1] / f) for f in INDEX_FILES}
        assert not [p for p in out.rglob("*") if p.name.startswith((".w", "..w")) or p.name.endswith(".tmp")]
        assert_refused(out, tok)
        monkeypatch.undo()
        mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*/data-*.tar")}
        (fs / "filler").unlink()
        pack_data(**pack_args(kd, out, resume=True))
        assert_complete(out, utts, tok)
        assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes


def test_failure_half_way_through_publishing_keeps_what_was_published(kaldi, tmp_path, monkeypatch):
    """ENOSPC (simulated: renames need no space, but a directory block may) at the 7th shard's
    publication: the 6 before it stay, nothing partial does, and --resume writes the rest."""
    root, kd, utts, tok = kaldi
    out = tmp_path / "out"
    real, calls = os.replace, []

    def replace(src, dst):
        if Path(dst).name.startswith("data-"):
            calls.append(dst)
            if len(calls) == 7:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst)

    from wdsprep.pack import output

    monkeypatch.setattr(output.os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        pack_data(**pack_args(kd, out))
    monkeypatch.undo()
    assert sorted(p.name for p in out.glob("*/data-*.tar")) == sorted(Path(p).name for p in calls[:6])
    assert not [p for p in out.rglob("*") if p.name.startswith((".w", "..w"))]
    assert_refused(out, tok)
    pack_data(**pack_args(kd, out, resume=True))
    assert_complete(out, utts, tok)


def test_a_pack_that_fails_before_it_publishes_leaves_nothing(kaldi, tmp_path, monkeypatch):
    """Nothing published yet (the first shard's publication fails): the folder is left empty, as before."""
    root, kd, utts, tok = kaldi
    out = tmp_path / "out"
    from wdsprep.pack import output

    real = os.replace

    def replace(src, dst):
        if Path(dst).name.startswith("data-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        pack_data(**pack_args(kd, out))
    assert [p for p in out.rglob("*")] == []
    monkeypatch.undo()
    pack_data(**pack_args(kd, out))
    assert_complete(out, utts, tok)
