#!/usr/bin/env python3
"""Pack a Kaldi data dir's audio (not features) into length-grouped shards: KEY.flac + KEY.txt.

    python local/pack_audio_shards.py --wav-scp data/train/wav.scp --text data/train/text \\
        --utt2spk data/train/utt2spk --out exp/audio/shards/train --filter-group :80 80:200 200: \\
        --utts-per-shard 16 [--format flac|wav] [--num-mel-bins 80] [--backend numpy]

A stand-in for ``wdsprep pack-audio --store flac``, which is not wired yet: it reads the audio
as ``pack-audio`` does (``wav.scp`` paths or pipes, resampled to ``--sample-rate``, channel 0),
puts each utterance in the length group of its fbank frame count, orders each group with
``pack``'s seeded shuffle, and writes every shard through the format's own writer
(``wdsprep.format.writer.write_audio_shard``) and every folder's index (sample counts, rate and
the fbank options the loader will compute features with).  Utterances without a transcript, or
whose audio is unreadable or shorter than one frame, are reported and left out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from wdsprep.format.index import FROM_KEYS, FROM_UTT2SPK, AudioIndex, FolderIndex, Speakers, write_index
from wdsprep.format.keys import decode_key, speaker_of
from wdsprep.format.writer import write_audio_shard
from wdsprep.pack.groups import Groups
from wdsprep.pack.plan import plan_shards
from wdsprep.prep.audio import AudioProblem, iter_waveforms, read_utterances
from wdsprep.prep.kaldi import read_text, read_utt2spk
from wdsprep.report import Report
from wdsprep.units import fbank_frames, frame_samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wav-scp", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--utt2spk", help="speakers for the index (default: the id up to its first '-')")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--filter-group", nargs="+", metavar="LO:HI", help="length groups in fbank frames")
    ap.add_argument("--utts-per-shard", type=int, default=2000)
    ap.add_argument("--format", choices=["flac", "wav"], default="flac")
    ap.add_argument("--sample-rate", type=int, default=16000)
    ap.add_argument("--num-mel-bins", type=int, default=80, help="recorded for the loader (default: %(default)s)")
    ap.add_argument("--backend", default="numpy", help="fbank backend recorded for the loader (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="of the shuffle into shards (pack's)")
    args = ap.parse_args(argv)

    report = Report()
    utts = read_utterances(args.wav_scp, None, report)
    texts = read_text([args.text])
    speakers = read_utt2spk([args.utt2spk]) if args.utt2spk else None
    groups = Groups(args.filter_group) if args.filter_group else None
    window = frame_samples(args.sample_rate)[0]
    pcm: dict[str, np.ndarray] = {}
    for u, wave in iter_waveforms(utts, sample_rate=args.sample_rate, min_samples=window):
        if isinstance(wave, AudioProblem):
            report.drop(wave.reason, u.uttid, wave.detail)
        elif u.uttid not in texts:
            report.drop("missing_label", u.uttid, f"in {u.where}, not in {args.text}")
        else:  # 16-bit, as stored: the int16 range the readers give, rounded
            pcm[u.uttid] = np.clip(np.rint(wave), -32768, 32767).astype(np.int16)
    ids = list(pcm)
    frames = np.array([fbank_frames(len(pcm[u]), args.sample_rate) for u in ids], np.int64)
    folders = [(g.folder if g is not None else None) for g in (groups.find(int(f)) for f in frames)] if groups \
        else ["."] * len(ids)
    for u, f in zip(ids, folders):
        if f is None:
            report.drop("outside_groups", u, "no length group holds its frame count")
    order = [g.folder for g in groups] if groups else ["."]
    if args.out.exists():
        shutil.rmtree(args.out)  # a recipe stage: its output is made anew
    audio = AudioIndex(args.format, args.sample_rate, num_mel_bins=args.num_mel_bins, backend=args.backend)
    written: dict[str, list] = {}
    for shard in plan_shards(ids, folders, frames, order, utts_per_shard=args.utts_per_shard, shuffle=True,
                             seed=args.seed):
        d = args.out / shard.folder
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"data-{len(written.get(shard.folder, [])):05d}.tar"
        items = [(ids[i], pcm[ids[i]], texts[ids[i]].value) for i in shard.items.tolist()]
        info = write_audio_shard(path, items, fmt=args.format, sample_rate=args.sample_rate)
        written.setdefault(shard.folder, []).append((info, os.stat(path)))
    for folder, shards in written.items():
        uttids = [decode_key(k) for s, _ in shards for k in s.keys]
        who = [speakers.get(u, speaker_of(u)) if speakers else speaker_of(u) for u in uttids]
        index = FolderIndex.from_shards(args.format, args.num_mel_bins, "float32", [s for s, _ in shards],
                                        sizes=[st.st_size for _, st in shards],
                                        mtimes=[st.st_mtime_ns for _, st in shards],
                                        speakers=Speakers.of(who, FROM_UTT2SPK if speakers else FROM_KEYS),
                                        audio=audio)
        write_index(args.out / folder, index)
        hours = index.num_frames / 360000
        print(f"pack_audio_shards: {args.out / folder}: {len(shards)} shards, {index.num_utts} utterances, "
              f"{hours:.3f} h, {sum(st.st_size for _, st in shards) / 1e6:.1f} MB {args.format}")
    for reason, items in report.dropped.items():
        print(f"pack_audio_shards: not packed ({reason}): {len(items)}, e.g. {items[0]['uttid']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
