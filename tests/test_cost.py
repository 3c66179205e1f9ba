"""Batches sized by what a training step costs (issue 27): the cost model, the cut by it, label
lengths in tokens kept beside the index, and what dry-run --plan says of the steps."""

from __future__ import annotations

import io
import json
from collections import Counter

import numpy as np
import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.loader import make_loader
from wdsprep.plan.batching import BatchFit, bucket_pools
from wdsprep.plan.cost import CostModel, load_cost
from wdsprep.plan.stats import StepCosts

ATTENTION = CostModel(subsampling=4, per_frame=512, per_frame2=1)
LABELS = CostModel(subsampling=4, per_frame=64, per_frame2=1, per_token=20)


def greedy(fit, lengths, tokens):
    """The cut rule one sample at a time, the running longest label included: the reference."""
    cuts, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i == len(lengths) or not fit.fits(i - start + 1, lengths[i], max(tokens[start:i + 1])):
            cuts.append((start, i))
            start = i
    return cuts


@pytest.mark.parametrize("fit", [BatchFit(cost=ATTENTION, max_cost=4e6), BatchFit(cost=LABELS, max_cost=3e5),
                                 BatchFit(20_000, 30, LABELS, 4e5)], ids=["attention", "labels", "all three"])
def test_the_cut_by_cost_equals_cutting_one_sample_at_a_time(fit):
    rng = np.random.default_rng(3)
    for _ in range(5):
        lengths = np.sort(np.clip(rng.lognormal(np.log(600), 0.5, 2000), 50, 3000).astype(np.int64))
        tokens = (lengths / 25 * rng.uniform(0.5, 1.5, len(lengths))).astype(np.int64)
        cuts = fit.cut(lengths, tokens if fit.uses_tokens else None)
        assert cuts == greedy(fit, lengths, tokens if fit.uses_tokens else np.zeros_like(lengths))
        for a, b in cuts:
            size, longest, u = b - a, int(lengths[a:b].max()), int(tokens[a:b].max()) if fit.uses_tokens else 0
            assert size == 1 or fit.cost.batch(size, longest, u) <= fit.max_cost * (1 + 1e-9)


def test_cost_sized_batches_are_even_where_frame_sized_ones_are_not():
    """The issue's measure on its corpus shape (20,000 utterances here): the largest batch cost
    against the median, with the budget the frames plan's largest batch cost."""
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(600), 0.5, 20_000), 50, 3000).astype(np.int64)
    rng = np.random.default_rng(1)
    costs = {}
    for name, fit in (("frames", BatchFit(20_000)), ("cost", None)):
        if fit is None:
            fit = BatchFit(cost=ATTENTION, max_cost=max(costs["frames"]))
        pos, starts = bucket_pools(lengths, fit=fit, rng=rng)
        costs[name] = [float(ATTENTION.batch(b - a, lengths[pos[a:b]].max())) for a, b in zip(starts, starts[1:])]
    spread = {k: max(v) / np.median(v) for k, v in costs.items()}
    assert spread["frames"] > 1.5 and spread["cost"] < 1.15
    assert len(costs["cost"]) < len(costs["frames"]) / 1.3


def test_a_cost_model_file_and_its_mistakes(tmp_path):
    f = tmp_path / "cost.json"
    f.write_text(json.dumps({**ATTENTION.to_json(), "fit": {"device": "cpu"}, "max_cost": 5.0}))
    assert load_cost(f) == ATTENTION == load_cost(ATTENTION.to_json())
    for doc, match in [({"per_frame": -1}, "per_frame must be a finite number >= 0"),
                       ({"subsampling": 0, "per_frame": 1}, "subsampling must be an integer >= 1"),
                       ({"subsampling": 4}, "every coefficient 0"), ({"fit": {}}, "has none of"),
                       ([1, 2], "must be an object")]:
        f.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=match):
            load_cost(f)
    f.write_text("{")
    with pytest.raises(ValueError, match="cost.json: not a cost model in JSON"):
        load_cost(f)
    with pytest.raises(FileNotFoundError, match="no such cost model file"):
        load_cost(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="needs both cost"):
        BatchFit(cost=ATTENTION)
    with pytest.raises(ValueError, match="batches need a bound"):
        BatchFit()


def test_the_t_u_term_counts_a_transducers_joint_tensor():
    joint = CostModel(subsampling=4, per_frame=512, per_frame2=1, per_frame_token=2, per_token2=1)
    t, u = 800 / 4, 30
    assert joint.per_utterance(800, 30) == pytest.approx(t * (512 + t) + 2 * t * u + u * u)
    assert joint.batch(7, 800, 30) == pytest.approx(7 * joint.per_utterance(800, 30))
    assert CostModel(per_frame_token=1.0).uses_tokens and not ATTENTION.uses_tokens
    # Only the t·u term counts tokens: a batch's room falls with its labels as t·u says.
    fit = BatchFit(cost=CostModel(subsampling=1, per_frame_token=1.0), max_cost=1e6)
    assert fit.room(1000, 10) == 100 and fit.room(1000, 20) == 50 and fit.room(2000, 10) == 50


def test_an_older_cost_file_loads_and_keeps_its_states(tmp_path):
    """Files and loader states written before the t·u term: no per_frame_token key, the same JSON back."""
    from wdsprep.plan.streams import PlanOptions, options_json

    older = {"subsampling": 4, "per_utt": 1.0, "per_frame": 512.0, "per_frame2": 1.0, "per_token": 0.0,
             "per_token2": 3.0}
    f = tmp_path / "cost.json"
    f.write_text(json.dumps({**older, "fit": {"shapes": []}, "max_cost": 5e6}))
    model = load_cost(f)
    assert model.per_frame_token == 0 and model.to_json() == older
    assert options_json(PlanOptions(cost=model, max_cost=5e6))["cost"] == older
    assert "max_tokens_per_second" not in options_json(PlanOptions(max_frames=100))
    assert load_cost({**older, "per_frame_token": 2}).to_json() == {**older, "per_frame_token": 2}


@pytest.mark.parametrize("doc,match", [
    ({"per_frame_2": 1.0}, r"unknown key 'per_frame_2' \(did you mean 'per_frame2'\?\)"),
    ({"per_frame": 1.0, "per_frame_tokens": 2}, r"unknown key 'per_frame_tokens' \(did you mean 'per_frame_token'"),
    ({"per_frame": 1.0, "comment": "x"}, r"unknown key 'comment'; a cost model has subsampling, per_utt"),
    ({"per_frame_token": "2"}, "per_frame_token must be a finite number >= 0, got '2'"),
    ({"per_frame": 1.0, "max_cost": "big"}, "max_cost must be a number, got 'big'"),
    ({"per_frame": 1.0, "fit": [1]}, "fit must be an object"),
    ({"subsampling": 4.0, "per_frame": 1.0}, "subsampling must be an integer"),
])
def test_a_cost_file_with_a_key_it_does_not_know_or_of_the_wrong_type_is_refused_by_name(tmp_path, doc, match):
    f = tmp_path / "my-cost.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"my-cost.json: .*{match}"):
        load_cost(f)


def test_label_padding_efficiency_beside_the_frames():
    from wdsprep.plan.stats import BatchTally, LoaderStats

    t = BatchTally()
    t.add([100, 200], 1000, tokens=[10, 30])
    t.add([300], 1000)  # a batch without its tokens counts for the frames only
    assert t.padding_efficiency == pytest.approx(600 / 700)
    assert t.label_padding_efficiency == pytest.approx(40 / 60)
    st = LoaderStats()
    st.add_batches(t)
    assert st.label_padding_efficiency == pytest.approx(40 / 60)
    assert st.to_dict()["label_padding_efficiency"] == pytest.approx(40 / 60)
    assert np.isnan(LoaderStats().label_padding_efficiency)


def test_step_costs_say_how_long_steps_wait_for_their_slowest_rank():
    c = StepCosts(np.array([[1.0, 2.0, 4.0], [3.0, 2.0, np.nan]]), "test")
    # steps every rank takes: 0 and 1; slowest 3 + 2 = 5 against means 2 + 2 = 4
    assert c.step_wait == pytest.approx(0.25)
    assert c.largest_over_median == pytest.approx(4 / 2)  # the median of 1, 2, 4, 3, 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cost")
    out, utts = build(root, n=160, utts_per_shard=20, seed=3)
    tok = train_char_tokenizer(root, root / "kaldi-cat-3" / "text")
    return f"{out}/data-*.tar", out, utts, tok


def test_the_loader_cuts_by_cost_with_labels_counted_once_beside_the_index(corpus, monkeypatch):
    import wdsprep.plan.tokens as tokens

    trset, out, utts, tok = corpus
    kw = dict(cost=LABELS.to_json(), max_cost=60_000, seed=2)
    loader = make_loader(trset, tok, **kw)
    loader.set_epoch(0)
    batches = list(loader)
    assert Counter(k for b in batches for k in b.keys) == Counter(list(utts))  # every utterance once
    for b in batches:  # the labels the loader made are the ones the plan counted
        if len(b.keys) > 1:
            assert LABELS.batch(len(b.keys), int(b.feat_lens.max()), int(b.label_lens.max())) <= 60_000
    column = list(out.glob("index.tokens.*.npy"))
    assert len(column) == 1
    mtime = column[0].stat().st_mtime_ns
    monkeypatch.setattr(tokens, "count_tokens", lambda *a: pytest.fail("counted again"))
    again = make_loader(trset, tok, **kw)
    again.set_epoch(0)
    assert [b.keys for b in again] == [b.keys for b in batches] and column[0].stat().st_mtime_ns == mtime


def test_count_labels_writes_the_column_a_loader_then_reads(corpus, tmp_path, monkeypatch, capsys):
    import wdsprep.plan.tokens as tokens
    from wdsprep.cli import main

    trset, out, _, tok = corpus
    for f in out.glob("index.tokens.*.npy"):
        f.unlink()
    assert main(["tokenizer", "count-labels", trset, "--tokenizer", str(tok)]) == 0
    assert "written, 160 labels" in capsys.readouterr().out
    monkeypatch.setattr(tokens, "count_tokens", lambda *a: pytest.fail("counted again"))
    make_loader(trset, tok, cost=LABELS.to_json(), max_cost=60_000)
    assert main(["tokenizer", "count-labels", "http://127.0.0.1:9/x/data-{0..1}.tar", "--tokenizer", str(tok)]) == 2
    assert "count a local copy and upload" in capsys.readouterr().err


def test_another_tokenizer_gets_a_column_of_its_own(corpus, tmp_path):
    from wdsprep.tokenizer import train_tokenizer

    trset, out, _, tok = corpus
    make_loader(trset, tok, cost=LABELS.to_json(), max_cost=60_000)
    spm = tmp_path / "spm.json"
    train_tokenizer("sentencepiece", [out.parent / "kaldi-cat-3" / "text"], spm, vocab_size=30)
    make_loader(trset, spm, cost=LABELS.to_json(), max_cost=60_000)
    assert len(list(out.glob("index.tokens.*.npy"))) == 2


def test_dry_run_plan_judges_steps_and_dumps_what_every_rank_yields(corpus, tmp_path):
    from wdsprep.check.planreport import plan_report

    trset, _, _, tok = corpus
    text = io.StringIO()
    dump = tmp_path / "keys.tsv"
    frames = plan_report(trset, world_size=2, max_frames=3000, seed=2, cost=ATTENTION.to_json(), out=text,
                         dump_keys=dump)[0]
    assert "every step waits" in text.getvalue() and "t = frames/4" in text.getvalue()
    assert frames["cost"]["largest_over_median"] > 1 and frames["cost"]["step_wait"] >= 0
    by_cost = plan_report(trset, world_size=2, seed=2, cost=ATTENTION.to_json(),
                          max_cost=frames["cost"]["largest"], out=io.StringIO())[0]
    assert by_cost["cost"]["largest_over_median"] < frames["cost"]["largest_over_median"]
    # The dump is what the loader yields, rank by rank, step by step, from the index alone.
    planned: dict[tuple[int, int], list[str]] = {}
    for line in dump.read_text().splitlines():
        epoch, step, rank, uttid = line.split("\t")
        planned.setdefault((int(rank), int(step)), []).append(uttid)
    for r in range(2):
        loader = make_loader(trset, tok, max_frames=3000, seed=2, rank=r, world_size=2)
        loader.set_epoch(0)
        assert [sorted(b.keys) for b in loader] == [sorted(planned[(r, k)]) for k in range(len(loader))]


def test_hyper_ld_gives_the_cost_and_its_budget(corpus, tmp_path):
    from wdsprep.hyper import loader_options, make_loader_from_hyper

    trset, _, _, tok = corpus
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(ATTENTION.to_json()))
    hyper = {"tokenizer": {"file": str(tok)},
             "train": {"option": {"ld": {"shards": trset, "cost": str(cost), "max_cost": 4e6}}}}
    o = loader_options(hyper, world_size=1)
    assert o.loader_kwargs == {"cost": str(cost), "max_cost": 4e6} and o.trset == trset
    path = tmp_path / "hyper-p.json"
    path.write_text(json.dumps(hyper))
    loader = make_loader_from_hyper(path)
    assert loader.dataset.cfg.plan.cost == ATTENTION and loader.dataset.cfg.plan.max_frames is None
    with pytest.raises(ValueError, match="mix named corpora"):
        loader_options({**hyper, "train": {"option": {"ld": {"shards": trset, "weights": {"a": 1}}}}}, world_size=1)
