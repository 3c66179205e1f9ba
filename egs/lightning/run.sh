#!/usr/bin/env bash
# wdsprep Lightning recipe: egs/demo's corpus and CTC model trained by a Lightning Trainer, the run
# stopped in the middle of an epoch (a killed job) and resumed from its checkpoint with
# Trainer.fit(ckpt_path=...): the resumed epoch goes on with the batch after the checkpoint.
#
# Usage (from anywhere; the recipe runs from egs/lightning like a Kaldi recipe):
#   bash egs/lightning/run.sh                          # all stages, 2 ranks
#   NPROC=1 bash egs/lightning/run.sh --stage 3        # train and resume on one process
#
# Stages:
#   0  check data/{train,dev} (egs/demo's corpus)
#   1  pack-audio: 80-dim fbank shards of train (egs/demo's conf/pack.conf groups) and dev
#   2  train the character tokenizer
#   3  train with Lightning until step $stop_step of epoch $stop_epoch, with a checkpoint there
#      (ModelCheckpoint every so many steps); the run stops as a killed one would
#   4  resume from that checkpoint to the end of $epochs epochs (a fresh Trainer, module and
#      loader), then check every epoch: each rank trained on the batches the loader planned, in
#      order, and the epoch on each of its utterances once (local/check_resume.py)
#
# Options (each also settable by the upper-case environment variable):
#   --stage N --stop-stage M   run stages N..M (default 0..4)
#   --nproc N       ranks: torchrun with Lightning's DDP on CPU (NPROC, default 2)
#   --epochs N      training epochs (EPOCHS, default 4)
#   --stop-epoch N --stop-step K   where stage 3 stops (STOP_EPOCH, default 1; STOP_STEP, default 7)
#   --exp DIR       all generated files go here (EXP, default exp/lightning)
set -euo pipefail

stage=0
stop_stage=4
nproc=${NPROC:-2}
epochs=${EPOCHS:-4}
stop_epoch=${STOP_EPOCH:-1}
stop_step=${STOP_STEP:-7}
exp=${EXP:-exp/lightning}
bucket_size=${BUCKET_SIZE:-1000}  # frames per step over all ranks, as in egs/demo
data=data
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

. "$(dirname "$0")/local/parse_options.sh"
cd "$(dirname "$0")"

log() { echo "$(date '+%H:%M:%S') [stage $1] ${*:2}"; }
if ! python -c 'import wdsprep' 2>/dev/null || ! command -v wdsprep >/dev/null; then
  echo "$0: error: wdsprep is not installed for this shell's python; from the repository root run" \
    "'make install && . .venv/bin/activate'" >&2
  exit 1
fi
if ! python -c 'import lightning' 2>/dev/null; then
  echo "$0: error: lightning does not import; install it: pip install 'wdsprep[lightning]'" >&2
  exit 1
fi
train=(python)
[ "$nproc" -gt 1 ] && train=(torchrun --standalone --nproc_per_node="$nproc")
common=(--shards "$exp/shards/train" --dev-shards "$exp/shards/dev" --tokenizer "$exp/tokenizer.json"
        --exp-dir "$exp" --epochs "$epochs" --bucket-size "$bucket_size")

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log 0 "checking the Kaldi data dirs $data/train $data/dev"
  python local/check_data.py "$data/train" "$data/dev"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  pack_opts=$(grep -v '^#' conf/pack.conf | tr '\n' ' ')
  for part in train dev; do
    opts=$pack_opts
    [ "$part" = dev ] && opts="--utts-per-shard $(awk '$1 == "--utts-per-shard" {print $2}' conf/pack.conf)"
    log 1 "pack-audio $data/$part ($opts) -> $exp/shards/$part"
    # shellcheck disable=SC2086  # $opts is a list of words on purpose
    wdsprep pack-audio --wav-scp "$data/$part/wav.scp" --text "$data/$part/text" --utt2spk "$data/$part/utt2spk" \
      --out "$exp/shards/$part" --overwrite --no-progress $opts
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log 2 "training a char tokenizer on $data/train/text -> $exp/tokenizer.json"
  wdsprep tokenizer train --kind char --text "$data/train/text" --out "$exp/tokenizer.json" --overwrite
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log 3 "Lightning on $nproc rank(s), stopping at step $stop_step of epoch $stop_epoch"
  rm -rf "$exp/ckpt" "$exp"/steps.rank*.tsv
  "${train[@]}" local/train_lightning.py "${common[@]}" --stop-epoch "$stop_epoch" --stop-step "$stop_step" \
    2>&1 | tee "$exp/train-stopped.log"
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  log 4 "resuming from $exp/ckpt/mid.ckpt to the end of epoch $((epochs - 1))"
  "${train[@]}" local/train_lightning.py "${common[@]}" --resume "$exp/ckpt/mid.ckpt" 2>&1 | tee "$exp/train-resumed.log"
  log 4 "what each epoch trained on, against the loader's plan"
  python local/check_resume.py --shards "$exp/shards/train" --tokenizer "$exp/tokenizer.json" --exp-dir "$exp" \
    --world-size "$nproc" --epochs "$epochs" --bucket-size "$bucket_size"
fi

echo "$0: done (stages $stage..$stop_stage)"
