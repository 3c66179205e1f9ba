#!/usr/bin/env python3
"""Write a Kaldi data dir's ``utt2lang`` and ``text.prev`` (the fields ``pack --utt2lang`` and
``--field prev_text=`` take).

    python local/fields.py exp/multilingual/data/train

``utt2lang``: each utterance's language, the prefix of its id before the first ``_`` (``en_...``,
``zh_...``, ``ru_...``: the demo corpus's convention).  ``text.prev``: the transcript of the same
speaker's previous utterance, in id order (what Whisper-style models are prompted with), and for a
speaker's first utterance an empty value (a line with the id alone).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for d in map(Path, argv):
        texts = dict(line.split(" ", 1) if " " in line else (line, "")
                     for line in (d / "text").read_text(encoding="utf-8").splitlines() if line.strip())
        spk = dict(line.split() for line in (d / "utt2spk").read_text(encoding="utf-8").splitlines() if line.strip())
        last: dict[str, str] = {}
        langs, prev = [], []
        for uttid in sorted(texts):
            langs.append(f"{uttid} {uttid.split('_', 1)[0]}\n")
            before = last.get(spk[uttid], "")
            prev.append(f"{uttid} {before}\n" if before else f"{uttid}\n")
            last[spk[uttid]] = texts[uttid]
        (d / "utt2lang").write_text("".join(langs), encoding="utf-8")
        (d / "text.prev").write_text("".join(prev), encoding="utf-8")
        found = sorted({line.split()[1] for line in langs})
        print(f"fields: {d}: utt2lang ({', '.join(found)}) and text.prev for {len(texts)} utterances")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
