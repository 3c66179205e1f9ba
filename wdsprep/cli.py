"""The ``wdsprep`` command line; each subcommand mirrors one Python function."""

from __future__ import annotations

import argparse
import shlex
import sys

from .kaldi import KaldiDataError
from .report import StrictError


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


def _cmd_pack(args: argparse.Namespace) -> None:
    from .pack import pack_data

    pack_data(args.scp, args.text, args.out, args.fmt, args.filter_group, utts_per_shard=args.utts_per_shard,
              layout=args.layout, dtype=args.dtype, nj=args.nj, strict=args.strict, overwrite=args.overwrite)


def _cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run_cli

    run_cli(args, " ".join(["wdsprep", *map(shlex.quote, sys.argv[1:])]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wdsprep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="feats.scp + text -> length-grouped tar shards")
    p.add_argument("--scp", nargs="+", required=True, metavar="SCP", help="Kaldi feats.scp file(s)")
    _add_pack_options(p)
    p.set_defaults(func=_cmd_pack)

    from .bench import add_arguments as add_bench_arguments  # stdlib + numpy only: cheap

    p = sub.add_parser("bench", help="benchmark the loader against raw reads, webdataset and kaldiio")
    add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (KaldiDataError, FileExistsError, ValueError, FileNotFoundError) as e:
        print(f"wdsprep {args.command}: error: {e}", file=sys.stderr)
        return 2
    except StrictError as e:
        print(f"wdsprep {args.command}: {e}", file=sys.stderr)
        return 1
    return 0
