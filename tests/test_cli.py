"""Every command fails with one line naming the file and what to do: status 2 for a command line
that cannot be run as written, 1 for bad data or a failed read or write; ``--debug`` for the traceback.

Each case is a real bad input on disk; the commands run through ``wdsprep.cli.main`` in this process
(what ``python -m wdsprep`` calls), and a few through a real subprocess.
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shard_helpers import fill, kaldi_data, packed, small_fs

from wdsprep.cli import main
from wdsprep.errors import DataError
from wdsprep.format.shardfile import ShardError
from wdsprep.pack import sink
from wdsprep.prep.kaldi import KaldiDataError
from wdsprep.tokenizer import TokenizerFileError

AUDIO = Path(__file__).parent / "data" / "audio"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A good Kaldi dir, a good pack, a tokenizer, a file and a folder in the wrong places, bad files."""
    root = tmp_path_factory.mktemp("cli")
    scp, text, _, _ = kaldi_data(root / "kaldi")
    shards, _, _ = packed(root / "good")
    (root / "afile").write_text("a file, not a folder\n")
    (root / "adir").mkdir()
    (root / "wav.scp").write_text(f"a {AUDIO / 'en_16k.wav'}\n")
    (root / "bad_text").write_bytes(b"u1 fine\nu2 \xff\xfe not utf-8\n")
    (root / "bad_scp").write_text(f"u1 {root / 'kaldi' / 'feats.ark'}:8 extra\n")
    (root / "ghost_scp").write_text(f"u1 {root / 'no.ark'}:8\n")
    (root / "segments").write_text("s1 a zero 1.0\n")
    (root / "not_json").write_text("u1 hello\n")
    (root / "hyper.json").write_text("{\"train\": ")
    main(["tokenizer", "train", "--kind", "char", "--text", str(text), "--out", str(root / "char.json")])
    return root, scp, text, shards


def cases(root: Path, scp: Path, text: Path, shards: Path) -> list[tuple[list[str], int, list[str]]]:
    """(argv, exit status, words the one line must hold)."""
    r, tok = str(root), str(root / "char.json")
    pack = ["pack", "--scp", str(scp), "--text", str(text)]
    trset = f"{shards}/*/data-*.tar"
    return [
        # usage: paths on the command line missing, of the wrong kind or in the way; option values
        (pack + ["--out", f"{r}/afile/sub"], 2, [f"{r}/afile is a file, not a folder", "pick another path"]),
        (pack + ["--out", f"{r}/afile"], 2, [f"{r}/afile exists and is not a directory"]),
        (pack + ["--out", str(shards)], 2, ["not empty", "--overwrite"]),
        (["pack", "--scp", f"{r}/adir", "--text", str(text), "--out", f"{r}/o"], 2, [f"{r}/adir: Is a directory"]),
        (["pack", "--scp", f"{r}/nope.scp", "--text", str(text), "--out", f"{r}/o"], 2,
         [f"{r}/nope.scp: no such file"]),
        (pack + ["--out", f"{r}/o", "--filter-group", "10-20"], 2, ["length group '10-20'", "LO:HI"]),
        (pack + ["--out", f"{r}/o", "--dims", "0"], 2, ["dims must be a positive number"]),
        (["pack-audio", "--wav-scp", f"{r}/adir", "--text", str(text), "--out", f"{r}/o"], 2, ["adir: Is a directory"]),
        (["pack-audio", "--wav-scp", f"{r}/wav.scp", "--text", str(text), "--out", f"{r}/afile/x"], 2,
         [f"{r}/afile is a file"]),
        (["fbank", "--wav-scp", f"{r}/wav.scp", "--out-dir", f"{r}/afile/x"], 2, [f"{r}/afile is a file"]),
        (["fbank", "--wav-scp", f"{r}/wav.scp", "--out-dir", f"{r}/o", "--segments", f"{r}/nope"], 2,
         ["nope: no such file"]),
        (["tokenizer", "train", "--kind", "char", "--text", str(text), "--out", f"{r}/afile/t.json"], 2,
         [f"{r}/afile is a file, not a folder"]),
        (["tokenizer", "train", "--kind", "char", "--text", f"{r}/adir", "--out", f"{r}/t.json"], 2,
         ["adir: Is a directory"]),
        (["tokenizer", "encode", "--tokenizer", f"{r}/nope.json", "x"], 2, ["nope.json: no such tokenizer file"]),
        (["inspect", f"{r}/nope/*.tar"], 2, ["matches no file"]),
        (["inspect", trset, "--json", f"{r}/afile/x.json"], 2, [f"{r}/afile/x.json: Not a directory"]),
        (["inspect", trset, "--plot", f"{r}/adir"], 2, [f"{r}/adir: Is a directory"]),
        (["verify", f"{r}/adir"], 2, ["adir: a folder with no shards in it", "give the folder a pack wrote"]),
        (["dry-run", "--trset", trset, "--tokenizer", tok, "--max-frames", "0"], 2,
         ["max_frames must be a positive int"]),
        (["dry-run", "--trset", trset, "--tokenizer", tok, "--max-cost", "5"], 2, ["needs both cost", "and max_cost"]),
        (["dry-run", "--trset", trset, "--tokenizer", tok, "--cost", f"{r}/nope.json", "--max-cost", "5"], 2,
         ["nope.json: no such cost model file"]),
        (["dry-run", "--trset", trset, "--tokenizer", tok], 2, ["batches need a bound: max_frames"]),
        (["dry-run", "--trset", trset, "--tokenizer", tok, "--max-frames", "900", "--stats-json", f"{r}/afile/s"], 2,
         [f"{r}/afile/s: Not a directory"]),
        # data: what is inside the files is wrong
        (["pack", "--scp", str(scp), "--text", f"{r}/bad_text", "--out", f"{r}/o"], 1, [f"{r}/bad_text:2: not UTF-8"]),
        (["pack", "--scp", f"{r}/bad_scp", "--text", str(text), "--out", f"{r}/o"], 1, [f"{r}/bad_scp:1: expected"]),
        (["pack", "--scp", f"{r}/ghost_scp", "--text", str(text), "--out", f"{r}/o"], 1, [f"{r}/ghost_scp:1: ark",
                                                                                        "does not exist"]),
        (["pack-audio", "--wav-scp", f"{r}/wav.scp", "--segments", f"{r}/segments", "--text", str(text),
          "--out", f"{r}/o"], 1, [f"{r}/segments:1: start and end must be seconds"]),
        (["tokenizer", "encode", "--tokenizer", f"{r}/not_json", "x"], 1,
         ["not_json: neither a wdsprep tokenizer file"]),
        (["dry-run", "--trset", trset, "--tokenizer", f"{r}/not_json", "--max-frames", "900"], 1,
         ["neither a wdsprep tokenizer file"]),
    ]


def test_every_failure_is_one_line_with_the_right_status(world, capsys):
    root, scp, text, shards = world
    for argv, status, words in cases(root, scp, text, shards):
        got = main(argv)
        err = capsys.readouterr().err
        assert got == status and err.count("\n") == 1 and err.startswith(f"wdsprep {argv[0]}"), (argv, got, err)
        for w in words:
            assert w in err, (argv, err)
        assert not (root / "o").exists() or not any((root / "o").iterdir()), (argv, "left output behind")


def test_debug_shows_the_traceback(world):
    root, scp, text, _ = world
    argv = ["pack", "--scp", str(scp), "--text", str(text), "--out", f"{root}/afile/sub"]
    plain = subprocess.run([sys.executable, "-m", "wdsprep", *argv], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    debug = subprocess.run([sys.executable, "-m", "wdsprep", "--debug", *argv], capture_output=True, text=True,
                           timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "NotADirectoryError" in debug.stderr


def test_an_unexpected_error_is_one_line_that_points_at_debug(world, capsys, monkeypatch):
    root, _, _, shards = world

    def broken(*args, **kwargs):
        raise KeyError("something we did not think of")

    monkeypatch.setattr("wdsprep.check.verify.verify_shards", broken)
    assert main(["verify", f"{shards}/*/data-*.tar"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KeyError" in err and "wdsprep --debug verify" in err


@pytest.mark.parametrize("error", [ShardError, TokenizerFileError, KaldiDataError])
def test_every_bad_data_error_is_a_data_error_the_cli_exits_1_on(world, capsys, monkeypatch, error):
    """One class for bad data: the readers' own errors are DataErrors (and ValueErrors, as callers
    catch), so the CLI says "error:" and exits 1 for each, not 2 (usage) or "unexpected"."""
    root, _, _, shards = world
    assert issubclass(error, DataError) and issubclass(error, ValueError)

    def damaged(*args, **kwargs):
        raise error(f"{shards}/x/data-00000.tar: damaged")

    monkeypatch.setattr("wdsprep.check.verify.verify_shards", damaged)
    assert main(["verify", f"{shards}/*/data-*.tar"]) == 1
    assert capsys.readouterr().err == f"wdsprep verify: error: {shards}/x/data-00000.tar: damaged\n"


@pytest.mark.parametrize("nj", [1, 2])
def test_disk_full_while_packing_names_the_shard_and_keeps_what_was_published(tmp_path, nj):
    """A real full file system: the shards do not fit a 256 KiB tmpfs.  One line names the shard
    that did not fit and says to resume; the shards published before it stay, nothing partial does."""
    from wdsprep.format.index import read_index

    scp, text, _, _ = kaldi_data(tmp_path / "kaldi", n=60)
    with small_fs(tmp_path / "fs", "256k") as fs:
        out = fs / "out"
        r = subprocess.run([sys.executable, "-m", "wdsprep", "pack", "--scp", str(scp), "--text", str(text),
                            "--out", str(out), "--nj", str(nj), "--utts-per-shard", "10"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        # the file that did not fit: a shard, or a published shard's index entry
        full = rf"error: {out}/\S*(\.tar\.tmp|\.npy|\.txt|\.json): No space left on device"
        assert re.search(full, r.stderr), r.stderr
        assert "free space" in r.stderr
        assert not [p for p in out.rglob("*") if p.name.startswith((".w", "..w")) or p.name.endswith(".tmp")]
        index = read_index(out) if out.exists() else None
        assert sorted(p.name for p in out.glob("data-*.tar")) == (index.names if index is not None else [])
        if index is not None and index.names:  # kept, and the line says how to finish
            assert f"{len(index.names)} of 6 shards published" in r.stderr and "--resume" in r.stderr
        else:
            assert not out.exists() or [p for p in out.rglob("*")] == []


def test_disk_full_while_writing_the_report_names_it(tmp_path, capsys):
    scp, text, _, _ = kaldi_data(tmp_path / "kaldi", n=10)
    with small_fs(tmp_path / "fs", "1m") as fs:
        out = fs / "out"
        real = sink.Report.write

        def fill_then_write(self, path):
            fill(fs)
            return real(self, path)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sink.Report, "write", fill_then_write)
            assert main(["pack", "--scp", str(scp), "--text", str(text), "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"wdsprep pack: error: {out}/pack_report.json: No space left on device"), err
        assert err.count("\n") == 1 and "--resume" in err
        (fs / "filler").unlink()
        assert main(["pack", "--scp", str(scp), "--text", str(text), "--out", str(out), "--resume"]) == 0
        assert (out / "pack_report.json").is_file() and not (out / "PACK_INCOMPLETE").exists()


def test_disk_full_writing_a_shard_names_it_without_a_tmpfs(tmp_path, capsys, monkeypatch):
    """The same naming where no tmpfs can be mounted: the writer's write() fails as a full disk's does."""
    scp, text, _, _ = kaldi_data(tmp_path / "kaldi", n=10)
    real = sink.ShardWriter.write
    calls = []

    def write(self, *args):
        calls.append(1)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")  # what write(2) gives: no file name
        return real(self, *args)

    monkeypatch.setattr(sink.ShardWriter, "write", write)
    out = tmp_path / "out"
    assert main(["pack", "--scp", str(scp), "--text", str(text), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == f"wdsprep pack: error: {out}/..w000-00000.tar.tmp: No space left on device; the file system is " \
                  f"full: free space or write elsewhere, then run the command again\n"
    assert list(out.rglob("*")) == []


def test_disk_full_in_fbank_names_the_ark(tmp_path):
    scp = tmp_path / "wav.scp"
    scp.write_text("".join(f"u{i} {AUDIO / 'en_16k.wav'}\n" for i in range(8)))
    with small_fs(tmp_path / "fs", "128k") as fs:
        r = subprocess.run([sys.executable, "-m", "wdsprep", "fbank", "--wav-scp", str(scp), "--out-dir", str(fs / "f"),
                            "--backend", "kaldi-native-fbank"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"{fs / 'f'}/.feats.1.ark.tmp: No space left on device" in r.stderr
        assert not list((fs / "f").glob("*"))


def test_pack_report_and_summary_name_unreadable_arks(world, tmp_path):
    root, scp, text, _ = world
    lines = scp.read_text().splitlines()
    first_ark = lines[0].split()[1].rsplit(":", 1)[0]
    cut = tmp_path / "cut.ark"
    data = Path(first_ark).read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    cut_scp = tmp_path / "cut.scp"
    cut_scp.write_text("".join(f"{u} {cut}:{v.rsplit(':', 1)[1]}\n" for u, v in (x.split() for x in lines)))
    out = tmp_path / "out"
    assert main(["pack", "--scp", str(cut_scp), "--text", str(text), "--out", str(out), "--strict"]) == 1
    report = json.loads((out / "pack_report.json").read_text())
    whys = [x["why"] for x in report["not_written"]["bad_features"]]
    assert whys and all(w.startswith(f"{cut}: ") and "byte" in w and "truncated" in w for w in whys)
    assert np.isclose(len(whys) / len(lines), 0.5, atol=0.15)


def test_output_piped_into_head_is_not_an_error(tmp_path):
    """``wdsprep verify ... | head``: the reader goes away early; that is no error to report."""
    scp, text, _, _ = kaldi_data(tmp_path / "kaldi", n=300)
    for d in ("a", "b"):  # the same ids twice: a problem line per utterance, more than a pipe holds
        main(["pack", "--scp", str(scp), "--text", str(text), "--out", str(tmp_path / d)])
    r = subprocess.run(f"{sys.executable} -m wdsprep verify '{tmp_path}/{{a,b}}/data-*.tar' | head -1",
                       shell=True, capture_output=True, text=True, timeout=120)
    assert r.stdout.count("\n") == 1 and "also in" in r.stdout
    assert r.stderr == "", r.stderr


@pytest.mark.parametrize("command,module,function", [("verify", "wdsprep.check.verify", "open_members"),
                                                     ("inspect", "wdsprep.check.inspect", "scan_shard")])
def test_a_read_error_names_the_shard(tmp_path, capsys, monkeypatch, command, module, function):
    """An I/O error of the disk (EIO, simulated: read(2) names no file) says which shard it hit."""
    from wdsprep.format.index import INDEX_NAME

    shards, _, _ = packed(tmp_path)
    for index in shards.rglob(INDEX_NAME):  # so inspect reads the tars
        index.unlink()

    def eio(path, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(f"{module}.{function}", eio)
    assert main([command, f"{shards}/*/data-*.tar"]) == 1
    err = capsys.readouterr().err
    first = sorted(shards.glob("*/data-*.tar"))[0]
    assert err.startswith(f"wdsprep {command}: error: {first}: Input/output error; the disk"), err
