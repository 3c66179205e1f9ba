"""Mid-epoch resume: state_dict() / load_state_dict() continue an epoch with exactly the planned
batches it had left, on the same or another number of workers, and refuse a state that would not."""

from __future__ import annotations

import json
import shutil

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.loader import make_loader
from wdsprep.plan.shardset import StaleIndexError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    out, utts = build(root, n=240, utts_per_shard=20, groups=["0:150", "150:"])
    tok = train_char_tokenizer(root, root / "kaldi-cat-0" / "text")
    return f"{out}/{{0_150,150_inf}}/data-*.tar", tok, out


def epoch(loader, e=None):
    if e is not None:
        loader.set_epoch(e)
    return [(tuple(b.keys), b.feats.clone(), b.labels.clone()) for b in loader]


def same(a, b):
    return len(a) == len(b) and all(x[0] == y[0] and x[1].equal(y[1]) and x[2].equal(y[2]) for x, y in zip(a, b))


KW = dict(max_frames=1200, seed=4, shuffle_buffer=30, min_frames=40, streams=4)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_resume_on_the_same_workers_yields_the_rest_of_the_epoch(data, workers):
    trset, tok, _ = data
    full_loader = make_loader(trset, tok, num_workers=workers, **KW)
    full = epoch(full_loader, 2)
    assert full_loader.stats.dropped.get("too_short", 0) > 0
    saved = full_loader.state_dict()
    assert (saved["epoch"], saved["step"], saved["complete"]) == (2, len(full), True)
    loader = make_loader(trset, tok, num_workers=workers, **KW)  # a new job: its workers serve every resume below
    for step in [1, len(full) // 2, len(full) - 2, len(full) - 1]:
        loader.load_state_dict({**saved, "step": step, "position": {"runs": [[1, workers, step]]}, "complete": False})
        assert loader.state_dict()["step"] == step  # a checkpoint taken before iterating again says the same
        # counted from the epoch's start, as a trainer that resumes counts (the iteration yields the rest)
        assert len(loader) == len(full) and len(loader) - loader.position().step == len(full) - step
        rest = epoch(loader)  # no set_epoch: the loaded state chose epoch 2
        assert same(rest, full[step:]), f"resumed at step {step} of {len(full)}"
        assert loader.stats.steps == len(full) and loader.stats.planned_steps == len(full) - step
        assert loader.state_dict()["position"]["runs"] == [[1, workers, step], [1, workers, len(full) - step]]
    assert same(epoch(loader, 3), epoch(full_loader, 3))  # the next epoch is untouched by the resume


@pytest.mark.parametrize("before,after", [(0, 2), (2, 0), (3, 1)])
def test_resume_on_other_workers_yields_the_planned_batches_left(data, before, after):
    trset, tok, _ = data
    a = make_loader(trset, tok, num_workers=before, **KW)
    a.set_epoch(1)
    done = []
    for b in a:
        done.append(tuple(b.keys))
        if len(done) == 5:
            break
    state = a.state_dict()
    b = make_loader(trset, tok, num_workers=after, **KW)
    b.load_state_dict(state)
    rest = [k for k, _, _ in epoch(b)]
    whole = [k for k, _, _ in epoch(make_loader(trset, tok, **KW), 1)]
    assert sorted(done + rest) == sorted(whole)  # the epoch's batches, each once


def test_state_follows_the_iteration(data):
    trset, tok, _ = data
    loader = make_loader(trset, tok, max_frames=1200, seed=4)
    loader.set_epoch(1)
    assert (loader.state_dict()["epoch"], loader.state_dict()["step"]) == (1, 0)
    it = iter(loader)
    next(it), next(it)
    s = loader.state_dict()
    assert (s["seed"], s["epoch"], s["step"], s["complete"], s["position"]) == (4, 1, 2, False, {"runs": [[1, 0, 2]]})
    json.dumps(s)  # a few plain numbers: goes into any checkpoint
    rest = list(it)
    assert loader.state_dict()["complete"] and loader.state_dict()["step"] == 2 + len(rest)
    # A finished epoch iterated again without set_epoch runs again (dev loaders do this).
    assert len(epoch(loader)) == 2 + len(rest)


def test_a_complete_epoch_resumes_as_empty(data):
    trset, tok, _ = data
    a = make_loader(trset, tok, max_frames=1200, seed=4)
    n = len(epoch(a, 0))
    b = make_loader(trset, tok, max_frames=1200, seed=4)
    b.load_state_dict(a.state_dict())
    assert len(b) == n and b.position().step == n and epoch(b) == [] and b.stats.steps == n
    assert same(epoch(b, 1), epoch(a, 1))


def test_load_state_for_another_epoch_is_dropped_by_set_epoch(data):
    trset, tok, _ = data
    a = make_loader(trset, tok, max_frames=1200, seed=4)
    b = make_loader(trset, tok, max_frames=1200, seed=4)
    b.load_state_dict({**a.state_dict(), "epoch": 5, "step": 3, "position": {"runs": [[1, 0, 3]]}})
    assert same(epoch(b, 6), epoch(a, 6))  # the trainer moved on: a whole epoch 6


@pytest.mark.parametrize("change,match", [
    (dict(seed=9), "seed=4 .this loader: 9."),
    (dict(max_frames=1300), "max_frames=1200 .this loader: 1300."),
    (dict(shuffle_buffer=10), "shuffle_buffer=2000 .this loader: 10."),
    (dict(streams=3), "streams=None .this loader: 3."),
    (dict(ctc_subsampling=4), "fingerprint"),
])
def test_a_state_that_would_give_other_batches_is_refused(data, change, match):
    trset, tok, _ = data
    kw = dict(max_frames=1200, seed=4)
    state = make_loader(trset, tok, **kw).state_dict()
    with pytest.raises(ValueError, match=match):
        make_loader(trset, tok, **{**kw, **change}).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        make_loader(trset, tok, **kw).load_state_dict({"epoch": 1, "step": 3})


def test_a_state_whose_plan_did_not_apply_the_ctc_rule_is_refused_naming_it(data):
    """The CTC rule is decided by the plan: its batches differ from those of a plan without it, where
    the readers alone applied it (states saved before, with ctc_subsampling set, hold no such plan
    option).  Such a state is refused, naming the option; one saved without the rule still resumes a
    loader without it (its fingerprint unchanged)."""
    trset, tok, _ = data
    kw = dict(max_frames=1200, seed=4)
    plain = make_loader(trset, tok, **kw)
    plain.set_epoch(1)
    it = iter(plain)
    next(it)
    old = json.loads(json.dumps(plain.state_dict()))  # what an older loader saved: no ctc_subsampling in its options
    del it
    ruled = make_loader(trset, tok, ctc_subsampling=4, **kw)
    assert "ctc_subsampling" not in old["options"] and ruled.state_dict()["options"]["ctc_subsampling"] == 4
    with pytest.raises(ValueError, match=r"fingerprint differs.*this loader's plan has ctc_subsampling=4 and the saved "
                                         r"plan had not"):
        ruled.load_state_dict(old)
    again = make_loader(trset, tok, **kw)
    again.load_state_dict(old)
    assert len(again) == len(plain) and again.position().step == 1  # the epoch's len; its rest is one batch shorter


def test_a_step_past_the_end_of_the_epoch_is_refused(data):
    """A state saying step 142 of a 92-step epoch used to yield nothing and report steps=142."""
    trset, tok, _ = data
    loader = make_loader(trset, tok, max_frames=1200, seed=4)
    n = len(epoch(loader, 0))
    state = {**loader.state_dict(), "step": n + 50, "position": {"runs": [[1, 0, n + 50]]}, "complete": False}
    with pytest.raises(ValueError, match=f"step {n + 50} of epoch 0 .* has {n} steps"):
        make_loader(trset, tok, max_frames=1200, seed=4).load_state_dict(state)


def test_a_state_over_a_reindexed_shard_set_is_refused(data, tmp_path):
    """A shard replaced and re-indexed after the checkpoint: the epoch would not be the one saved."""
    trset, tok, out = data
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    pattern = f"{copy}/{{0_150,150_inf}}/data-*.tar"
    state = make_loader(pattern, tok, max_frames=1200, seed=4).state_dict()
    a, b = sorted((copy / "150_inf").glob("data-*.tar"))[:2]
    shutil.copyfile(b, a)
    with pytest.raises(StaleIndexError, match=a.name):  # not re-indexed: refused at start
        make_loader(pattern, tok, max_frames=1200, seed=4)
    for f in (copy / "150_inf").glob("index.*"):
        f.unlink()
    with pytest.warns(UserWarning, match="no index"):
        reindexed = make_loader(pattern, tok, max_frames=1200, seed=4)
    with pytest.raises(ValueError, match="fingerprint"):
        reindexed.load_state_dict(state)
