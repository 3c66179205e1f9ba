"""The ``wdsprep`` command line; each subcommand mirrors one Python function.

A command that fails prints one line, ``wdsprep CMD: error: ...``, naming the file and what to
do, and exits with status 2 when the command line cannot be carried out as written (an option
value, an input path that does not exist or is a directory, an output path in the way) and 1
when the data is wrong or reading or writing failed (a malformed Kaldi file, a damaged shard, an
unfinished pack, a full disk; ``--strict`` drops; ``verify`` problems).  ``wdsprep --debug CMD``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path

from wdsprep.errors import failure
from wdsprep.options import add_flags, given
from wdsprep.pack.options import Engine, Spread
from wdsprep.tokenizer.base import trainable_kinds
from wdsprep.tokenizer.spm import SPM_MODEL_TYPES


def _add_pack_options(p: argparse.ArgumentParser, *, audio: bool) -> None:
    """The options of ``pack`` and ``pack-audio`` (they write the same shards), from their homes."""
    from wdsprep.pack.options import OutputOptions, PackInputs, PackOptions
    from wdsprep.prep.options import AudioInputs, JobOptions

    add_flags(p, PackInputs)
    p.add_argument("--out", required=True, help="output directory")
    if audio:
        add_flags(p, AudioInputs)
    add_flags(p, PackOptions, only=None if not audio else [n for n in _names(PackOptions) if n != "dims"])
    add_flags(p, JobOptions)
    add_flags(p, OutputOptions)
    add_flags(p.add_argument_group("a pack spread over machines (a job array; docs/fbank.md)"), Spread)
    add_flags(p.add_argument_group("an engine's workers write the shards (docs/fbank.md)"), Engine)


def _add_progress(p: argparse._ActionsContainer) -> None:
    from wdsprep.prep.options import JobOptions

    add_flags(p, JobOptions, only=["progress"])


def _names(cls: type) -> list[str]:
    from wdsprep.options import options_of

    return [f.name for f, _ in options_of(cls)]


SHARDS_HELP = "a pack's folder (or several), or a shard pattern, e.g. 'DIR/*/data-*.tar'"


def _add_shards(p: argparse.ArgumentParser, what: str = "shards") -> None:
    """The shards a command reads: positional patterns (as the command took them before) or --trset,
    which every command that reads shards takes."""
    p.add_argument("patterns", nargs="*", metavar="PATTERN", help=f"{what}: {SHARDS_HELP}")
    p.add_argument("--trset", nargs="+", metavar="PATTERN", help="the same, as the loader's commands name them")


def _shards(args: argparse.Namespace) -> list[str]:
    """The shards named by position or by --trset (one of them)."""
    if args.patterns and args.trset:
        raise ValueError(f"the shards are given twice ({args.patterns[0]} and --trset {args.trset[0]}): give them "
                         f"once")
    named = args.patterns or args.trset
    if not named:
        raise ValueError("give the shards: a pack's folder or a shard pattern (or --trset PATTERN)")
    return named


def _one_or_many(items: list[str] | None) -> str | list[str] | None:
    """--trset's words: one pattern as it is, several as a list."""
    return items[0] if items and len(items) == 1 else items


def _add_wav_scp(p: argparse._ActionsContainer, *, required: bool) -> None:
    p.add_argument("--wav-scp", required=required, help="Kaldi wav.scp: 'recid path' or 'recid command |'")


def _add_from(p: argparse.ArgumentParser, source: argparse._ActionsContainer, kinds: dict) -> None:
    """``--from KIND PATH``: the input in another project's format; its kinds from their registry."""
    from wdsprep.pack.sources import Manifest

    listed = "; ".join(f"{name}: {kind.help}" for name, kind in kinds.items())
    source.add_argument("--from", dest="source", nargs=2, metavar=("KIND", "PATH"),
                        help=f"the utterances, transcripts, speakers and languages in another project's format "
                             f"(docs/import.md), in place of the Kaldi files. KIND: {listed}")
    if any(kind.options for kind in kinds.values()):
        add_flags(p.add_argument_group("--from: which key (hf: column) of a line holds what (nemo, wenet, hf), where "
                                       "text files may be (nemo); --field NAME=KEY carries a key as a field"),
                  Manifest)


def _input(args: argparse.Namespace, kaldi: str) -> object:
    """The pack's input: a Manifest (--from) or the Kaldi file given (with --text)."""
    from wdsprep.pack.sources import Manifest

    if args.source is None:
        if args.f_labels is None:
            raise ValueError("--text is required with --" + kaldi.replace("_", "-"))
        return getattr(args, kaldi)
    from wdsprep.options import named_paths

    kind, path = args.source
    for flag, value in (("--text", args.f_labels), ("--utt2spk", args.utt2spk),
                        ("--segments", getattr(args, "segments", None))):
        if value is not None:
            raise ValueError(f"{flag}: the manifest of --from {kind} names the utterances' transcripts, segments and "
                             f"speakers; give --from alone")
    # With --from, --field NAME=KEY names a key of the manifest's lines, not a table.
    keys, args.fields = (named_paths(args.fields) if args.fields else None), None
    return Manifest(kind, path, fields=keys, **given(args, Manifest))


def _cmd_fbank(args: argparse.Namespace) -> None:
    from wdsprep.prep.fbank import compute_fbank
    from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions

    compute_fbank(args.wav_scp, args.out_dir, **given(args, FbankOptions, AudioInputs, JobOptions))


def _pack_given(args: argparse.Namespace) -> dict:
    """What ``pack`` and ``pack-audio`` were given beside their input, as their function's arguments."""
    from wdsprep.pack.options import AudioOptions, OutputOptions, PackInputs, PackOptions
    from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions

    homes = (PackInputs, PackOptions, JobOptions, OutputOptions, Spread, Engine, AudioInputs, FbankOptions,
             AudioOptions)
    kw = given(args, *homes)
    kw.pop("f_labels", None)
    return kw


def _cmd_pack_audio(args: argparse.Namespace) -> None:
    from wdsprep.pack.from_audio import pack_audio

    pack_audio(_input(args, "wav_scp"), args.f_labels, args.out, **_pack_given(args))


def _cmd_pack(args: argparse.Namespace) -> None:
    from wdsprep.pack import pack_data

    pack_data(_input(args, "scp"), args.f_labels, args.out, **_pack_given(args))


def option_value(text: str) -> bool | int | float | str:
    """A KEY=VALUE option's value as sentencepiece's trainer wants it: true/false, an int, a float, or the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def key_value(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE`` -> (key, parsed value); argparse turns the ValueError into a usage error."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. add_dummy_prefix=false), got {text!r}")
    return key.strip(), option_value(value)


def _train_options(args: argparse.Namespace) -> dict:
    """The trainer's options ``tokenizer train`` and ``aggregate`` were given, as train_tokenizer's arguments."""
    return dict(model_type=args.model_type, user_dict=args.user_dict, keep_spaces=not args.drop_spaces,
                character_coverage=args.character_coverage, spm_options=dict(args.spm_option or []),
                normalize=args.normalize, special_tokens=args.special_tokens or ())


def _transcripts(args: argparse.Namespace) -> object | None:
    """What a tokenizer trains on besides Kaldi text: a manifest (--from KIND PATH) or shards (--trset)."""
    from wdsprep.pack.sources import Manifest
    from wdsprep.tokenizer import ShardTranscripts

    if args.source is not None:
        return Manifest(*args.source, **given(args, Manifest))
    return None if args.trset is None else ShardTranscripts(args.trset)


def _cmd_tokenizer_train(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import train_tokenizer

    source = _transcripts(args) or args.text
    tok = train_tokenizer(args.kind, source, args.out, vocab_size=args.vocab_size, overwrite=args.overwrite,
                          lang=args.lang, **_train_options(args))
    print(f"{args.out}: {tok.kind} tokenizer, vocab_size {tok.vocab_size}", file=sys.stderr)


def _cmd_tokenizer_aggregate(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import aggregate_tokenizers, train_aggregate_tokenizer

    source = _transcripts(args)
    files = _named(args.languages, "tokenizer aggregate", "LANG=FILE", "en=exp/en.json")
    if source is None:
        if not files:
            raise ValueError("give each language's tokenizer file (LANG=FILE ...), or the transcripts to train one per "
                             "language on: --from KIND PATH or --trset PATTERN, with --kind")
        tok = aggregate_tokenizers(files, args.out, special_tokens=args.special_tokens or (), overwrite=args.overwrite)
    else:
        if files:
            raise ValueError("give the languages' tokenizer files (LANG=FILE) or the transcripts to train them on "
                             "(--from, --trset), not both")
        if args.kind is None:
            raise ValueError("--kind: the kind of tokenizer to train for each language (e.g. --kind sentencepiece)")
        sizes = _vocab_sizes(args.vocab_size)
        tok = train_aggregate_tokenizer(args.kind, source, args.out, vocab_size=sizes, overwrite=args.overwrite,
                                        **_train_options(args))
    ranges = ", ".join(f"{lang} {tok.offsets[lang]}..{tok.offsets[lang] + t.vocab_size - 3}"
                       for lang, t in tok.tokenizers.items())
    specials = f", special tokens 2..{1 + len(tok.special_tokens)}" if tok.special_tokens else ""
    print(f"{args.out}: aggregate tokenizer, vocab_size {tok.vocab_size} (ids 0 and 1 shared{specials}; {ranges})",
          file=sys.stderr)


def _vocab_sizes(items: list[str] | None) -> int | dict[str, int] | None:
    """``aggregate``'s --vocab-size: one size for every language, or LANG=N for each."""
    if not items:
        return None
    if len(items) == 1 and "=" not in items[0]:
        return _size(items[0], "--vocab-size")
    return {lang: _size(n, f"--vocab-size {lang}=") for lang, n in
            _named(items, "--vocab-size", "N, or LANG=N for each language", "en=500 zh=3000").items()}


def _size(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag}{text}: not a whole number of ids") from None


def _named(items: list[str] | None, flag: str, form: str, example: str) -> dict[str, str]:
    """A flag's NAME=VALUE items (``form`` says which, ``example`` shows one) as a dict, in order."""
    out: dict[str, str] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise ValueError(f"{flag}: {item!r} is not {form} (e.g. {example})")
        if name in out:
            raise ValueError(f"{flag}: {name!r} is given twice")
        out[name] = value
    return out


def _cmd_tokenizer_import_cat(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import import_cat_tokenizer

    tok = import_cat_tokenizer(args.file, args.out, overwrite=args.overwrite)
    print(f"{args.out}: {tok.kind} tokenizer from {args.file}, vocab_size {tok.vocab_size} (CAT's ids)",
          file=sys.stderr)


def _cmd_tokenizer_encode(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    languages = list(getattr(tok, "languages", ()))
    if args.lang is None and len(languages) > 1:
        raise ValueError(f"--tokenizer {args.tokenizer} holds a tokenizer per language ({', '.join(languages)}): give "
                         f"the language of the text with --lang, e.g. --lang {languages[0]}")
    if args.lang is not None and languages and args.lang not in languages:
        raise ValueError(f"--lang {args.lang}: {args.tokenizer} has no tokenizer for it; its languages: "
                         f"{', '.join(languages)}")
    if args.lang is not None and not languages:
        raise ValueError(f"--lang {args.lang}: {args.tokenizer} is one tokenizer for every language; give --lang only "
                         f"with an aggregate tokenizer (wdsprep tokenizer aggregate)")
    lines = args.texts if args.texts else (line.rstrip("\n") for line in sys.stdin)
    for text in lines:
        ids = tok.encode(text, args.lang) if args.lang else tok.encode(text)  # type: ignore[call-arg]
        if args.ids_only:
            print(" ".join(map(str, ids)))
        else:
            print(" ".join(tok.id_to_piece(i) for i in ids) + "\t" + " ".join(map(str, ids)))


def _cmd_tokenizer_count_labels(args: argparse.Namespace) -> None:
    from wdsprep.plan.tokens import count_labels

    for folder, what in count_labels(_shards(args), args.tokenizer, normalize=args.normalize).items():
        print(f"{folder}: {what}")


def _add_special_tokens(p: argparse.ArgumentParser, *, shared: bool = False) -> None:
    p.add_argument("--special-tokens", nargs="+", metavar="SYMBOL",
                   help="symbols encoded as one id each wherever they appear, in transcripts and text fields, never "
                        "split or changed by a text treatment, e.g. '<|en|>' '<|transcribe|>'"
                        + (" (one id shared by every language, as each language tokenizer's own)" if shared else ""))


def _add_transcripts(p: argparse.ArgumentParser, *, required: bool) -> None:
    """Where a tokenizer's training transcripts are: Kaldi text, a manifest (the pack's readers and
    their key flags), or packed shards (languages from the manifest's or the shards')."""
    from wdsprep.pack.sources import AUDIO_KINDS, Manifest

    src = p.add_mutually_exclusive_group(required=required)
    if required:
        src.add_argument("--text", nargs="+", metavar="TEXT", help="Kaldi text file(s): uttid transcript")
    else:
        p.set_defaults(text=None)
    src.add_argument("--from", dest="source", nargs=2, metavar=("KIND", "PATH"),
                     help=f"the transcripts (and languages) of a manifest, read as pack-audio --from reads it: "
                          f"{', '.join(AUDIO_KINDS)} (docs/import.md)")
    src.add_argument("--trset", nargs="+", metavar="PATTERN", help=f"the transcripts (and languages) of packed "
                                                                   f"shards: {SHARDS_HELP}")
    add_flags(p.add_argument_group("--from: which key (hf: column) of a line holds what"), Manifest)


def _add_train_options(p: argparse.ArgumentParser, *, shared: bool = False) -> None:
    """The trainer's options, which ``train`` and ``aggregate`` (``shared``: its special tokens' ids) share."""
    p.add_argument("--model-type", choices=SPM_MODEL_TYPES, default="unigram",
                   help="sentencepiece model type (default: %(default)s)")
    p.add_argument("--character-coverage", type=float, default=0.9995,
                   help="sentencepiece: share of characters covered, rarer ones become <unk> (default: %(default)s)")
    p.add_argument("--user-dict", help="jieba: user dictionary, lines 'word [freq] [tag]'; stored in the output")
    p.add_argument("--drop-spaces", action="store_true",
                   help="char: drop whitespace instead of a <space> token (e.g. word-segmented Mandarin)")
    p.add_argument("--spm-option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="sentencepiece: a trainer option, repeatable (values true/false, numbers or text), e.g. "
                        "--spm-option add_dummy_prefix=false --spm-option use_all_vocab=true (CAT's char recipes)")
    p.add_argument("--normalize", nargs="+", metavar="STEP",
                   help="treat every transcript before training, as the loader's --normalize does: named steps "
                        "(nfkc, lower, upper, strip_punct, collapse_spaces, remove_spaces, ...) or MODULE:FUNC")
    _add_special_tokens(p, shared=shared)
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _add_tokenizer_parser(sub: argparse._SubParsersAction) -> None:
    tp = sub.add_parser("tokenizer", help="train a tokenizer / show how it encodes text")
    tsub = tp.add_subparsers(dest="tokenizer_command", required=True)
    p = tsub.add_parser("train", help="transcripts (Kaldi text, a manifest, packed shards) -> one JSON tokenizer "
                                      "file (ids: 0=<s>/blank, 1=<unk>)")
    p.add_argument("--kind", choices=trainable_kinds(), required=True,
                   help="simple: the units transcripts write with spaces between them (words, phones), "
                        "as CAT's SimpleTokenizer")
    _add_transcripts(p, required=True)
    p.add_argument("--lang", help="with --from or --trset: train on the transcripts of this language only")
    p.add_argument("--out", required=True, help="tokenizer file to write (JSON)")
    p.add_argument("--vocab-size", type=int, help="ids in total, <s> and <unk> included (required for "
                   "sentencepiece unigram/bpe; char/jieba keep the most frequent pieces)")
    _add_train_options(p)
    p.set_defaults(func=_cmd_tokenizer_train)
    p = tsub.add_parser("aggregate", help="one tokenizer per language -> one JSON tokenizer file: each language's "
                                          "ids in a range of their own, <s> and <unk> shared (ids 0 and 1); the "
                                          "tokenizers given, or trained on each language's transcripts")
    p.add_argument("languages", nargs="*", metavar="LANG=FILE",
                   help="each language's tokenizer file, in the order their ids are laid out, e.g. en=exp/en.json")
    _add_transcripts(p, required=False)
    p.add_argument("--kind", choices=trainable_kinds(), help="with --from or --trset: the kind trained per language")
    p.add_argument("--vocab-size", nargs="+", metavar="N|LANG=N",
                   help="with --from or --trset: each language's ids in total, or LANG=N for each (e.g. en=500 "
                        "zh=3000)")
    p.add_argument("--out", required=True, help="tokenizer file to write (JSON)")
    _add_train_options(p, shared=True)
    p.set_defaults(func=_cmd_tokenizer_aggregate)
    p = tsub.add_parser("import-cat", help="CAT's tokenizer.tknz (read without unpickling) or sentencepiece .model "
                        "-> one JSON tokenizer file with CAT's ids")
    p.add_argument("file", help="CAT's tokenizer file, e.g. exp/NAME/tokenizer.tknz, or a sentencepiece .model")
    p.add_argument("--out", required=True, help="tokenizer file to write (JSON)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_tokenizer_import_cat)
    p = tsub.add_parser("encode", help="print pieces and ids of TEXT (or of each stdin line)")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer file from 'wdsprep tokenizer train' or 'import-cat', or a sentencepiece .model")
    p.add_argument("--ids-only", action="store_true", help="print only the ids")
    p.add_argument("--lang", help="an aggregate tokenizer's language to encode in")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to encode; stdin lines if none")
    p.set_defaults(func=_cmd_tokenizer_encode)
    p = tsub.add_parser("count-labels", help="every label's length in TOKENIZER's tokens, written beside each index "
                                             "(what a cost model that counts tokens plans with; upload it with the "
                                             "index for remote shards)")
    _add_shards(p, "local shards")
    p.add_argument("--tokenizer", required=True, help="tokenizer file (or a sentencepiece .model)")
    p.add_argument("--normalize", nargs="+", metavar="STEP", help="the text treatment the loader applies (its "
                                                                  "--normalize)")
    p.set_defaults(func=_cmd_tokenizer_count_labels)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from wdsprep.check.inspect import inspect_shards, write_json

    result = inspect_shards(_shards(args), plot=args.plot, max_frames_list=args.max_frames, seed=args.seed,
                            **_retry_options(args))
    print(result.format(per_shard=not args.groups_only))
    if args.json:
        write_json(result, args.json)
    return 0 if result.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from wdsprep.check.verify import verify_shards

    result = verify_shards(_shards(args), growing=args.growing, **_retry_options(args))
    print(result.format())
    return 0 if result.ok else 1


def _cmd_index(args: argparse.Namespace) -> int:
    from wdsprep.check.index_remote import index_remote
    from wdsprep.format.reindex import index_shards
    from wdsprep.remote.urls import is_url

    shards = _shards(args)
    remote = any(is_url(p) for p in shards)
    result = (index_remote if remote else index_shards)(shards, refresh=args.refresh, force=args.force,
                                                        index_fields=args.index_field or (), progress=args.progress)
    print(result.format())
    return 0 if result.ok else 1


def _cmd_pattern(args: argparse.Namespace) -> None:
    from wdsprep.format.shardlist import shard_pattern

    print(shard_pattern(args.folder, remote=args.remote, planned=args.planned))


def _add_pattern(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pattern", help="print the shard pattern of a pack's folder, for the loader, inspect or verify; "
                                       "with --remote, of the folder uploaded there (http(s): every shard as brace "
                                       "ranges, as a web server cannot list)")
    p.add_argument("folder", help="the folder a pack wrote (pack --out)")
    p.add_argument("--remote", metavar="URL", help="where the folder was uploaded: s3://BUCKET/PREFIX, "
                                                  "https://HOST/PATH, or a template holding {shard}")
    p.add_argument("--planned", action="store_true", help="the groups a pack still writing will fill (growing)")
    p.set_defaults(func=_cmd_pattern)


def _add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="write the index of shards packed elsewhere (CAT's, a copied folder): "
                                     "headers only; exit 1 if a sample is unreadable")
    _add_shards(p)
    p.add_argument("--refresh", action="store_true",
                   help="read again the shards that changed since they were indexed (size or mtime), keep the rest")
    p.add_argument("--force", action="store_true", help="read every shard again")
    p.add_argument("--index-field", action="append", metavar="NAME",
                   help="a field the samples carry (members KEY.NAME) to make a column of the index, for plans "
                        "(mix_by) and inspect (repeatable; the language, lang, always is)")
    _add_progress(p)
    p.set_defaults(func=_cmd_index)


def _tokenizer_arg(items: list[str] | None) -> str | dict[str, str] | None:
    """--tokenizer: one file, or LANG=FILE items (a tokenizer per language)."""
    if not items:
        return None
    if len(items) == 1 and "=" not in items[0]:
        return items[0]
    return _named(items, "--tokenizer", "one FILE, or LANG=FILE for each language", "en=exp/en.json zh=exp/zh.json")


def _trset(args: argparse.Namespace) -> str | dict[str, str] | None:
    """--trset, or the named corpora of --corpus NAME=PATTERN items."""
    if args.corpus:
        return _named(args.corpus, "--corpus", "NAME=PATTERN", "en='data/en/*/data-*.tar'")
    return _one_or_many(args.trset)


def _cmd_dry_run(args: argparse.Namespace) -> None:
    opts = _loader_options(args)
    trset = _trset(args)
    args.tokenizer = _tokenizer_arg(args.tokenizer)
    if args.plan:
        if args.hyper is not None:  # the shards and batching hyper-p.json names, resolved for --world-size
            from wdsprep.hyper import loader_options, read_hyper

            resolved = loader_options(read_hyper(args.hyper), world_size=args.world_size, where=args.hyper)
            trset, opts = resolved.trset, {**resolved.loader_kwargs, **opts}
            tokenizer = args.tokenizer or resolved.tokenizer_file(args.hyper)
        else:
            tokenizer = args.tokenizer
        if trset is None:
            raise ValueError("dry-run --plan needs --hyper, or --trset (or --corpus) (it reads only the index)")
        from wdsprep.check.planreport import plan_report  # reads only the index: no torch

        plan_report(trset, tokenizer, world_size=args.world_size, epochs=args.epochs, dump_keys=args.dump_keys,
                    stats_json=args.stats_json, plot=args.plot, count_tokens=args.tokenizer is not None, **opts)
        return
    from wdsprep.check.dryrun import dry_run

    dry_run(hyper=args.hyper, trset=trset, tokenizer=args.tokenizer, epochs=args.epochs, dump_keys=args.dump_keys,
            stats_json=args.stats_json, plot=args.plot, **opts)


def _add_loader_options(p: argparse.ArgumentParser, every_help: bool = False) -> None:
    """The options of make_loader, one flag each, from their homes (``plan/options.py``);
    ``--help`` shows those most runs set, ``--help-all`` every one."""
    from wdsprep.plan.options import GROUPS, LoaderOptions

    add_flags(p.add_argument_group("loader options (make_loader's; with --hyper they override hyper-p.json)"
                                   + ("" if every_help else "; --help-all shows every one, docs/loader.md has the "
                                                            "table")),
              LoaderOptions, every_help=every_help)
    for cls, title in GROUPS.values():
        add_flags(p.add_argument_group(title), cls, every_help=every_help)


def _loader_options(args: argparse.Namespace) -> dict:
    """The loader options given on the command line, as make_loader's keyword arguments."""
    from wdsprep.plan.options import GROUPS, LoaderOptions

    out = given(args, LoaderOptions)
    for cls, _ in GROUPS.values():
        out.update(given(args, cls))
    return out


def _add_retry_options(g: argparse._ActionsContainer) -> None:
    """The retries of a remote fetch, for whatever reads remote shards or indexes (verify, inspect)."""
    from wdsprep.plan.options import RETRY_OPTIONS, FetchOptions

    add_flags(g, FetchOptions, only=RETRY_OPTIONS)


def _retry_options(args: argparse.Namespace) -> dict:
    from wdsprep.plan.options import RETRY_OPTIONS, FetchOptions

    return given(args, FetchOptions, only=RETRY_OPTIONS)


def _add_dry_run(sub: argparse._SubParsersAction, every_help: bool = False) -> None:
    p = sub.add_parser("dry-run", help="the training loader without a model: its plan (--plan), or a real pass "
                                       "(torchrun-safe)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hyper", help="CAT hyper-p.json (train:option)")
    src.add_argument("--trset", nargs="+", metavar="PATTERN", help=SHARDS_HELP)
    src.add_argument("--corpus", action="append", metavar="NAME=PATTERN",
                     help="a named corpus (repeat for each); in training they are mixed (see --weights)")
    p.add_argument("--tokenizer", nargs="+", metavar="FILE",
                   help="tokenizer file, or LANG=FILE for each language (a tokenizer per language) (with --trset or "
                        "--corpus; with --plan: the labels' tokens are counted for the report, label padding and "
                        "tokens per second)")
    p.add_argument("--plan", action="store_true", help="print the epoch's plan from the index; read no feature")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")),
                   help="ranks to plan for, with --plan (default: $WORLD_SIZE or 1)")
    p.add_argument("--epochs", type=int, default=1, help="(default: %(default)s)")
    p.add_argument("--dump-keys", metavar="FILE",
                   help="write 'epoch<TAB>step<TAB>uttid' lines (FILE.rankR under torchrun); with --plan, every "
                        "rank's planned batches from the index, 'epoch<TAB>step<TAB>rank<TAB>uttid'")
    p.add_argument("--stats-json", metavar="FILE", help="rank 0 writes every rank's stats per epoch as JSON (with "
                                                        "--plan: the plan's report per epoch)")
    p.add_argument("--plot", metavar="FILE.png", help="mixed corpora: each corpus's realized (with --plan: planned) "
                                                      "share per step against the schedule")
    p.add_argument("--help-all", action="help", help="show every option and exit")
    _add_loader_options(p, every_help)
    p.set_defaults(func=_cmd_dry_run)


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from wdsprep.check.calibrate import calibrate

    result = calibrate(args.model, _one_or_many(args.trset), args.tokenizer, args.out, device=args.device,
                       step=args.step,
                       max_seconds=args.max_seconds, subsampling=args.subsampling, seed=args.seed,
                       tokens_per_frame=args.tokens_per_frame, max_tokens=args.max_tokens, optimizer=args.optimizer,
                       oom_margin=args.oom_margin, max_frames=args.max_frames, max_error=args.max_error,
                       overwrite=args.overwrite, progress=args.progress)
    print(result.format())
    print(f"wrote {args.out}")


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    # Defaults written out, not imported: wdsprep.check.calibrate imports torch, and building the parser must not.
    p = sub.add_parser("calibrate", help="time your model's training step over the corpus's lengths and fit the cost "
                                         "model the loader's batches can be sized by (on CUDA also the largest "
                                         "max_cost that fits in memory)")
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                   help="FACTORY(feat_dim=, vocab_size=) returns the model; its forward(feats, feat_lens, labels, "
                        "label_lens) returns the scalar loss. MODULE: a dotted module or a path to a .py file")
    p.add_argument("--trset", nargs="+", required=True, metavar="PATTERN", help="training shards: a pack's folder or a "
                   "pattern, e.g. 'data/{10_1000,1000_2000}/data-*.tar' "
                                                  "(their index gives the feature dims and the lengths)")
    p.add_argument("--tokenizer", required=True, help="tokenizer file (gives vocab_size)")
    p.add_argument("--out", required=True, help="the cost model to write (JSON)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--step", metavar="MODULE:FUNC",
                   help="FUNC(model, feats, feat_lens, labels, label_lens) returns the loss, instead of the forward "
                        "call (e.g. under torch.autocast)")
    p.add_argument("--max-seconds", type=float, default=120.0,
                   help="time for the timing; fewer shapes and rounds are timed where the full grid does not fit it, "
                        "and the error to expect is printed; the CUDA memory search comes on top (default: "
                        "%(default)s)")
    p.add_argument("--subsampling", type=int, default=4,
                   help="the encoder's frame rate reduction: t = frames / subsampling (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the model, the synthetic batches and the timing order "
                                                       "(default: %(default)s)")
    p.add_argument("--tokens-per-frame", type=float,
                   help="the longest label timed at a length, in tokens per input frame (default: the 95th "
                        "percentile of the corpus's labels, counted with --tokenizer)")
    p.add_argument("--max-tokens", type=int, help="and at most this many tokens")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                   help="the optimizer whose step is timed, and whose state counts in the memory search "
                        "(default: %(default)s)")
    p.add_argument("--oom-margin", type=float, default=0.1,
                   help="CUDA: the share of the largest batch that trained kept free in max_cost (default: "
                        "%(default)s)")
    p.add_argument("--max-frames", type=int, metavar="N",
                   help="the max_frames you would train with otherwise: the costliest batch of its plan, under the "
                        "fitted cost, is the max_cost suggested (and, on CPU, written to --out)")
    p.add_argument("--max-error", type=float, default=0.25, metavar="SHARE",
                   help="write no model that misses a held-out shape by more (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    _add_progress(p)
    p.set_defaults(func=_cmd_calibrate)


def _cmd_rehearse(args: argparse.Namespace) -> int:
    from wdsprep.check.rehearse import rehearse

    result = rehearse(args.model, _trset(args), _tokenizer_arg(args.tokenizer), k=args.k, epoch=args.epoch,
                      device=args.device, step=args.step, optimizer=args.optimizer, world_size=args.world_size,
                      max_seconds=args.max_seconds, **_loader_options(args))
    print(result.format())
    return 1 if result.failed else 0


def _add_rehearse(sub: argparse._SubParsersAction, every_help: bool = False) -> None:
    # Defaults written out, not imported: wdsprep.check.rehearse imports torch, and building the parser must not.
    p = sub.add_parser("rehearse", help="run your model's training step on the epoch's costliest planned batches, "
                                        "with their real data, before training; exit 1 if one runs out of memory")
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                   help="as calibrate takes it: FACTORY(feat_dim=, vocab_size=) returns the model, whose "
                        "forward(feats, feat_lens, labels, label_lens) returns the scalar loss")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trset", nargs="+", metavar="PATTERN", help=SHARDS_HELP)
    src.add_argument("--corpus", action="append", metavar="NAME=PATTERN",
                     help="a named corpus (repeat for each); in training they are mixed (see --weights)")
    p.add_argument("--tokenizer", nargs="+", required=True, metavar="FILE",
                   help="tokenizer file, or LANG=FILE for each language (a tokenizer per language)")
    p.add_argument("--k", type=int, default=8, help="the costliest batches rehearsed (default: %(default)s)")
    p.add_argument("--epoch", type=int, default=0, help="the epoch whose plan they come from (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")),
                   help="ranks the epoch is planned for; every rank's batches are ranked (default: $WORLD_SIZE or 1)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N; on CUDA each step's peak memory is "
                                                   "measured (default: %(default)s)")
    p.add_argument("--step", metavar="MODULE:FUNC",
                   help="FUNC(model, feats, feat_lens, labels, label_lens) returns the loss, instead of the forward "
                        "call (e.g. under torch.autocast)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                   help="the optimizer whose step runs, and whose state counts in the memory (default: %(default)s)")
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="the rehearsal's steps must end within this, all together; past it the step is stopped and "
                        "the command fails saying so (default: %(default)s)")
    _add_loader_options(p, every_help)
    p.set_defaults(func=_cmd_rehearse)


def _add_fbank(sub: argparse._SubParsersAction) -> None:
    from wdsprep.prep.options import AudioInputs, FbankOptions, JobOptions

    p = sub.add_parser("fbank", help="wav.scp [+ segments] -> Kaldi fbank feats.scp + arks")
    _add_wav_scp(p, required=True)
    add_flags(p, AudioInputs)
    add_flags(p, FbankOptions)
    p.add_argument("--out", "--out-dir", dest="out_dir", required=True,
                   help="the folder that gets feats.scp, feats.N.ark, utt2num_frames, fbank_report.json (--out, as "
                        "pack's; --out-dir is the same)")
    add_flags(p, JobOptions)
    p.set_defaults(func=_cmd_fbank)


def _add_pack(sub: argparse._SubParsersAction) -> None:
    from wdsprep.pack.sources import FEATURE_KINDS

    p = sub.add_parser("pack", help="feats.scp + text (or another project's features: --from) -> length-grouped tar "
                                    "shards")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--scp", nargs="+", metavar="SCP", help="Kaldi feats.scp file(s)")
    _add_from(p, source, FEATURE_KINDS)
    _add_pack_options(p, audio=False)
    p.set_defaults(func=_cmd_pack)


def _add_pack_audio(sub: argparse._SubParsersAction) -> None:
    from wdsprep.pack.options import AudioOptions
    from wdsprep.pack.sources import AUDIO_KINDS
    from wdsprep.prep.options import FbankOptions

    p = sub.add_parser("pack-audio", help="wav.scp [+ segments] + text, or another project's manifest (--from) -> "
                                          "shards (fbank on the fly, no ark)")
    source = p.add_mutually_exclusive_group(required=True)
    _add_wav_scp(source, required=False)
    _add_from(p, source, AUDIO_KINDS)
    add_flags(p, FbankOptions)
    _add_pack_options(p, audio=True)
    add_flags(p, AudioOptions)
    p.set_defaults(func=_cmd_pack_audio)


def _cmd_export(args: argparse.Namespace) -> None:
    from wdsprep.export import export_shards

    n = export_shards(args.kind, args.trset, args.out, overwrite=args.overwrite)
    print(f"wrote {args.out}: {n:,} utterances", file=sys.stderr)


def _add_export(sub: argparse._SubParsersAction) -> None:
    from wdsprep.export import EXPORTS

    p = sub.add_parser("export", help="a shard set's utterances (ids, durations, texts, speakers, languages) as "
                                      "another project's manifest")
    p.add_argument("kind", choices=list(EXPORTS), metavar="KIND",
                   help="; ".join(f"{name}: {e.help}" for name, e in EXPORTS.items()))
    p.add_argument("--trset", nargs="+", required=True, metavar="PATTERN", help=f"local shards: {SHARDS_HELP}")
    p.add_argument("--out", required=True, help="the manifest to write, e.g. cuts.jsonl.gz")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_export)


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="per group and shard: utterances, hours, frame and transcript lengths; plots")
    _add_shards(p)
    p.add_argument("--plot", metavar="FILE.png", help="length histogram per group and padding efficiency vs max_frames")
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    p.add_argument("--max-frames", nargs="*", type=int, metavar="N",
                   help="max_frames for the padding-efficiency curve; none to skip (default: 2, 4, 8, 16 and 32 "
                        "times the corpus's 95th-percentile utterance)")
    p.add_argument("--groups-only", action="store_true", help="one line per group, no per-shard lines")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the shuffle the padding-efficiency curve is computed on (default: %(default)s)")
    _add_retry_options(p)
    p.set_defaults(func=_cmd_inspect)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="read every member of every shard, check them and the index; exit 1 on problems")
    _add_shards(p, "shards, local or remote ('s3://BUCKET/PREFIX/*/data-*.tar', https://HOST/...)")
    p.add_argument("--growing", action="store_true",
                   help="accept a folder a pack is still writing (check the shards it published); without it, a "
                        "folder whose pack has not committed is a problem (exit 1)")
    _add_retry_options(p)
    p.set_defaults(func=_cmd_verify)


# Commands that run a script of the repository checkout rather than library code: the demo
# needs the bundled corpus (egs/demo) and the benchmark its baselines, neither of which an
# installed wheel has.  Their options are the script's (``wdsprep demo --help``).
CHECKOUT_TOOLS = {
    "demo": ("tools/demo.py", "the whole pipeline on the bundled real-speech corpus, with a summary and plots"),
    "bench": ("tools/bench/bench.py", "benchmark the loader against raw reads, webdataset and kaldiio"),
}


# Where a checkout tool finds the name it was run by (its argparse prog).
PROG_VARIABLE = "WDSPREP_PROG"


def run_checkout_tool(command: str, argv: list[str]) -> int:
    """Run ``command``'s script from the checkout this package was installed from; its exit status."""
    script, _ = CHECKOUT_TOOLS[command]
    root = Path(__file__).resolve().parent.parent
    path = root / script
    if not path.is_file():
        print(f"wdsprep {command}: error: {path} not found: this command runs {script} of a clone of the wdsprep "
              f"repository, and this wdsprep was installed without one; clone the repository and run it there "
              f"(make demo)", file=sys.stderr)
        return 2
    # The script's usage line then names the command the user typed, not the script.
    return subprocess.run([sys.executable, str(path), *argv], env={**os.environ, PROG_VARIABLE: f"wdsprep {command}"}
                          ).returncode


def _add_checkout_tools(sub: argparse._SubParsersAction) -> None:
    for command, (script, what) in CHECKOUT_TOOLS.items():
        # Listed for --help only: main() hands their arguments to the script untouched.
        sub.add_parser(command, help=f"{what} (runs {script} of a clone)", add_help=False)


def build_parser(every_help: bool = False) -> argparse.ArgumentParser:
    """The command line; ``every_help``: ``--help`` lists every option (what ``--help-all`` asks)."""
    parser = argparse.ArgumentParser(
        prog="wdsprep", description="Kaldi data dirs -> length-grouped tar shards -> a streaming ASR training loader.")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback, not one line")
    sub = parser.add_subparsers(dest="command", required=True)
    # In data-flow order, so --help reads like the pipeline.
    for add in (_add_fbank, _add_pack, _add_pack_audio, _add_pattern, _add_index, _add_tokenizer_parser, _add_inspect,
                _add_verify, _add_export):
        add(sub)
    _add_dry_run(sub, every_help)
    _add_calibrate(sub)
    _add_rehearse(sub, every_help)
    _add_checkout_tools(sub)
    return parser


def unexpected(extra: list[str]) -> str:
    """What to say of words left on the command line: shard files mean that the shell expanded an
    unquoted pattern given to an option that takes one."""
    if all(x.endswith(".tar") or os.path.isfile(x) for x in extra):
        from wdsprep.format.shardlist import folder_pattern

        example = "'DIR/*/data-*.tar'"
        for folder in (os.path.dirname(os.path.dirname(extra[0])), os.path.dirname(extra[0])):
            try:
                example = repr(folder_pattern(folder or "."))
                break
            except (FileNotFoundError, ValueError):
                continue
        return (f"{len(extra)} more shard files after an option's value ({extra[0]} ...): the shell expanded a "
                f"pattern; quote it, e.g. {example}")
    return f"unrecognized arguments: {' '.join(extra)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = bool(argv) and argv[0] == "--debug"
    rest = argv[1:] if debug else argv
    if rest and rest[0] in CHECKOUT_TOOLS:
        return run_checkout_tool(rest[0], rest[1:])
    parser = build_parser(every_help="--help-all" in argv)
    args, extra = parser.parse_known_args(argv)
    command = args.command if args.command != "tokenizer" else f"tokenizer {args.tokenizer_command}"
    if extra:
        parser.exit(2, f"wdsprep {command}: error: {unexpected(extra)}\n")
    # A warning is a line for the user, not a Python traceback-like "file:line: UserWarning".
    plain = warnings.formatwarning
    warnings.formatwarning = lambda message, *_, **__: f"wdsprep {command}: warning: {message}\n"
    try:
        # A subcommand may return an exit status (1: it ran and found problems).
        status = args.func(args)
    except (Exception, KeyboardInterrupt) as e:
        if args.debug:
            raise
        if isinstance(e, BrokenPipeError) and e.filename is None:  # stdout closed early (... | head): not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the exit's flush fails again
            return 141  # as a shell reports a process ended by SIGPIPE
        code, line = failure(e, command)
        print(line, file=sys.stderr)
        return code
    finally:
        warnings.formatwarning = plain
    return status or 0
