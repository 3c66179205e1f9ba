"""One rank's loader: coverage, labels, determinism, reshuffling, bounds, filters, corruption, buffers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
from shardsets import build, strip_index, train_char_tokenizer

from wdsprep.format.shardfile import ShardError
from wdsprep.loader import LABEL_PAD, Batch, make_loader
from wdsprep.plan.shardset import StaleIndexError
from wdsprep.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    out, utts = build(root, n=240, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return root, out, utts, tok


def run(loader, epoch=0):
    loader.set_epoch(epoch)
    return list(loader)


def keys_of(batches):
    return [k for b in batches for k in b.keys]


def check_batches(batches, utts, tok_path, max_frames=None):
    """Every utterance once, features and labels right for its key, padding as documented."""
    tok = load_tokenizer(tok_path)
    keys = keys_of(batches)
    assert Counter(keys) == Counter(utts.keys())
    for b in batches:
        assert isinstance(b, Batch) and b.feats.dtype.is_floating_point and str(b.feats.dtype) == "torch.float32"
        assert str(b.labels.dtype) == "torch.int64" and str(b.feat_lens.dtype) == "torch.int64"
        xs, x_lens, ys, y_lens = b[:4]  # unpacks like CAT's collate
        assert xs.shape[:2] == (len(b.keys), int(x_lens.max()))
        if max_frames is not None and len(b.keys) > 1:
            assert len(b.keys) * int(x_lens.max()) <= max_frames
        for i, k in enumerate(b.keys):
            feats, text = utts[k]
            n, u = int(x_lens[i]), int(y_lens[i])
            np.testing.assert_array_equal(xs[i, :n].numpy(), feats.astype(np.float32))
            assert (xs[i, n:] == 0).all()
            assert ys[i, :u].tolist() == tok.encode(text)
            assert (ys[i, u:] == LABEL_PAD).all()


@pytest.mark.parametrize("workers", [0, 2])
def test_every_utterance_once_with_right_labels(data, workers):
    _, out, utts, tok = data
    loader = make_loader(f"{out}/{{0_150,150_inf}}/data-*.tar", tok, max_frames=1500, num_workers=workers)
    batches = run(loader)
    check_batches(batches, utts, tok, max_frames=1500)
    st = loader.stats
    assert st.utterances == st.read == st.assigned == len(utts) and st.num_dropped == 0
    assert st.discarded == 0 and st.steps == st.planned_steps == len(batches) == len(loader)
    assert st.padding_efficiency > 0.85


@pytest.mark.parametrize("layout,dtype", [("cat-v3", "float32"), ("cat", "float16")])
def test_other_layout_and_float16(tmp_path, data, layout, dtype):
    _, _, _, tok = data
    out, utts = build(tmp_path, n=60, utts_per_shard=17, layout=layout, dtype=dtype, seed=3)
    if dtype == "float16":
        utts = {k: (f.astype(np.float16), t) for k, (f, t) in utts.items()}
    check_batches(run(make_loader(f"{out}/data-*.tar", tok, max_frames=2000)), utts, tok)


def test_without_index_the_headers_are_read_to_plan(tmp_path, data):
    _, out, utts, tok = data
    bare = strip_index(out, tmp_path / "bare")
    with pytest.warns(UserWarning, match="no index entry.*wdsprep index"):
        loader = make_loader([f"{bare}/0_150/data-*.tar", f"{bare}/150_inf/data-*.tar"], tok, max_frames=1500)
    check_batches(run(loader), utts, tok)
    indexed = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500)
    assert len(loader) == len(indexed) and keys_of(run(loader)) == keys_of(run(indexed))  # the same plan


def test_same_seed_same_batches_and_new_epoch_reshuffles(data):
    _, out, _, tok = data
    pattern = f"{out}/*/data-*.tar"
    a = run(make_loader(pattern, tok, max_frames=1500, seed=3), epoch=2)
    b = run(make_loader(pattern, tok, max_frames=1500, seed=3), epoch=2)
    assert [x.keys for x in a] == [x.keys for x in b]
    assert all(x.feats.equal(y.feats) and x.labels.equal(y.labels) for x, y in zip(a, b))
    c = run(make_loader(pattern, tok, max_frames=1500, seed=3), epoch=3)
    assert keys_of(a) != keys_of(c) and sorted(keys_of(a)) == sorted(keys_of(c))


def test_oversize_utterance_is_its_own_batch_not_dropped(data):
    _, out, utts, tok = data
    longest = max(f.shape[0] for f, _ in utts.values())
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=longest - 1)
    batches = run(loader)
    assert Counter(keys_of(batches)) == Counter(utts.keys())
    over = [b for b in batches if int(b.feat_lens.max()) > longest - 1]
    assert over and all(len(b.keys) == 1 for b in over)
    assert loader.stats.oversize_batches == len(over)


def test_max_duration_is_max_frames_in_seconds(data):
    """max_duration=S plans the batches of max_frames=100*S (B x longest, padded), resumes the
    same state, and is refused beside a max_frames that says otherwise; ld takes it too."""
    from wdsprep.hyper import loader_options

    _, out, utts, tok = data
    by_seconds, by_frames = make_loader(out, tok, max_duration=6.5), make_loader(out, tok, max_frames=650)
    batches = run(by_seconds)
    assert keys_of(batches) == keys_of(run(by_frames)) and Counter(keys_of(batches)) == Counter(utts.keys())
    assert max(len(b.keys) * int(b.feat_lens.max()) for b in batches if len(b.keys) > 1) <= 650
    assert by_seconds.state_dict() == by_frames.state_dict()
    assert make_loader(out, tok, max_duration=0.29).dataset.cfg.plan.max_frames == 29  # not 28 (0.29 * 100)
    with pytest.raises(ValueError, match="max_duration=6.5 s is max_frames=650, and max_frames=600"):
        make_loader(out, tok, max_duration=6.5, max_frames=600)
    with pytest.raises(ValueError, match="max_duration must be a finite number of seconds"):
        make_loader(out, tok, max_duration=float("nan"))
    hyper = {"train": {"option": {"ld": {"shards": str(out), "max_duration": 6.5}, "tokenizer": str(tok)}}}
    assert loader_options(hyper, world_size=2).loader_kwargs == {"max_duration": 6.5}


def test_filters_count_every_drop(data):
    _, out, utts, tok = data
    t = load_tokenizer(tok)
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=3000, min_frames=50, max_utt_frames=350,
                         ctc_subsampling=8, max_batch_size=4)
    batches = run(loader)
    expect = Counter()
    for f, text in utts.values():
        n = f.shape[0]
        expect["too_short" if n < 50 else "too_long" if n > 350 else
               "ctc_too_short" if n // 8 <= len(t.encode(text)) else "kept"] += 1
    kept = expect.pop("kept")
    assert loader.stats.dropped == dict(expect) and len(keys_of(batches)) == kept
    assert all(len(b.keys) <= 4 for b in batches)
    assert loader.stats.discarded == 0  # dropped samples are accounted, not discarded
    # Every filter, the CTC rule too (from the labels counted beside the index), acts on the plan:
    # no planned batch loses an utterance later, none comes empty.
    assert loader.source.corpus.plan(0).dropped == dict(expect)
    assert len(batches) == len(loader) == loader.stats.planned_steps and all(len(b.keys) for b in batches)


def test_dev_mode_no_shuffle_once(data):
    _, out, utts, tok = data
    a = run(make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, train=False), epoch=0)
    b = run(make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, train=False), epoch=5)
    assert Counter(keys_of(a)) == Counter(utts.keys()) and keys_of(a) == keys_of(b)


def test_corrupt_shard_warns_counts_and_can_raise(tmp_path, data):
    """Damage that keeps the shard's size and mtime (bit rot, a bad copy) is found while reading."""
    _, out, utts, tok = data
    bad = tmp_path / "bad"
    shutil.copytree(out / "150_inf", bad)
    victim = sorted(bad.glob("data-*.tar"))[1]
    st0 = victim.stat()
    raw = bytearray(victim.read_bytes())
    with tarfile.open(victim) as tf:
        third = [m for m in tf][4]  # the third sample's features member
    raw[third.offset:third.offset + 512] = bytes(512)  # its header zeroed: the tar ends there for a reader
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    loader = make_loader(f"{bad}/data-*.tar", tok, max_frames=2000)
    with pytest.warns(RuntimeWarning, match=victim.name):
        batches = run(loader)
    st = loader.stats
    assert st.corrupt_shards == 1 and st.dropped["corrupt_shard"] > 0
    assert st.utterances + st.dropped["corrupt_shard"] == st.assigned  # nothing unaccounted
    assert len(set(keys_of(batches))) == st.utterances and len(batches) == len(loader)
    with pytest.raises(ShardError, match=victim.name) as raised:
        run(make_loader(f"{bad}/data-*.tar", tok, max_frames=2000, on_error="raise"))
    assert "skipped" not in str(raised.value)  # it was not: training stopped


@pytest.mark.parametrize("change", ["replaced", "truncated", "a byte flipped"])
def test_a_shard_changed_after_indexing_is_refused_at_start(tmp_path, data, change):
    """The stale-index case: one shard swapped for another after packing would yield some
    utterances twice and lose others; it is refused before the first batch, by name."""
    _, out, utts, tok = data
    copy = tmp_path / "copy"
    shutil.copytree(out / "150_inf", copy)
    a, b = sorted(copy.glob("data-*.tar"))[:2]
    if change == "replaced":
        shutil.copyfile(b, a)
    elif change == "truncated":
        a.write_bytes(a.read_bytes()[:-1024])
    else:  # the same size, another time (a shard only touched loads: checked by its content)
        raw = bytearray(a.read_bytes())
        raw[1500] ^= 1
        a.write_bytes(bytes(raw))
    with pytest.raises(StaleIndexError, match=f"{a.name} changed since it was indexed.*wdsprep index --refresh"):
        make_loader(f"{copy}/data-*.tar", tok, max_frames=2000)


def test_pattern_matching_nothing_is_an_error(data, tmp_path):
    _, _, _, tok = data
    with pytest.raises(FileNotFoundError, match="matches no file"):
        make_loader(f"{tmp_path}/nothing-*.tar", tok, max_frames=100)


def test_fewer_batches_than_ranks_is_an_error(data):
    _, out, _, tok = data
    with pytest.raises(ValueError, match="batches in an epoch for 40 ranks"):
        make_loader(f"{out}/0_150/data-00000.tar", tok, max_frames=100_000, rank=0, world_size=40)


def test_one_shard_for_two_ranks_and_workers(data):
    """One shard, one stream: rank 0 owns it, rank 1 is given half its batches (and reads it too)."""
    _, out, utts, tok = data
    shard = str(sorted(out.glob("0_150/data-*.tar"))[0])
    loaders = [make_loader(shard, tok, max_frames=600, num_workers=2, rank=r, world_size=2) for r in range(2)]
    got = [keys_of(run(loader)) for loader in loaders]
    assert len(loaders[0]) == len(loaders[1]) == loaders[0].stats.steps == loaders[1].stats.steps > 0
    assert not set(got[0]) & set(got[1]) and len(got[0] + got[1]) == len(set(got[0] + got[1]))
    assert loaders[0].stats.discarded == loaders[1].stats.discarded <= max(len(b) for b in got)


def test_import_wdsprep_does_not_import_torch():
    code = "import sys, wdsprep; assert 'torch' not in sys.modules; wdsprep.make_loader; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_full_gc_pass_walks_only_what_was_made_after_the_loader(data):
    """torch's ~170k long-lived objects are frozen once, so CPython's full collection, which the
    loader's allocation triggers every so often, no longer walks them (it cost ~80-150 ms)."""
    _, out, _, tok = data
    code = f"""
import gc, json, wdsprep
loader = wdsprep.make_loader("{out}/*/data-*.tar", "{tok}", max_frames=2000, num_workers=1)
for e in range(3):
    loader.set_epoch(e)
    for b in loader:
        pass
print(json.dumps([gc.get_freeze_count(), len(gc.get_objects())]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    frozen, tracked = json.loads(r.stdout.strip().splitlines()[-1])
    assert frozen > 50_000 and tracked < frozen / 4, (frozen, tracked)


def _samples(seed=0, n=7):
    """(uttid, features, labels) of n utterances, features read-only views like a pipe shard's, and
    their block."""
    from wdsprep.format.records import Records

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        dtype = np.float16 if i % 2 else np.float32
        raw = rng.standard_normal((int(rng.integers(1, 30)), 3)).astype(dtype).tobytes()
        label = rng.integers(2, 50, int(rng.integers(0, 6))).tolist()
        out.append((f"u{i}", np.frombuffer(raw, dtype).reshape(-1, 3), label))
    return out, Records.of((u, f, "x") for u, f, _ in out).with_labels([labels for *_, labels in out])


@pytest.mark.parametrize("shared", [False, True])
def test_collate_one_buffer_padded_right(shared):
    from wdsprep.loading.collate import collate, unpack

    samples, rows = _samples()
    p = collate(rows, shared=shared)
    b = unpack(p)
    assert p.buf.untyped_storage().is_shared() == shared  # shared: a worker sends a handle, not a copy
    for t in b[:4]:
        assert t.untyped_storage().data_ptr() == p.buf.untyped_storage().data_ptr()
    by_key = {u: (f, labels) for u, f, labels in samples}
    assert sorted(b.keys) == sorted(by_key) and list(b.feat_lens) == sorted(b.feat_lens.tolist(), reverse=True)
    for i, k in enumerate(b.keys):
        (feats, labels), n, u = by_key[k], int(b.feat_lens[i]), int(b.label_lens[i])
        np.testing.assert_array_equal(b.feats[i, :n].numpy(), feats.astype(np.float32))
        assert (b.feats[i, n:] == 0).all() and b.labels[i, :u].tolist() == labels
        assert (b.labels[i, u:] == LABEL_PAD).all()


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_buffers_recycled_only_after_the_trainer_drops_them(data, workers):
    """Batches kept by the trainer stay intact while the pool recycles the dropped ones (workers or not)."""
    _, out, utts, tok = data
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, num_workers=workers)
    loader.set_epoch(0)
    kept, copies = [], []
    for i, b in enumerate(loader):
        copies.append(Batch(*(t.clone() for t in b[:4]), b.keys))
        if i % 3 == 0:
            kept.append((i, b))
    check_batches(copies, utts, tok, max_frames=1500)
    for i, b in kept:
        assert b.keys == copies[i].keys and all(x.equal(y) for x, y in zip(b[:4], copies[i][:4]))


def test_shm_pool_reuses_a_slot_only_when_freed():
    import torch.multiprocessing as mp

    from wdsprep.loading.transport import POOL_SLOTS, ShmPool

    flags = mp.RawArray("b", 2 * POOL_SLOTS)
    pool = ShmPool(flags, worker=1)
    bufs = [pool.alloc(1000) for _ in range(POOL_SLOTS)]
    assert [j for _, j in bufs] == list(range(POOL_SLOTS)) and list(flags[POOL_SLOTS:]) == [1] * POOL_SLOTS
    extra, j = pool.alloc(1000)  # all busy: a fresh unpooled buffer, no waiting
    assert j == -1 and extra.untyped_storage().is_shared()
    flags[POOL_SLOTS + 2] = 0  # the main process hands slot 2 back
    again, j = pool.alloc(900)
    assert j == 2 and again.data_ptr() == bufs[2][0].data_ptr() and again.numel() == 900
    flags[POOL_SLOTS + 2] = 0
    bigger, j = pool.alloc(5000)  # too small: that slot grows
    assert j == 2 and bigger.numel() == 5000 and list(flags[:POOL_SLOTS]) == [0] * POOL_SLOTS


def test_shm_pool_sends_a_buffer_once_per_epoch_and_again_when_regrown():
    import torch.multiprocessing as mp

    from wdsprep.loading.collate import Packed
    from wdsprep.loading.transport import POOL_SLOTS, ShmPool

    flags = mp.RawArray("b", POOL_SLOTS)
    pool = ShmPool(flags, worker=0)
    pool.begin()

    def send(nbytes):
        buf, j = pool.alloc(nbytes)
        flags[j] = 0  # handed straight back, so slot 0 is taken every time
        return pool.outgoing(Packed(buf, (1, 1, 1, 1), ["k"], j))

    first, second = send(100), send(100)
    assert first.buf is not None and second.buf is None and first.gen == second.gen == 1
    grown = send(10_000)  # a new buffer: sent, with a new generation
    assert grown.buf is not None and grown.gen == 2 and send(100).buf is None
    pool.begin()  # next epoch: the main process may have missed a send (drained), so send again
    assert send(100).buf is not None and send(100).gen == 2
    unpooled = Packed(pool.alloc(10)[0], (1, 1, 1, 1), ["k"])
    assert pool.outgoing(unpooled) is unpooled


def test_shm_pool_frees_slots_filled_for_drained_batches():
    """Slots taken after the main process's epoch start (same serial) held discarded batches."""
    import torch.multiprocessing as mp

    from wdsprep.loading.transport import POOL_SLOTS, ShmPool

    flags, serial = mp.RawArray("b", POOL_SLOTS), mp.RawValue("q", 1)
    pool = ShmPool(flags, worker=0, serial=serial)
    pool.begin()
    _, held = pool.alloc(100)  # epoch 1: the trainer keeps this one
    serial.value = 2  # the main process starts epoch 2 (and frees every slot it does not hold) ...
    _, drained = pool.alloc(100)  # ... while the worker still fills a batch of epoch 1
    pool.begin()
    assert (held, drained) == (0, 1) and list(flags[:2]) == [1, 0]

def _same(a, b):
    return [x.keys for x in a] == [y.keys for y in b] and all(
        all(s.equal(t) for s, t in zip(x[:4], y[:4])) for x, y in zip(a, b))


def test_persistent_workers_give_each_epoch_the_fresh_loader_batches(data):
    """One loader's workers live through epochs 0-2; each epoch equals a fresh loader's (keys and tensors)."""
    _, out, utts, tok = data
    pattern = f"{out}/*/data-*.tar"
    loader = make_loader(pattern, tok, max_frames=1500, seed=4, num_workers=2)
    assert loader.persistent_workers
    for epoch in range(3):
        got = run(loader, epoch)
        want = run(make_loader(pattern, tok, max_frames=1500, seed=4, num_workers=2, persistent_workers=False), epoch)
        assert _same(got, want) and Counter(keys_of(got)) == Counter(utts.keys())
        assert loader.stats.utterances == len(utts) and loader.stats.epoch == epoch
    assert not _same(run(loader, 0), run(loader, 1))  # the epoch reached the workers


def test_breaking_out_of_an_epoch_leaves_persistent_workers_usable(data):
    """After a `break` (the DDP quit path too), the next epoch is exactly that epoch's batches."""
    _, out, utts, tok = data
    pattern = f"{out}/*/data-*.tar"
    loader = make_loader(pattern, tok, max_frames=1500, seed=2, num_workers=2)
    loader.set_epoch(0)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert loader.stats.steps == 2 and loader.state_dict()["step"] == 2
    got = run(loader, 1)
    want = run(make_loader(pattern, tok, max_frames=1500, seed=2, num_workers=2), 1)
    assert _same(got, want)
    check_batches(got, utts, tok, max_frames=1500)  # every utterance of epoch 1 once
    assert loader.stats.steps == len(got) and loader.stats.utterances == len(utts)


@pytest.mark.parametrize("workers", [0, 2])
def test_slot_buffers_travel_once_and_held_batches_survive_epochs(data, monkeypatch, workers):
    """Most pooled batches arrive as a slot number; batches held across epochs are never overwritten."""
    from wdsprep.loading.transport import SlotCache

    _, out, utts, tok = data
    sent = Counter()
    real = SlotCache.buffer

    def spy(self, p, worker):
        sent["buffer" if p.buf is not None else "slot number"] += 1
        return real(self, p, worker)

    monkeypatch.setattr(SlotCache, "buffer", spy)
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=600, num_workers=workers)
    kept = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, b in enumerate(loader):
            if i in (0, 5):  # kept while the workers go on through this and later epochs
                kept.append((b, Batch(*(t.clone() for t in b[:4]), b.keys)))
            if epoch == 1 and i == 3:
                break  # cut short: the in-flight batches are drained, their slots handed back
    assert sent["slot number"] > 3 * sent["buffer"] > 0
    for b, copy in kept:
        assert b.keys == copy.keys and all(x.equal(y) for x, y in zip(b[:4], copy[:4]))


def test_slot_cache_refuses_a_stale_buffer():
    import torch

    from wdsprep.loading.collate import Packed
    from wdsprep.loading.collate import alloc_buffer as _alloc
    from wdsprep.loading.transport import SlotCache

    cache = SlotCache(num_workers=1)
    shape = (2, 3, 4, 1)
    with pytest.raises(RuntimeError, match="never arrived"):
        cache.buffer(Packed(None, shape, ["a", "b"], slot=0, gen=1), worker=0)
    buf = _alloc(1000, True)
    buf[:] = 7
    mem, i = cache.buffer(Packed(buf[:144], shape, ["a", "b"], slot=1, gen=1), worker=0)
    again, j = cache.buffer(Packed(None, shape, ["a", "b"], slot=1, gen=1), worker=0)
    assert i == j == 1 and again.data_ptr() == mem.data_ptr() == buf.data_ptr() and again.numel() == 144
    assert again.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    assert torch.equal(again, buf[:144])
    with pytest.raises(RuntimeError, match="generation 1"):  # the worker regrew the slot; its new buffer was lost
        cache.buffer(Packed(None, shape, ["a", "b"], slot=1, gen=2), worker=0)


def test_pinned_batches_are_copies_and_free_their_slots_at_once(data, monkeypatch):
    """With CUDA the main process pins each batch (a copy), so the slot is reusable at once."""
    import torch

    import wdsprep.loader as loader_mod

    _, out, utts, tok = data
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pinned = []
    monkeypatch.setattr(loader_mod, "_pin", lambda t: pinned.append(t.numel()) or t.clone())
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=600, num_workers=2, pin_memory=True)
    batches = run(loader)  # all held: without pinning the pools would run dry
    assert len(pinned) == len(batches)
    assert not any(b.feats.untyped_storage().is_shared() for b in batches)
    check_batches(batches, utts, tok, max_frames=600)
    assert all(f == 0 for f in loader._slots.flags)  # every slot handed back


def test_pin_memory_without_cuda_warns(data, monkeypatch):
    import torch

    _, out, _, tok = data
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="not pinned"):
        make_loader(f"{out}/*/data-*.tar", tok, max_frames=600, pin_memory=True)


def test_resuming_an_older_iteration_is_an_error(data):
    """Persistent workers serve one iteration: an older one resumed must not steal the newer one's batches."""
    _, out, utts, tok = data
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, num_workers=2)
    old = iter(loader)
    next(old)
    new = iter(loader)
    first = next(new)
    with pytest.raises(RuntimeError, match="iterated again"):
        next(old)
    assert Counter(keys_of([first, *new])) == Counter(utts.keys())


@pytest.mark.parametrize("path", ["c", "python", "pipe"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_nan_and_inf_features_never_reach_the_trainer(tmp_path, data, monkeypatch, path, dtype):
    """Shards written by other tools may hold NaN/Inf: pack refuses them, the loader drops and counts them."""
    from shard_helpers import cat_members, write_tar

    from wdsprep.format import native

    _, _, _, tok = data
    rng = np.random.default_rng(0)
    feats = {f"u{i:02d}": rng.standard_normal((20 + i, 4)).astype(dtype) for i in range(12)}
    feats["u03"][5, 1] = np.nan
    feats["u07"][0, 0] = np.inf
    shard = tmp_path / "other" / "data-00000.tar"
    write_tar(shard, cat_members(feats, {u: "the cat" for u in feats}, "cat"))
    if path == "python":
        monkeypatch.setattr(native, "lib", None)
    trset = f"pipe:cat {shard}" if path == "pipe" else str(shard)
    with pytest.warns(UserWarning, match="no index"):
        loader = make_loader(trset, tok, max_frames=100, shuffle_buffer=1)
    with pytest.warns(RuntimeWarning, match="NaN or infinite features in utterance 'u0[37]'.*left out") as seen:
        batches = run(loader)
    assert len([w for w in seen if "NaN" in str(w.message)]) <= 2
    got = keys_of(batches)
    assert sorted(got) == sorted(set(feats) - {"u03", "u07"})
    assert all(bool(b.feats.isfinite().all()) for b in batches)
    assert loader.stats.dropped == {"nonfinite_features": 2} and len(batches) == len(loader)
    for b in batches:  # a batch that lost a row is still right: every row its own utterance's features
        for i, k in enumerate(b.keys):
            n = int(b.feat_lens[i])
            np.testing.assert_array_equal(b.feats[i, :n].numpy(), feats[k].astype(np.float32))
    with pytest.warns(UserWarning, match="no index"):
        strict = make_loader(trset, tok, max_frames=100, shuffle_buffer=1, on_error="raise")
    with pytest.raises(ShardError, match="NaN or infinite features in utterance 'u0[37]'"):
        run(strict)


def test_each_worker_returns_its_free_heap_when_its_epoch_ends(data, tmp_path, monkeypatch):
    """Workers fork from this process, so they inherit the stand-in: one call per worker per epoch."""
    from wdsprep.loading import stream

    _, out, utts, tok = data

    def count_call() -> None:
        with open(tmp_path / f"{os.getpid()}", "a") as f:
            f.write("x")

    monkeypatch.setattr(stream, "_return_free_heap", count_call)
    loader = make_loader(f"{out}/{{0_150,150_inf}}/data-*.tar", tok, max_frames=1500, num_workers=2,
                         streams=2)
    for epoch in range(2):
        assert len(keys_of(run(loader, epoch))) == len(utts)
    calls = sorted(p.read_text() for p in tmp_path.iterdir())
    assert calls == ["xx", "xx"] and str(os.getpid()) not in {p.name for p in tmp_path.iterdir()}


def test_returning_the_free_heap_gives_its_holes_back():
    """What the workers' trim relies on: freed blocks below the mmap threshold stay resident until
    the trim (the last block kept, so the heap's top cannot shrink by itself)."""
    from wdsprep.loading.stream import _malloc_trim

    if _malloc_trim() is None or not os.path.exists("/proc/self/status"):
        pytest.skip("glibc's malloc_trim and /proc are Linux's")
    code = """if True:
        import ctypes
        from wdsprep.loading.stream import _return_free_heap
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        def rss():
            return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        blocks = [libc.malloc(100_000) for _ in range(400)]
        for b in blocks:
            ctypes.memset(b, 1, 100_000)
        for b in blocks[:-1]:
            libc.free(b)
        before = rss()
        _return_free_heap()
        print(before - rss())
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(r.stdout) >= 30, r.stdout  # MB of the 38 freed
