"""Multi-rank behaviour for real: torchrun with the gloo backend on CPU, under a timeout.

A hang (e.g. one rank waiting for another forever) fails the test through a timeout instead of
stalling CI.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from audio_shards import audio_like, demo_waves, feature_shards
from shardsets import build, build_multilingual, train_char_tokenizer

from wdsprep import load_tokenizer, make_loader

pytestmark = pytest.mark.slow  # every test here runs torchrun

HERE = Path(__file__).resolve().parent
TIMEOUT = 150


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Two length groups with different shard sizes: 11 shards of uneven frame totals."""
    root = tmp_path_factory.mktemp("ddp")
    out, utts = build(root, n=260, utts_per_shard=29, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return root, out, utts, tok


def run_torchrun(nproc: int, *args: str, script: str = "ddp_worker.py", timeout: float = TIMEOUT
                 ) -> subprocess.CompletedProcess:
    """torchrun of ``script`` (here) in its own session, so a hang kills the whole process group
    (ranks and workers) and fails the test."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / script), *args]
    # The checkout under test first (a worktree's ranks must not import another checkout's wdsprep),
    # then the tests' helpers, then the caller's path.
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun --nproc_per_node={nproc} {script} {' '.join(args)} hung for {timeout}s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(nproc: int, out: Path, trset: str | dict[str, str], tok: Path, *extra: str) -> list[dict]:
    shards = [a for n, p in trset.items() for a in ("--corpus", f"{n}={p}")] if isinstance(trset, dict) else \
        ["--trset", trset]
    proc = run_torchrun(nproc, *shards, "--tokenizer", str(tok), "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def canonical(trset: str, tok: Path, epoch: int, streams: int | None = None, **batching) -> list[tuple[str, ...]]:
    """The epoch's batches on one rank without workers: the plan every topology deals out."""
    batching = batching or {"max_frames": 3000}
    loader = make_loader(trset, tok, seed=7, shuffle_buffer=50, streams=streams, **batching)
    loader.set_epoch(epoch)
    return [tuple(sorted(b.keys)) for b in loader]


def batch_set(batches: list[list[str]]) -> list[tuple[str, ...]]:
    return [tuple(sorted(b)) for b in batches]


def check_epoch(epochs: list[dict], plan: list[tuple[str, ...]]) -> None:
    """Equal steps equal to len(loader); every batch one of the plan's, none twice; at most one
    planned batch per rank left over, and that counted as discarded, alike on every rank."""
    nproc = len(epochs)
    steps = [ep["steps"] for ep in epochs]
    assert len(set(steps)) == 1 and steps[0] > 0, f"unequal steps per rank {steps}"
    assert all(len(ep["batches"]) == ep["len"] == ep["steps"] for ep in epochs)
    got = [b for ep in epochs for b in batch_set(ep["batches"])]
    assert set(got) <= set(plan), "a batch that is not one of the canonical plan's"
    assert len(got) == len(set(got)), "a batch yielded twice"
    keys = Counter(k for b in got for k in b)
    assert max(keys.values()) == 1
    left = set(plan) - set(got)
    assert len(left) < nproc, f"{len(left)} planned batches left over on {nproc} ranks"
    discarded = {ep["stats"]["discarded"] for ep in epochs}
    assert discarded == {sum(len(b) for b in left)}


@pytest.fixture(scope="module")
def three_ranks(uneven, tmp_path_factory):
    """One launch of 3 ranks with 2 workers and 11 streams serves two tests (a launch costs seconds):
    two epochs of the canonical plan, then an epoch in dev mode (``--also``)."""
    _, out, _, tok = uneven
    dev = {"trset": f"{out}/*/data-*.tar", "tokenizer": str(tok),
           "kwargs": {"train": False, "max_frames": 3000, "seed": 7, "shuffle_buffer": 50, "streams": 11}}
    return torchrun(3, tmp_path_factory.mktemp("three"), f"{out}/{{0_150,150_inf}}/data-*.tar", tok, "--num-workers",
                    "2", "--epochs", "2", "--streams", "11", "--also", json.dumps(dev))


# (3, 0) is run by the elastic and cost tests below.
@pytest.mark.parametrize("nproc,workers,streams", [(1, 0, None), (2, 2, None), (3, 2, 11)])
def test_every_rank_yields_len_batches_of_the_canonical_plan(uneven, tmp_path, request, nproc, workers, streams):
    """11 uneven shards: whatever the world size and workers, the batches are the plan's; steps are
    equal by construction (no per-step collective), and at most one batch per rank is left over.
    Each rank's batches, in order, are those a loader of that rank yields in this process: a run
    repeats them exactly."""
    _, out, utts, tok = uneven
    trset = f"{out}/{{0_150,150_inf}}/data-*.tar"
    if nproc == 3:
        ranks = request.getfixturevalue("three_ranks")
    else:
        ranks = torchrun(nproc, tmp_path / "o", trset, tok, "--num-workers", str(workers), "--epochs", "2")
    plans = [canonical(trset, tok, e, streams) for e in range(2)]
    for e in range(2):
        check_epoch([r["epochs"][e] for r in ranks], plans[e])
    assert plans[0] != plans[1]  # a new epoch, new batches
    if nproc == 2:
        for r, rank in enumerate(ranks):
            loader = make_loader(trset, tok, max_frames=3000, seed=7, shuffle_buffer=50, rank=r, world_size=nproc,
                                 num_workers=workers)
            loader.set_epoch(0)
            assert rank["epochs"][0]["batches"] == [list(b.keys) for b in loader]


def test_elastic_resume_continues_the_plan_on_other_topologies(uneven, tmp_path):
    """A checkpoint holds rank 0's state_dict(); jobs of other world sizes and worker counts, one
    after another (3 ranks, then 2 with workers, then 3), each yield exactly planned batches not
    yielded yet, dealt over their ranks with equal steps, until the epoch is done."""
    _, out, utts, tok = uneven
    trset = f"{out}/*/data-*.tar"
    common = ["--epochs", "1", "--streams", "6"]
    plan = canonical(trset, tok, 0, 6)
    runs: list[list[int]] = []
    done: list[tuple[str, ...]] = []
    state = None
    for i, (nproc, workers, stop) in enumerate([(3, 0, 3), (2, 2, 2), (3, 0, None)]):
        extra = (["--save-at", str(stop)] if stop else []) + (["--resume", str(state)] if state else [])
        eps = [r["epochs"][0] for r in torchrun(nproc, tmp_path / f"run{i}", trset, tok, "--num-workers",
                                                  str(workers), *extra, *common)]
        before = sum(run[2] for run in runs)
        assert len({ep["len"] for ep in eps}) == 1 and all(ep["epoch_len"] == before + ep["len"] for ep in eps)
        steps = stop or eps[0]["len"]
        assert all(len(ep["batches"]) == steps for ep in eps)
        got = [bt for ep in eps for bt in batch_set(ep["batches"])]
        assert not set(got) & set(done), "a batch trained twice"
        done += got
        runs.append([nproc, workers, steps])
        if stop:
            saved = eps[0]["saved"]
            assert (saved["epoch"], saved["step"], saved["position"]) == (0, before + stop, {"runs": runs})
            state = tmp_path / f"state{i}.json"
            state.write_text(json.dumps(saved))
    assert all(ep["state"]["position"] == {"runs": runs} for ep in eps)
    assert set(done) <= set(plan) and len(set(plan) - set(done)) < 3  # nothing skipped beyond one batch per rank


def test_cost_sized_batches_keep_the_plans_guarantees_on_every_topology(uneven, tmp_path):
    """Batches cut by a cost model that counts label tokens: on 3 ranks with workers the batches
    are the canonical plan's, steps equal; the state at step 2, resumed on 2 ranks, gives the rest
    of the plan, nothing twice."""
    _, out, utts, tok = uneven
    trset = f"{out}/*/data-*.tar"
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"subsampling": 4, "per_frame": 64, "per_frame2": 1, "per_token": 20}))
    batching = ["--max-frames", "0", "--cost", str(cost), "--max-cost", "60000", "--streams", "6", "--epochs", "1"]
    plan = canonical(trset, tok, 0, 6, cost=str(cost), max_cost=60000)
    assert plan != canonical(trset, tok, 0, 6)  # cut otherwise than by frames
    whole = torchrun(3, tmp_path / "w", trset, tok, "--num-workers", "2", "--record-at", "2", *batching)
    check_epoch([r["epochs"][0] for r in whole], plan)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(whole[0]["epochs"][0]["saved"]))
    b = torchrun(2, tmp_path / "b", trset, tok, "--resume", str(state), *batching)
    done = [bt for r in whole for bt in batch_set(r["epochs"][0]["batches"][:2])]
    later = [bt for r in b for bt in batch_set(r["epochs"][0]["batches"])]
    assert len(done) == 6 and not set(done) & set(later) and set(done) | set(later) <= set(plan)
    assert len(set(plan) - set(done) - set(later)) < 2


def test_dev_mode_reads_each_utterance_once(uneven, three_ranks):
    """Every utterance once over the ranks; each rank's batches, in order, are those its dev loader
    yields in this process (a training loader's would be other batches)."""
    _, out, utts, tok = uneven
    seen = Counter(k for r in three_ranks for b in r["also"]["batches"] for k in b)
    assert set(seen) == set(utts) and max(seen.values()) == 1
    assert all(r["also"]["len"] == len(r["also"]["batches"]) for r in three_ranks)
    for r, rank in enumerate(three_ranks):
        alone = make_loader(f"{out}/*/data-*.tar", tok, train=False, max_frames=3000, seed=7, streams=11, rank=r,
                            world_size=3, num_workers=2)
        alone.set_epoch(0)
        assert rank["also"]["batches"] == [list(b.keys) for b in alone]


def test_a_rank_that_stops_stepping_is_named(uneven, tmp_path):
    """The other ranks wait for it at the epoch's end only as long as collective_timeout, then name it."""
    _, out, utts, tok = uneven
    proc = run_torchrun(3, "--trset", f"{out}/*/data-*.tar", "--tokenizer", str(tok), "--out", str(tmp_path),
                        "--epochs", "1", "--hang-rank", "1", "--collective-timeout", "5")
    assert proc.returncode != 0
    assert "rank(s) 1 did not answer within 5 s" in proc.stderr, proc.stderr[-3000:]


MIX = {"weights": {"en": 1, "zh": 1}}


def in_process(trset, tok, world: int, kwargs: dict, state: dict | None = None) -> list[list]:
    """Each rank's batches of epoch 0 (of the saved epoch after ``state``), every rank simulated in
    this process (no group), without workers."""
    out = []
    for r in range(world):
        loader = make_loader(trset, tok, rank=r, world_size=world, **kwargs)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(0 if state is None else state["epoch"])
        out.append([b.keys for b in loader])
    return out


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory):
    """English, Mandarin and Russian (60/30/10% of the hours) with a language and a previous text each."""
    root = tmp_path_factory.mktemp("ddp-multilingual")
    out, utts, toks = build_multilingual(root)
    return f"{out}/data-*.tar", utts, {lang: str(p) for lang, p in toks.items()}


# Utterances mixed by language (a batch holds several), a tokenizer per language and the previous
# text delivered: the launches of the mixed-corpora test run it too (--also), on their topologies.
BY_LANG = {"max_frames": 1500, "seed": 7, "mix_by": "lang", "mix_unit": "utterance", "temperature": 2,
           "fields": ["prev_text"]}
NAMED = {"max_frames": 3000, "seed": 7, "shuffle_buffer": 50, **MIX}


def same_batches(got: list[list[str]], planned: list[list[str]], most_left: int) -> None:
    """``got`` is the planned batches (as multisets), but for at most ``most_left`` left over."""
    want, have = Counter(batch_set(planned)), Counter(batch_set(got))
    assert not +(have - want), "a batch the one-rank epoch does not have, or one twice"
    assert sum((want - have).values()) <= most_left, (sum((want - have).values()), most_left)


def test_mixed_corpora_are_the_same_batches_on_every_topology_and_resume_on_another(uneven, multilingual, tmp_path):
    """Two named corpora by weight (batch by batch), and one corpus's utterances mixed by language
    (temperature 2, a tokenizer per language, prev_text): (1 rank, 0 workers), (2 ranks, 2 workers)
    under torchrun and 3 ranks give the same batches, at most one per rank apart; the 2 ranks' state
    after 5 steps, resumed on 3 ranks under torchrun and on 1, delivers with those 5 steps the
    one-rank epoch's batches."""
    root, out, utts, tok = uneven
    ml_trset, ml_utts, toks = multilingual
    zh, zh_utts = build(root, n=80, utts_per_shard=20, seed=5, prefix="zh-")
    trset = {"en": f"{out}/*/data-*.tar", "zh": f"{zh}/data-*.tar"}
    one, ml_one = in_process(trset, tok, 1, NAMED)[0], in_process(ml_trset, toks, 1, BY_LANG)[0]
    also = {"trset": ml_trset, "tokenizer": toks, "kwargs": BY_LANG}
    a = torchrun(2, tmp_path / "a", trset, tok, "--num-workers", "2", "--record-at", "5", "--epochs", "1", "--mix",
                 json.dumps(MIX), "--also", json.dumps({**also, "record_at": 5}))
    named_a, ml_a = [r["epochs"][0] for r in a], [r["also"] for r in a]
    for got, planned in ((named_a, one), (ml_a, ml_one)):
        assert len({len(r["batches"]) for r in got}) == 1  # equal steps
        same_batches([b for r in got for b in r["batches"]], planned, 1)
    three, ml_three = in_process(trset, tok, 3, NAMED), in_process(ml_trset, toks, 3, BY_LANG)
    same_batches([b for r in three for b in r], one, 2)
    same_batches([b for r in ml_three for b in r], ml_one, 2)
    # Resumed from the 2 ranks' state at step 5: on 3 ranks under torchrun, and on 1.
    saved, ml_saved = named_a[0]["saved"], ml_a[0]["saved"]
    assert saved == named_a[1]["saved"] and saved["step"] == 5 and ml_saved == ml_a[1]["saved"]
    (tmp_path / "state.json").write_text(json.dumps(saved))
    (tmp_path / "ml_state.json").write_text(json.dumps(ml_saved))
    b = torchrun(3, tmp_path / "b", trset, tok, "--resume", str(tmp_path / "state.json"), "--epochs", "1", "--mix",
                 json.dumps(MIX), "--also", json.dumps({**also, "resume": str(tmp_path / "ml_state.json")}))
    head, ml_head = [x for r in named_a for x in r["batches"][:5]], [x for r in ml_a for x in r["batches"][:5]]
    rest, ml_rest = [r["epochs"][0] for r in b], [r["also"] for r in b]
    assert len({ep["len"] for ep in rest}) == 1 and all(len(ep["batches"]) == ep["len"] > 0 for ep in rest)
    same_batches(head + [x for ep in rest for x in ep["batches"]], one, 2)
    same_batches(ml_head + [x for r in ml_rest for x in r["batches"]], ml_one, 2)
    same_batches(head + in_process(trset, tok, 1, NAMED, saved)[0], one, 0)
    same_batches(ml_head + in_process(ml_trset, toks, 1, BY_LANG, ml_saved)[0], ml_one, 0)
    # Every utterance named with its corpus; mixed by language: its own language, previous text and ids.
    assert sum(len(set(langs)) > 1 for r in ml_a for langs in r["langs"]) > len(ml_one) / 2
    for ep in named_a + rest:
        for keys, corpus in zip(ep["batches"], ep["corpora"]):
            assert [("en", "zh")[c] for c in corpus] == ["zh" if k.startswith("zh-") else "en" for k in keys]
    agg = {lang: load_tokenizer(p) for lang, p in toks.items()}
    offsets = dict(zip(agg, np.cumsum([2] + [t.vocab_size - 2 for t in agg.values()]).tolist()))
    for r in ml_a + ml_rest:
        for keys, langs, fields, labels, corpora in zip(r["batches"], r["langs"], r["fields"], r["labels"],
                                                        r["corpora"]):
            assert [("en", "zh", "ru")[c] for c in corpora] == langs
            for k, lang, prev, ids in zip(keys, langs, fields["prev_text"], labels):
                assert (lang, prev) == (ml_utts[k][0], ml_utts[k][2])
                assert ids == [i if i < 2 else i - 2 + offsets[lang] for i in agg[lang].encode(ml_utts[k][1])]


@pytest.fixture(scope="module")
def augmented(tmp_path_factory):
    """FLAC shards of the demo corpus, a noise folder and an impulse response: every augmentation at once."""
    import numpy as np
    import soundfile as sf

    root = tmp_path_factory.mktemp("ddp-audio")
    flac = audio_like(feature_shards(root), root / "flac")
    rng = np.random.default_rng(0)
    (root / "noise").mkdir()
    sf.write(root / "noise" / "white.wav", (rng.standard_normal(32000) * 2000).astype(np.int16), 16000)
    (root / "rir").mkdir()
    rir = np.concatenate([[1.0], rng.standard_normal(3200) * np.exp(-np.arange(3200) / 600) * 0.2])
    sf.write(root / "rir" / "room.wav", (rir * 20000).astype(np.int16), 16000)
    augment = {"speed": {"factors": [0.9, 1.0, 1.1]}, "noise": {"dir": str(root / "noise"), "snr": [5, 20]},
               "reverb": {"dir": str(root / "rir"), "prob": 0.5}, "specaugment": {"time_warp": 3}}
    tok = train_char_tokenizer(root, demo_waves()[2] / "text")
    return f"{flac}/*/data-*.tar", json.dumps(augment), tok


def test_augmented_batches_are_bit_identical_on_every_topology_and_after_resume(augmented, tmp_path):
    """Speed, noise, reverberation and SpecAugment on real speech: (1 rank, 0 workers) and (2 ranks,
    2 workers, torchrun) give the same batches with bit-identical features; resumed from the second
    run's state at step 2 on 1 rank with 2 workers, the rest of its epoch, bit for bit."""
    trset, augment, tok = augmented
    loader = make_loader(trset, tok, max_frames=3000, seed=7, shuffle_buffer=50, streams=4, augment=augment)
    one = {}
    for b in loader:
        for i, k in enumerate(b.keys):
            row = b.feats[i, :int(b.feat_lens[i])].numpy()
            one[k] = hashlib.blake2b(row.tobytes() + str(row.shape).encode(), digest_size=16).hexdigest()
    assert any(k.startswith("sp0.9-") for k in one) and any(k.startswith("sp1.1-") for k in one)  # perturbed
    common = ["--augment", augment, "--digests", "--epochs", "1", "--streams", "4"]
    two = [r["epochs"][0] for r in torchrun(2, tmp_path / "two", trset, tok, "--num-workers", "2", "--record-at", "2",
                                            *common)]
    got = {k: d for ep in two for k, d in ep["digests"].items()}
    assert got.items() <= one.items() and len(one) - len(got) <= max(len(b) for ep in two for b in ep["batches"])
    state = tmp_path / "state.json"
    state.write_text(json.dumps(two[0]["saved"]))
    rest = torchrun(1, tmp_path / "rest", trset, tok, "--num-workers", "2", "--resume", str(state), *common)
    later = {k for ep in two for b in ep["batches"][2:] for k in b}
    resumed = rest[0]["epochs"][0]["digests"]
    # what the 2 ranks yielded after step 2, bit for bit, and the batch 2 ranks left over (1 rank takes it)
    assert resumed.items() <= one.items() and later <= resumed.keys()
    assert all(resumed[k] == got[k] for k in later) and len(resumed) + len(got) - len(later) == len(one)
