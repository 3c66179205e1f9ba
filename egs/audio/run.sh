#!/usr/bin/env bash
# wdsprep audio-shard recipe: the bundled corpus stored as FLAC in shards, features computed while
# training, with speed perturbation (drawn by the plan) and SpecAugment instead of Kaldi's
# speed-perturbed copies on disk.
#
# Usage (from anywhere; the recipe runs from egs/audio like a Kaldi recipe):
#   bash egs/audio/run.sh                        # all stages
#   bash egs/audio/run.sh --stage 3 --stop-stage 4 --speed "0.9 1.0 1.1"
#
# Stages:
#   0  check data/{train,dev} (egs/demo's corpus)
#   1  pack the audio into length-grouped FLAC shards (train) and one folder (dev), with
#      egs/demo's conf/pack.conf (`wdsprep pack-audio --store flac`); then verify them.
#   2  train the character tokenizer
#   3  write $exp/hyper-p.json whose `ld` is an object: the shards and the augmentation
#   4  the plan with speed perturbation (dry-run --plan: perturbed lengths), then one real epoch
#      on $nproc ranks with 2 workers each: features made in the workers
#   5  train with torchrun (egs/demo's local/train.py; make_loader_from_hyper gives the
#      augmented loader, the dev loader reads the dev audio shards unaugmented)
#
# Options (each also settable by the upper-case environment variable):
#   --stage N --stop-stage M   run stages N..M (default 0..5)
#   --nproc N       ranks (NPROC, default 2)
#   --speed "F ..." speed factors (SPEED, default "0.9 1.0 1.1"; "1.0" for none)
#   --format F      flac or wav (FORMAT, default flac)
#   --epochs N      training epochs (EPOCHS; default 50, written into hyper-p.json at stage 3;
#                   given with --stage 5 it overrides hyper-p.json)
#   --exp DIR       all generated files go here (EXP, default exp/audio)
#   --max-steps N   stop training after N steps (MAX_STEPS; for quick checks)
set -euo pipefail

stage=0
stop_stage=5
nproc=${NPROC:-2}
speed=${SPEED:-"0.9 1.0 1.1"}
format=${FORMAT:-flac}
epochs=${EPOCHS:-}  # empty: 50 when writing hyper-p.json; stage 5 then follows hyper-p.json
exp=${EXP:-exp/audio}
max_steps=${MAX_STEPS:-}
bucket_size=${BUCKET_SIZE:-1000}  # frames per step over all ranks, as in egs/demo
data=data
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

. "$(dirname "$0")/local/parse_options.sh"
cd "$(dirname "$0")"

. local/common.sh  # log, need, the install check
factors=$(echo "$speed" | tr ' ' ',')
augment="{\"speed\": {\"factors\": [$factors]}, \"specaugment\": {\"freq_masks\": 2, \"freq_width\": 15, \"time_masks\": 2, \"time_width\": 20}}"

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log 0 "checking the Kaldi data dirs $data/train $data/dev"
  python local/check_data.py "$data/train" "$data/dev"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  pack_opts=$(grep -v '^#' conf/pack.conf | tr '\n' ' ')
  for part in train dev; do
    opts=$pack_opts
    [ "$part" = dev ] && opts="--utts-per-shard $(awk '$1 == "--utts-per-shard" {print $2}' conf/pack.conf)"
    log 1 "packing the audio of $data/$part ($opts) -> $exp/shards/$part ($format)"
    # shellcheck disable=SC2086  # $opts is a list of words on purpose
    wdsprep pack-audio --store "$format" --wav-scp "$data/$part/wav.scp" --text "$data/$part/text" \
      --utt2spk "$data/$part/utt2spk" --out "$exp/shards/$part" --overwrite --no-progress $opts
  done
  wdsprep verify "$exp/shards/train/*/data-*.tar" "$exp/shards/dev/data-*.tar"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log 2 "training a char tokenizer on $data/train/text -> $exp/tokenizer.json"
  wdsprep tokenizer train --kind char --text "$data/train/text" --out "$exp/tokenizer.json" --overwrite
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  need "$exp/shards/train/pack_report.json" 1
  need "$exp/tokenizer.json" 2
  log 3 "writing $exp/hyper-p.json: ld = {shards, augment: $augment}"
  python local/make_hyper.py --shards "$exp/shards/train" --dev-shards "$exp/shards/dev" --augment "$augment" \
    --tokenizer "$exp/tokenizer.json" --out "$exp/hyper-p.json" --model dropout=0.0 \
    --set epochs="${epochs:-50}" lr=1e-3 warmup_steps=50 seed=0 bucket_size="$bucket_size" ld_shuffle_buffer=100
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  need "$exp/hyper-p.json" 3
  log 4 "the plan of 2 epochs for $nproc rank(s), from the index alone, with the speed factors it draws"
  wdsprep dry-run --plan --hyper "$exp/hyper-p.json" --world-size "$nproc" --epochs 2
  log 4 "one real epoch on $nproc rank(s) with 2 workers each: fbank, speed and SpecAugment in the workers"
  torchrun --standalone --nproc_per_node="$nproc" -m wdsprep dry-run --hyper "$exp/hyper-p.json" \
    --num-workers 2 --epochs 1 --stats-json "$exp/dry_run.json" --dump-keys "$exp/keys.tsv" | tail -n 8
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  need "$exp/hyper-p.json" 3
  log 5 "training on $nproc rank(s): torchrun local/train.py --hyper $exp/hyper-p.json"
  extra=()
  [ -n "$max_steps" ] && extra+=(--max-steps "$max_steps")
  [ -n "$epochs" ] && extra+=(--epochs "$epochs")  # given explicitly: overrides hyper-p.json
  torchrun --standalone --nproc_per_node="$nproc" local/train.py \
    --hyper "$exp/hyper-p.json" --exp-dir "$exp" "${extra[@]}" 2>&1 | tee "$exp/train.log"
fi

echo "$0: done (stages $stage..$stop_stage)"
