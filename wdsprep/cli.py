"""The ``wdsprep`` command line; each subcommand mirrors one Python function."""

from __future__ import annotations

import argparse
import subprocess
import sys
import warnings
from pathlib import Path

from wdsprep.check.inspect import DEFAULT_MAX_FRAMES
from wdsprep.prep.fbank import BackendUnavailable
from wdsprep.prep.kaldi import KaldiDataError
from wdsprep.report import StrictError


def _add_pack_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``pack`` and ``pack-audio`` (they write the same shards)."""
    p.add_argument("--text", nargs="+", required=True, metavar="TEXT", help="Kaldi text file(s)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--filter-group", nargs="+", metavar="LO:HI",
                   help="length groups in frames, LO <= frames < HI; an open end is allowed (:10, 1000:)")
    p.add_argument("--fmt", default="data-%05d.tar", help="shard file name (default: %(default)s)")
    p.add_argument("--utts-per-shard", type=int, default=2000, help="(default: %(default)s)")
    p.add_argument("--layout", choices=["cat", "cat-v3"], default="cat",
                   help="cat: KEY.npy + KEY.txt; cat-v3: KEY.mat.npy + KEY.label.txt (default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="feature dtype on disk; readers return float32 (default: %(default)s)")
    p.add_argument("--nj", type=int, default=1, help="worker processes (default: %(default)s)")
    p.add_argument("--strict", action="store_true", help="exit non-zero if any utterance is not packed or flagged")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the shards, indexes and report of an earlier pack in --out")
    _add_progress(p)


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: only on a terminal)")


def _add_audio_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``fbank`` and ``pack-audio`` (they compute the same features)."""
    p.add_argument("--wav-scp", required=True, help="Kaldi wav.scp: 'recid path' or 'recid command |'")
    p.add_argument("--segments", help="Kaldi segments: 'uttid recid start end [channel]', end -1 = to the end")
    p.add_argument("--num-mel-bins", type=int, default=80, help="(default: %(default)s)")
    p.add_argument("--sample-rate", type=int, default=16000,
                   help="audio at another rate is resampled (default: %(default)s)")
    p.add_argument("--dither", type=float, default=0.0,
                   help="Kaldi's default is 1.0; 0 makes features reproducible (default: %(default)s)")
    p.add_argument("--backend", choices=["auto", "torchaudio", "kaldi-native-fbank"], default="auto",
                   help="auto: torchaudio if it imports, else kaldi-native-fbank (default: %(default)s)")
    p.add_argument("--channel", type=int, default=0,
                   help="channel of multi-channel audio unless the segments line names one (default: %(default)s)")


def _cmd_fbank(args: argparse.Namespace) -> None:
    from wdsprep.prep.fbank import compute_fbank

    compute_fbank(args.wav_scp, args.out_dir, segments=args.segments, num_mel_bins=args.num_mel_bins,
                  sample_rate=args.sample_rate, dither=args.dither, backend=args.backend, channel=args.channel,
                  nj=args.nj, strict=args.strict, progress=args.progress)


def _cmd_pack_audio(args: argparse.Namespace) -> None:
    from wdsprep.pack.from_audio import pack_audio

    pack_audio(args.wav_scp, args.text, args.out, args.fmt, args.filter_group, segments=args.segments,
               num_mel_bins=args.num_mel_bins, sample_rate=args.sample_rate, dither=args.dither,
               backend=args.backend, channel=args.channel, utts_per_shard=args.utts_per_shard,
               layout=args.layout, dtype=args.dtype, nj=args.nj, strict=args.strict, overwrite=args.overwrite,
               progress=args.progress)


def _cmd_pack(args: argparse.Namespace) -> None:
    from wdsprep.pack import pack_data

    pack_data(args.scp, args.text, args.out, args.fmt, args.filter_group, utts_per_shard=args.utts_per_shard,
              layout=args.layout, dtype=args.dtype, nj=args.nj, strict=args.strict, overwrite=args.overwrite,
              progress=args.progress)


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


def _cmd_tokenizer_train(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import train_tokenizer

    tok = train_tokenizer(args.kind, args.text, args.out, vocab_size=args.vocab_size, model_type=args.model_type,
                          user_dict=args.user_dict, keep_spaces=not args.drop_spaces,
                          character_coverage=args.character_coverage, spm_options=dict(args.spm_option or []),
                          overwrite=args.overwrite)
    print(f"{args.out}: {tok.kind} tokenizer, vocab_size {tok.vocab_size}", file=sys.stderr)


def _cmd_tokenizer_import_cat(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import import_cat_tokenizer

    tok = import_cat_tokenizer(args.file, args.out, overwrite=args.overwrite)
    print(f"{args.out}: {tok.kind} tokenizer from {args.file}, vocab_size {tok.vocab_size} (CAT's ids)", file=sys.stderr)


def _cmd_tokenizer_encode(args: argparse.Namespace) -> None:
    from wdsprep.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    lines = args.texts if args.texts else (line.rstrip("\n") for line in sys.stdin)
    for text in lines:
        ids = tok.encode(text)
        if args.ids_only:
            print(" ".join(map(str, ids)))
        else:
            print(" ".join(tok.id_to_piece(i) for i in ids) + "\t" + " ".join(map(str, ids)))


def _add_tokenizer_parser(sub: argparse._SubParsersAction) -> None:
    tp = sub.add_parser("tokenizer", help="train a tokenizer / show how it encodes text")
    tsub = tp.add_subparsers(dest="tokenizer_command", required=True)
    p = tsub.add_parser("train", help="Kaldi text -> one JSON tokenizer file (ids: 0=<s>/blank, 1=<unk>)")
    p.add_argument("--kind", choices=["sentencepiece", "jieba", "char", "simple"], required=True,
                   help="simple: the units transcripts write with spaces between them (words, phones), "
                        "as CAT's SimpleTokenizer")
    p.add_argument("--text", nargs="+", required=True, metavar="TEXT", help="Kaldi text file(s): uttid transcript")
    p.add_argument("--out", required=True, help="tokenizer file to write (JSON)")
    p.add_argument("--vocab-size", type=int, help="ids in total, <s> and <unk> included (required for "
                   "sentencepiece unigram/bpe; char/jieba keep the most frequent pieces)")
    p.add_argument("--model-type", choices=["unigram", "bpe", "char"], default="unigram",
                   help="sentencepiece model type (default: %(default)s)")
    p.add_argument("--character-coverage", type=float, default=0.9995,
                   help="sentencepiece: share of characters covered, rarer ones become <unk> (default: %(default)s)")
    p.add_argument("--user-dict", help="jieba: user dictionary, lines 'word [freq] [tag]'; stored in the output")
    p.add_argument("--drop-spaces", action="store_true",
                   help="char: drop whitespace instead of a <space> token (e.g. word-segmented Mandarin)")
    p.add_argument("--spm-option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="sentencepiece: a trainer option, repeatable (values true/false, numbers or text), e.g. "
                        "--spm-option add_dummy_prefix=false --spm-option use_all_vocab=true (CAT's char recipes)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_cmd_tokenizer_train)
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
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to encode; stdin lines if none")
    p.set_defaults(func=_cmd_tokenizer_encode)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from wdsprep.check.inspect import inspect_shards, write_json

    result = inspect_shards(args.patterns, plot=args.plot, max_frames_list=args.max_frames, seed=args.seed)
    print(result.format(per_shard=not args.groups_only))
    if args.json:
        write_json(result, args.json)
    return 0 if result.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from wdsprep.check.verify import verify_shards

    result = verify_shards(args.patterns)
    print(result.format())
    return 0 if result.ok else 1


def _cmd_dry_run(args: argparse.Namespace) -> None:
    from wdsprep.check.dryrun import dry_run

    dry_run(hyper=args.hyper, trset=args.trset, tokenizer=args.tokenizer, max_frames=args.max_frames,
            epochs=args.epochs, dump_keys=args.dump_keys, num_workers=args.num_workers, seed=args.seed,
            stats_json=args.stats_json)


def _add_dry_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dry-run", help="iterate the training loader without a model and report (torchrun-safe)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hyper", help="CAT hyper-p.json (train:option)")
    src.add_argument("--trset", help="shard pattern, e.g. 'data/{10_1000,1000_2000}/data-*.tar'")
    p.add_argument("--tokenizer", help="tokenizer file (with --trset)")
    p.add_argument("--max-frames", type=int, help="padded frames per rank batch (with --trset)")
    p.add_argument("--epochs", type=int, default=1, help="(default: %(default)s)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    p.add_argument("--dump-keys", metavar="FILE",
                   help="write 'epoch<TAB>step<TAB>uttid' lines (FILE.rankR under torchrun)")
    p.add_argument("--stats-json", metavar="FILE", help="rank 0 writes every rank's stats per epoch as JSON")
    p.set_defaults(func=_cmd_dry_run)


def _add_fbank(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fbank", help="wav.scp [+ segments] -> Kaldi fbank feats.scp + arks")
    _add_audio_options(p)
    p.add_argument("--out-dir", required=True, help="gets feats.scp, feats.N.ark, utt2num_frames, fbank_report.json")
    p.add_argument("--nj", type=int, default=1, help="worker processes (default: %(default)s)")
    p.add_argument("--strict", action="store_true", help="exit non-zero if any utterance was skipped")
    _add_progress(p)
    p.set_defaults(func=_cmd_fbank)


def _add_pack(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pack", help="feats.scp + text -> length-grouped tar shards")
    p.add_argument("--scp", nargs="+", required=True, metavar="SCP", help="Kaldi feats.scp file(s)")
    _add_pack_options(p)
    p.set_defaults(func=_cmd_pack)


def _add_pack_audio(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pack-audio", help="wav.scp [+ segments] + text -> shards (fbank on the fly, no ark)")
    _add_audio_options(p)
    _add_pack_options(p)
    p.set_defaults(func=_cmd_pack_audio)


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="per group and shard: utterances, hours, frame and transcript lengths; plots")
    p.add_argument("patterns", nargs="+", metavar="PATTERN", help="shards, e.g. 'DIR/{10_1000,1000_2000}/data-*.tar'")
    p.add_argument("--plot", metavar="FILE.png", help="length histogram per group and padding efficiency vs max_frames")
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    p.add_argument("--max-frames", nargs="*", type=int, default=list(DEFAULT_MAX_FRAMES),
                   metavar="N", help="max_frames for the padding-efficiency curve; none to skip (default: %(default)s)")
    p.add_argument("--groups-only", action="store_true", help="one line per group, no per-shard lines")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the shuffle the padding-efficiency curve is computed on (default: %(default)s)")
    p.set_defaults(func=_cmd_inspect)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="read every member of every shard, check them and the index; exit 1 on problems")
    p.add_argument("patterns", nargs="+", metavar="PATTERN", help="shards, e.g. 'DIR/*/data-*.tar'")
    p.set_defaults(func=_cmd_verify)


# Commands that run a script of the repository checkout rather than library code: the demo
# needs the bundled corpus (egs/demo) and the benchmark its baselines, neither of which an
# installed wheel has.  Their options are the script's (``wdsprep demo --help``).
CHECKOUT_TOOLS = {
    "demo": ("tools/demo.py", "the whole pipeline on the bundled real-speech corpus, with a summary and plots"),
    "bench": ("tools/bench/bench.py", "benchmark the loader against raw reads, webdataset and kaldiio"),
}


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
    return subprocess.run([sys.executable, str(path), *argv]).returncode


def _add_checkout_tools(sub: argparse._SubParsersAction) -> None:
    for command, (script, what) in CHECKOUT_TOOLS.items():
        # Listed for --help only: main() hands their arguments to the script untouched.
        sub.add_parser(command, help=f"{what} (runs {script} of a clone)", add_help=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wdsprep", description="Kaldi data dirs -> length-grouped tar shards -> a streaming ASR training loader.")
    sub = parser.add_subparsers(dest="command", required=True)
    # In data-flow order, so --help reads like the pipeline.
    for add in (_add_fbank, _add_pack, _add_pack_audio, _add_tokenizer_parser, _add_inspect, _add_verify,
                _add_dry_run, _add_checkout_tools):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in CHECKOUT_TOOLS:
        return run_checkout_tool(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    # A warning is a line for the user, not a Python traceback-like "file:line: UserWarning".
    plain = warnings.formatwarning
    warnings.formatwarning = lambda message, *_, **__: f"wdsprep {args.command}: warning: {message}\n"
    try:
        # A subcommand may return an exit status (1: it ran and found problems).
        status = args.func(args)
    except (KaldiDataError, FileExistsError, ValueError, FileNotFoundError, BackendUnavailable) as e:
        print(f"wdsprep {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StrictError as e:
        print(f"wdsprep {args.command}: {e}", file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = plain
    return status or 0
