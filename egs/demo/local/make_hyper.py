#!/usr/bin/env python3
"""Write a CAT-style ``hyper-p.json`` whose ``train:option.ld`` is a brace pattern over length groups.

    python local/make_hyper.py --shards exp/demo/shards/train --dev-shards exp/demo/shards/dev \\
        --tokenizer exp/demo/tokenizer.model --out exp/demo/hyper-p.json --set epochs=10 lr=2e-3

Only the group folders that ``wdsprep pack`` actually filled go into the pattern (an empty group
would make the pattern match nothing); the pattern is expanded once here so a broken one fails now,
not at the start of training.  With ``--remote s3://bucket/prefix/train`` or
``--remote https://host/shards/train`` the pattern names the same shards where they were uploaded
(S3: the groups as a brace list and a glob, which the loader answers by listing the bucket;
http(s): every shard as brace ranges, since a web server cannot list); a template holding
``{shard}`` (``'pipe:aws s3 cp s3://b/train/{shard} -'``) is filled the same way.  ``--set
KEY=VALUE`` adds or overrides ``train:option`` keys and
``--model KEY=VALUE`` the model section (values are parsed as JSON when they can be).

``--growing N`` (stage 6): the shards are still being written by ``pack-audio`` (or are about to
be); the pattern covers the groups of the pack's plan (``pack_plan.json``; before it is written,
every group: ``DIR/*/data-*.tar``), and ``ld`` becomes ``{"shards": PATTERN, "growing": true,
"min_shards": N}``: training follows the shards as they are published.

Named corpora to mix (``egs/mix``): ``--corpus en=DIR zh=DIR`` instead of ``--shards``, and
``--mix schedule='[[0, {"en": 9, "zh": 1}], [400, {"en": 1, "zh": 1}]]'`` (or ``weights=``,
``temperature=``, ``steps_per_epoch=``): ``ld`` becomes the object wdsprep reads.  So does
``--augment '{"speed": {"factors": [0.9, 1.0, 1.1]}, "specaugment": {}}'`` (``egs/audio``): the
training loader's augmentation, ``ld.augment``.  ``--ld KEY=VALUE`` (``egs/multilingual``) adds any
other loader option to the ``ld`` object (``mix_by=lang mix_unit=utterance text_fields='["prompt"]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from wdsprep import shard_pattern
from wdsprep.format.shardlist import expand_shards


def pattern_of(folder: str | Path, **kw: Any) -> str:
    """``wdsprep.shard_pattern`` of a folder a stage packed, or the recipe's one-line error."""
    try:
        return shard_pattern(folder, **kw)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"make_hyper: {e}; did the pack stage run?") from None


def parse_kv(items: list[str]) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (JSON values where they parse)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"make_hyper: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train = ap.add_mutually_exclusive_group(required=True)
    train.add_argument("--shards", type=Path, help="train shard dir (pack --out)")
    train.add_argument("--corpus", nargs="+", metavar="NAME=DIR", help="named train shard dirs, to mix")
    ap.add_argument("--mix", nargs="*", default=[], metavar="KEY=VALUE",
                    help="with --corpus: schedule=, weights=, temperature= or steps_per_epoch= (JSON values)")
    ap.add_argument("--augment", type=json.loads, metavar="JSON",
                    help="the training loader's augmentation (ld.augment), e.g. '{\"specaugment\": {}}'")
    ap.add_argument("--ld", nargs="*", default=[], metavar="KEY=VALUE",
                    help="other loader options of the ld object (JSON values), e.g. mix_by=lang temperature=2")
    ap.add_argument("--dev-shards", type=Path, help="dev shard dir (pack --out)")
    ap.add_argument("--remote", metavar="URL",
                    help="the train shard dir was uploaded here: s3://bucket/prefix/train or https://host/shards/train "
                         "(or a template holding {shard} = LO_HI/data-{0..N}.tar, e.g. 'pipe:curl -s URL/{shard}')")
    ap.add_argument("--dev-remote", metavar="URL", help="as --remote, for the dev shards")
    ap.add_argument("--growing", type=int, metavar="MIN_SHARDS",
                    help="the train shards are still being packed: follow them (ld.growing), starting once "
                         "MIN_SHARDS are published")
    ap.add_argument("--tokenizer", required=True, help="tokenizer file (wdsprep tokenizer train --out)")
    ap.add_argument("--out", required=True, type=Path, help="hyper-p.json to write")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="train:option keys")
    ap.add_argument("--model", nargs="*", default=[], metavar="KEY=VALUE", help="model keys")
    ap.add_argument("--data", nargs="*", default=[], metavar="NAME=DIR",
                    help="source Kaldi data dirs, recorded in the top-level 'data' section as CAT does")
    args = ap.parse_args(argv)

    ld: Any
    if args.corpus:
        if args.remote:
            raise SystemExit("make_hyper: --remote takes one --shards dir, not --corpus")
        corpora = {name: pattern_of(str(d)) for name, d in parse_kv(args.corpus).items()}
        ld = {"corpora": corpora, **parse_kv(args.mix)}
        n_train = sum(len(expand_shards(p)) for p in corpora.values())
    elif args.growing is not None:
        pattern = pattern_of(args.shards, planned=True)
        ld = {"shards": pattern, "growing": True, "min_shards": args.growing}
        n_train = "still being packed:"
    else:
        if args.mix:
            raise SystemExit("make_hyper: --mix mixes named corpora: give them with --corpus")
        ld = pattern_of(args.shards, remote=args.remote)
        # Expanded once here so a broken pattern fails now; an s3:// glob is not listed (the upload may
        # still be running): the local copy is counted instead.
        n_train = len(expand_shards(pattern_of(args.shards) if ld.startswith("s3://") else ld))
        if args.augment:
            ld = {"shards": ld}
    if args.augment:
        ld["augment"] = args.augment
    if args.ld:
        ld = ld if isinstance(ld, dict) else {"shards": ld}
        ld.update(parse_kv(args.ld))
    option: dict[str, Any] = {
        "ld": ld,
        "tokenizer": {"file": args.tokenizer},
        # Frames per step over all ranks (CAT's meaning); each rank batches bucket_size / world.
        "bucket_size": 20000,
        "batching_mode": "bucket",
        "ld_shuffle_buffer": 500,
        "seed": 0,
        "epochs": 10,
        "lr": 2e-3,
    }
    if args.dev_shards:
        option["dev_ld"] = pattern_of(args.dev_shards, remote=args.dev_remote)
        expand_shards(pattern_of(args.dev_shards) if option["dev_ld"].startswith("s3://") else option["dev_ld"])
    option.update(parse_kv(args.set))
    hyper = {
        "data": parse_kv(args.data),
        "tokenizer": {"file": args.tokenizer},
        "model": {"idim": 80, "d_model": 144, "lstm_layers": 2, "lstm_hidden": 160, "dropout": 0.1,
                  **parse_kv(args.model)},
        # CAT's layout: wdsprep.make_loader_from_hyper reads train.option, as CAT's trainer does.
        "train": {"bin": "local/train.py", "option": option},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(hyper, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"make_hyper: wrote {args.out}: ld={json.dumps(ld, ensure_ascii=False)} ({n_train} train shards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
