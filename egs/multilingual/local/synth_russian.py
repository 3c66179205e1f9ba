#!/usr/bin/env python3
"""Synthesize a small Russian corpus with espeak-ng: a third language, in its own script, beside
the demo corpus's English and Mandarin.

    python local/synth_russian.py --out exp/multilingual/data/ru --num-utts 40 --seed 0

Writes OUT/{train,dev}/{wav.scp,text,utt2spk} and OUT/audio/<uttid>.wav (espeak-ng's 22,050 Hz
mono: ``pack-audio`` resamples to 16 kHz as it packs).  Ids are ``ru_SPEAKER-NNNN``, the demo
corpus's convention; transcripts are lower-case Cyrillic words.  Sentences come from the word
lists below (nothing is downloaded); every choice from one ``random.Random(seed)``, and espeak-ng
is deterministic, so the same seed gives the same corpus.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

SUBJECTS = ["кот", "собака", "мальчик", "девочка", "учитель", "друг", "сосед", "брат"]
VERBS = ["видит", "любит", "читает", "ждёт", "знает", "слушает", "рисует", "ищет"]
OBJECTS = ["книгу", "море", "город", "окно", "письмо", "музыку", "дорогу", "картину"]
TAILS = ["сегодня", "утром", "вечером", "дома", "в парке", "очень тихо", "каждый день", "снова"]
# (espeak-ng voice variant, words per minute): one speaker each; the last one is the dev speaker.
SPEAKERS = [("m1", 150), ("f2", 165), ("m3", 175), ("f4", 160)]


def sentence(rng: random.Random) -> str:
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.6:
        words.append(rng.choice(TAILS))
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for train/, dev/ and audio/")
    ap.add_argument("--num-utts", type=int, default=40, help="utterances in all (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    audio = args.out / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[tuple[str, str, str]]] = {"train": [], "dev": []}
    for k in range(args.num_utts):
        variant, wpm = SPEAKERS[k % len(SPEAKERS)]
        spk = f"ru_{variant}"
        uttid = f"{spk}-{k:04d}"
        text = sentence(rng)
        wav = audio / f"{uttid}.wav"
        subprocess.run(["espeak-ng", "-v", f"ru+{variant}", "-s", str(wpm), "-w", str(wav), text], check=True)
        part = "dev" if k % len(SPEAKERS) == len(SPEAKERS) - 1 else "train"
        rows[part].append((uttid, spk, text))
    for part, utts in rows.items():
        d = args.out / part
        d.mkdir(parents=True, exist_ok=True)
        (d / "wav.scp").write_text("".join(f"{u} {audio.resolve() / (u + '.wav')}\n" for u, _, _ in utts),
                                   encoding="utf-8")
        (d / "text").write_text("".join(f"{u} {t}\n" for u, _, t in utts), encoding="utf-8")
        (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s, _ in utts), encoding="utf-8")
        print(f"synth_russian: {d}: {len(utts)} utterances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
