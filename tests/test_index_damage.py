"""A damaged or tampered index: the loader, ``verify``, ``inspect`` and ``index`` each give one clean
error naming the file and field (never a crash or a hang), all give the same verdict, and
``wdsprep index --force`` rebuilds it from the shards whatever state it is in (issue 30, items 9,
12 and 14)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from shardsets import build, train_char_tokenizer

from wdsprep import cli, make_loader, verify_shards
from wdsprep.errors import DataError
from wdsprep.format.index import (
    FRAMES_FILE,
    INDEX_NAME,
    KEYS_FILE,
    SPEAKER_NAMES_FILE,
    SPEAKERS_FILE,
    TEXT_LENS_FILE,
    read_index,
)

N, PER_SHARD = 300, 60  # 5 shards in one folder
MAX_FRAMES = 3000


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("damage")
    out, _ = build(root, n=N, utts_per_shard=PER_SHARD)
    return out, train_char_tokenizer(root, root / "kaldi-cat-0" / "text")


@pytest.fixture
def folder(pristine, tmp_path) -> tuple[Path, Path]:
    """A fresh copy of the packed folder (copy2 keeps the mtimes, so the index still fits the shards)."""
    out, tok = pristine
    d = tmp_path / "shards"
    shutil.copytree(out, d)
    return d, tok


# --- ways to damage an index: each a function of the folder -------------------------------------

def edit_json(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        doc = json.loads((d / INDEX_NAME).read_text())
        edit(doc)
        (d / INDEX_NAME).write_text(json.dumps(doc))  # NaN and 10**30 are written as they are
    return damage


def edit_shard(i: int, **fields: object) -> Callable[[Path], None]:
    return edit_json(lambda doc: doc["shards"][i].update(fields))


def edit_column(name: str, edit: Callable[[np.ndarray], np.ndarray], allow_pickle: bool = False) -> Callable:
    def damage(d: Path) -> None:
        column = np.load(d / name).copy()
        np.save(d / name, edit(column), allow_pickle=allow_pickle)
    return damage


def set_row(row: int, value: int) -> Callable[[np.ndarray], np.ndarray]:
    def edit(column: np.ndarray) -> np.ndarray:
        column[row] = value
        return column
    return edit


def write(name: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (d / name).write_bytes(data((d / name).read_bytes()) if callable(data) else data)
    return damage


def unlink(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def folder_instead(name: str) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        (d / name).unlink()
        (d / name).mkdir()
    return damage


def move_utts(doc: dict) -> None:
    doc["shards"][0]["utts"] -= 5
    doc["shards"][1]["utts"] += 5


def inflate_utts(doc: dict) -> None:
    doc["shards"][0]["utts"] += 40  # 340 utterances for 300, the totals made to agree
    doc["num_utts"] += 40


def rename_as_first(doc: dict) -> None:
    doc["shards"][1]["name"] = doc["shards"][0]["name"]


NESTED = ('{"version": 2, "layout": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()

# (id, damage, the file the error must name, what the error must say)
DAMAGE = [
    ("json-truncated", write(INDEX_NAME, lambda b: b[:len(b) // 2]), INDEX_NAME, "not valid JSON"),
    ("json-empty", write(INDEX_NAME, b""), INDEX_NAME, "not valid JSON"),
    ("json-not-utf8", write(INDEX_NAME, b'{"version": 2, "layout": "\xff"}'), INDEX_NAME, "not valid JSON"),
    ("json-nested-100k-deep", write(INDEX_NAME, NESTED), INDEX_NAME, "RecursionError"),
    ("json-a-list", write(INDEX_NAME, b"[]"), INDEX_NAME, "not a JSON object"),
    ("version-missing", edit_json(lambda doc: doc.pop("version")), INDEX_NAME, "'version' is missing"),
    ("version-99", edit_json(lambda doc: doc.update(version=99)), INDEX_NAME, "'version' is 99"),
    ("version-true", edit_json(lambda doc: doc.update(version=True)), INDEX_NAME, "'version' is true"),
    ("layout-unknown", edit_json(lambda doc: doc.update(layout="kaldi")), INDEX_NAME, "'layout'"),
    ("dims-negative", edit_json(lambda doc: doc.update(dims=-3)), INDEX_NAME, "'dims' is -3"),
    ("dtype-object", edit_json(lambda doc: doc.update(dtype="object")), INDEX_NAME, "'dtype'"),
    ("shards-missing", edit_json(lambda doc: doc.pop("shards")), INDEX_NAME, "'shards' is missing"),
    ("shards-an-object", edit_json(lambda doc: doc.update(shards={})), INDEX_NAME, "'shards' is a JSON object"),
    ("shard-a-string", edit_json(lambda doc: doc["shards"].__setitem__(2, "x")), INDEX_NAME, "'shards[2]'"),
    ("utts-nan", edit_shard(0, utts=float("nan")), INDEX_NAME, "'shards[0].utts' is nan"),
    ("utts-string", edit_shard(0, utts="60"), INDEX_NAME, "'shards[0].utts' is '60'"),
    ("utts-negative", edit_shard(0, utts=-5), INDEX_NAME, "'shards[0].utts' is -5"),
    ("utts-moved", edit_json(move_utts), INDEX_NAME, "'shards[0].frames_digest'"),
    ("utts-inflated-340-for-300", edit_json(inflate_utts), FRAMES_FILE, "340 utterances"),
    ("num-utts", edit_json(lambda doc: doc.update(num_utts=1)), INDEX_NAME, "'num_utts'"),
    ("size-10e30", edit_shard(0, size=10**30), INDEX_NAME, "'shards[0].size' is a 31-digit number"),
    ("size-too-small", edit_shard(0, size=4096), INDEX_NAME, "4,096 bytes can hold"),
    ("mtime-float", edit_shard(0, mtime_ns=1.5), INDEX_NAME, "'shards[0].mtime_ns' is 1.5"),
    ("lost-a-million", edit_shard(0, lost=10**6), INDEX_NAME, "'lost' (1,000,000)"),
    ("lost-negative", edit_shard(0, lost=-1), INDEX_NAME, "'shards[0].lost' is -1"),
    ("lost-int64-max", edit_shard(0, lost=2**63 - 1), INDEX_NAME, "'lost' (9,223,372,036,854,775,807)"),
    ("frames-total", edit_json(lambda doc: doc["shards"][3].update(frames=doc["shards"][3]["frames"] + 1)),
     INDEX_NAME, "'shards[3].frames'"),
    ("num-frames", edit_json(lambda doc: doc.update(num_frames=doc["num_frames"] - 1)), INDEX_NAME, "'num_frames'"),
    ("digest-missing", edit_json(lambda doc: doc["shards"][1].pop("frames_digest")), INDEX_NAME,
     "'shards[1].frames_digest' is missing"),
    ("digest-other", edit_shard(1, frames_digest="0" * 16), INDEX_NAME, "'shards[1].frames_digest' does not match"),
    ("name-leaves-the-folder", edit_shard(0, name="../data-00000.tar"), INDEX_NAME, "'shards[0].name'"),
    ("name-twice", edit_json(rename_as_first), INDEX_NAME, "'shards[1].name'"),
    ("speakers-a-string", edit_json(lambda doc: doc.update(speakers="x")), INDEX_NAME, "'speakers'"),
    ("speakers-count", edit_json(lambda doc: doc["speakers"].update(count=doc["speakers"]["count"] + 1)),
     SPEAKER_NAMES_FILE, "'speakers.count'"),
    ("frames-deleted", unlink(FRAMES_FILE), FRAMES_FILE, "is missing"),
    ("text-lens-deleted", unlink(TEXT_LENS_FILE), TEXT_LENS_FILE, "is missing"),
    ("speakers-deleted", unlink(SPEAKERS_FILE), SPEAKERS_FILE, "is missing"),
    ("speaker-names-deleted", unlink(SPEAKER_NAMES_FILE), SPEAKER_NAMES_FILE, "is missing"),
    ("frames-a-folder", folder_instead(FRAMES_FILE), FRAMES_FILE, "is a directory"),
    ("frames-int64", edit_column(FRAMES_FILE, lambda c: c.astype(np.int64)), FRAMES_FILE, "'<i8'"),
    ("frames-float", edit_column(FRAMES_FILE, lambda c: c.astype(np.float32)), FRAMES_FILE, "'<f4'"),
    ("frames-pickled", edit_column(FRAMES_FILE, lambda c: c.astype(object), allow_pickle=True), FRAMES_FILE, "'|O'"),
    ("frames-short", edit_column(FRAMES_FILE, lambda c: c[:-1]), FRAMES_FILE, "has shape (299,)"),
    ("frames-2d", edit_column(FRAMES_FILE, lambda c: c.reshape(-1, 2)), FRAMES_FILE, "has shape (150, 2)"),
    ("frames-cut", write(FRAMES_FILE, lambda b: b[:-10]), FRAMES_FILE, "bytes"),
    ("frames-not-npy", write(FRAMES_FILE, b"hello"), FRAMES_FILE, "not an .npy column"),
    ("frames-huge-header", write(FRAMES_FILE, b"\x93NUMPY\x02\x00\xff\xff\xff\x7f" + b" " * 100), FRAMES_FILE,
     "not an .npy column"),
    ("frames-huge-shape", write(FRAMES_FILE, lambda b: b.replace(b"(300,)", b"(9999999999999,)")), FRAMES_FILE,
     "has shape (9999999999999,)"),
    ("frames-zero", edit_column(FRAMES_FILE, set_row(5, 0)), FRAMES_FILE, "frame count 0 at row 5"),
    ("frames-negative", edit_column(FRAMES_FILE, set_row(7, -70)), FRAMES_FILE, "frame count -70 at row 7"),
    ("frames-value", edit_column(FRAMES_FILE, set_row(7, 12345)), INDEX_NAME, "'shards[0].frames_digest'"),
    ("text-lens-negative", edit_column(TEXT_LENS_FILE, set_row(8, -1)), TEXT_LENS_FILE, "transcript length -1"),
    ("speaker-id-out-of-range", edit_column(SPEAKERS_FILE, set_row(3, 10_000)), SPEAKERS_FILE,
     "speaker id 10000 at row 3"),
    ("speaker-id-negative", edit_column(SPEAKERS_FILE, set_row(3, -1)), SPEAKERS_FILE, "speaker id -1 at row 3"),
    ("speaker-names-not-utf8", write(SPEAKER_NAMES_FILE, lambda b: b"\xff" + b), SPEAKER_NAMES_FILE, "not UTF-8"),
    ("speaker-names-cut", write(SPEAKER_NAMES_FILE, lambda b: b[:-1]), SPEAKER_NAMES_FILE, "newline"),
]
# Edits an index may take without being wrong: loader and verify both accept them.
HARMLESS = [
    ("json-reformatted", lambda d: (d / INDEX_NAME).write_text(
        json.dumps(json.loads((d / INDEX_NAME).read_text()), indent=2, sort_keys=True))),
    ("unknown-fields", edit_json(lambda doc: (doc.update(comment="made by hand"), doc["shards"][0].update(x=[1])))),
    ("lost-zero-spelled-out", edit_shard(2, lost=0)),
]


def loader_epoch(pattern: str, tok: Path) -> int:
    loader = make_loader(pattern, tok, max_frames=MAX_FRAMES)
    loader.set_epoch(0)
    return sum(len(b.keys) for b in loader)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``wdsprep ARGV`` in this process: exit status, stdout, stderr."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage,file,says", [pytest.param(*c[1:], id=c[0]) for c in DAMAGE])
def test_a_damaged_index_is_one_named_refusal_everywhere_and_force_rebuilds_it(folder, capsys, damage, file, says):
    d, tok = folder
    pattern = f"{d}/data-*.tar"
    damage(d)
    path = str(d / file)

    with pytest.raises(DataError) as refused:  # the loader
        make_loader(pattern, tok, max_frames=MAX_FRAMES)
    line = str(refused.value)
    assert line.startswith(f"{path}: ") and says in line and "wdsprep index --force" in line and "\n" not in line

    r = verify_shards(pattern)  # verify: that refusal, and nothing else (the shards are fine)
    assert [(p.shard, f"{p.shard}: {p.what}") for p in r.problems] == [(path, line)]

    code, out, err = run(capsys, "inspect", pattern, "--max-frames")  # inspect: read the tars instead, exit 1
    assert code == 1 and f"  {line}; its shards were read instead" in out and not err
    assert f"{'total':<28} {N:>9,}" in out

    code, out, err = run(capsys, "index", pattern)  # index: the same line, exit 1
    assert (code, out, err) == (1, "", f"wdsprep index: error: {line}\n")

    code, out, err = run(capsys, "index", "--force", "--no-progress", pattern)  # the recovery the errors name
    assert code == 0 and f"re-indexed: 5 shards, 5 read; the old index was damaged ({path}: " in out, out + err
    assert verify_shards(pattern).ok
    assert loader_epoch(pattern, tok) == N
    assert read_index(d).num_utts == N


@pytest.mark.parametrize("edit", [pytest.param(e, id=i) for i, e in HARMLESS])
def test_an_index_edited_harmlessly_is_accepted_by_loader_and_verify_alike(folder, edit):
    d, tok = folder
    edit(d)
    assert verify_shards(f"{d}/data-*.tar").ok
    assert loader_epoch(f"{d}/data-*.tar", tok) == N


LOADER = """
import sys, wdsprep
try:
    loader = wdsprep.make_loader(sys.argv[1], sys.argv[2], max_frames=int(sys.argv[3]))
    loader.set_epoch(0)
    print(sum(len(b.keys) for b in loader))
except Exception as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(3)
"""


def subprocess_run(*args: str) -> subprocess.CompletedProcess:
    """A process of its own, so a hang is a timeout failure here, not a stuck test run."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=90)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", [INDEX_NAME, FRAMES_FILE, SPEAKER_NAMES_FILE, KEYS_FILE])  # json, column, text
def test_a_fifo_in_place_of_an_index_file_blocks_nothing(folder, name):
    d, tok = folder
    pattern = f"{d}/data-*.tar"
    (d / name).unlink()
    os.mkfifo(d / name)  # opening it for reading would block until a writer came
    named = f"{d / name}: is a FIFO, not a regular file"

    loader = subprocess_run("-c", LOADER, pattern, str(tok), str(MAX_FRAMES))
    if name == KEYS_FILE:  # the loader never reads the keys; what reads them names the FIFO
        assert (loader.returncode, loader.stdout) == (0, f"{N}\n"), loader.stderr[-2000:]
    else:
        assert loader.returncode == 3 and loader.stdout.startswith(f"DamagedIndexError: {named}"), loader.stdout
    verify = subprocess_run("-m", "wdsprep", "verify", pattern)
    assert verify.returncode == 1 and f"{named}; the index is damaged" in verify.stdout, verify.stdout + verify.stderr
    if name != KEYS_FILE:
        inspect = subprocess_run("-m", "wdsprep", "inspect", pattern, "--max-frames")
        assert inspect.returncode == 1 and named in inspect.stdout and f"{N:>9,}" in inspect.stdout, inspect.stdout
    index = subprocess_run("-m", "wdsprep", "index", pattern)
    assert index.returncode == 1 and index.stderr.startswith(f"wdsprep index: error: {named}"), index.stderr
    force = subprocess_run("-m", "wdsprep", "index", "--force", "--no-progress", pattern)
    assert force.returncode == 0 and "re-indexed: 5 shards, 5 read" in force.stdout, force.stdout + force.stderr
    assert (d / name).is_file() and verify_shards(pattern).ok
    assert loader_epoch(pattern, tok) == N


@pytest.mark.parametrize("damage", [
    pytest.param(unlink(KEYS_FILE), id="deleted"),
    pytest.param(write(KEYS_FILE, lambda b: b[:b.index(b"\n") + 1] + b[b.index(b"\n", 100) + 1:]), id="lines-cut"),
    pytest.param(write(KEYS_FILE, lambda b: b"\n" + b[b.index(b"\n") + 1:]), id="empty-key"),
])
def test_damaged_keys_are_named_by_verify_and_index_and_force_rebuilds_them(folder, capsys, damage):
    """The keys are read by what needs them (verify, index), not by the loader, which plans without them."""
    d, tok = folder
    pattern = f"{d}/data-*.tar"
    damage(d)
    assert loader_epoch(pattern, tok) == N
    r = verify_shards(pattern)
    assert [p.shard for p in r.problems] == [str(d / KEYS_FILE)] and "wdsprep index --force" in r.problems[0].what
    code, _, err = run(capsys, "index", pattern)
    assert code == 1 and err.startswith(f"wdsprep index: error: {d / KEYS_FILE}: ")
    code, out, _ = run(capsys, "index", "--force", "--no-progress", pattern)
    assert code == 0 and "re-indexed: 5 shards, 5 read" in out
    assert verify_shards(pattern).ok


def test_a_deleted_shard_leaves_the_index_and_index_says_so(folder, capsys):
    d, tok = folder
    pattern = f"{d}/data-*.tar"
    (d / "data-00002.tar").unlink()
    code, out, _ = run(capsys, "index", "--no-progress", pattern)
    assert code == 0 and "re-indexed: 4 shards, 0 read; dropped 1 shard(s) no longer on disk (data-00002.tar)" in out
    assert "data-00002.tar" not in read_index(d).names and read_index(d).num_utts == N - PER_SHARD
    assert verify_shards(pattern).ok
    assert loader_epoch(pattern, tok) == N - PER_SHARD
    code, out, _ = run(capsys, "index", "--no-progress", pattern)
    assert code == 0 and "up to date" in out


def test_a_lost_count_the_tar_does_not_bear_out_is_named_by_verify(folder):
    """A plausible ``lost`` (within what the shard can hold) passes the index's own checks; the
    loader would report those drops, and verify, which reads the tar, names the difference."""
    d, _ = folder
    edit_shard(1, lost=3)(d)
    r = verify_shards(f"{d}/data-*.tar")
    assert [(p.shard, p.what.split(";")[0]) for p in r.problems] == [
        (str(d / "data-00001.tar"), f"{INDEX_NAME} of {d} says 3 samples of this shard are lost, the tar has 0")]
