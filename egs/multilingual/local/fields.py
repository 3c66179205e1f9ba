#!/usr/bin/env python3
"""Write a Kaldi data dir's ``utt2lang`` and ``text.prompt`` (the fields ``pack --utt2lang`` and
``--field prompt=`` take).

    python local/fields.py exp/multilingual/data/train
    python local/fields.py --special-tokens    # the prompt's symbols, for the tokenizer

``utt2lang``: each utterance's language, the prefix of its id before the first ``_`` (``en_...``,
``zh_...``, ``ru_...``: the demo corpus's convention).  ``text.prompt``: a Whisper-style prompt of
special tokens and text, ``<|prev|>`` and the transcript of the same speaker's previous utterance
in id order (nothing for a speaker's first), then the language and the task:
``<|prev|>the quick fox<|en|><|transcribe|>``.  ``SPECIAL_TOKENS`` lists the symbols; the
tokenizer is trained with them (``tokenizer aggregate --special-tokens``), so each is one id.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL_TOKENS = ["<|prev|>", "<|en|>", "<|zh|>", "<|ru|>", "<|transcribe|>"]


def main(argv: list[str]) -> int:
    if argv == ["--special-tokens"]:
        print(" ".join(SPECIAL_TOKENS))
        return 0
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for d in map(Path, argv):
        texts = dict(line.split(" ", 1) if " " in line else (line, "")
                     for line in (d / "text").read_text(encoding="utf-8").splitlines() if line.strip())
        spk = dict(line.split() for line in (d / "utt2spk").read_text(encoding="utf-8").splitlines() if line.strip())
        last: dict[str, str] = {}
        langs, prompts = [], []
        for uttid in sorted(texts):
            lang = uttid.split("_", 1)[0]
            langs.append(f"{uttid} {lang}\n")
            prompts.append(f"{uttid} <|prev|>{last.get(spk[uttid], '')}<|{lang}|><|transcribe|>\n")
            last[spk[uttid]] = texts[uttid]
        (d / "utt2lang").write_text("".join(langs), encoding="utf-8")
        (d / "text.prompt").write_text("".join(prompts), encoding="utf-8")
        found = sorted({line.split()[1] for line in langs})
        print(f"fields: {d}: utt2lang ({', '.join(found)}) and text.prompt for {len(texts)} utterances")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
