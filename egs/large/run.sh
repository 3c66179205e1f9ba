#!/usr/bin/env bash
# wdsprep recipe for your own large corpus (CAT style): a Kaldi data dir -> length-grouped shards
# -> tokenizer -> hyper-p.json -> dry run of the loader on every rank -> training.
#
# Usage:
#   DATA=/path/to/kaldi/data/train DEV=/path/to/kaldi/data/dev bash egs/large/run.sh
#   bash egs/large/run.sh --data /path/to/data/train --stage 2 --stop-stage 5 --nj 16
# Multi-node training after stage 5: see local/launch_multinode.sh and README.md.
#
# Stages:
#   0  check the data dirs, print counts
#   1  fbank for train/dev, unless a feats.scp exists (FEATS, or DATA/feats.scp)
#   2  pack train into length groups ($groups), dev into one folder; with --parts N, train as a
#      pack spread over N jobs (a job array: plan, N parts at once, commit)
#   3  train the tokenizer on the train transcripts
#   4  write $exp/hyper-p.json; `ld` is a brace pattern over the filled group folders
#   5  dry run: every rank of a torchrun job builds the loader and reads one epoch's batches
#   6  train on this node (torchrun --standalone); several nodes: local/launch_multinode.sh
#
# Options (each also settable by the upper-case environment variable):
#   --data DIR     Kaldi train data dir (DATA, required)
#   --dev DIR      Kaldi dev data dir (DEV, optional; without it training reports no dev loss)
#   --feats SCP    existing train feats.scp to pack instead of computing fbank (FEATS)
#   --root DIR     directory that relative paths in wav.scp/feats.scp are relative to
#                  (ROOT; default: two levels above DATA, i.e. the Kaldi recipe dir)
#   --exp DIR      output dir (EXP, default egs/large/exp/large)
#   --nj N         parallel jobs for fbank and pack (NJ, default 8)
#   --parts N      stage 2: pack train in N parts, each with NJ workers (PARTS, default 1: one pack);
#                  here N background processes stand in for the tasks of a SLURM job array
#   --dask ADDR    stage 2: the workers of the Dask cluster whose scheduler is at ADDR write the
#                  shards, one task per shard, a task lost with its worker run again (DASK; e.g.
#                  tcp://10.0.0.5:8786 from `dask scheduler`, with `dask worker tcp://10.0.0.5:8786` on
#                  each machine; pip install 'wdsprep[cluster]'); the workers must read the inputs
#                  and the output: a shared folder, or --out s3://BUCKET/PREFIX (see docs/fbank.md).
#                  Ray: pack_data(..., executor=E) takes any concurrent.futures.Executor, one whose
#                  submit() runs on Ray included (docs/fbank.md, "An engine writes the shards")
#   --nproc N      ranks per node for dry run and training (NPROC, default 2)
#   --kind K --vocab-size N   tokenizer (KIND default sentencepiece, VOCAB default 5000)
#   --groups "LO:HI ..."      length groups in frames (LEN_GROUPS; bash reserves GROUPS)
#   --utts-per-shard N        (UTTS_PER_SHARD, default 2000, as CAT)
#   --stage N --stop-stage M  (default 0..5: training is a separate, long step)
set -euo pipefail

recipe_dir=$(cd "$(dirname "$0")" && pwd)

stage=0
stop_stage=5
data=${DATA:-}
dev=${DEV:-}
feats=${FEATS:-}
root=${ROOT:-}
exp=${EXP:-}  # default: egs/large/exp/large
nj=${NJ:-8}
parts=${PARTS:-1}
dask=${DASK:-}
nproc=${NPROC:-2}
kind=${KIND:-sentencepiece}
vocab_size=${VOCAB:-5000}
# Typical for read/conversational speech at 100 frames/s: 0.1-5 s, 5-10 s, 10-15 s, 15-20 s, 20-30 s.
# Longer utterances are left out and listed in shards/train/pack_report.json.
groups=${LEN_GROUPS:-"10:500 500:1000 1000:1500 1500:2000 2000:3000"}
utts_per_shard=${UTTS_PER_SHARD:-2000}
bucket_size=${BUCKET_SIZE:-60000}   # frames per step over ALL ranks (CAT's bucket_size)
max_steps=${MAX_STEPS:-}

. "$recipe_dir/local/parse_options.sh"

log() { echo "$(date '+%H:%M:%S') [stage $1] ${*:2}"; }
die() { echo "$0: error: $*" >&2; exit 1; }
# The stages call `wdsprep`, `python` and `torchrun` from the environment wdsprep is installed in.
if ! python -c 'import wdsprep' 2>/dev/null || ! command -v wdsprep >/dev/null; then
  echo "$0: error: wdsprep is not installed for this shell's python; from the repository root run" \
    "'make install && . .venv/bin/activate'" >&2
  exit 1
fi

[ -n "$data" ] || die "set DATA=/path/to/kaldi/data/train (or --data); see $0 --help"
[ -d "$data" ] || die "DATA=$data is not a directory"
# Absolute paths everywhere: stages run from $root (where the data dir's relative paths work) and
# hyper-p.json is read by every node, so it must not depend on anyone's working directory.
data=$(realpath "$data")
[ -n "$dev" ] && dev=$(realpath "$dev")
[ -n "$root" ] || root=$(dirname "$(dirname "$data")")
root=$(realpath "$root")
# Like DATA, a given EXP is relative to where you ran the script; the default is in the recipe.
if [ -n "$exp" ]; then exp=$(realpath -m "$exp"); else exp="$recipe_dir/exp/large"; fi
cd "$recipe_dir"
mkdir -p "$exp"
[[ "$parts" =~ ^[1-9][0-9]*$ ]] || die "PARTS=$parts (--parts) must be a whole number >= 1"
sets=(train); [ -n "$dev" ] && sets+=(dev)
dir_of() { if [ "$1" = train ]; then echo "$data"; else echo "$dev"; fi; }
# Use existing features when there are some: FEATS for train, DIR/feats.scp otherwise.
feats_of() {
  local d; d=$(dir_of "$1")
  if [ "$1" = train ] && [ -n "$feats" ]; then realpath "$feats"
  elif [ -f "$d/feats.scp" ]; then echo "$d/feats.scp"
  else echo "$exp/fbank/$1/feats.scp"; fi
}

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log 0 "checking ${sets[*]} data dirs (relative paths from $root)"
  for part in "${sets[@]}"; do
    (cd "$root" && python "$recipe_dir/local/check_data.py" "$(dir_of "$part")")
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  for part in "${sets[@]}"; do
    d=$(dir_of "$part"); f=$(feats_of "$part")
    if [ "$f" != "$exp/fbank/$part/feats.scp" ]; then
      log 1 "$part: using existing features $f"
      continue
    fi
    log 1 "$part: fbank from $d/wav.scp -> $exp/fbank/$part (nj=$nj)"
    segments=(); [ -f "$d/segments" ] && segments=(--segments "$d/segments")
    (cd "$root" && wdsprep fbank --wav-scp "$d/wav.scp" "${segments[@]}" --out-dir "$exp/fbank/$part" \
      --num-mel-bins 80 --nj "$nj")
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log 2 "packing train into length groups [$groups] -> $exp/shards/train (nj=$nj)"
  # utt2spk, when the data dir has one, goes into the index: the loader's shuffle report uses it.
  spk=(); [ -f "$data/utt2spk" ] && spk=(--utt2spk "$data/utt2spk")
  # shellcheck disable=SC2206  # $groups is a list of words on purpose
  pack=(wdsprep pack --scp "$(feats_of train)" --text "$data/text" --out "$exp/shards/train"
        --filter-group $groups --utts-per-shard "$utts_per_shard" "${spk[@]}" --nj "$nj")
  [ -z "$dask" ] || pack+=(--dask "$dask")  # the cluster's workers write the shards; this process publishes
  if [ "$parts" -eq 1 ]; then
    (cd "$root" && "${pack[@]}" --overwrite)
  else
    # A pack spread over a job array: the plan first, then the parts (any order, at once, on any
    # machine that sees the output folder; each resumable by running it again), then the commit.
    # Under SLURM the loop is `sbatch --array=0-$((parts - 1))` of a script that runs
    #   "${pack[@]}" --part "$SLURM_ARRAY_TASK_ID/$parts"
    # and the commit an `sbatch --dependency=afterok:ARRAY_JOB_ID` job (Kubernetes: an indexed
    # Job, $JOB_COMPLETION_INDEX).  The shards are the bytes one pack gives.
    log 2 "train: a pack in $parts parts: plan, $parts background jobs (a job array's tasks), commit"
    (cd "$root" && "${pack[@]}" --overwrite --plan-only)
    pids=()
    for ((i = 0; i < parts; i++)); do
      (cd "$root" && "${pack[@]}" --part "$i/$parts" > "$exp/shards/pack_part$i.log" 2>&1) &
      pids+=($!)
    done
    for ((i = 0; i < parts; i++)); do
      wait "${pids[$i]}" || die "pack part $i/$parts failed (see $exp/shards/pack_part$i.log); run stage 2's" \
        "command with --part $i/$parts again to finish it, then with --resume to commit"
    done
    (cd "$root" && "${pack[@]}" --resume)
  fi
  if [ -n "$dev" ]; then
    log 2 "packing dev -> $exp/shards/dev"
    (cd "$root" && wdsprep pack --scp "$(feats_of dev)" --text "$dev/text" --out "$exp/shards/dev" \
      --utts-per-shard "$utts_per_shard" --nj "$nj" --overwrite)
  fi
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log 3 "training a $kind tokenizer (vocab $vocab_size) on $data/text -> $exp/tokenizer.json"
  wdsprep tokenizer train --kind "$kind" --vocab-size "$vocab_size" --text "$data/text" --out "$exp/tokenizer.json" --overwrite
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  log 4 "writing $exp/hyper-p.json"
  dev_args=(); data_args=(train="$data")
  [ -n "$dev" ] && dev_args=(--dev-shards "$exp/shards/dev") && data_args+=(dev="$dev")
  # To train from shards uploaded (with their index files) to S3 or a web server, add e.g.
  #   --remote s3://BUCKET/shards/train   or   --remote https://HOST/shards/train   (see README.md)
  python local/make_hyper.py --shards "$exp/shards/train" "${dev_args[@]}" \
    --tokenizer "$exp/tokenizer.json" --out "$exp/hyper-p.json" \
    --data "${data_args[@]}" \
    --set bucket_size="$bucket_size" ld_shuffle_buffer=2000 epochs=30 lr=1e-3 warmup_steps=2000 seed=0 \
    --model d_model=256 lstm_layers=4 lstm_hidden=320
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  log 5 "dry run of the loader on $nproc rank(s): wdsprep dry-run --hyper $exp/hyper-p.json"
  torchrun --standalone --nproc_per_node="$nproc" -m wdsprep dry-run --hyper "$exp/hyper-p.json"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  log 6 "training on this node, $nproc rank(s); for several nodes use local/launch_multinode.sh"
  extra=(); [ -n "$max_steps" ] && extra=(--max-steps "$max_steps")
  torchrun --standalone --nproc_per_node="$nproc" local/train.py \
    --hyper "$exp/hyper-p.json" --exp-dir "$exp" "${extra[@]}" 2>&1 | tee "$exp/train.log"
fi

echo "$0: done (stages $stage..$stop_stage)"
