#!/usr/bin/env python3
"""Check Kaldi data dirs before spending time on features (like Kaldi's validate_data_dir.sh).

    python local/check_data.py data/train data/dev

Needs ``text`` plus ``wav.scp`` or ``feats.scp``; checks ids agree across ``text``, ``wav.scp``
(through ``segments`` when present), ``feats.scp`` and ``utt2spk``, that local audio files exist
(relative paths are taken from the current directory, as Kaldi does), and prints counts.  Exits
non-zero with the file and line of the first problem.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from wdsprep.prep.kaldi import KaldiDataError, read_tables, read_text


def check_dir(d: Path, *, check_audio: bool = True) -> dict[str, int]:
    """Validate one data dir; returns counts, raises KaldiDataError naming the problem."""
    if not (d / "text").is_file():
        raise KaldiDataError(f"{d}: no 'text' file; is this a Kaldi data dir?")
    text = read_text([d / "text"])
    has_wav, has_feats = (d / "wav.scp").is_file(), (d / "feats.scp").is_file()
    if not (has_wav or has_feats):
        raise KaldiDataError(f"{d}: needs wav.scp (audio) or feats.scp (features)")
    counts = {"utterances": len(text)}
    empty = [k for k, e in text.items() if not e.value.strip()]
    if empty:
        raise KaldiDataError(f"{d / 'text'}: {len(empty)} empty transcript(s), e.g. {empty[0]!r}")

    if has_wav:
        wav = read_tables([d / "wav.scp"], "wav.scp")
        counts["recordings"] = len(wav)
        if (d / "segments").is_file():
            segs = read_tables([d / "segments"], "segments")
            for e in segs.values():
                rec = e.value.split()[0]
                if rec not in wav:
                    raise KaldiDataError(f"{e.where}: recording {rec!r} is not in {d / 'wav.scp'}")
            audio_ids = set(segs)
        else:
            audio_ids = set(wav)
        _same_ids(text, audio_ids, d / "text", "segments" if (d / "segments").is_file() else "wav.scp")
        if check_audio:
            for e in wav.values():
                if e.value.rstrip().endswith("|"):
                    continue  # a command; only running it would tell
                if not os.path.isfile(e.value):
                    raise KaldiDataError(f"{e.where}: audio file {e.value!r} not found (relative to {os.getcwd()})")
    if has_feats:
        feats = read_tables([d / "feats.scp"], "feats.scp")
        _same_ids(text, set(feats), d / "text", "feats.scp")
    if (d / "utt2spk").is_file():
        u2s = read_tables([d / "utt2spk"], "utt2spk")
        _same_ids(text, set(u2s), d / "text", "utt2spk")
        counts["speakers"] = len({e.value for e in u2s.values()})
    return counts


def _same_ids(text: dict, other: set[str], text_path: Path, other_name: str) -> None:
    missing, extra = sorted(set(text) - other), sorted(other - set(text))
    if missing or extra:
        what = f"{len(missing)} in text only (e.g. {missing[0]!r})" if missing else \
            f"{len(extra)} in {other_name} only (e.g. {extra[0]!r})"
        raise KaldiDataError(f"{text_path}: ids of text and {other_name} differ: {what}; "
                             f"fix the data dir (Kaldi: utils/fix_data_dir.sh)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--no-audio-check", action="store_true", help="skip checking audio files exist")
    args = ap.parse_args(argv)
    for d in args.dirs:
        try:
            counts = check_dir(d, check_audio=not args.no_audio_check)
        except KaldiDataError as e:
            print(f"check_data: error: {e}", file=sys.stderr)
            return 1
        print(f"check_data: {d}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
