#!/usr/bin/env bash
# wdsprep mixing recipe: the bundled corpus's English and Mandarin halves as two corpora, mixed
# on a schedule (90/10 to 50/50 of the utterances), planned, plotted and trained on.
#
# Usage (from anywhere; the recipe runs from egs/mix like a Kaldi recipe):
#   bash egs/mix/run.sh                        # all stages
#   bash egs/mix/run.sh --stage 4 --stop-stage 5 --ramp 200
#
# Stages:
#   0  split data/train (egs/demo's corpus) by language: $exp/data/train/{en,zh}
#   1  fbank (80-dim) for each language and for dev
#   2  pack each language into its own shards, with egs/demo's conf/pack.conf
#   3  train the character tokenizer on all train transcripts
#   4  write $exp/hyper-p.json whose `ld` is an object: the corpora and the schedule
#   5  the plan (dry-run --plan: scheduled against planned share per step range), then a real
#      pass on $nproc ranks that plots each corpus's realized share against the schedule:
#      $exp/mixture.png
#   6  train with torchrun (egs/demo's local/train.py; the loader is the mixed one)
#
# Options (each also settable by the upper-case environment variable):
#   --stage N --stop-stage M   run stages N..M (default 0..6)
#   --nproc N       ranks (NPROC, default 2)
#   --nj N          parallel jobs for fbank and pack (NJ, default 2)
#   --ramp N        global step at which the schedule reaches 50/50 (RAMP, default 300)
#   --epochs N      training epochs (EPOCHS; default 40, written into hyper-p.json at stage 4; given
#                   with --stage 6 it overrides hyper-p.json); the stage 5 pass runs 30
#   --exp DIR       all generated files go here (EXP, default exp/mix)
#   --max-steps N   stop training after N steps (MAX_STEPS; for quick checks)
set -euo pipefail

stage=0
stop_stage=6
nproc=${NPROC:-2}
nj=${NJ:-2}
ramp=${RAMP:-300}
epochs=${EPOCHS:-}  # empty: 40 when writing hyper-p.json; stage 6 then follows hyper-p.json
exp=${EXP:-exp/mix}
max_steps=${MAX_STEPS:-}
bucket_size=${BUCKET_SIZE:-1000}  # frames per step over all ranks, as in egs/demo
data=data
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

. "$(dirname "$0")/local/parse_options.sh"
cd "$(dirname "$0")"

. local/common.sh  # log, need, the install check
langs=(en zh)
schedule="[[0, {\"en\": 9, \"zh\": 1}], [$ramp, {\"en\": 1, \"zh\": 1}]]"

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log 0 "splitting $data/train by language -> $exp/data/train/{en,zh}"
  local/split_by_language.sh "$data/train" "$exp/data/train" "${langs[@]}"
  python local/check_data.py "$exp/data/train/en" "$exp/data/train/zh" "$data/dev"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  need "$exp/data/train/en/wav.scp" 0
  for part in train/en train/zh; do
    log 1 "fbank for $exp/data/$part -> $exp/fbank/$part"
    wdsprep fbank --wav-scp "$exp/data/$part/wav.scp" --out-dir "$exp/fbank/$part" --num-mel-bins 80 --nj "$nj"
  done
  log 1 "fbank for $data/dev -> $exp/fbank/dev"
  wdsprep fbank --wav-scp "$data/dev/wav.scp" --out-dir "$exp/fbank/dev" --num-mel-bins 80 --nj "$nj"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  need "$exp/fbank/train/en/feats.scp" 1
  pack_opts=$(grep -v '^#' conf/pack.conf | tr '\n' ' ')
  for lang in "${langs[@]}"; do
    log 2 "packing $lang ($pack_opts) -> $exp/shards/$lang"
    # shellcheck disable=SC2086  # $pack_opts is a list of words on purpose
    wdsprep pack --scp "$exp/fbank/train/$lang/feats.scp" --text "$exp/data/train/$lang/text" \
      --utt2spk "$exp/data/train/$lang/utt2spk" --out "$exp/shards/$lang" $pack_opts --nj "$nj" --overwrite
  done
  log 2 "packing dev -> $exp/shards/dev"
  wdsprep pack --scp "$exp/fbank/dev/feats.scp" --text "$data/dev/text" --out "$exp/shards/dev" \
    --utt2spk "$data/dev/utt2spk" --utts-per-shard "$(awk '$1 == "--utts-per-shard" {print $2}' conf/pack.conf)" --nj "$nj" --overwrite
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log 3 "training a char tokenizer on $data/train/text -> $exp/tokenizer.json"
  wdsprep tokenizer train --kind char --text "$data/train/text" --out "$exp/tokenizer.json" --overwrite
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  need "$exp/shards/en/pack_report.json" 2
  need "$exp/tokenizer.json" 3
  log 4 "writing $exp/hyper-p.json: ld = {corpora: en, zh; schedule: $schedule}"
  python local/make_hyper.py --corpus en="$exp/shards/en" zh="$exp/shards/zh" --mix schedule="$schedule" \
    --dev-shards "$exp/shards/dev" --tokenizer "$exp/tokenizer.json" --out "$exp/hyper-p.json" \
    --model dropout=0.0 \
    --set epochs="${epochs:-40}" lr=1e-3 warmup_steps=50 seed=0 bucket_size="$bucket_size" ld_shuffle_buffer=100
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  need "$exp/hyper-p.json" 4
  log 5 "the mixed plan for $nproc rank(s), from the index alone"
  wdsprep dry-run --plan --hyper "$exp/hyper-p.json" --world-size "$nproc" --epochs 2
  log 5 "a real pass of 30 epochs on $nproc rank(s) -> $exp/mixture.png"
  torchrun --standalone --nproc_per_node="$nproc" -m wdsprep dry-run --hyper "$exp/hyper-p.json" \
    --epochs 30 --plot "$exp/mixture.png" --stats-json "$exp/dry_run.json" | tail -n 17
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  need "$exp/hyper-p.json" 4
  log 6 "training on $nproc rank(s): torchrun local/train.py --hyper $exp/hyper-p.json"
  extra=()
  [ -n "$max_steps" ] && extra+=(--max-steps "$max_steps")
  [ -n "$epochs" ] && extra+=(--epochs "$epochs")  # given explicitly: overrides hyper-p.json
  torchrun --standalone --nproc_per_node="$nproc" local/train.py \
    --hyper "$exp/hyper-p.json" --exp-dir "$exp" "${extra[@]}" 2>&1 | tee "$exp/train.log"
fi

echo "$0: done (stages $stage..$stop_stage)"
