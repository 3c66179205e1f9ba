"""Resume states edited or damaged: every field is checked against the plan before it is used, and
refused in one line naming it; never a hang, an allocation of the state's say-so, or an empty or
repeated epoch in silence (issue 30, items 4 and 5)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.loader import make_loader
from wdsprep.plan.state import StateError

KW = dict(max_frames=1200, seed=4, streams=3)
MIX = dict(max_frames=1500, seed=2, weights={"en": 1, "zh": 1})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    en, _ = build(root, n=200, utts_per_shard=20, seed=1)
    zh, _ = build(root, n=80, utts_per_shard=20, seed=2, prefix="zh")
    tok = train_char_tokenizer(root, root / "kaldi-cat-1" / "text")
    return f"{en}/data-*.tar", {"en": f"{en}/data-*.tar", "zh": f"{zh}/data-*.tar"}, tok


def saved_mid_epoch(trset, tok, steps=3, **kw):
    loader = make_loader(trset, tok, **kw)
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(steps):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def edited(state, path, value):
    out = copy.deepcopy(state)
    *keys, last = path
    node = out
    for k in keys:
        node = node[k]
    node[last] = value
    return out


def refused(trset, tok, state, match, **kw):
    with pytest.raises(StateError, match=match) as e:
        make_loader(trset, tok, **kw).load_state_dict(state)
    assert "\n" not in str(e.value)


def test_a_real_state_loads_and_yields_the_rest(data):
    trset, _, tok = data
    state = saved_mid_epoch(trset, tok, **KW)
    loader = make_loader(trset, tok, **KW)
    loader.load_state_dict(state)
    whole = make_loader(trset, tok, **KW)
    whole.set_epoch(1)
    assert [b.keys for b in loader] == [b.keys for b in whole][3:]


@pytest.mark.parametrize("path,value,match", [
    (("complete",), "false", "complete must be true or false"),
    (("complete",), True, "says epoch 1 is complete, but its position has steps left"),
    (("version",), 99, "version 99; this wdsprep reads versions 2, 3"),
    (("version",), True, "version must be an integer"),
    (("epoch",), -1, "epoch is -1"),
    (("step",), 7, "says step 7, its position 3"),
    (("position", "runs"), [[1, 0, 3]] * 20_000, "20,000 entries, at most 64"),
    (("position", "runs"), [[10_000_000, 0, 3]], r"a run on 10000000 ranks"),
    (("position", "runs"), [[1, 0, -3]], r"runs\[0\] must be 3 integers >= 0"),
    (("position", "runs"), [[1, 0, 10_000]], "step 10000 of epoch 1 on world size 1"),
    (("position", "runs"), [[1, 0, 2.5]], "must be 3 integers"),
    (("position",), None, "position must be an object"),
    (("seed",), "4", "seed must be an integer"),
])
def test_an_edited_single_corpus_state_is_refused_naming_the_field(data, path, value, match):
    trset, _, tok = data
    refused(trset, tok, edited(saved_mid_epoch(trset, tok, **KW), path, value), match, **KW)


def version_2(state):
    """The state as wdsprep 0.1 before this format saved it: the runs at the top, no kind."""
    keys = ("seed", "epoch", "step", "complete", "options", "fingerprint")
    return {"version": 2, **{k: state[k] for k in keys}, "runs": state["position"]["runs"]}


@pytest.mark.parametrize("path,value,match", [
    (("complete",), "false", "complete must be true or false"),
    (("complete",), True, "says epoch 1 is complete, but its position has steps left"),
    (("runs",), [[10_000_000, 0, 3]], r"a run on 10000000 ranks"),
    (("runs",), [[1, 0, 3]] * 20_000, "20,000 entries, at most 64"),
])
def test_an_edited_version_2_state_is_refused_too(data, path, value, match):
    trset, _, tok = data
    state = version_2(saved_mid_epoch(trset, tok, **KW))
    loader = make_loader(trset, tok, **KW)
    loader.load_state_dict(state)  # as saved: still loads, and goes on where it stood
    whole = make_loader(trset, tok, **KW)
    whole.set_epoch(1)
    assert [b.keys for b in loader] == [b.keys for b in whole][3:]
    refused(trset, tok, edited(state, path, value), match, **KW)


@pytest.mark.parametrize("state,match", [
    (None, "not None"), ([], "not list"), ({"epoch": 1, "step": 3}, "missing version"),
])
def test_what_is_not_a_state_is_refused(data, state, match):
    trset, _, tok = data
    refused(trset, tok, state, match, **KW)


def mixed_case(state, case):
    """An edited mixed state, by name (the edits the hostile rounds tried)."""
    start = state["position"]["start"]
    if case == "start of another epoch":
        return edited(state, ("position", "start", "epoch"), 7)
    if case == "a corpus dropped":
        return edited(state, ("position", "start", "cursors"), start["cursors"][:1])
    if case == "cursor past its epoch":
        return edited(state, ("position", "start", "cursors", 1), [start["cursors"][1][0], 10**6])
    if case == "takes huge":
        return edited(state, ("position", "start", "takes"), [10**15, 1])
    if case == "clock negative":
        return edited(state, ("position", "start", "global_step"), -5)
    if case == "world size huge":
        return edited(state, ("position", "runs"), [[10**7, 0, 3]])
    if case == "per-step mixture of an older wdsprep":
        return edited(state, ("position",), {"epoch": 1, "step": 4, "corpora": []})
    raise AssertionError(case)


@pytest.mark.parametrize("case,match", [
    ("start of another epoch", r"position.start.epoch is 7, its epoch 1"),
    ("a corpus dropped", r"position has 1 corpora, this loader 2 \(en, zh\)"),
    ("cursor past its epoch", r"cursors\[1\] says item 1000000 of corpus 'zh'"),
    ("takes huge", r"takes ask 1,000,000,000,000,001 items of one epoch, more than 1024 passes"),
    ("clock negative", r"global_step is -5"),
    ("world size huge", r"a run on 10000000 ranks"),
    ("per-step mixture of an older wdsprep", "planned per step by an older wdsprep"),
])
def test_an_edited_mixed_state_is_refused_naming_the_field(data, case, match):
    _, named, tok = data
    state = saved_mid_epoch(named, tok, steps=4, **MIX)
    refused(named, tok, mixed_case(state, case), match, **MIX)


def test_a_huge_count_in_a_state_costs_nothing_to_refuse(data, tmp_path):
    """Under a 3 GB address-space limit and a timeout: refused in a line, not killed by the kernel."""
    trset, named, tok = data
    single = edited(saved_mid_epoch(trset, tok, **KW), ("position", "runs"), [[1, 0, 3]] * 20_000)
    mixed = mixed_case(saved_mid_epoch(named, tok, steps=4, **MIX), "takes huge")
    for name, (pattern, state, kw) in {"single": (trset, single, KW), "mixed": (named, mixed, MIX)}.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"trset": pattern, "tok": str(tok), "state": state, "kw": kw}))
        code = textwrap.dedent(f"""
            import json, resource
            resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
            from wdsprep.loader import make_loader
            doc = json.load(open({str(f)!r}))
            loader = make_loader(doc["trset"], doc["tok"], **doc["kw"])
            try:
                loader.load_state_dict(doc["state"])
                print("loaded", len(loader))
            except ValueError as e:
                print("refused:", e)
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.startswith("refused: the loader state's"), r.stdout
