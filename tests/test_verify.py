"""verify: a good pack passes; each planted fault is named with its shard and member or key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import kaldiio
import numpy as np
import pytest
from shard_helpers import cat_members, npy, packed, rewrite_tar, tar_members, write_tar

from wdsprep import verify_shards
from wdsprep.format.index import frames_digest, read_index
from wdsprep.format.keys import encode_key
from wdsprep.format.samples import iter_decoded


@pytest.fixture
def pack_dir(tmp_path):
    d, feats, _ = packed(tmp_path)
    return d, feats


def shard(d: Path) -> Path:
    return d / "60_150" / "data-00001.tar"


def problems_for(d: Path, path: Path) -> list:
    """The problems verify names for one shard, less the one every rewrite of a shard also causes
    (it changed since it was indexed: test_a_shard_changed_since_indexing_is_named checks that)."""
    r = verify_shards(f"{d}/*/data-*.tar")
    assert not r.ok
    return [p for p in r.problems if p.shard == str(path) and "changed since it was indexed" not in p.what]


def test_a_shard_changed_since_indexing_is_named(pack_dir):
    d, _ = pack_dir
    path = shard(d)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert verify_shards(f"{d}/*/data-*.tar").ok  # only touched: the same bytes (judged by their SHA-256)
    path.write_bytes(path.read_bytes()[:-512])  # one block short
    r = verify_shards(f"{d}/*/data-*.tar")
    assert [p.shard for p in r.problems] == [str(path)]
    assert "changed since it was indexed" in r.problems[0].what and "--refresh" in r.problems[0].what


def test_good_pack_passes(pack_dir):
    d, feats = pack_dir
    r = verify_shards(f"{d}/*/data-*.tar")
    assert r.ok, r.format()
    assert r.samples == len(feats) and len(r.shards) == 8
    assert "OK" in r.format()


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_cat_tars_without_index_pass(tmp_path, layout):
    feats = {f"u{i}": np.ones((10 + i, 3), np.float32) for i in range(4)}
    write_tar(tmp_path / "a" / "d-0.tar", cat_members(feats, {u: "txt" for u in feats}, layout))
    r = verify_shards(str(tmp_path / "a/d-0.tar"))
    assert r.ok, r.format()
    assert r.samples == 4


@pytest.mark.parametrize("where", ["block boundary", "inside a member"])
def test_truncated_shard_is_named(pack_dir, where):
    d, _ = pack_dir
    path = shard(d)
    with tarfile.open(path) as tf:
        m = list(tf)[3]  # second sample's transcript member
    end = m.offset_data + -(-m.size // 512) * 512
    # At a block boundary tarfile itself sees a clean, shorter tar; inside a member it raises.
    cut = end if where == "block boundary" else m.offset_data + 3
    path.write_bytes(path.read_bytes()[:cut])
    found = problems_for(d, path)
    assert any(p.what.startswith("the tar is damaged:") and "truncated" in p.what for p in found), found
    # The samples lost are named through the index: exactly those the loader does not read.
    with pytest.warns(RuntimeWarning, match="truncated"):
        read = {encode_key(uttid) for uttid, _, _ in iter_decoded(str(path))}
    listed = read_index(path.parent).shard(1).keys
    assert {p.key for p in found if "not in the tar" in p.what} == set(listed) - read
    assert len(read) == 1


def test_corrupt_npy_header_is_named(pack_dir):
    d, _ = pack_dir
    path = shard(d)
    members = tar_members(path)
    name = members[2][0]
    rewrite_tar(path, lambda ms: [(n, b"\x93NUMPY\x01\x00\x10\x00{'descr': <bad>}\n" + data[26:] if n == name else data)
                                  for n, data in ms])
    found = problems_for(d, path)
    assert [p.member for p in found] == [name]
    assert "npy header" in found[0].what
    # ... and that the loader leaves that sample out alone and reads the rest (the tar is whole).
    assert "the loader leaves this sample out (counted as unreadable) and reads on" in found[0].what


def test_pickled_object_array_is_refused_not_loaded(pack_dir, tmp_path):
    d, _ = pack_dir
    path = shard(d)
    marker = tmp_path / "unpickled"

    class Trap:  # unpickling it creates the marker file
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = npy(np.array([Trap()], dtype=object), allow_pickle=True)
    name = tar_members(path)[0][0]
    rewrite_tar(path, lambda ms: [(n, evil if n == name else data) for n, data in ms])
    found = problems_for(d, path)
    assert not marker.exists(), "verify unpickled a shard member"
    assert [p.member for p in found] == [name] and "pickled" in found[0].what


def test_missing_text_member_is_named(pack_dir):
    d, _ = pack_dir
    path = shard(d)
    text_name = tar_members(path)[3][0]
    key = text_name[: -len(".txt")]
    rewrite_tar(path, lambda ms: [m for m in ms if m[0] != text_name])
    found = problems_for(d, path)
    assert [(p.key, f"no {key}.txt" in p.what) for p in found] == [(key, True)]
    assert "the loader leaves this sample out" in found[0].what


def test_index_mismatch_is_named(pack_dir):
    d, _ = pack_dir
    index = read_index(d / "60_150")
    frames = np.array(index.frames)
    row = int(index.starts[1]) + 2  # the third utterance of the second shard
    frames[row] += 7
    np.save(d / "60_150" / "index.frames.npy", frames)
    # The column alone edited: the index disagrees with itself, which the loader refuses too.
    r = verify_shards(f"{d}/*/data-*.tar")
    want = "field 'shards[1].frames_digest' does not match rows 4:8 of index.frames.npy"
    assert [(p.shard, p.what.split(";")[0]) for p in r.problems] == [(str(d / "60_150" / "index.json"), want)]
    # Digest and totals edited too (a coherent index of other shards): verify holds it against the tar.
    doc = json.loads((d / "60_150" / "index.json").read_text())
    doc["shards"][1]["frames_digest"] = frames_digest(frames[4:8])
    doc["shards"][1]["frames"] += 7
    doc["num_frames"] += 7
    (d / "60_150" / "index.json").write_text(json.dumps(doc))
    found = problems_for(d, shard(d))
    assert [p.key for p in found] == [index.keys()[row]]
    assert f"says {frames[row]} frames" in found[0].what


def test_shard_missing_from_disk_is_named(pack_dir):
    d, _ = pack_dir
    shard(d).unlink()
    found = problems_for(d, shard(d))
    assert len(found) == 1 and "missing on disk" in found[0].what


def test_shard_not_in_index_is_named(pack_dir):
    d, _ = pack_dir
    extra = d / "60_150" / "data-00077.tar"
    write_tar(extra, cat_members({"new": np.ones((70, 4), np.float32)}, {"new": "x"}, "cat"))
    found = problems_for(d, extra)
    assert len(found) == 1 and "not listed" in found[0].what


def test_content_faults_without_index(tmp_path):
    """Duplicate ids across shards, NaNs, non-UTF-8 text, 1-D features, stray members; a dotted key is a note."""
    ok = np.ones((5, 3), np.float32)
    write_tar(tmp_path / "a" / "0.tar", [("dup.npy", npy(ok)), ("dup.txt", b"a")])
    write_tar(tmp_path / "a" / "1.tar", [
        ("d%75p.npy", npy(ok)), ("d%75p.txt", b"a"),                 # decodes to "dup" again
        ("sp1.1-u.npy", npy(ok)), ("sp1.1-u.txt", b"a"),             # webdataset would cut at the '.'
        ("nan.npy", npy(np.full((4, 3), np.nan, np.float32))), ("nan.txt", b"a"),
        ("latin.npy", npy(ok)), ("latin.txt", "é".encode("latin-1")),
        ("flat.npy", npy(np.ones(5, np.float32))), ("flat.txt", b"a"),
        ("x.json", b"{}"),
    ])
    r = verify_shards(str(tmp_path / "a/*.tar"))
    msgs = {(p.member or p.key): p.what for p in r.problems}
    assert "also in" in msgs["d%75p"] and str(tmp_path / "a" / "0.tar") in msgs["d%75p"]
    assert "NaN" in msgs["nan.npy"]
    assert "UTF-8" in msgs["latin.txt"]
    assert "2-D" in msgs["flat.npy"]
    assert "known layout" in msgs["x.json"]
    # The loader leaves out the samples it refuses (the non-UTF-8 transcript, the 1-D features), alone.
    assert all("leaves this sample out" in msgs[m] for m in ("latin.txt", "flat.npy"))
    assert len(r.problems) == 5, r.format()
    # wdsprep reads a dotted key whole (by its layout suffix); other readers would cut it.
    assert [n.key for n in r.notes] == ["sp1.1-u"] and "'.'" in r.notes[0].what


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True)


def test_cli_exit_codes(pack_dir):
    d, _ = pack_dir
    good = run_cli("verify", f"{d}/*/data-*.tar")
    assert good.returncode == 0 and "OK" in good.stdout
    path = shard(d)
    path.write_bytes(path.read_bytes()[:3000])
    bad = run_cli("verify", f"{d}/*/data-*.tar")
    assert bad.returncode == 1
    assert f"{path}: the tar is damaged" in bad.stdout  # cut inside a header: tarfile alone misses it
    assert run_cli("verify", f"{d}/nope/*.tar").returncode == 2


def test_shards_of_different_feature_dims_are_named(tmp_path):
    """Two packs of different dims given to one loader: it fails on the first mixed batch, so verify says so."""
    from wdsprep import pack_data

    rng = np.random.default_rng(5)
    for dims, n in ((40, 3), (80, 5)):
        feats = {f"d{dims}-u{i}": rng.standard_normal((20 + i, dims)).astype(np.float32) for i in range(n)}
        k = tmp_path / f"k{dims}"
        k.mkdir()
        kaldiio.save_ark(str(k / "feats.ark"), feats, scp=str(k / "feats.scp"))
        (k / "text").write_text("".join(f"{u} x\n" for u in feats))
        pack_data(k / "feats.scp", k / "text", tmp_path / "shards" / str(dims), progress=False)
    r = verify_shards(f"{tmp_path}/shards/{{40,80}}/data-*.tar")
    assert len(r.problems) == 1, r.format()
    p = r.problems[0]
    assert p.shard == str(tmp_path / "shards" / "40" / "data-00000.tar")
    assert "80 dims in 5 sample(s)" in p.what and "40 dims in 3 sample(s)" in p.what
    assert verify_shards(f"{tmp_path}/shards/80/data-*.tar").ok
