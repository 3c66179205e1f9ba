#!/usr/bin/env bash
# Regenerates the committed test clips (real, if robotic, speech from espeak-ng).
# Needs: espeak-ng, sox, and a Python with soundfile (for the MP3, which this sox cannot write).
# Usage: tests/data/audio/make_clips.sh [python]
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

espeak-ng -v en-us -w "$tmp/a.wav" "The quick brown fox jumps over the lazy dog."
espeak-ng -v en-us -w "$tmp/b.wav" "Speech recognition needs a lot of data."
espeak-ng -v cmn-latn-pinyin -w "$tmp/c.wav" "ni3 hao3 shi4 jie4."
espeak-ng -v en-us -w "$tmp/d.wav" "Seven shards."

# 16 kHz FLAC, a longer recording that segments point into (English, then Mandarin).
sox "$tmp/a.wav" "$tmp/c.wav" -r 16000 -b 16 en_zh_16k.flac
# 22.05 kHz WAV (espeak's own rate): resampled on read.
sox "$tmp/c.wav" -b 16 zh_22k.wav
# 8 kHz OGG.
sox "$tmp/b.wav" -r 8000 en_8k.ogg
# MP3 at 16 kHz, written with libsndfile through soundfile.
sox "$tmp/d.wav" -r 16000 -b 16 "$tmp/d16.wav"
"$PY" -c "import soundfile as sf, sys; x, r = sf.read(sys.argv[1]); sf.write(sys.argv[2], x, r, format='MP3')" \
    "$tmp/d16.wav" en_16k.mp3
# Stereo 16 kHz WAV: left = d, right = start of b (different speech, so channel choice shows).
sox "$tmp/d.wav" -r 16000 -b 16 "$tmp/l.wav"
sox "$tmp/b.wav" -r 16000 -b 16 "$tmp/r.wav" trim 0 "$(soxi -D "$tmp/l.wav")"
sox -M "$tmp/l.wav" "$tmp/r.wav" stereo_16k.wav
# 16 kHz mono WAV, the reference for pipes and int16 scaling.
cp "$tmp/l.wav" en_16k.wav
ls -l
