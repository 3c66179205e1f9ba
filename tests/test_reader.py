"""The fast shard reader: same samples as tarfile, both layouts, no pickle, corrupt shards named."""

from __future__ import annotations

import io
import shutil
import tarfile
import warnings

import numpy as np
import pytest

from wdsprep.reader import ShardError, decode_npy, iter_decoded, iter_shard_samples
from wdsprep.shards import ShardWriter, iter_tar_samples


def write_shard(path, n=12, layout="cat", dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    w = ShardWriter(path, layout=layout, mtime=1.5)  # a float mtime makes tarfile write pax headers
    utts = {}
    for i in range(n):
        uttid = f"sp1.1-spk{i}-utt{i}" if i % 3 == 0 else f"utt{i}"
        feats = rng.standard_normal((int(rng.integers(5, 60)), 4)).astype(dtype)
        w.write(uttid, feats, f"text {i} 好")
        utts[uttid] = (feats, f"text {i} 好")
    w.close()
    return utts


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_members_match_tarfile(tmp_path, layout):
    write_shard(tmp_path / "a.tar", layout=layout)
    got = [(k, {e: bytes(v) for e, v in m.items()}) for k, m in iter_shard_samples(str(tmp_path / "a.tar"))]
    assert got == list(iter_tar_samples(tmp_path / "a.tar"))


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decoded_both_layouts_and_dtypes(tmp_path, layout, dtype):
    utts = write_shard(tmp_path / "a.tar", layout=layout, dtype=dtype)
    got = {u: (f, t) for u, f, t in iter_decoded(str(tmp_path / "a.tar"))}
    assert got.keys() == utts.keys()  # keys decoded back to the dotted utterance ids
    for u, (f, t) in got.items():
        assert f.dtype == np.float32 and t == utts[u][1]
        np.testing.assert_array_equal(f, utts[u][0].astype(np.float32))


def test_exotic_headers_fall_back_to_tarfile(tmp_path):
    """GNU long names (> 100 chars) are read too; the fast path hands them to tarfile."""
    path = tmp_path / "long.tar"
    key = "x" * 150
    feats = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, feats)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for ext, data in (("npy", buf.getvalue()), ("txt", b"hi")):
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (u, f, t), = list(iter_decoded(str(path)))
    assert u == key and t == "hi"
    np.testing.assert_array_equal(f, feats)


def test_pipe_url(tmp_path):
    utts = write_shard(tmp_path / "a.tar")
    got = [u for u, _, _ in iter_decoded(f"pipe:cat {tmp_path / 'a.tar'}")]
    assert got == list(utts)


def test_truncated_shard_warns_names_shard_and_key_and_keeps_good_samples(tmp_path):
    utts = write_shard(tmp_path / "a.tar", n=12)
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "t.tar").write_bytes(data[: len(data) // 2])
    seen = []
    with pytest.warns(RuntimeWarning, match=r"t\.tar.*(truncated|needs).*utterance") as rec:
        got = list(iter_decoded(str(tmp_path / "t.tar"), on_corrupt=lambda *a: seen.append(a)))
    assert 0 < len(got) < len(utts)
    assert [u for u, _, _ in got] == list(utts)[: len(got)]
    assert len(seen) == 1 and seen[0][0].endswith("t.tar")
    with pytest.raises(ShardError, match=r"t\.tar"):
        list(iter_decoded(str(tmp_path / "t.tar"), on_error="raise"))


def test_flipped_header_byte_is_a_checksum_error(tmp_path):
    write_shard(tmp_path / "a.tar", n=6)
    data = bytearray((tmp_path / "a.tar").read_bytes())
    # Corrupt the name in the last member's header region: find the 3rd-from-last header by scan.
    pos = data.rfind(b"utt5.txt")
    data[pos] ^= 0x01
    (tmp_path / "c.tar").write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="checksum"):
        got = list(iter_decoded(str(tmp_path / "c.tar")))
    assert len(got) == 5


def test_object_arrays_are_refused_never_unpickled(tmp_path):
    buf = io.BytesIO()
    np.save(buf, np.array([[{"a": 1}]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="unpickling"):
        decode_npy(buf.getvalue())


def test_missing_file_is_reported_not_crashing(tmp_path):
    with pytest.raises(ShardError, match="nope.tar"):
        list(iter_decoded(str(tmp_path / "nope.tar"), on_error="raise"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert list(iter_decoded(str(tmp_path / "nope.tar"))) == []
    assert "nope.tar" in str(w[0].message)
