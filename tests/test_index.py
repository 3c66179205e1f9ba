"""``wdsprep index``: the index of shards packed elsewhere, from headers only; kept current with --refresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from shard_helpers import cat_members, npy, write_tar
from shardsets import build

from wdsprep import index_shards, make_loader, train_tokenizer, verify_shards
from wdsprep.format.index import FRAMES_FILE, INDEX_NAME, KEYS_FILE, read_index


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wdsprep", *args], capture_output=True, text=True, timeout=120)


def cat_shards(tmp_path, layout: str):
    """Shards as CAT writes them: webdataset-style tars, keys unencoded (speed-perturbed ids keep their dots)."""
    rng = np.random.default_rng(0)
    feats, texts = {}, {}
    for i in range(60):
        uttid = f"sp0.9-spk{i % 4}-utt{i:03d}" if i % 3 == 0 else f"spk{i % 4}-utt{i:03d}"
        feats[uttid] = rng.standard_normal((int(rng.integers(20, 300)), 5)).astype(np.float32)
        texts[uttid] = "ni hao " * int(rng.integers(1, 4))
    ids = sorted(feats)
    d = tmp_path / "cat"
    for k in range(4):
        chunk = ids[k * 15:(k + 1) * 15]
        members = [(name.replace("%2E", "."), data) for name, data in
                   cat_members({u: feats[u] for u in chunk}, {u: texts[u] for u in chunk}, layout)]
        write_tar(d / f"data-{k:05d}.tar", members)
    (tmp_path / "text").write_text("".join(f"{u} {t}\n" for u, t in texts.items()))
    tok = tmp_path / "char.json"
    train_tokenizer("char", [tmp_path / "text"], tok)
    return d, feats, tok


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_cat_written_shards_indexed_plan_without_reading_them(tmp_path, layout):
    d, feats, tok = cat_shards(tmp_path, layout)
    with pytest.warns(UserWarning, match="no index entry"):
        scanned = make_loader(f"{d}/data-*.tar", tok, max_frames=2000)
    r = run_cli("index", f"{d}/data-*.tar")
    assert r.returncode == 0, r.stderr
    assert "indexed: 4 shards, 4 read" in r.stdout and "60 utterances" in r.stdout
    index = read_index(d)
    assert index.layout == layout and index.dims == 5 and (d / FRAMES_FILE).is_file()
    assert sorted(index.keys()) == sorted(feats)  # dotted ids read whole by their layout suffix
    assert sorted(index.frames.tolist()) == sorted(f.shape[0] for f in feats.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an index for every shard: nothing to scan, nothing to warn about
        indexed = make_loader(f"{d}/data-*.tar", tok, max_frames=2000)
    for loader in (scanned, indexed):
        loader.set_epoch(0)
    a, b = [list(map(tuple, (x.keys for x in scanned)))], [list(map(tuple, (x.keys for x in indexed)))]
    assert a == b and sorted(k for batch in a[0] for k in batch) == sorted(feats)
    assert verify_shards(f"{d}/data-*.tar").ok
    again = run_cli("index", f"{d}/data-*.tar")
    assert again.returncode == 0 and "up to date" in again.stdout


def test_a_copied_folder_is_refreshed_not_rebuilt(tmp_path):
    out, _ = build(tmp_path, n=80, utts_per_shard=20)
    pattern = f"{out}/data-*.tar"
    tok = tmp_path / "char.json"
    train_tokenizer("char", [tmp_path / "kaldi-cat-0" / "text"], tok)
    shard = sorted(out.glob("data-*.tar"))[2]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))  # as `cp` without -p leaves it
    with pytest.warns(UserWarning, match=r"matched the index's SHA-256.*--refresh"):  # loaded, by its content
        make_loader(pattern, tok, max_frames=2000)
    r = run_cli("index", pattern)
    assert r.returncode == 2 and "--refresh" in r.stderr
    r = run_cli("index", "--refresh", pattern)
    assert r.returncode == 0 and "re-indexed: 4 shards, 1 read" in r.stdout, r.stdout + r.stderr
    assert len(make_loader(pattern, tok, max_frames=2000)) > 0


def test_a_version_1_index_is_read_and_upgraded(tmp_path):
    out, _ = build(tmp_path, n=40, utts_per_shard=20)
    new = read_index(out)
    v1 = {"version": 1, "layout": new.layout, "dims": new.dims, "dtype": new.dtype,
          "shards": [{"name": s.name, "keys": s.keys, "frames": s.frames, "text_lens": s.text_lens}
                     for s in new.shards]}
    for f in out.glob("index.*"):
        f.unlink()
    (out / INDEX_NAME).write_text(json.dumps(v1))
    old = read_index(out)
    assert old.shards == new.shards and (old.sizes == -1).all()
    result = index_shards(f"{out}/data-*.tar")
    assert list(result.folders.values()) == ["upgraded from version 1: 2 shards, 2 read"]
    assert read_index(out).shards == new.shards and (out / KEYS_FILE).is_file()


def test_a_damaged_shard_is_indexed_as_the_loader_reads_it_and_the_loss_counted(tmp_path):
    d, feats, tok = cat_shards(tmp_path, "cat")
    victim = d / "data-00001.tar"
    with __import__("tarfile").open(victim) as tf:
        members = [(m.name, tf.extractfile(m).read()) for m in tf]
    members[10] = (members[10][0], npy(np.ones((3, 5), ">f4")))  # the sixth sample's features: refused
    write_tar(victim, members)
    result = index_shards(f"{d}/data-*.tar")
    assert not result.ok and "'>f4' refused" in result.problems[0] and "leaves this sample out" in result.problems[0]
    assert read_index(d).utts.tolist() == [15, 14, 15, 15]  # the tar is whole: that sample alone is left out
    assert read_index(d).lost.tolist() == [0, 1, 0, 0]
    loader = make_loader(f"{d}/data-*.tar", tok, max_frames=2000)
    loader.set_epoch(0)
    with pytest.warns(RuntimeWarning, match="'>f4' refused"):
        got = sum(len(b.keys) for b in loader)
    assert got == 59 and loader.stats.dropped == {"unreadable": 1} and loader.stats.corrupt_shards == 0
    assert run_cli("index", "--force", f"{d}/data-*.tar").returncode == 1  # the CLI says so too
