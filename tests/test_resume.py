"""Mid-epoch resume: state_dict() / load_state_dict() continue an epoch with exactly the batches it
had left, with and without workers, and refuse a state that would not."""

from __future__ import annotations

import json

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.loader import make_loader


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    # Two length groups: workers get shards of different lengths, hence different batch counts,
    # so near the end of an epoch some workers are done while others still make batches.
    out, utts = build(root, n=240, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return f"{out}/{{0_150,150_inf}}/data-*.tar", tok


def epoch(loader, e=None):
    if e is not None:
        loader.set_epoch(e)
    return [(tuple(b.keys), b.feats.clone(), b.labels.clone()) for b in loader]


def same(a, b):
    return len(a) == len(b) and all(x[0] == y[0] and x[1].equal(y[1]) and x[2].equal(y[2]) for x, y in zip(a, b))


STATS = ("steps", "utterances", "read", "dropped", "real_frames", "padded_frames", "oversize_batches", "discarded")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_resume_yields_the_rest_of_the_epoch(data, workers):
    trset, tok = data
    kw = dict(max_frames=1200, seed=4, shuffle_buffer=30, min_frames=40, num_workers=workers)
    full_loader = make_loader(trset, tok, **kw)
    full = epoch(full_loader, 2)
    whole = full_loader.stats.to_dict()
    assert whole["dropped"].get("too_short", 0) > 0  # the filter's counts are part of the check
    saved = full_loader.state_dict()
    assert (saved["epoch"], saved["step"], saved["complete"]) == (2, len(full), True)

    loader = make_loader(trset, tok, **kw)  # a new job: persistent workers serve every resume below
    ended_early = 0
    totals = loader._skip_plan(len(full))[0]  # every worker's batch count (all are done at the end)
    for step in [1, len(full) // 2] + list(range(len(full) - 2 * max(1, workers), len(full))):
        loader.load_state_dict({**saved, "step": step, "complete": False})
        assert loader.state_dict()["step"] == step  # a checkpoint taken before iterating again says the same
        skip, _ = loader._skip_plan(step)
        ended_early += any(s == t for s, t in zip(skip, totals))
        rest = epoch(loader)  # no set_epoch: the loaded state chose epoch 2
        assert same(rest, full[step:]), f"resumed at step {step} of {len(full)}"
        got = loader.stats.to_dict()
        assert {k: got[k] for k in STATS} == {k: whole[k] for k in STATS}, f"stats at step {step}"
        assert loader.state_dict()["step"] == len(full) and loader.state_dict()["complete"]
    if workers > 1:
        assert ended_early, "no resume point fell after a worker's last batch: the test lost its hard case"
    # The next epoch is untouched by the resume.
    assert same(epoch(loader, 3), epoch(full_loader, 3))


def test_state_follows_the_iteration(data):
    trset, tok = data
    loader = make_loader(trset, tok, max_frames=1200, seed=4)
    loader.set_epoch(1)
    assert (loader.state_dict()["epoch"], loader.state_dict()["step"]) == (1, 0)
    it = iter(loader)
    next(it), next(it)
    s = loader.state_dict()
    assert (s["seed"], s["epoch"], s["step"], s["complete"], s["world_size"]) == (4, 1, 2, False, 1)
    assert all(len(c) == 2 for c in s["cursors"].values())
    json.dumps(s)  # a few plain numbers: goes into any checkpoint
    rest = list(it)
    assert loader.state_dict()["complete"] and loader.state_dict()["step"] == 2 + len(rest)
    # A finished epoch iterated again without set_epoch runs again (dev loaders do this).
    assert len(epoch(loader)) == 2 + len(rest)


def test_a_complete_epoch_resumes_as_empty(data):
    trset, tok = data
    a = make_loader(trset, tok, max_frames=1200, seed=4)
    n = len(epoch(a, 0))
    b = make_loader(trset, tok, max_frames=1200, seed=4)
    b.load_state_dict(a.state_dict())
    assert epoch(b) == [] and b.stats.steps == n
    assert same(epoch(b, 1), epoch(a, 1))


def test_load_state_for_another_epoch_is_dropped_by_set_epoch(data):
    trset, tok = data
    a = make_loader(trset, tok, max_frames=1200, seed=4)
    b = make_loader(trset, tok, max_frames=1200, seed=4)
    b.load_state_dict({**a.state_dict(), "epoch": 5, "step": 3})
    assert same(epoch(b, 6), epoch(a, 6))  # the trainer moved on: a whole epoch 6


@pytest.mark.parametrize("change,match", [
    (dict(num_workers=2), "num_workers=0 .this loader: 2."),
    (dict(seed=9), "seed=4 .this loader: 9."),
    (dict(max_frames=1300), "fingerprint"),
    (dict(shuffle_buffer=10), "fingerprint"),
])
def test_a_state_that_would_give_other_batches_is_refused(data, change, match):
    trset, tok = data
    kw = dict(max_frames=1200, seed=4)
    state = make_loader(trset, tok, **kw).state_dict()
    with pytest.raises(ValueError, match=match):
        make_loader(trset, tok, **{**kw, **change}).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        make_loader(trset, tok, **kw).load_state_dict({"epoch": 1, "step": 3})
