"""The fast shard reader: same samples as tarfile, both layouts, no pickle, corrupt shards named."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from pagecache import resident_fraction
from shard_helpers import cold_file, wait_for
from shard_readers import decode_npy, iter_shard_samples, iter_tar_samples

from wdsprep.format import native, shardfile
from wdsprep.format.samples import iter_decoded
from wdsprep.format.shardfile import FileFeats, ShardError, prefetch_shard
from wdsprep.format.writer import ShardWriter


@pytest.fixture(autouse=True, params=["native", "python"])
def walk(request, monkeypatch):
    """Every test here runs with the C walk (when built) and with the Python one it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(native, "lib", None)
    elif native.lib is None:
        pytest.skip("wdsprep._native not in use: not built (see test_native.py for when that is an error) "
                    "or WDSPREP_PURE_PYTHON set")
    return request.param


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
    """The format reads a pipe's shard once the layer above fetched it (with the user's retries); it
    never fetches one itself."""
    from wdsprep.plan.shardset import fetched_shard
    from wdsprep.remote.fetch import RetryPolicy

    utts = write_shard(tmp_path / "a.tar")
    url = f"pipe:cat {tmp_path / 'a.tar'}"
    got = [u for u, _, _ in iter_decoded(url, source=fetched_shard(url, policy=RetryPolicy(retries=0)))]
    assert got == list(utts)
    with pytest.raises(TypeError, match="not fetched; the format reads local files and fetched copies"):
        list(iter_decoded(url))


def test_truncated_shard_warns_names_shard_and_key_and_keeps_good_samples(tmp_path):
    utts = write_shard(tmp_path / "a.tar", n=12)
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "t.tar").write_bytes(data[: len(data) // 2])
    seen = []
    with pytest.warns(RuntimeWarning, match=r"t\.tar.*(truncated|needs).*utterance"):
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


@pytest.mark.parametrize("lazy", [False, True])
def test_a_garbled_npy_header_is_reported_naming_the_utterance(tmp_path, lazy):
    buf = io.BytesIO()
    np.save(buf, np.ones((3, 2), np.float32))
    garbled = buf.getvalue().replace(b"(3, 2)", b"(3, \xb4)")  # one flipped bit: not Python syntax
    with tarfile.open(tmp_path / "g.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in [("utt1.npy", garbled), ("utt1.txt", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(ShardError, match="utt1.*not an npy header"):
        list(iter_decoded(str(tmp_path / "g.tar"), on_error="raise", lazy=lazy))


def test_missing_file_is_reported_not_crashing(tmp_path):
    with pytest.raises(ShardError, match="nope.tar"):
        list(iter_decoded(str(tmp_path / "nope.tar"), on_error="raise"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert list(iter_decoded(str(tmp_path / "nope.tar"))) == []
    assert "nope.tar" in str(w[0].message)


def _open(path) -> bool:
    """Whether this process has ``path`` open (Linux /proc)."""
    fds = Path("/proc/self/fd")
    return any(os.path.realpath(fds / fd) == os.path.realpath(path) for fd in os.listdir(fds))


@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_positional_reads_equal_reading_the_whole_shard(tmp_path, layout, dtype):
    write_shard(tmp_path / "a.tar", n=20, layout=layout, dtype=dtype)
    for float32 in (True, False):
        whole = list(iter_decoded(str(tmp_path / "a.tar"), float32=float32, whole=True))
        pread = list(iter_decoded(str(tmp_path / "a.tar"), float32=float32))
        lazy = list(iter_decoded(str(tmp_path / "a.tar"), float32=float32, lazy=True))
        assert [(u, t) for u, _, t in whole] == [(u, t) for u, _, t in pread] == [(u, t) for u, _, t in lazy]
        for (_, a, _), (_, b, _), (_, c, _) in zip(whole, pread, lazy):
            assert isinstance(c, FileFeats) and c.dtype == dtype and c.shape == a.shape  # stays on disk
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(np.asarray(c, a.dtype), a)


def test_shard_stays_open_while_a_lazy_sample_needs_it(tmp_path):
    """Samples in the shuffle buffer keep their shard open; nothing stays open after."""
    path = tmp_path / "a.tar"
    utts = write_shard(path, n=6)
    got = list(iter_decoded(str(path), lazy=True))
    assert _open(path)
    uttid, kept, _ = got[3]
    del got
    assert _open(path)
    np.testing.assert_array_equal(kept.read(), utts[uttid][0])
    del kept
    assert not _open(path)
    # A consumer stopping half-way releases the file too, and eager reads never keep it.
    it = iter_decoded(str(path), lazy=True)
    next(it)
    it.close()
    assert not _open(path)
    eager = list(iter_decoded(str(path)))
    assert len(eager) == 6 and not _open(path)


def test_open_shards_are_bounded_and_reopened_on_demand(tmp_path, monkeypatch):
    """Lazy samples of many shards keep at most MAX_OPEN_SHARDS files open, and still read right."""
    monkeypatch.setattr(shardfile, "MAX_OPEN_SHARDS", 2)
    got = []
    for k in range(6):
        write_shard(tmp_path / f"s{k}.tar", n=4, seed=k)
        got += list(iter_decoded(str(tmp_path / f"s{k}.tar"), lazy=True))
        assert sum(_open(tmp_path / f"s{j}.tar") for j in range(k + 1)) <= 2
    assert len(got) == 24
    for k in range(6):  # every sample still reads, its shard reopened when needed
        again = {u: f for u, f, _ in iter_decoded(str(tmp_path / f"s{k}.tar"))}
        for u, f, _ in got[4 * k:4 * k + 4]:
            np.testing.assert_array_equal(f.read(), again[u])
    assert sum(_open(tmp_path / f"s{j}.tar") for j in range(6)) <= 2


def test_shard_replaced_while_samples_wait_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shardfile, "MAX_OPEN_SHARDS", 1)
    write_shard(tmp_path / "a.tar", n=4, seed=1)
    write_shard(tmp_path / "b.tar", n=4, seed=2)
    waiting = list(iter_decoded(str(tmp_path / "a.tar"), lazy=True))
    rest = list(iter_decoded(str(tmp_path / "b.tar"), lazy=True))  # a.tar's file is closed now
    assert not _open(tmp_path / "a.tar") and rest
    write_shard(tmp_path / "a.tar", n=5, seed=3)  # re-packed under the same name
    with pytest.raises(ShardError, match=r"a\.tar.*(replaced|changed)"):
        waiting[0][1].read()


def test_shard_truncated_after_the_walk_names_shard_and_utterance(tmp_path):
    path = tmp_path / "a.tar"
    write_shard(path, n=6)
    got = list(iter_decoded(str(path), lazy=True))
    os.truncate(path, got[-1][1].offset + 8)  # the last sample's features are cut
    np.testing.assert_array_equal(got[0][1].read().shape, got[0][1].shape)  # earlier ones still read
    with pytest.raises(ShardError, match=rf"a\.tar.*{got[-1][0]}.*truncated"):
        got[-1][1].read()


def test_truncated_and_empty_shards_are_reported_on_both_paths(tmp_path):
    utts = write_shard(tmp_path / "a.tar", n=12)
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "t.tar").write_bytes(data[: len(data) // 2])
    (tmp_path / "e.tar").write_bytes(b"")
    for name in ("t.tar", "e.tar"):
        for whole in (True, False):
            with pytest.warns(RuntimeWarning, match=rf"{name}.*truncated"):
                got = [u for u, _, _ in iter_decoded(str(tmp_path / name), whole=whole)]
            assert got == list(utts)[: len(got)]


@pytest.mark.serial  # another process's reads may evict the cold file before it is counted
def test_prefetch_shard_reads_a_cold_shard_into_the_page_cache(tmp_path, monkeypatch):
    # Chunks no larger than the kernel's smallest readahead window, so every byte is asked for
    # (see shardfile._READAHEAD_CHUNK) on either path.
    monkeypatch.setattr(shardfile, "_READAHEAD_CHUNK_PY", shardfile._READAHEAD_CHUNK)
    path = cold_file(tmp_path / "cold.tar")
    prefetch_shard(str(path))
    assert wait_for(lambda: resident_fraction([path]) == 1.0), resident_fraction([path])
    # The thread ends once nothing is pending: none may be running when a DataLoader forks workers.
    assert wait_for(lambda: not any(t.name == "wdsprep-readahead" for t in threading.enumerate()))


@pytest.mark.serial
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_prefetch_in_a_forked_child_while_the_parent_thread_held_the_lock(tmp_path):
    path = cold_file(tmp_path / "cold.tar")
    with shardfile._ahead.lock:  # as if the readahead thread were inside it when the DataLoader forked
        pid = os.fork()
        if pid == 0:  # the child: without a fresh state, prefetch_shard waits for the lock forever
            code = 1
            try:
                prefetch_shard(str(path))
                code = 0 if wait_for(lambda: resident_fraction([path]) > 0) else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("prefetch_shard hung in a forked child")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_prefetch_shard_is_harmless(tmp_path):
    write_shard(tmp_path / "a.tar", n=3)
    prefetch_shard(str(tmp_path / "a.tar"))
    prefetch_shard(str(tmp_path / "missing.tar"))  # reported later, when the shard is read
    prefetch_shard(f"pipe:cat {tmp_path / 'a.tar'}")
    assert len(list(iter_decoded(str(tmp_path / "a.tar")))) == 3
