"""CAT hyper-p.json: old and current keys, hyphens read as CAT reads them, CAT's per-rank split, strict
booleans, pass-through, and no batching key ignored without a word."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.hyper import (
    NO_FRAME_BOUND,
    loader_options,
    make_loader_from_hyper,
    normalize_keys,
    parse_bool,
)


def test_current_keys_bucket_mode_split_across_ranks():
    h = {"train": {"option": {"ld": "d/*/data-*.tar", "tokenizer": {"file": "t.json"}, "batching_mode": "bucket",
                          "bucket_size": 40000, "ld_shuffle_buffer": 500, "check_freq": 100, "amp": True}}}
    o = loader_options(h, world_size=4)
    assert (o.trset, o.tokenizer) == ("d/*/data-*.tar", "t.json")
    assert o.loader_kwargs == {"max_frames": 10000, "shuffle_buffer": 500}
    assert o.passthrough == {"check_freq": 100, "amp": True}


def test_old_keys_and_top_level_tokenizer_batch_mode():
    h = {"tokenizer": {"file": "exp/tokenizer.json"},
         "train": {"option": {"large_dataset": "true", "trset": "x/{a,b}/*.tar", "batch_size": 128}}}
    o = loader_options(h, world_size=2)
    assert (o.trset, o.tokenizer) == ("x/{a,b}/*.tar", "exp/tokenizer.json")
    assert o.loader_kwargs == {"max_batch_size": 64, "max_frames": NO_FRAME_BOUND}


def test_cat_nested_layout_and_flat_key_read_alike():
    option = {"ld": "d/*.tar", "tokenizer": "t.json", "bucket_size": 900}
    nested = loader_options({"train": {"bin": "cat.ctc.train", "option": option}}, world_size=3)
    flat = loader_options({"train:option": option}, world_size=3)
    assert nested.loader_kwargs == flat.loader_kwargs == {"max_frames": 300}
    with pytest.raises(ValueError, match="no train:option"):
        loader_options({"train": {"bin": "cat.ctc.train"}}, world_size=1)


def test_false_string_is_false():
    assert parse_bool("false", "k") is False and parse_bool("True", "k") is True and parse_bool(0, "k") is False
    with pytest.raises(ValueError, match="boolean"):
        parse_bool("maybe", "k")
    h = {"train": {"option": {"large_dataset": "false", "trset": "x/*.tar", "tokenizer": "t", "batch_size": 8}}}
    with pytest.raises(ValueError, match="names no shards"):
        loader_options(h, world_size=1)
    with pytest.warns(UserWarning, match="padded frames"):
        loader_options({"train": {"option": {"ld": "x", "tokenizer": "t", "bucket_size": 100,
                                          "ld_bucket_count_padding": "false"}}}, world_size=1)


def test_builds_a_working_loader(tmp_path):
    out, utts = build(tmp_path, n=80, utts_per_shard=15)
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")
    hp = tmp_path / "hyper-p.json"
    hp.write_text(json.dumps({"tokenizer": {"file": str(tok)},
                              "train": {"option": {"ld": f"{out}/data-*.tar", "batching_mode": "bucket",
                                               "bucket_size": 3000, "ld_bucket_count_padding": True}}}))
    loader = make_loader_from_hyper(hp)
    loader.set_epoch(0)
    batches = list(loader)
    assert Counter(k for b in batches for k in b.keys) == Counter(utts.keys())
    assert all(len(b.keys) * int(b.feat_lens.max()) <= 3000 for b in batches if len(b.keys) > 1)


def test_dry_run_cli_reports_and_dumps_keys(tmp_path, capsys):
    from wdsprep.cli import main

    out, utts = build(tmp_path, n=50, utts_per_shard=12)
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")
    keys = tmp_path / "keys.tsv"
    assert main(["dry-run", "--trset", f"{out}/data-*.tar", "--tokenizer", str(tok), "--max-frames", "2000",
                 "--epochs", "2", "--dump-keys", str(keys)]) == 0
    report = capsys.readouterr().out
    assert "epoch 1:" in report and "padding efficiency" in report and "50 utterances" in report
    lines = [line.split("\t") for line in keys.read_text().splitlines()]
    assert Counter(k for e, _, k in lines if e == "0") == Counter(utts.keys())


# train:option blocks as CAT's own egs/ write them: hyphens and underscores mixed in one block.
CAT_EGS_OPTIONS = [
    # egs/cv-lang10/exp/Monolingual/en: "large-dataset" beside the current "ld"
    {"amp": True, "batch_size": 512, "check_freq": 500, "large-dataset": True,
     "ld": "data/en/{11_1000,1001_1200}/*.tar"},
    # a bucket-mode block spelled with hyphens, as CAT's argparse options are (--bucket-size, --batching-mode)
    {"ld": "data/x/*.tar", "batching-mode": "bucket", "bucket-size": 40000, "grad-norm": 5.0, "grad-accum-fold": 6,
     "ld-shuffle-buffer": 500, "check-freq": 1000},
    # the old key pair, hyphenated
    {"large-dataset": "true", "trset": "old/{a,b}/*.tar", "batch-size": 128, "check-freq": 100},
]


def _underscored(opt: dict) -> dict:
    return {k.replace("-", "_"): v for k, v in opt.items()}


@pytest.mark.parametrize("opt", CAT_EGS_OPTIONS)
def test_hyphenated_keys_read_as_cat_reads_them(opt):
    """CAT's parse_args_from_var does k.replace('-', '_'): both spellings must give the same loader."""
    h = {"tokenizer": {"file": "t.json"}, "train": {"option": opt}}
    got = loader_options(h, world_size=4)
    want = loader_options({"tokenizer": {"file": "t.json"}, "train": {"option": _underscored(opt)}}, world_size=4)
    assert (got.trset, got.loader_kwargs, got.passthrough) == (want.trset, want.loader_kwargs, want.passthrough)
    assert not any("-" in k for k in got.passthrough)  # the trainer sees CAT's attribute names


def test_hyphenated_bucket_keys_bound_the_frames():
    o = loader_options({"tokenizer": "t", "train": {"option": CAT_EGS_OPTIONS[1]}}, world_size=4)
    assert o.trset == "data/x/*.tar"
    assert o.loader_kwargs == {"max_frames": 10000, "shuffle_buffer": 500}
    assert o.passthrough == {"grad_norm": 5.0, "grad_accum_fold": 6, "check_freq": 1000}
    o = loader_options({"tokenizer": "t", "train": {"option": CAT_EGS_OPTIONS[2]}}, world_size=2)
    assert (o.trset, o.loader_kwargs) == ("old/{a,b}/*.tar", {"max_batch_size": 64, "max_frames": NO_FRAME_BOUND})


def test_two_spellings_of_one_key():
    assert normalize_keys({"bucket-size": 10, "bucket_size": 10}) == {"bucket_size": 10}
    with pytest.raises(ValueError, match="'bucket-size': 10 and 'bucket_size': 20"):
        normalize_keys({"bucket-size": 10, "bucket_size": 20}, "exp/x/hyper-p.json")


def _ignored(opt: dict, world_size: int = 1) -> tuple[dict, list[str]]:
    h = {"tokenizer": "t", "train": {"option": {"ld": "d/*.tar", **opt}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = loader_options(h, world_size=world_size, where="hp.json")
    return o.ignored, [str(w.message) for w in caught]


def test_no_batching_key_is_ignored_silently():
    ignored, msgs = _ignored({"batching-mode": "bucket", "bucket-size": 8000, "batch_size": 64})
    assert list(ignored) == ["batch_size"] and any("batch_size=64 is not used" in m and "hp.json" in m for m in msgs)
    ignored, msgs = _ignored({"batch_size": 64, "batching-uneven": True, "dynamic_batch_mode": 1})
    assert sorted(ignored) == ["batching_uneven", "dynamic_batch_mode"] and len(msgs) == 2
    # Every batching key CAT knows either changes the loader's arguments or warns.
    base = {"batch_size": 64}
    for key, value in [("bucket-size", 5000), ("batching-mode", "bucket"), ("ld-shuffle-buffer", 10),
                       ("ld-bucket-count-padding", False), ("batching-uneven", True), ("dynamic-batch-mode", 1)]:
        opt = {**base, key: value, **({"bucket_size": 900} if key == "batching-mode" else {})}
        h = {"tokenizer": "t", "train": {"option": {"ld": "d/*.tar", **opt}}}
        plain = loader_options({"tokenizer": "t", "train": {"option": {"ld": "d/*.tar", **base}}}, world_size=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            o = loader_options(h, world_size=1)
        assert o.loader_kwargs != plain.loader_kwargs or caught, key


def test_cat_defaults_and_bad_values():
    # bucket_size -1 is CAT's "unset": batch mode keeps no frame bound.
    o = loader_options({"tokenizer": "t", "train": {"option": {"ld": "d", "batch_size": 8, "bucket_size": -1}}},
                       world_size=2)
    assert o.loader_kwargs == {"max_batch_size": 4, "max_frames": NO_FRAME_BOUND}
    # Without batching_mode, both bounds given both apply.
    o = loader_options({"tokenizer": "t", "train": {"option": {"ld": "d", "batch_size": 8, "bucket-size": 600}}},
                       world_size=2)
    assert o.loader_kwargs == {"max_batch_size": 4, "max_frames": 300}
    with pytest.raises(ValueError, match="bucket_size > 0"):
        loader_options({"tokenizer": "t", "train": {"option": {"ld": "d", "batching-mode": "bucket"}}}, world_size=1)
    with pytest.raises(ValueError, match="'bucket_size' must be an integer"):
        loader_options({"tokenizer": "t", "train": {"option": {"ld": "d", "bucket-size": "lots"}}}, world_size=1)
    # Current CAT ignores 'large-dataset'; without 'ld' the error says what to set.
    with pytest.raises(ValueError, match="set 'ld'"):
        loader_options({"tokenizer": "t", "train": {"option": {"large-dataset": True, "batch_size": 8}}}, world_size=1)
    with pytest.raises(ValueError, match="pickled data"):
        loader_options({"tokenizer": "t", "train": {"option": {"large-dataset": True, "trset": "exp/pkl/train.pkl",
                                                              "batch_size": 8}}}, world_size=1)


def test_hyphenated_hyper_builds_a_bounded_loader(tmp_path):
    """The issue's case: {"large-dataset": true, ...} with "batching-mode"/"bucket-size" must bound frames."""
    out, utts = build(tmp_path, n=80, utts_per_shard=15)
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")
    hp = tmp_path / "hyper-p.json"
    hp.write_text(json.dumps({"tokenizer": {"file": str(tok)},
                              "train": {"option": {"large-dataset": True, "trset": f"{out}/data-*.tar",
                                                   "batching-mode": "bucket", "bucket-size": 2000,
                                                   "grad-norm": 5.0}}}))
    loader = make_loader_from_hyper(hp)
    loader.set_epoch(0)
    batches = list(loader)
    assert Counter(k for b in batches for k in b.keys) == Counter(utts.keys())
    assert all(len(b.keys) * int(b.feat_lens.max()) <= 2000 for b in batches if len(b.keys) > 1)
    assert any(len(b.keys) > 1 for b in batches)


def test_hyper_vocab_size_and_tokenizer_override(tmp_path):
    out, _ = build(tmp_path, n=30, utts_per_shard=15)
    tok = train_char_tokenizer(tmp_path, tmp_path / "kaldi-cat-0" / "text")
    from wdsprep.tokenizer import load_tokenizer

    n = load_tokenizer(tok).vocab_size
    hp = tmp_path / "hyper-p.json"
    # As CAT writes it: the top-level tokenizer names CAT's pickle and records |V|.
    doc = {"tokenizer": {"type": "SimpleTokenizer", "file": str(tmp_path / "tokenizer.tknz"), "|V|": n + 1},
           "train": {"option": {"ld": f"{out}/data-*.tar", "bucket_size": 2000}}}
    hp.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"'|V|' is {n + 1}"):
        make_loader_from_hyper(hp, tokenizer=tok)
    doc["tokenizer"]["|V|"] = n
    hp.write_text(json.dumps(doc))
    assert make_loader_from_hyper(hp, tokenizer=tok) is not None
    with pytest.raises(FileNotFoundError, match="tokenizer.tknz"):
        make_loader_from_hyper(hp)
