"""The CLI mirrors the Python API: every argument a function takes has an option of its subcommand;
make_loader's options have one home each (``plan/options.py``), and its signature, the CLI's
flags, hyper-p.json's ``ld`` keys, the defaults and the resume fingerprint's rule agree with it."""

from __future__ import annotations

import argparse
import inspect

import pytest

import wdsprep
from wdsprep.check.calibrate import calibrate
from wdsprep.check.dryrun import dry_run
from wdsprep.check.planreport import plan_report
from wdsprep.check.rehearse import rehearse
from wdsprep.cli import build_parser
from wdsprep.export import export_shards
from wdsprep.plan.tokens import count_labels
from wdsprep.tokenizer import aggregate_tokenizers

# (subcommand path, function, {parameter: option dest where the names differ}, parameters with no option and why)
MIRRORS = [
    (("fbank",), wdsprep.compute_fbank, {}, {}),
    (("pack",), wdsprep.pack_data, {"f_scps": "scp", "d_out": "out"}, {"executor": "Python's: --dask makes one"}),
    (("pack-audio",), wdsprep.pack_audio, {"d_out": "out"}, {"executor": "Python's: --dask makes one"}),
    (("tokenizer", "train"), wdsprep.train_tokenizer,
     {"text_files": "text", "keep_spaces": "drop_spaces", "spm_options": "spm_option"}, {}),
    (("tokenizer", "import-cat"), wdsprep.import_cat_tokenizer, {"path": "file"}, {}),
    (("tokenizer", "aggregate"), aggregate_tokenizers, {}, {}),
    (("inspect",), wdsprep.inspect_shards, {"max_frames_list": "max_frames"}, {}),
    (("verify",), wdsprep.verify_shards, {}, {}),
    (("dry-run",), dry_run, {}, {"out": "the report goes to stdout", "loader_options": "make_loader's: below"}),
    (("dry-run",), wdsprep.make_loader, {},
     {"trset": "--trset or --hyper", "tokenizer": "--tokenizer", "options": "each option has its flag (below)",
      "overrides": "each option has its flag (below)"}),
    (("index",), wdsprep.index_shards, {"index_fields": "index_field"}, {}),
    (("pattern",), wdsprep.shard_pattern, {}, {}),
    (("tokenizer", "count-labels"), count_labels, {}, {}),
    (("dry-run",), plan_report, {}, {"out": "the report goes to stdout", "windows": "a printout detail",
                                     "loader_options": "make_loader's: above", "count_tokens": "--tokenizer given"}),
    (("calibrate",), calibrate, {}, {}),
    (("rehearse",), rehearse, {}, {"loader_options": "make_loader's: below"}),
    (("rehearse",), wdsprep.make_loader, {},
     {"trset": "--trset or --corpus", "tokenizer": "--tokenizer", "options": "each option has its flag (below)",
      "overrides": "each option has its flag (below)"}),
    (("export",), export_shards, {}, {}),
]


def _subparser(path: tuple[str, ...], every_help: bool = False) -> argparse.ArgumentParser:
    parser = build_parser(every_help)
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


def test_make_loader_options_have_one_home_that_the_keywords_flags_keys_and_docstring_follow():
    """Every option of the groups is a keyword make_loader takes (TypeError for any other) and has an
    entry in its docstring, written from the home; every flag is the field's, unset by default;
    hyper-p.json's ld keys are the fields that say so; make_loader's own source restates none."""
    from dataclasses import fields

    from wdsprep.hyper import LD_KEYS
    from wdsprep.options import default, flag_of, options_of
    from wdsprep.plan.options import GROUPS, OWNER, LoaderOptions

    homes = [LoaderOptions, *(cls for cls, _ in GROUPS.values())]
    option_fields = {f.name: (f, s) for cls in homes for f, s in options_of(cls)}
    assert set(option_fields) == set(OWNER)
    base = LoaderOptions.of(max_frames=100)
    values = base.values()
    assert set(values) == set(OWNER) and LoaderOptions.of(**values) == base
    for name, (f, _) in option_fields.items():
        assert values[name] == default(f) or name == "max_frames"
    with pytest.raises(TypeError, match="max_frame"):
        LoaderOptions.of(max_frame=100)
    doc = " ".join(wdsprep.make_loader.__doc__.split())
    for name, (f, s) in option_fields.items():
        assert f"{name}: {' '.join((s.doc or s.help).split())[:50]}" in doc, name
    source = inspect.getsource(wdsprep.make_loader)
    assert "locals()" not in source
    assert not [s.help for f, s in option_fields.values() if s.help[:30] in source]
    dests = {a.dest: a for a in _subparser(("dry-run",), every_help=True)._actions}
    flagged = {n for n, (f, s) in option_fields.items() if flag_of(f, s) is not None}
    assert flagged == set(OWNER) - {"rank", "world_size"}
    for name in flagged:
        action = dests[name]
        assert flag_of(*option_fields[name]) in action.option_strings and action.default is None
        d = default(option_fields[name][0])
        if d is not None and not isinstance(d, bool):
            assert f"(default: {d})" in action.help, f"--help of {name} does not say its default"
    assert LD_KEYS == {"shards", "corpora"} | {n for n, (f, s) in option_fields.items() if s.ld}
    assert not [f.name for cls in homes for f in fields(cls) if f.name in option_fields and f.name not in OWNER]


def test_make_loader_takes_the_options_as_one_value_with_keywords_over_it():
    from wdsprep.plan.options import LoaderOptions

    opts = LoaderOptions.of(max_frames=500, seed=3, num_workers=1)
    assert opts.replaced(seed=4).seed == 4 and opts.replaced(seed=4).plan.max_frames == 500
    assert opts.replaced() is opts
    with pytest.raises(ValueError, match="num_workers"):
        opts.replaced(num_workers=-1)


# The plan options every resume state has held since version 2; any other is held only once set
# (``when_set``), or older states would stop resuming.
ALWAYS_FINGERPRINTED = {"max_frames", "max_batch_size", "shuffle_buffer", "pool_size", "min_frames", "max_utt_frames",
                        "streams", "train", "max_utts_per_speaker"}


def test_plan_options_added_since_the_first_states_are_fingerprinted_only_when_set():
    from dataclasses import fields, replace

    from wdsprep.options import fingerprinted
    from wdsprep.plan.streams import PlanOptions, fingerprint

    added = [f for f in fields(PlanOptions) if f.name not in ALWAYS_FINGERPRINTED]
    assert added and all(f.metadata.get("when_set") and f.default is None for f in added), \
        [f.name for f in added if not f.metadata.get("when_set") or f.default is not None]
    base = PlanOptions(max_frames=100)
    # unset, an added option is not in the digest (the options an older state's digest was made of);
    # set, it is
    assert set(fingerprinted(base)) == ALWAYS_FINGERPRINTED
    assert fingerprint(replace(base, max_cost=5.0, cost={"per_frame": 1.0}), "shards") != fingerprint(base, "shards")


def test_the_options_table_of_the_docs_is_written_from_the_homes():
    from docs_options import DOC, with_table

    text = DOC.read_text(encoding="utf-8")
    assert with_table(text) == text, "docs/loader.md's options table is stale: run python tools/docs_options.py"


# The flags of pack, pack-audio and fbank written by hand in cli.py, not made from a home.
HAND_SPELLED = {"pack": {"scp", "source", "out"}, "pack-audio": {"wav_scp", "source", "out"},
                "fbank": {"wav_scp", "out_dir"}}


def _pack_homes():
    from wdsprep.pack.options import AudioOptions, Engine, OutputOptions, PackInputs, PackOptions, Spread
    from wdsprep.pack.sources import Manifest
    from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions

    return (PackOptions, AudioOptions, FbankOptions, PackInputs, AudioInputs, JobOptions, OutputOptions, Spread,
            Engine, Manifest)


@pytest.mark.parametrize("command,func", [("pack", wdsprep.pack_data), ("pack-audio", wdsprep.pack_audio),
                                          ("fbank", wdsprep.compute_fbank)])
def test_pack_and_fbank_options_have_one_home_that_flags_and_signatures_follow(command, func):
    """Every flag but the input and output is made from an option's home, with its flag and choices,
    unset unless given; every signature default is the home's (pack_audio's layout and dtype: None,
    the features' unless a --store of audio refuses them)."""
    from wdsprep.options import default, flag_of, options_of

    homes = {f.name: (f, s) for cls in _pack_homes() for f, s in options_of(cls)}
    actions = [a for a in _subparser((command,), every_help=True)._actions if a.dest != "help"]
    hand = {a.dest for a in actions if a.dest not in homes}
    assert hand == HAND_SPELLED[command] and len(hand) <= 3
    for a in actions:
        if a.dest in homes:
            f, s = homes[a.dest]
            assert flag_of(f, s) in a.option_strings and a.default is None, a.dest
            assert a.choices == (list(s.kind.choices) if s.kind.choices else None) or a.choices == s.kind.choices
    own = ("layout", "dtype") if func is wdsprep.pack_audio else ()
    params = {n: p for n, p in inspect.signature(func).parameters.items() if n in homes and n not in own}
    for name, p in params.items():
        if p.default is not inspect.Parameter.empty:  # f_labels is a positional input
            assert p.default == default(homes[name][0]), f"{func.__name__}'s default of {name} is not its home's"
        f, s = homes[name]  # and the docstring says what the home says of it
        assert f"{name}: {' '.join((s.doc or s.help).split())[:40]}" in " ".join(func.__doc__.split()), name


def test_the_resume_record_is_the_options_that_decide_the_shards():
    """A pack's resume record holds every option of its home marked as deciding the shards, and
    nothing else: a feature pack's, and an audio pack's (its fbank options and store, no dims; a
    lossy store's encoder settings, which no option changes)."""
    from wdsprep.options import options_of
    from wdsprep.pack.options import AudioOptions, PackOptions
    from wdsprep.prep.options import FbankOptions

    deciding = {f.name for f, s in options_of(PackOptions) if s.plan}
    assert set(PackOptions(index_fields=["x"], fields=["x"]).record()) == deciding | {"fields"}
    audio = AudioOptions(FbankOptions(backend="numpy"), "opus")
    record = PackOptions(layout="opus", audio=audio).record()
    unset = {f.name for f, s in options_of(FbankOptions) if f.metadata["when_set"]}  # held once set: channel
    assert set(record) == ((deciding - {"dims", "index_fields"}) | {f.name for f, s in options_of(FbankOptions)}
                           | {f.name for f, s in options_of(AudioOptions)} | {"encoder"}) - unset
    assert (record["store"], record["bitrate"], record["num_mel_bins"]) == ("opus", 32000, FbankOptions.num_mel_bins)
    one = AudioOptions(FbankOptions(backend="numpy", channel=1), "flac")
    assert PackOptions(layout="flac", audio=one).record()["channel"] == 1


@pytest.mark.parametrize("flags", [["--layout", "cat-v3"], ["--dtype", "float16"], ["--layout", "cat", "--dtype",
                                                                                       "float32"]])
def test_an_audio_store_with_feature_layout_or_dtype_is_refused_naming_both(tmp_path, flags, capsys):
    from wdsprep.cli import main

    wav = tmp_path / "wav.scp"
    wav.write_text("u1 /nonexistent.wav\n")
    (tmp_path / "text").write_text("u1 hello\n")
    code = main(["pack-audio", "--wav-scp", str(wav), "--text", str(tmp_path / "text"), "--out", str(tmp_path / "o"),
                 "--store", "flac", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "--store" in err and all(f"({f})" in err for f in flags if f.startswith("--")), err
    assert not (tmp_path / "o").exists()
