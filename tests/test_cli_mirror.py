"""The CLI mirrors the Python API: every argument a function takes has an option of its subcommand."""

from __future__ import annotations

import argparse
import inspect

import pytest

import wdsprep
from wdsprep.check.dryrun import dry_run
from wdsprep.check.planreport import plan_report
from wdsprep.cli import build_parser
from wdsprep.loading.tokens import count_labels

# (subcommand path, function, {parameter: option dest where the names differ}, parameters with no option and why)
MIRRORS = [
    (("fbank",), wdsprep.compute_fbank, {}, {}),
    (("pack",), wdsprep.pack_data, {"f_scps": "scp", "f_labels": "text", "d_out": "out"}, {}),
    (("pack-audio",), wdsprep.pack_audio, {"f_labels": "text", "d_out": "out"}, {}),
    (("tokenizer", "train"), wdsprep.train_tokenizer,
     {"text_files": "text", "keep_spaces": "drop_spaces", "spm_options": "spm_option"}, {}),
    (("tokenizer", "import-cat"), wdsprep.import_cat_tokenizer, {"path": "file"}, {}),
    (("inspect",), wdsprep.inspect_shards, {"max_frames_list": "max_frames"}, {}),
    (("verify",), wdsprep.verify_shards, {}, {}),
    (("dry-run",), dry_run, {}, {"out": "the report goes to stdout", "loader_options": "make_loader's: below"}),
    (("dry-run",), wdsprep.make_loader, {"train": "dev", "persistent_workers": "no_persistent_workers"},
     {"trset": "--trset or --hyper", "tokenizer": "--tokenizer", "rank": "torchrun's", "world_size": "torchrun's"}),
    (("index",), wdsprep.index_shards, {}, {}),
    (("tokenizer", "count-labels"), count_labels, {}, {}),
    (("dry-run",), plan_report, {}, {"out": "the report goes to stdout", "windows": "a printout detail",
                                     "plan_options": "make_loader's: above"}),
]


def _subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("path,func,renamed,exempt", MIRRORS, ids=[" ".join(m[0]) for m in MIRRORS])
def test_every_api_argument_has_an_option(path, func, renamed, exempt):
    dests = {a.dest for a in _subparser(path)._actions}
    missing = [name for name in inspect.signature(func).parameters
               if name not in exempt and renamed.get(name, name) not in dests]
    assert not missing, f"wdsprep {' '.join(path)} has no option for {func.__name__}({', '.join(missing)})"
