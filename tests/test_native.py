"""The C hot path (``wdsprep/_native.c``) against the Python code it stands in for.

The C walk may decline a tar (``None``: the Python walk then takes it), but whatever it returns
must be exactly what the Python walk finds; and it must not decline the shards real writers make.
"""

from __future__ import annotations

import gc
import io
import os
import re
import shutil
import sysconfig
import tarfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from shard_helpers import cold_file, npy, wait_for
from shard_readers import iter_shard_samples
from shardsets import build, train_char_tokenizer

from wdsprep.format import native, shardfile, tar
from wdsprep.format import samples as fsamples
from wdsprep.format.records import Records
from wdsprep.format.samples import iter_decoded
from wdsprep.format.shardfile import ShardError, ShardFile, read_rows
from wdsprep.format.tar import PEEK
from wdsprep.format.writer import ShardWriter
from wdsprep.loader import make_loader
from wdsprep.loading import stream as loader_module
from wdsprep.loading.collate import collate, start_collate, unpack

needs_native = pytest.mark.skipif(native.lib is None,
                                  reason="wdsprep._native not in use: not built, or WDSPREP_PURE_PYTHON set")


def test_built_where_a_compiler_exists():
    if os.environ.get("WDSPREP_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("WDSPREP_PURE_PYTHON is set")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no C compiler or Python headers here: the Python path is expected")
    assert native.lib is not None, ("wdsprep._native was not built although a C compiler is here: "
                                        "see the output of pip install -e . for the compiler's error")


def python_scan(src, monkeypatch):
    """What the Python walk makes of ``src``: (members, problem), or "tarfile" for the exotic."""
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        try:
            return tar.scan_ustar(src)
        except tar._Exotic:
            return "tarfile"


def c_walk(src):
    return native.lib.walk(src.fileno() if isinstance(src, ShardFile) else src, PEEK, len(src))


def agree(path, monkeypatch) -> bool:
    """The C walk equals the Python one wherever it answers, from a file and from memory; whether it answered."""
    answers = []
    for src in (ShardFile(str(path)), Path(path).read_bytes()):
        got, ref = c_walk(src), python_scan(src, monkeypatch)
        if got is not None:
            assert ref == (got, None)
        answers.append(got is not None)
    assert answers[0] == answers[1]
    return answers[0]


def decoded(path, *, python: bool, monkeypatch):
    """What iter_decoded(lazy) gives: (uttid, shape, dtype, data offset or values, text) rows,
    then the warning or error that ended it."""
    rows, end = [], None
    with monkeypatch.context() as m, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if python:
            m.setattr(native, "lib", None)
        try:
            for uttid, f, text in iter_decoded(str(path), lazy=True, float32=False):
                where = f.offset if type(f) is shardfile.FileFeats else np.asarray(f).tobytes()
                rows.append((uttid, tuple(f.shape), str(f.dtype), where, text))
        except ShardError as e:
            end = str(e)
    messages = [end] if end else [str(w.message) for w in caught]
    return rows, [re.sub(r" at 0x[0-9a-f]+", "", m) for m in messages]  # literal_eval's name addresses


def samples_agree(path, monkeypatch) -> bool:
    """The loader's read of ``path`` is the same with the C samples walk as in Python; whether C answered."""
    got = decoded(path, python=False, monkeypatch=monkeypatch)
    assert got == decoded(path, python=True, monkeypatch=monkeypatch)
    return fsamples.native_samples(str(path)) is not None


def ustar(path, members, fmt=tarfile.USTAR_FORMAT, mtime=0):
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


@needs_native
@pytest.mark.parametrize("layout", ["cat", "cat-v3"])
def test_walk_takes_our_shards(tmp_path, monkeypatch, layout):
    w = ShardWriter(tmp_path / "a.tar", layout=layout, mtime=1.5)  # float mtime: a pax record per member
    for i in range(9):
        w.write(f"sp0.9-spk{i}.utt%{i}", np.full((i + 1, 3), i, np.float16), "好" * (i * 40))
    w.close()
    assert agree(tmp_path / "a.tar", monkeypatch)
    assert samples_agree(tmp_path / "a.tar", monkeypatch)


@needs_native
def test_walk_takes_webdataset_tars(tmp_path, monkeypatch):
    import webdataset as wds

    with wds.TarWriter(str(tmp_path / "w.tar")) as tw:
        for i in range(5):
            tw.write({"__key__": f"utt{i}", "npy": npy(np.ones((i + 2, 4), np.float32)), "txt": b"a b"})
    assert agree(tmp_path / "w.tar", monkeypatch)
    assert samples_agree(tmp_path / "w.tar", monkeypatch)


@needs_native
def test_walk_takes_every_member_size_prefixes_and_directories(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    sizes = [0, 1, PEEK - 1, PEEK, PEEK + 1, 511, 512, 513, 3000]
    members = [("dir", None)] + [(f"d/k{i}.txt", rng.bytes(n)) for i, n in enumerate(sizes)]
    members.append(("p" * 120 + "/name.npy", b"x" * 40))  # a name that needs ustar's prefix field
    ustar(tmp_path / "a.tar", members)
    assert agree(tmp_path / "a.tar", monkeypatch)
    got = c_walk(ShardFile(str(tmp_path / "a.tar")))
    assert [m[0] for m in got] == [n for n, d in members if d is not None]
    assert [m[3] for m in got] == [d[:PEEK] for n, d in members if d is not None]


@needs_native
@pytest.mark.parametrize("kind", ["gnu-long-name", "pax-path", "not-utf8", "pax-global"])
def test_walk_declines_what_it_does_not_parse(tmp_path, monkeypatch, kind):
    path = tmp_path / "x.tar"
    if kind == "gnu-long-name":
        ustar(path, [("x" * 150 + ".npy", b"1"), ("x" * 150 + ".txt", b"2")], fmt=tarfile.GNU_FORMAT)
    elif kind == "pax-path":
        ustar(path, [("ü" * 80 + ".npy", b"1")], fmt=tarfile.PAX_FORMAT)
    elif kind == "not-utf8":
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="latin-1") as tf:
            info = tarfile.TarInfo("é.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    else:
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "hi"}) as tf:
            info = tarfile.TarInfo("a.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    assert not agree(path, monkeypatch)
    # ... and the reader still reads it, through the Python walk or tarfile.
    with tarfile.open(path) as tf:
        expected = {m.name.split(".", 1)[0] for m in tf if m.isfile()}
    assert [k for k, _ in iter_shard_samples(str(path))] == sorted(expected)


@needs_native
def test_walk_never_disagrees_on_damaged_shards(tmp_path, monkeypatch):
    """Truncated anywhere, or any header byte changed: the C walk declines or finds what Python finds."""
    write = ShardWriter(tmp_path / "a.tar")
    rng = np.random.default_rng(0)
    for i in range(6):
        write.write(f"utt{i}", rng.standard_normal((int(rng.integers(1, 40)), 4)).astype(np.float32), f"t {i}")
    write.close()
    data = (tmp_path / "a.tar").read_bytes()
    members = c_walk(data)
    headers = [m[1] - 512 for m in members]
    cases = [data[:n] for n in sorted({*range(0, len(data), 512), *rng.integers(0, len(data), 40).tolist()})]
    for _ in range(150):
        bad = bytearray(data)
        bad[int(rng.choice(headers)) + int(rng.integers(0, 512))] ^= 1 << int(rng.integers(0, 8))
        cases.append(bytes(bad))
    for _ in range(100):  # .npy headers and transcripts: the samples walk parses those
        bad = bytearray(data)
        _, offset, size, _ = members[int(rng.integers(len(members)))]
        bad[offset + int(rng.integers(0, min(size, 128)))] ^= 1 << int(rng.integers(0, 8))
        cases.append(bytes(bad))
    declined = answered = 0
    for i, case in enumerate(cases):
        (tmp_path / "c.tar").write_bytes(case)
        declined += not agree(tmp_path / "c.tar", monkeypatch)
        answered += samples_agree(tmp_path / "c.tar", monkeypatch)
    assert declined > len(cases) // 3  # the damage was seen: mostly it is the Python walk's to report
    assert answered > 0  # e.g. a changed mtime or a transcript letter: still a plain shard


def feats_of(path):
    return [(u, f) for u, f, _ in iter_decoded(str(path), lazy=True, float32=False)]


@needs_native
def test_read_rows_equals_row_by_row_reads_and_zeroes_padding(tmp_path):
    w = ShardWriter(tmp_path / "a.tar")
    for i in range(7):
        w.write(f"u{i}", np.arange((i * 37 + 5) % 50 * 3 + 1, dtype=np.float32).reshape(-1, 1).repeat(3, 1) + i, "x")
    w.close()
    rows = [f for _, f in feats_of(tmp_path / "a.tar")]
    t = max(f.shape[0] for f in rows)
    out = np.full((len(rows), t, 3), np.nan, np.float32)
    assert read_rows(out, rows) == len(rows)
    for i, f in enumerate(rows):
        np.testing.assert_array_equal(out[i, :f.shape[0]], f.read())
        assert (out[i, f.shape[0]:] == 0).all()


@needs_native
def test_read_rows_stops_at_a_truncated_shard_and_collate_names_it(tmp_path):
    w = ShardWriter(tmp_path / "a.tar")
    for i in range(4):
        w.write(f"u{i}", np.ones((20, 2), np.float32) * i, "x")
    w.close()
    rows = feats_of(tmp_path / "a.tar")
    os.truncate(tmp_path / "a.tar", rows[2][1].offset + 8)
    out = np.zeros((4, 20, 2), np.float32)
    assert read_rows(out, [f for _, f in rows]) == 2  # rows before the cut are read
    np.testing.assert_array_equal(out[1], 1)
    with pytest.raises(ShardError, match=r"a\.tar.*u2.*truncated"):
        collate(_batch(rows))


def _batch(pairs):
    """A batch of (uttid, features) pairs, each labelled (1, 2)."""
    return Records.of((u, f, "x") for u, f in pairs).with_labels([(1, 2)] * len(pairs))


@needs_native
def test_batch_over_more_shards_than_stay_open_is_read_in_one_call(tmp_path, monkeypatch):
    # Reopening one shard closes another (whose descriptor number may be reused): the bulk read
    # works on duplicates of the descriptors, taken before any is closed.
    monkeypatch.setattr(shardfile, "MAX_OPEN_SHARDS", 2)
    samples = []
    for k in range(4):
        w = ShardWriter(tmp_path / f"s{k}.tar")
        w.write(f"u{k}", np.full((5 + k, 3), k, np.float32), "x")
        w.close()
        samples += feats_of(tmp_path / f"s{k}.tar")
    out = np.full((4, 8, 3), -1, np.float32)
    assert read_rows(out, [f for _, f in samples]) == 4
    for k in range(4):
        assert (out[k, :5 + k] == k).all() and (out[k, 5 + k:] == 0).all()
    b = unpack(collate(_batch(samples)))
    for i, k in enumerate([3, 2, 1, 0]):  # longest first
        assert b.keys[i] == f"u{k}" and (b.feats[i, :5 + k] == k).all() and (b.feats[i, 5 + k:] == 0).all()


def _threads() -> int:
    """This process's threads started outside Python's ``threading`` (which also runs the shard
    readahead, a thread that may or may not be alive at a given moment)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


@needs_native
def test_row_reader_runs_jobs_in_order_in_its_own_thread(tmp_path):
    path = tmp_path / "f.bin"
    data = np.arange(4000, dtype=np.float32)
    data.tofile(path)
    before = _threads()
    fd = os.open(path, os.O_RDONLY)
    try:
        r = native.lib.RowReader()
        with pytest.raises(ValueError, match="without a job"):
            r.wait()
        outs = [np.full((2, 100), np.nan, np.float32) for _ in range(3)]
        jobs = [[(fd, 0, 400), (fd, 4000, 200)], [(fd, 8000, 400), (fd, 16000 - 40, 400)], [(fd, 400, 4)]]
        for out, rows in zip(outs, jobs):
            r.submit(out, 400, np.array(rows, np.int64))
        assert _threads() == before + 1
        assert [r.wait() for _ in jobs] == [-1, 1, -1]  # row 1 of job 2 runs past the end of the file
        np.testing.assert_array_equal(outs[0][0], data[:100])
        np.testing.assert_array_equal(outs[0][1], np.r_[data[1000:1050], np.zeros(50, np.float32)])
        np.testing.assert_array_equal(outs[1][0], data[2000:2100])
        assert outs[2][0, 0] == data[100] and (outs[2][0, 1:] == 0).all() and np.isnan(outs[2][1]).all()
        r.submit(outs[0], 400, np.array([(fd, 800, 400)], np.int64))  # close() finishes a job nobody waited for
        r.close()
        np.testing.assert_array_equal(outs[0][0], data[200:300])
        assert wait_for(lambda: _threads() == before)
        with pytest.raises(ValueError, match="closed"):
            r.submit(outs[0], 400, np.array([(fd, 0, 4)], np.int64))
        with pytest.raises(ValueError, match="do not fit"):
            native.lib.RowReader().submit(outs[0], 400, np.array([(fd, 0, 404)], np.int64))
        with pytest.raises(ValueError, match=r"int64 \[n, 3\]"):
            native.lib.RowReader().submit(outs[0], 400, np.array([fd, 0], np.int64))
    finally:
        os.close(fd)


def _bytes_read_by_this_thread() -> int | None:
    try:
        with open("/proc/thread-self/io") as f:
            return int(f.readline().split()[1])  # rchar
    except OSError:
        return None


@needs_native
def test_row_reader_jobs_are_read_right_by_both_threads(tmp_path):
    """The thread that waits reads rows of its job too: every row lands in its place, a short row
    stops the job there with every row before it read, and nothing is lost between the threads."""
    path = tmp_path / "f.bin"
    data = np.arange(1 << 20, dtype=np.float32)
    data.tofile(path)
    rng = np.random.default_rng(0)
    fd = os.open(path, os.O_RDONLY)
    r = native.lib.RowReader()
    try:
        jobs = []
        for j in range(40):
            n, width = int(rng.integers(0, 60)), int(rng.integers(2, 5000))
            starts = rng.integers(0, len(data) - width, n)
            lens = rng.integers(0, width + 1, n)
            short = int(rng.integers(0, n)) if n and j % 5 == 0 else -1
            rows = np.stack([np.full(n, fd), starts * 4, lens * 4], 1).astype(np.int64).reshape(-1, 3)
            if short >= 0:
                rows[short, 1] = data.nbytes - 4  # one value left in the file: this row ends early
                rows[short, 2] = 8
            out = np.full((n, width), np.nan, np.float32)
            r.submit(out, width * 4, rows)
            jobs.append((out, starts, lens, short))
        for out, starts, lens, short in jobs:
            assert r.wait() == short
            for i in range(len(out) if short < 0 else short):
                np.testing.assert_array_equal(out[i, :lens[i]], data[starts[i]:starts[i] + lens[i]])
                assert (out[i, lens[i]:] == 0).all()
        # A job too big for the reader's thread alone by the time wait() begins: the caller reads some.
        big = np.empty((400, 1 << 16), np.float32)
        rows = np.array([(fd, 0, big[0].nbytes)] * len(big), np.int64)
        before = _bytes_read_by_this_thread()
        if before is None:
            pytest.skip("no per-thread I/O accounting here")
        r.submit(big, big[0].nbytes, rows)
        assert r.wait() == -1 and (big == data[:1 << 16]).all()
        assert _bytes_read_by_this_thread() - before >= big[0].nbytes
    finally:
        r.close()
        os.close(fd)


@needs_native
def test_row_reads_in_flight_survive_their_shard_being_closed(tmp_path, monkeypatch):
    """The stages open shards while a batch is read; the bulk read keeps its own descriptors."""
    samples = []
    for k in range(3):
        w = ShardWriter(tmp_path / f"s{k}.tar")
        w.write(f"u{k}", np.full((300, 80), k, np.float32), "x")
        w.close()
        samples += feats_of(tmp_path / f"s{k}.tar")
    rows = _batch(samples)
    r = shardfile.row_reader()
    out = np.full((3, 300, 80), -1, np.float32)
    reads = shardfile.bulk_reads(rows.sources.tolist(), rows.offsets, rows.frames * rows.dims * 4, 4)
    reads.start(out, r)
    for file in rows.sources:
        file._close()  # what reopening other shards does (MAX_OPEN_SHARDS) ...
    decoys = [os.open(tmp_path / "s0.tar", os.O_RDONLY) for _ in range(3)]  # ... and the numbers get reused
    try:
        assert reads.wait() == 3
    finally:
        for fd in decoys:
            os.close(fd)
        r.close()
    for k in range(3):
        assert (out[k] == k).all()
    assert reads.fds == {}  # the duplicates are closed


@needs_native
def test_row_reader_refuses_a_forked_child():
    r = native.lib.RowReader()
    pid = os.fork()
    if pid == 0:  # the child: the reader's thread is not here, so it must not queue work for it
        try:
            r.submit(np.zeros(4, np.float32), 16, np.zeros((0, 3), np.int64))
        except RuntimeError:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@needs_native
@pytest.mark.parametrize("background", [False, True])
def test_float16_rows_become_exact_float32_in_c(tmp_path, background):
    """Every kind of float16 value, in the 8-wide converted part of a row and in its tail."""
    special = np.array([0.0, -0.0, 1.0, -2.5, 65504, -65504, 6.1e-5, 6e-8, -3e-7, np.inf, -np.inf, np.nan,
                        0.333, 1e4], np.float16)
    samples, expected = [], {}
    for k, frames in enumerate([7, 5, 1]):  # 21, 15 and 3 values: tails of 5, 7 and 3
        a = np.resize(np.roll(special, k), frames * 3).reshape(frames, 3)
        a.view(np.uint16)[-1, -1] = 0x7E01 + k  # a NaN payload survives too
        w = ShardWriter(tmp_path / f"s{k}.tar")
        w.write(f"u{k}", a, "x")
        w.close()
        expected[f"u{k}"] = a.astype(np.float32)
        samples += feats_of(tmp_path / f"s{k}.tar")
    r = shardfile.row_reader() if background else None
    try:
        b = unpack(start_collate(_batch(samples), reader=r)())
    finally:
        if r is not None:
            r.close()
    for i, key in enumerate(b.keys):
        n = len(expected[key])
        assert b.feats[i, :n].numpy().view(np.uint32).tolist() == expected[key].view(np.uint32).tolist()
        assert (b.feats[i, n:] == 0).all()


@needs_native
def test_the_loader_ends_its_reader_thread_and_reads_with_the_epoch(tmp_path):
    out, _ = build(tmp_path, n=90, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1200, seed=3)
    for _ in loader:  # a first epoch: torch starts threads of its own on first use, and they stay
        pass
    threads = _threads()  # the epoch's reader thread is joined when the epoch ends
    seen = set()
    loader.set_epoch(1)
    for _ in loader:
        seen.add(_threads())
    assert threads + 1 in seen  # the reader ran in a thread of its own
    assert wait_for(lambda: _threads() == threads)
    fds = len(os.listdir("/proc/self/fd"))
    for epoch in range(5):  # stopped early (DDP's early stop, or a break), reads still in flight
        loader.set_epoch(epoch)
        for b in loader:
            break
        del b
    assert wait_for(lambda: _threads() == threads)
    gc.collect()
    # Only the shards' own descriptors may stay open (MAX_OPEN_SHARDS), not the reads' duplicates.
    assert len(os.listdir("/proc/self/fd")) <= fds + len(list(out.glob("*/*.tar")))


@needs_native
def test_loader_batches_are_the_same_without_the_c_part(tmp_path, monkeypatch):
    out, _ = build(tmp_path, n=90, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")

    def epoch():
        loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1200, seed=3)
        return [(b.keys, b.feats.clone(), b.labels.clone()) for b in loader]

    in_c = epoch()
    monkeypatch.setattr(native, "lib", None)
    python = epoch()
    assert [k for k, _, _ in in_c] == [k for k, _, _ in python] and len(in_c) > 3
    for (_, fa, la), (_, fb, lb) in zip(in_c, python):
        assert torch.equal(fa, fb) and torch.equal(la, lb)


@needs_native
def test_workers_give_the_same_batches_with_or_without_a_read_thread(tmp_path, monkeypatch):
    """Workers read in a thread of their own only with 2 cores each (loader._cores); same batches."""
    out, _ = build(tmp_path, n=90, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")

    def epoch(cores):
        monkeypatch.setattr(loader_module, "_cores", lambda: cores)  # the workers fork with it
        loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1200, seed=3, num_workers=2)
        return [(b.keys, b.feats.clone()) for b in loader]

    threaded, direct = epoch(64), epoch(1)
    assert [k for k, _ in threaded] == [k for k, _ in direct] and len(direct) > 3
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(threaded, direct))


@pytest.mark.parametrize("dtypes", [(np.float16,), (np.float32, np.float16)])
def test_collate_float16_and_mixed_dtypes_from_shards(tmp_path, dtypes):
    """float16 rows are converted in the bulk read; a batch of mixed dtypes is read row by row, both right."""
    samples, expected = [], {}
    for k in range(4):
        w = ShardWriter(tmp_path / f"s{k}.tar")
        a = (np.arange((6 + k) * 3, dtype=np.float32).reshape(-1, 3) / 7).astype(dtypes[k % len(dtypes)])
        w.write(f"u{k}", a, "x")
        w.close()
        expected[f"u{k}"] = a.astype(np.float32)
        samples += feats_of(tmp_path / f"s{k}.tar")
    for _ in range(2):  # twice: nothing of the first collate is left behind to change the second
        b = unpack(collate(_batch(samples)))
        for i, key in enumerate(b.keys):
            n = len(expected[key])
            np.testing.assert_array_equal(b.feats[i, :n].numpy(), expected[key])
            assert (b.feats[i, n:] == 0).all()


@needs_native
@pytest.mark.serial  # another process's reads may evict the cold file or fill the cache
def test_readahead_asks_only_for_a_file_not_cached(tmp_path):
    path = cold_file(tmp_path / "f.tar", 1 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert native.lib.readahead(fd, 1 << 20, 1 << 17) is True
        path.read_bytes()
        assert native.lib.readahead(fd, 1 << 20, 1 << 17) is False  # cached: 16 probes, no reads
    finally:
        os.close(fd)


@needs_native
def test_buffered_samples_are_not_tracked_by_the_gc(tmp_path):
    """Thousands wait in the buffers; tracked, they cost a full collection per epoch (see format.native.untrack)."""
    w = ShardWriter(tmp_path / "a.tar")
    w.write("u1", np.ones((3, 2), np.float32), "x")
    w.close()
    (_, feats, _), = iter_decoded(str(tmp_path / "a.tar"), lazy=True)
    assert type(feats) is shardfile.FileFeats and not gc.is_tracked(feats)
    rows = _batch([("u1", feats)])
    gc.collect()
    assert not gc.is_tracked(rows.obj) and not gc.is_tracked(rows.labels[0])  # a block, and its label tuples
    assert native.lib.untrack(7) == 7  # objects the GC never tracks pass through


@needs_native
@pytest.mark.parametrize("kind", ["no-transcript", "float64", "fortran", "npy-v2", "npy-spacing",
                                  "short-data", "text-not-utf8", "key-not-ascii", "long-text"])
def test_samples_leave_the_unusual_to_python(tmp_path, monkeypatch, kind):
    """The C samples walk declines (or, for a long transcript, reads it); the loader sees the same either way."""
    path = tmp_path / "x.tar"
    good = [("a.npy", npy(np.ones((3, 2), np.float32))), ("a.txt", b"ok")]
    feats = npy(np.arange(6, dtype=np.float32).reshape(3, 2))
    buf = io.BytesIO()
    if kind == "no-transcript":
        members = [("b.npy", feats)]
    elif kind == "float64":
        members = [("b.npy", npy(np.ones((3, 2)))), ("b.txt", b"x")]
    elif kind == "fortran":
        members = [("b.npy", npy(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(3, 2)))), ("b.txt", b"x")]
    elif kind == "npy-v2":
        np.lib.format.write_array(buf, np.ones((3, 2), np.float32), version=(2, 0))
        members = [("b.npy", buf.getvalue()), ("b.txt", b"x")]
    elif kind == "npy-spacing":  # a header numpy would not write; the Python parser still reads it
        members = [("b.npy", feats.replace(b"(3, 2)", b"(3,2) ")), ("b.txt", b"x")]
    elif kind == "short-data":
        members = [("b.npy", feats[:-4]), ("b.txt", b"x")]
    elif kind == "text-not-utf8":
        members = [("b.npy", feats), ("b.txt", b"\xff")]
    elif kind == "key-not-ascii":
        members = [("b\u00fc.npy", feats), ("b\u00fc.txt", b"x")]
    else:
        members = [("b.npy", feats), ("b.txt", "好".encode() * PEEK)]
    ustar(path, good + members + good[:0])
    taken = samples_agree(path, monkeypatch)
    assert taken == (kind == "long-text")
    rows, end = decoded(path, python=False, monkeypatch=monkeypatch)
    assert rows[0][0] == "a"
    if kind in ("no-transcript", "short-data", "text-not-utf8"):
        assert len(rows) == 1 and "b" in str(end)  # reported, naming the utterance
    else:
        assert len(rows) == 2


@needs_native
def test_samples_report_an_undecodable_key_like_python(tmp_path, monkeypatch):
    ustar(tmp_path / "x.tar", [("a.npy", npy(np.ones((3, 2), np.float32))), ("a.txt", b"ok"),
                              ("b%FF.npy", npy(np.ones((3, 2), np.float32))), ("b%FF.txt", b"x")])
    assert samples_agree(tmp_path / "x.tar", monkeypatch)
    rows, end = decoded(tmp_path / "x.tar", python=False, monkeypatch=monkeypatch)
    assert [r[0] for r in rows] == ["a"] and "b%FF" in str(end)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("threaded", [False, True])
def test_read_rows_flags_exactly_the_rows_holding_a_nan_or_an_infinity(tmp_path, dtype, threaded):
    """Every row length around the vector widths, the bad value at every place (the vector body
    and the scalar tail), against the largest finite values, which must pass."""
    big = np.finfo(dtype).max
    rows, want = [], []
    for n in range(1, 70):
        rows.append(np.full(n, -big, dtype))
        want.append(0)
        for at in range(n):
            for bad in (np.nan, np.inf, -np.inf):
                row = np.full(n, big, dtype)
                row[at] = bad
                rows.append(row)
                want.append(1)
    path = tmp_path / "rows.bin"
    path.write_bytes(b"".join(r.tobytes() for r in rows))
    half = dtype == np.float16
    out = np.zeros((len(rows), 69), np.float32 if half else dtype)
    flags = np.full(len(rows), 7, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        offsets = np.cumsum([0] + [r.nbytes for r in rows[:-1]])
        spec = np.array([(fd, o, r.nbytes) for o, r in zip(offsets, rows)], np.int64)
        if threaded:
            reader = native.lib.RowReader()
            reader.submit(out, out[0].nbytes, spec, half, flags)
            assert reader.wait() == -1
            reader.close()
        else:
            assert native.lib.read_rows(out, out[0].nbytes, spec, half, flags) == -1
    finally:
        os.close(fd)
    np.testing.assert_array_equal(flags, want)
    np.testing.assert_array_equal(out[1, :1], rows[1].astype(out.dtype))
