#!/usr/bin/env bash
# wdsprep demo recipe: the bundled corpus -> fbank -> length-grouped shards -> tokenizer -> CTC training.
#
# Usage (from anywhere; the recipe runs from egs/demo like a Kaldi recipe):
#   bash egs/demo/run.sh                         # all stages
#   NPROC=2 bash egs/demo/run.sh --stage 5       # training only, 2 ranks
#   bash egs/demo/run.sh --stage 1 --stop-stage 3 --nj 4
#
# Stages:
#   0  check data/{train,dev} and print counts
#   1  fbank features (80-dim, Kaldi-compatible) for train and dev
#   2  pack into tar shards by length group (train) and one group (dev)
#   3  train the tokenizer on the train transcripts
#   4  write $exp/hyper-p.json (CAT style; `ld` is a brace pattern over the groups)
#   5  train with torchrun (gloo on CPU, nccl on GPUs)
#   6  train while the shards are being written (run it on its own: --stage 6 --stop-stage 6):
#      the ranks start and wait; pack-audio (no fbank stage, no ark) publishes $exp/shards/grow
#      shard by shard in the background, and training follows it (ld.growing): it starts once 3
#      shards are published, and every epoch takes the shards published when it begins (the log
#      says how many; on this tiny corpus the pack holds still after its first shards until the
#      first epoch has trained on them, as a real corpus's hours-long pack would).  Killed
#      half-way, the same command resumes the pack (--resume).  Needs stage 3's tokenizer (and
#      uses stage 2's dev shards when they are there).
#
# Options (each also settable by the upper-case environment variable):
#   --stage N --stop-stage M   run stages N..M (default 0..5)
#   --nproc N    training processes (ranks) on this machine (NPROC, default 2)
#   --nj N       parallel jobs for fbank and pack (NJ, default 2)
#   --epochs N   training epochs (EPOCHS; default 50, written into hyper-p.json at stage 4;
#                given with --stage 5 it overrides hyper-p.json)
#   --exp DIR    all generated files go here (EXP, default exp/demo)
#   --max-steps N  stop training after N steps (MAX_STEPS; for quick checks)
# Generated files never go into data/: that is the committed corpus.
set -euo pipefail

stage=0
stop_stage=5
nproc=${NPROC:-2}
nj=${NJ:-2}
epochs=${EPOCHS:-}  # empty: 50 when writing hyper-p.json; stage 5 then follows hyper-p.json
exp=${EXP:-exp/demo}
max_steps=${MAX_STEPS:-}
# Frames per step over all ranks (CAT; each rank gets bucket_size / NPROC). The train set is ~18,000
# frames, so ~20 steps per epoch: CTC needs ~1,000 updates to leave its all-blank plateau here.
bucket_size=${BUCKET_SIZE:-1000}
data=data
vocab_kind=char      # see README.md: characters train a CTC model fastest on this small corpus
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per rank: ranks x threads <= cores

. "$(dirname "$0")/local/parse_options.sh"
# Run from egs/demo like a Kaldi recipe: wav.scp paths (and relative --exp paths) start there.
cd "$(dirname "$0")"

. local/common.sh  # log, need, the install check

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log 0 "checking the Kaldi data dirs $data/train $data/dev"
  python local/check_data.py "$data/train" "$data/dev"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  for part in train dev; do
    log 1 "fbank for $data/$part -> $exp/fbank/$part (nj=$nj)"
    segments=()
    [ -f "$data/$part/segments" ] && segments=(--segments "$data/$part/segments")
    wdsprep fbank --wav-scp "$data/$part/wav.scp" "${segments[@]}" --out-dir "$exp/fbank/$part" \
      --num-mel-bins 80 --nj "$nj"
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  # Length groups and shard size: conf/pack.conf (tools/demo.py packs with the same file).
  need "$exp/fbank/train/feats.scp" 1
  pack_opts=$(grep -v '^#' conf/pack.conf | tr '\n' ' ')
  log 2 "packing train ($pack_opts) -> $exp/shards/train"
  # shellcheck disable=SC2086  # $pack_opts is a list of words on purpose
  wdsprep pack --scp "$exp/fbank/train/feats.scp" --text "$data/train/text" --out "$exp/shards/train" \
    --utt2spk "$data/train/utt2spk" $pack_opts --nj "$nj" --overwrite
  # dev: one folder, every utterance (no length limits: validation should see all of it).
  log 2 "packing dev -> $exp/shards/dev"
  wdsprep pack --scp "$exp/fbank/dev/feats.scp" --text "$data/dev/text" --out "$exp/shards/dev" \
    --utt2spk "$data/dev/utt2spk" --utts-per-shard "$(awk '$1 == "--utts-per-shard" {print $2}' conf/pack.conf)" --nj "$nj" --overwrite
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log 3 "training a $vocab_kind tokenizer on $data/train/text -> $exp/tokenizer.json"
  wdsprep tokenizer train --kind "$vocab_kind" --text "$data/train/text" --out "$exp/tokenizer.json" --overwrite
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  need "$exp/shards/train/pack_report.json" 2
  need "$exp/tokenizer.json" 3
  log 4 "writing $exp/hyper-p.json"
  python local/make_hyper.py --shards "$exp/shards/train" --dev-shards "$exp/shards/dev" \
    --tokenizer "$exp/tokenizer.json" --out "$exp/hyper-p.json" \
    --data train="$data/train" dev="$data/dev" --model dropout=0.0 \
    --set epochs="${epochs:-50}" lr=1e-3 warmup_steps=50 seed=0 bucket_size="$bucket_size" ld_shuffle_buffer=100
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  need "$exp/hyper-p.json" 4
  log 5 "training on $nproc rank(s): torchrun local/train.py --hyper $exp/hyper-p.json"
  extra=()
  [ -n "$max_steps" ] && extra+=(--max-steps "$max_steps")
  [ -n "$epochs" ] && extra+=(--epochs "$epochs")  # given explicitly: overrides hyper-p.json
  # --standalone: a single-node rendezvous on a free port, so two runs never collide.
  torchrun --standalone --nproc_per_node="$nproc" local/train.py \
    --hyper "$exp/hyper-p.json" --exp-dir "$exp" "${extra[@]}" 2>&1 | tee "$exp/train.log"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  need "$exp/tokenizer.json" 3
  # Smaller shards than stage 2's, so the corpus is published in ~24 steps that training can follow.
  pack_opts="$(grep -v '^#' conf/pack.conf | tr '\n' ' ') --utts-per-shard 8"
  grow=$exp/shards/grow
  log 6 "training follows $grow as pack-audio writes it: $exp/grow/hyper-p.json (ld.growing)"
  dev_opts=()
  [ -d "$exp/shards/dev" ] && dev_opts=(--dev-shards "$exp/shards/dev")  # from stage 2
  python local/make_hyper.py --shards "$grow" --growing 3 "${dev_opts[@]}" \
    --tokenizer "$exp/tokenizer.json" --out "$exp/grow/hyper-p.json" \
    --data train="$data/train" dev="$data/dev" --model dropout=0.0 \
    --set epochs="${epochs:-20}" lr=1e-3 warmup_steps=50 seed=0 bucket_size="$bucket_size" ld_shuffle_buffer=100
  extra=()
  [ -n "$max_steps" ] && extra+=(--max-steps "$max_steps")
  : > "$exp/grow/train.log"
  # What the waits below wait for (published_shards: local/common.sh).
  reminders() { grep -c "still waiting" "$exp/grow/train.log" || true; }
  ranks_wait() {
    grep -q "waiting for" "$exp/grow/train.log" || ! kill -0 "$train_pid" 2>/dev/null \
      || { [ -f "$grow/pack_report.json" ] && [ ! -e "$grow/PACK_INCOMPLETE" ]; }  # packed by an earlier run
  }
  three_published() { [ "$(published_shards "$grow")" -ge 3 ] || ! kill -0 "$pack_pid" 2>/dev/null; }
  first_epoch_or_waiting() {
    grep -q "shards published" "$exp/grow/train.log" || ! kill -0 "$train_pid" 2>/dev/null \
      || [ "$(reminders)" -gt "$reminded" ]
  }
  (torchrun --standalone --nproc_per_node="$nproc" local/train.py \
     --hyper "$exp/grow/hyper-p.json" --exp-dir "$exp/grow" "${extra[@]}" 2>&1 | tee "$exp/grow/train.log") &
  train_pid=$!
  # Either may start first; here the ranks start first and wait for the first shards (on this tiny
  # corpus the pack is done in seconds, before the ranks are up).  The pack runs niced: the CPU is
  # the training's first.  --resume: a pack stopped half-way goes on where it stopped.  Every wait
  # below is bounded, and one that runs out says what it waited for.
  if ! wait_until 60 0.2 ranks_wait; then
    log 6 "the ranks have not said within 60 s that they wait for shards (see $exp/grow/train.log); the pack starts"
  fi
  log 6 "pack-audio into $grow in the background ($pack_opts --resume; log: $exp/pack-grow.log)"
  # shellcheck disable=SC2086
  nice -n 19 wdsprep pack-audio --wav-scp "$data/train/wav.scp" --text "$data/train/text" \
    --utt2spk "$data/train/utt2spk" --out "$grow" $pack_opts --nj 1 --resume > "$exp/pack-grow.log" 2>&1 &
  pack_pid=$!
  # A real corpus's pack runs for hours; this one would be done before the first epoch is planned.
  # So, as a slow pack would, it holds still (SIGSTOP) once 3 shards are published, until training
  # has run its first epoch over them, and then goes on.  The pause ends sooner when the loader
  # says it still waits (it needs more shards than the 3 to give every rank a batch), and after
  # 120 s in any case: a paused pack must never leave the training waiting for it.
  if ! wait_until 120 0.05 three_published; then
    log 6 "after 120 s the pack has published $(published_shards "$grow") shards, not 3 (see $exp/pack-grow.log)"
  fi
  reminded=$(reminders)
  if kill -STOP "$pack_pid" 2>/dev/null; then
    log 6 "pack paused at $(published_shards "$grow") published shards until training has run its first epoch over them"
    if ! wait_until 120 0.25 first_epoch_or_waiting; then
      log 6 "after 120 s paused, training has not ended its first epoch (see $exp/grow/train.log); the pack goes on"
    elif [ "$(reminders)" -gt "$reminded" ]; then
      log 6 "the loader still waits for shards (see $exp/grow/train.log); the pack goes on"
    fi
    kill -CONT "$pack_pid" 2>/dev/null || true
  fi
  if ! wait "$pack_pid"; then
    echo "$0: pack-audio failed, see $exp/pack-grow.log; run stage 6 again to resume it" >&2
    kill "$train_pid" 2>/dev/null || true
    exit 1
  fi
  log 6 "pack complete: $grow ($grow/pack_report.json)"
  wait "$train_pid"
  log 6 "training done: $exp/grow/history.json"
fi

echo "$0: done (stages $stage..$stop_stage)"
