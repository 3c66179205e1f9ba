#!/usr/bin/env bash
# Split a Kaldi data dir by the language prefix of its utterance ids (en_..., zh_...).
#
#     local/split_by_language.sh data/train exp/mix/data/train en zh
#
# Writes OUT/LANG/{wav.scp,text,utt2spk,spk2utt} (and segments, utt2dur when present) with the
# lines whose first field starts with "LANG_", in the source's order.  Fails when a language
# matches nothing, so a wrong prefix never yields an empty corpus.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SRC_DIR OUT_DIR LANG [LANG ...]" >&2; exit 1; }
src=$1; out=$2; shift 2
for lang in "$@"; do
  d=$out/$lang
  mkdir -p "$d"
  for f in wav.scp text utt2spk segments utt2dur; do
    [ -f "$src/$f" ] || continue
    awk -v p="${lang}_" 'index($1, p) == 1' "$src/$f" > "$d/$f.tmp" && mv "$d/$f.tmp" "$d/$f"
  done
  # spk2utt from utt2spk, speakers in first-seen order.
  awk '{ if (!($2 in u)) o[n++] = $2; u[$2] = u[$2] " " $1 } END { for (i = 0; i < n; i++) print o[i] u[o[i]] }' \
    "$d/utt2spk" > "$d/spk2utt"
  n=$(wc -l < "$d/text")
  [ "$n" -gt 0 ] || { echo "$0: no utterance id in $src starts with '${lang}_'" >&2; exit 1; }
  echo "$0: $d: $n utterances"
done
