"""CAT hyper-p.json: old and current keys, CAT's per-rank split, strict booleans, pass-through."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from shardsets import build, train_char_tokenizer

from wdsprep.hyper import (
    NO_FRAME_BOUND,
    loader_options,
    make_loader_from_hyper,
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
