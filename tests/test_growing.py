"""Training while a pack writes its shards, and packs that resume where they stopped (issue 28).

The packs run for real in processes of their own: in the background while a loader with
``growing=True`` trains epochs (in this process, and under torchrun with 2 ranks and gloo), and
SIGKILLed at chosen file operations before ``--resume`` finishes them.  What is checked is what the
issue asks: each epoch reads every utterance of the shards published when it started, once (at
most one batch per rank left over) and nothing else; once the pack is complete an epoch is an
ordinary loader's; a resumed pack's shards are byte-identical to an uninterrupted one's, and those
published before a kill are never rewritten.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from shardsets import make_kaldi_dir, train_char_tokenizer

from wdsprep import inspect_shards, make_loader, pack_data, verify_shards
from wdsprep.errors import DataError
from wdsprep.format.commit import PLAN_NAME, UncommittedPackError, published_count, read_plan
from wdsprep.format.index import DamagedIndexError, entry_dir, read_index
from wdsprep.format.keys import decode_key
from wdsprep.plan.state import StateError

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEMO = REPO / "egs" / "demo"
GROUPS = ["0:150", "150:"]
TIMEOUT = 180

# A pack in a process of its own; with "kill": [op, pattern, n] it SIGKILLs itself at the n-th call
# of os.<op> on a file whose name (source or destination) matches the pattern (in a worker process
# too: a forked worker inherits the patch, and kills itself, not the pack).
CHILD = r"""
import fnmatch, json, os, signal, sys
spec = json.loads(sys.argv[1])
if spec.get("kill"):
    op, pattern, n = spec["kill"]
    real, calls = getattr(os, op), [0]
    def deadly(*args, **kw):
        names = [os.path.basename(os.fspath(a)) for a in args[:2]]
        if any(fnmatch.fnmatch(name, pattern) for name in names):
            calls[0] += 1
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kw)
    setattr(os, op, deadly)
import wdsprep
getattr(wdsprep, spec["fn"])(**spec["kwargs"])
"""


def start_pack(fn: str, kwargs: dict, *, kill: list | None = None, cwd: Path | None = None) -> subprocess.Popen:
    spec = json.dumps({"fn": fn, "kwargs": kwargs, "kill": kill})
    return subprocess.Popen([sys.executable, "-c", CHILD, spec], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def run_pack(fn: str, kwargs: dict, *, kill: list | None = None) -> subprocess.CompletedProcess:
    proc = start_pack(fn, kwargs, kill=kill)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the pack hung for {TIMEOUT} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def kaldi(tmp_path_factory):
    """460 utterances: 47 shards of 10 in two length groups."""
    root = tmp_path_factory.mktemp("growing")
    utts = make_kaldi_dir(root / "kaldi", 460, seed=5)
    return root, root / "kaldi", utts, train_char_tokenizer(root, root / "kaldi" / "text")


def pack_kwargs(kd: Path, out: Path, **kw) -> dict:
    return {"f_scps": str(kd / "feats.scp"), "f_labels": str(kd / "text"), "d_out": str(out),
            "filter_group": GROUPS, "utts_per_shard": 10, "progress": False, **kw}


@pytest.fixture(scope="module")
def stopped(kaldi):
    """A pack SIGKILLed when publishing its 15th shard: 14 published, the 15th under its final name
    but not published (a copy of this folder is what a test gets)."""
    root, kd, utts, tok = kaldi
    out = root / "stopped"
    r = run_pack("pack_data", pack_kwargs(kd, out), kill=["rename", ".tmp-*", 15])
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    return out


def copy_of(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)  # copy2: modification times kept, as the index wants them
    return dest


def shard_bytes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*/data-*.tar"))}


def published_mtimes(d: Path) -> dict[Path, int]:
    """Every published shard's modification time."""
    out = {}
    for folder in (p for p in d.iterdir() if p.is_dir()):
        index = read_index(folder)
        for name in index.names if index is not None else []:
            out[folder / name] = (folder / name).stat().st_mtime_ns
    return out


def view_utterances(d: Path, published: dict[str, int]) -> set[str]:
    """The utterances of the shards a view counts (folders not in it: all of theirs), from the
    finished folder's index."""
    out = set()
    for folder in (p for p in d.iterdir() if p.is_dir()):
        index = read_index(folder)
        n = published.get(str(folder), len(index.names))
        out.update(decode_key(k) for k in index.keys()[:int(index.starts[n])])
    return out


# -- resume -------------------------------------------------------------------------------------------


def test_sigkilled_packs_resume_to_the_bytes_of_an_uninterrupted_pack(kaldi, tmp_path):
    """Killed five times at different points (publishing a shard's entry, naming a shard, a worker
    writing one, writing the report, removing the entries after it), each time resumed: the shards
    are those of a pack never interrupted, byte for byte, the ones published before each kill keep
    their modification times, and the index and report are the same too."""
    root, kd, utts, tok = kaldi
    whole = tmp_path / "whole"
    pack_data(**pack_kwargs(kd, whole), nj=2)
    out = tmp_path / "out"
    kills = [  # (os call, name pattern, n, workers, how it ends)
        ("rename", ".tmp-*", 4, 1, -signal.SIGKILL),  # the 4th shard named, its entry not yet published
        ("replace", "data-*.tar", 9, 2, -signal.SIGKILL),  # naming a shard
        ("replace", "..w*.tar.tmp", 5, 2, 1),  # a worker dies writing a shard: the pack stops, says so
        ("replace", "pack_report.json", 1, 1, -signal.SIGKILL),  # every shard published, the report not
        ("rename", ".index.parts", 1, 1, -signal.SIGKILL),  # report written, entries being removed
    ]
    kept: dict[Path, int] = {}
    for k, (op, pattern, n, nj, code) in enumerate(kills):
        r = run_pack("pack_data", pack_kwargs(kd, out, nj=nj, resume=k > 0), kill=[op, pattern, n])
        assert r.returncode == code, f"kill {k}: {r.returncode} {r.stderr[-2000:]}"
        if code == 1:
            assert "worker process died" in r.stderr and "--resume" in r.stderr, r.stderr[-2000:]
        now = published_mtimes(out)
        assert {p: now.get(p) for p in kept} == kept, f"kill {k}: a shard published before was rewritten or lost"
        kept.update(now)
    assert len(kept) == read_plan(out).shards  # the last kills came after every shard was published
    r = subprocess.run([sys.executable, "-m", "wdsprep", "pack", "--scp", str(kd / "feats.scp"), "--text",
                        str(kd / "text"), "--out", str(out), "--filter-group", *GROUPS, "--utts-per-shard", "10",
                        "--resume"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert shard_bytes(out) == shard_bytes(whole) and len(shard_bytes(out)) >= 40
    assert published_mtimes(out) == kept
    for folder in ("0_150", "150_inf"):
        a, b = (json.loads((d / folder / "index.json").read_text()) for d in (out, whole))
        for doc in (a, b):
            for s in doc["shards"]:
                s.pop("mtime_ns")
        assert a == b
        for name in ("index.frames.npy", "index.keys.txt", "index.speakers.npy"):
            assert (out / folder / name).read_bytes() == (whole / folder / name).read_bytes()
        assert not (out / folder / ".index.parts").exists()
    assert json.loads((out / "pack_report.json").read_text()) == json.loads((whole / "pack_report.json").read_text())
    assert verify_shards(f"{out}/*/data-*.tar").ok


def test_resume_with_other_inputs_or_options_is_refused_naming_what_differs(kaldi, stopped, tmp_path):
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    with pytest.raises(DataError, match=r"--utts-per-shard 11 \(the pack started with --utts-per-shard 10\)"):
        pack_data(**pack_kwargs(kd, out, utts_per_shard=11, resume=True))
    text = tmp_path / "text"
    text.write_text((kd / "text").read_text().replace("cat", "dog", 1))
    with pytest.raises(DataError, match=f"text {text} differs from the one the pack started with"):
        pack_data(**{**pack_kwargs(kd, out, resume=True), "f_labels": str(text)})
    r = subprocess.run([sys.executable, "-m", "wdsprep", "pack", "--scp", str(kd / "feats.scp"), "--text",
                        str(kd / "text"), "--out", str(out), "--utts-per-shard", "10", "--resume"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 1 and "no --filter-group (the pack started with --filter-group 0:150 150:)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(FileExistsError, match="--resume"):
        pack_data(**pack_kwargs(kd, out))
    with pytest.raises(ValueError, match="give one"):
        pack_data(**pack_kwargs(kd, out, resume=True, overwrite=True))
    # a published shard changed by hand is never rewritten: the resume stops, naming it
    shard = out / "0_150" / "data-00001.tar"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=f"{shard}: published .* changed since"):
        pack_data(**pack_kwargs(kd, out, resume=True))


def test_a_second_pack_into_a_folder_being_packed_is_refused(kaldi, tmp_path):
    from wdsprep.pack.output import lock_folder

    root, kd, utts, tok = kaldi
    out = tmp_path / "out"
    out.mkdir()
    lock = lock_folder(out)  # what a running pack holds
    try:
        for kw in ({"resume": True}, {"overwrite": True}, {}):
            with pytest.raises(FileExistsError, match="another pack is writing there now"):
                pack_data(**pack_kwargs(kd, out, **kw))
    finally:
        os.close(lock)
    pack_data(**pack_kwargs(kd, out, utts_per_shard=100))


def test_resume_of_a_complete_pack_only_reports_it(kaldi, tmp_path):
    root, kd, utts, tok = kaldi
    out = tmp_path / "out"
    first = pack_data(**pack_kwargs(kd, out, utts_per_shard=100))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = pack_data(**pack_kwargs(kd, out, utts_per_shard=100, resume=True))
    assert again.to_json() == first.to_json()
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


# -- the growing loader -------------------------------------------------------------------------------


def test_a_growing_folder_is_refused_without_growing_and_read_as_published_with_it(kaldi, stopped, tmp_path):
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    pattern = f"{out}/*/data-*.tar"
    with pytest.raises(UncommittedPackError, match=r"0_150: .*5 of 17 shards are published so far.*growing=True"):
        make_loader(pattern, tok, max_frames=3000)
    # the 15th shard got its final name, but no entry: not published, never read
    assert (out / "150_inf" / "data-00009.tar").exists() or (out / "0_150" / "data-00005.tar").exists()
    loader = make_loader(pattern, tok, max_frames=3000, growing=True)
    loader.set_epoch(0)
    keys = [k for b in loader for k in b.keys]
    expected = {decode_key(k) for d in ("0_150", "150_inf") for k in read_index(out / d).keys()}
    assert Counter(keys) == Counter(expected) and len(keys) == 140
    g = loader.stats.growing
    assert (g["complete"], g["shards"], g["shards_final"], g["utterances"], g["utterances_final"]) == \
        (False, 14, 47, 140, 460)
    # inspect and verify see the published shards and say the folder is growing
    seen = inspect_shards(pattern, max_frames_list=[])
    assert seen.utts == 140 and all("still being packed" in n for n in seen.notes) and len(seen.notes) == 2
    v = verify_shards(pattern, growing=True)
    assert v.ok and v.samples == 140 and "OK so far" in v.format(), v.format()
    # dry-run --plan says how much of the final corpus the epoch covers
    r = subprocess.run([sys.executable, "-m", "wdsprep", "dry-run", "--plan", "--trset", pattern, "--max-frames",
                        "3000", "--growing"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "growing (2 folder(s) still being packed): 14 of 47 shards, 140 of 460 " \
                                  "utterances (30.4% of the final corpus)" in r.stdout, r.stdout + r.stderr


def test_a_damaged_published_entry_is_named(kaldi, stopped, tmp_path):
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    bad = entry_dir(out / "0_150", 2) / "index.frames.npy"
    bad.write_bytes(bad.read_bytes()[:-4])
    with pytest.raises(DamagedIndexError, match=str(bad)):
        make_loader(f"{out}/*/data-*.tar", tok, max_frames=3000, growing=True)


def test_the_first_epoch_waits_for_min_shards(kaldi, stopped, tmp_path):
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    pattern = f"{out}/*/data-*.tar"
    with pytest.raises(ValueError, match="growing=True"):
        make_loader(pattern, tok, max_frames=3000, min_shards=3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"14 shards .* waits for 40 shard\(s\) .*--resume.*wait_timeout"):
        make_loader(pattern, tok, max_frames=3000, growing=True, min_shards=40, wait_timeout=1.5)
    assert time.monotonic() - t0 < 20
    # the pack goes on meanwhile: the loader starts once 40 shards are published
    done: list = []
    worker = threading.Thread(target=lambda: done.append(pack_data(**pack_kwargs(kd, out, resume=True))))
    worker.start()
    try:
        loader = make_loader(pattern, tok, max_frames=3000, growing=True, min_shards=40, wait_timeout=60)
    finally:
        worker.join(timeout=TIMEOUT)
    assert done and loader.source.coverage["shards"] >= 40


def test_resume_plans_the_saved_epoch_over_the_shards_published_then(kaldi, stopped, tmp_path):
    """A state saved mid-epoch on the stopped pack; the pack then finishes.  A loader resumed from
    it, on 1 rank or 2, yields exactly the rest of that epoch's plan (nothing of the shards published
    since); the next epoch is planned over the finished folder, as an ordinary loader's."""
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    pattern = f"{out}/*/data-*.tar"
    kw = dict(max_frames=2000, seed=3, shuffle_buffer=20, streams=4)
    first = make_loader(pattern, tok, growing=True, **kw)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it).keys for _ in range(3)]
    state = first.state_dict()
    rest = [b.keys for b in it]
    assert not {k for b in head for k in b} & {k for b in rest for k in b}
    assert state["published"] == {str(out / "0_150"): 5, str(out / "150_inf"): 9}
    assert json.loads(json.dumps(state)) == state
    pack_data(**pack_kwargs(kd, out, resume=True))
    again = make_loader(pattern, tok, growing=True, **kw)
    again.load_state_dict(state)
    again.set_epoch(2)
    assert len(again) == len(head) + len(rest) and [b.keys for b in again] == rest
    halves = [make_loader(pattern, tok, growing=True, rank=r, world_size=2, **kw) for r in range(2)]
    for h in halves:
        h.load_state_dict(state)
    got = [list(b.keys) for h in halves for b in h]
    assert len({len(h) for h in halves}) == 1
    assert not Counter(k for b in got for k in b) - Counter(k for b in rest for k in b)  # none but the rest's
    assert len([b for b in rest if list(b) not in got]) < 2  # at most one batch per rank left over
    # the next epoch: the finished folder, planned as an ordinary loader plans it
    again.set_epoch(3)
    ordinary = make_loader(pattern, tok, **kw)
    ordinary.set_epoch(3)
    assert [b.keys for b in again] == [b.keys for b in ordinary] and again.stats.growing["complete"]
    # a state naming more shards than were ever published, or damaged, is refused naming it
    for bad, match in (({str(out / "0_150"): 99}, "99 shards were published"), ([1], "published must be an object"),
                       ({str(out / "0_150"): -1}, "published.*-1")):
        fresh = make_loader(pattern, tok, growing=True, **kw)
        with pytest.raises((StateError, DataError), match=match):
            fresh.load_state_dict({**state, "published": bad})


def test_a_growing_corpus_mixes_with_finished_ones(kaldi, stopped, tmp_path):
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    other = tmp_path / "other"
    pack_data(**pack_kwargs(kd, other, utts_per_shard=40, filter_group=None))
    trset = {"grow": f"{out}/*/data-*.tar", "done": f"{other}/data-*.tar"}
    kw = dict(max_frames=2000, seed=1, weights={"grow": 1, "done": 1}, steps_per_epoch=12)
    loader = make_loader(trset, tok, growing=True, **kw)
    published = {decode_key(k) for d in ("0_150", "150_inf") for k in read_index(out / d).keys()}
    loader.set_epoch(0)
    batches = list(loader)
    grown = [k for b in batches for k, c in zip(b.keys, b.corpus.tolist()) if c == 0]
    assert grown and set(grown) <= published and len(grown) == len(set(grown))
    state = loader.state_dict()
    pack_data(**pack_kwargs(kd, out, resume=True))
    loader.set_epoch(1)
    assert loader.stats.growing is not None
    it = iter(loader)
    next(it)
    mid = loader.state_dict()
    rest = [b.keys for b in it]
    assert loader.stats.growing["complete"]
    resumed = make_loader(trset, tok, growing=True, **kw)
    resumed.load_state_dict(mid)
    resumed.set_epoch(1)
    assert [b.keys for b in resumed] == rest
    assert state["published"] != mid["published"]


def test_a_loader_trains_epochs_while_pack_audio_writes_the_shards(tmp_path):
    """pack-audio on the bundled corpus in the background, 44 shards: its first shard is published
    before the features of the later ones are computed (no ark of the corpus anywhere), and a
    growing loader trains epoch after epoch meanwhile: each reads exactly the shards published when
    it started; once the pack is complete, an epoch is an ordinary loader's."""
    tok = train_char_tokenizer(tmp_path, DEMO / "data" / "train" / "text")
    out = tmp_path / "shards"
    kwargs = {"wav_scp": str(DEMO / "data/train/wav.scp"), "f_labels": str(DEMO / "data/train/text"),
              "d_out": str(out), "filter_group": ["0:200", "200:"], "utts_per_shard": 4, "progress": False,
              "utt2spk": str(DEMO / "data/train/utt2spk")}
    proc = start_pack("pack_audio", kwargs, cwd=DEMO)
    try:
        deadline = time.monotonic() + TIMEOUT
        while published_count(out / "0_200") < 1:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no shard published"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)  # the pack holds still while epoch 0 is planned and read
        plan = read_plan(out)
        assert plan.shards >= 40
        published = sum(published_count(out / f) for f in plan.folders)
        assert 1 <= published < plan.shards - 5
        assert not list(out.rglob("*.ark")) and not (out / ".features").exists()
        loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=2000, seed=4, growing=True)
        epochs = []
        deadline = time.monotonic() + TIMEOUT
        for epoch in itertools.count():  # until the pack is complete: as many epochs as it takes
            assert time.monotonic() < deadline, "the pack did not finish"
            loader.set_epoch(epoch)
            steps = len(loader)
            keys = [k for b in loader for k in b.keys]
            state = loader.state_dict()
            epochs.append((state["published"], keys, steps, loader.stats.steps, dict(loader.stats.growing)))
            if epoch == 0:
                os.kill(proc.pid, signal.SIGCONT)
            if loader.stats.growing["complete"]:
                break
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    growing = [e for e in epochs if not e[4]["complete"]]
    assert len(growing) >= 1 and epochs[-1][4]["complete"]
    last = -1
    for view, keys, steps, yielded, g in epochs:
        expected = view_utterances(out, view)
        assert Counter(keys) == Counter(expected), "an epoch reads exactly the shards published when it started"
        assert steps == yielded > 0
        assert g["utterances"] == len(expected) and g["shards_final"] == plan.shards
        assert g["utterances"] >= last
        last = g["utterances"]
    ordinary = make_loader(f"{out}/*/data-*.tar", tok, max_frames=2000, seed=4)
    ordinary.set_epoch(len(epochs) - 1)
    assert [list(b.keys) for b in ordinary] == _batches_of(loader, len(epochs) - 1)


def _batches_of(loader, epoch: int) -> list[list[str]]:
    loader.set_epoch(epoch)
    return [list(b.keys) for b in loader]


@pytest.mark.slow
def test_growing_loader_under_torchrun_with_two_ranks(tmp_path):
    """The same under torchrun (2 ranks, gloo), the pack held still until epoch 0 is planned: every
    rank plans every epoch over rank 0's view; together they yield the planned batches of that view,
    each once, at most one per rank left over, nothing of a later shard; the last epoch, over the
    finished folder, is an ordinary loader's."""
    from test_ddp import check_epoch, run_torchrun

    tok = train_char_tokenizer(tmp_path, DEMO / "data" / "train" / "text")
    out = tmp_path / "shards"
    kwargs = {"wav_scp": str(DEMO / "data/train/wav.scp"), "f_labels": str(DEMO / "data/train/text"),
              "d_out": str(out), "filter_group": ["0:200", "200:"], "utts_per_shard": 4, "progress": False}
    proc = start_pack("pack_audio", kwargs, cwd=DEMO)
    dumps = tmp_path / "ranks"
    try:
        deadline = time.monotonic() + TIMEOUT
        while published_count(out / "0_200") < 6:  # enough for a batch on each rank
            assert proc.poll() is None and time.monotonic() < deadline, "no shard published"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)

        def release() -> None:  # the pack goes on once epoch 0 is planned on the ranks
            until = time.monotonic() + 60
            while not (dumps / "epoch0.planned").exists() and time.monotonic() < until:
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGCONT)

        threading.Thread(target=release, daemon=True).start()
        r = run_torchrun(2, "--trset", f"{out}/*/data-*.tar", "--tokenizer", str(tok), "--out", str(dumps),
                         "--max-frames", "1500", "--growing", "--min-shards", "6", "--until-complete",
                         "--epochs", "400")
        assert r.returncode == 0, r.stderr[-3000:]
        proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
    ranks = [json.loads((dumps / f"rank{r}.json").read_text()) for r in range(2)]
    epochs = list(zip(*(r["epochs"] for r in ranks)))
    assert not epochs[0][0]["stats"]["growing"]["complete"] and epochs[-1][0]["stats"]["growing"]["complete"]
    for e, pair in enumerate(epochs):
        views = [ep["planned"].get("published") for ep in pair]
        assert views[0] == views[1], f"epoch {e}: ranks planned over different shards"
        # the plan of that epoch over that view, on one rank: resumed from the state at its start
        one = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, seed=7, shuffle_buffer=50, growing=True)
        one.load_state_dict(pair[0]["planned"])
        one.set_epoch(e)
        plan = [tuple(sorted(b.keys)) for b in one]
        check_epoch(list(pair), plan)
        assert {k for ep in pair for b in ep["batches"] for k in b} <= view_utterances(out, views[0])
    ordinary = make_loader(f"{out}/*/data-*.tar", tok, max_frames=1500, seed=7, shuffle_buffer=50)
    ordinary.set_epoch(len(epochs) - 1)
    check_epoch(list(epochs[-1]), [tuple(sorted(b.keys)) for b in ordinary])


def test_hyper_ld_growing(tmp_path):
    from wdsprep.hyper import loader_options

    hyper = {"train": {"option": {"ld": {"shards": "x/*/data-*.tar", "growing": "true", "min_shards": 4,
                                         "min_hours": 1.5}, "tokenizer": "t.json", "bucket_size": 4000}}}
    kw = loader_options(hyper, world_size=2).loader_kwargs
    assert (kw["growing"], kw["min_shards"], kw["min_hours"]) == (True, 4, 1.5)
    with pytest.raises(ValueError, match="growing"):
        loader_options({"train": {"option": {"ld": {"shards": "x", "growing": "maybe"}, "tokenizer": "t",
                                             "bucket_size": 4}}}, world_size=1)


def test_plan_file_is_written_before_the_first_shard(kaldi, tmp_path):
    """The plan says, before any shard is written, what every folder will hold."""
    root, kd, utts, tok = kaldi
    out = tmp_path / "out"
    r = run_pack("pack_data", pack_kwargs(kd, out), kill=["rename", ".tmp-*", 1])
    assert r.returncode == -signal.SIGKILL
    plan = read_plan(out)
    assert {f: p.shards for f, p in plan.folders.items()} == {"0_150": 17, "150_inf": 30}
    assert sum(p.utts for p in plan.folders.values()) == 460
    assert json.loads((out / PLAN_NAME).read_text())["options"]["utts_per_shard"] == 10


def test_stats_describe_the_epoch_set_before_it_is_iterated(kaldi, stopped, tmp_path):
    """stats.growing read right after set_epoch is the new epoch's view, not the last one's."""
    root, kd, utts, tok = kaldi
    out = copy_of(stopped, tmp_path / "out")
    loader = make_loader(f"{out}/*/data-*.tar", tok, max_frames=2000, growing=True)
    loader.set_epoch(0)
    assert loader.stats.growing["shards"] == 14 and not loader.stats.growing["complete"]
    assert loader.stats.planned_steps == len(loader) and loader.stats.epoch == 0
    list(loader)
    pack_data(**pack_kwargs(kd, out, resume=True))
    loader.set_epoch(1)
    assert loader.stats.growing["complete"] and loader.stats.growing["shards"] == read_plan(out).shards
    assert loader.stats.epoch == 1 and loader.stats.planned_steps == len(loader)
