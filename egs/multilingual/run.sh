#!/usr/bin/env bash
# wdsprep multilingual, prompted recipe: the demo corpus's English and Mandarin with a third
# language in its own script (Russian, synthesized here with espeak-ng), packed with each
# utterance's language and a Whisper-style prompt (<|prev|>previous text<|en|><|transcribe|>); a
# tokenizer per language, aggregated with the prompt's special tokens; utterances mixed by language
# with a temperature, so a batch holds several; a CTC model given the prompt.
#
# Usage (from anywhere; the recipe runs from egs/multilingual like a Kaldi recipe):
#   bash egs/multilingual/run.sh                        # all stages
#   bash egs/multilingual/run.sh --stage 3 --stop-stage 5 --temperature 3
#
# Stages:
#   0  synthesize the Russian utterances (espeak-ng -v ru) -> $exp/data/ru/{train,dev}; combine them
#      with data/{train,dev} (egs/demo's corpus) -> $exp/data/{train,dev}, with utt2lang and
#      text.prompt (the speaker's previous transcript, the language, the task: local/fields.py)
#   1  pack-audio (fbank on the way, no ark) with --utt2lang and --field prompt=text.prompt, by
#      length group with egs/demo's conf/pack.conf (train) and one folder (dev); verify; inspect
#      prints the hours of each language
#   2  a tokenizer per language (characters; Mandarin without spaces), then one aggregate file:
#      <s>, <unk> and the prompt's special tokens shared (ids 0 to 6), then each language's ids in
#      a range of its own
#   3  write $exp/hyper-p.json: ld = {shards, mix_by: lang, mix_unit: utterance, temperature,
#      text_fields: [prompt], streams: 4 (one per reader of 2 ranks x 2 workers)}, the aggregate
#      tokenizer
#   4  the plan (dry-run --plan: each language's share of the mixture, how many batches hold
#      several), then one real epoch on $nproc ranks with 2 workers each
#   5  train with torchrun (egs/demo's local/train.py --prompt prompt)
#
# Options (each also settable by the upper-case environment variable):
#   --stage N --stop-stage M   run stages N..M (default 0..5)
#   --nproc N        ranks (NPROC, default 2)
#   --nj N           parallel jobs for pack-audio (NJ, default 2)
#   --num-ru N       Russian utterances to synthesize (NUM_RU, default 48)
#   --temperature T  the mixture's temperature over the languages' hours (TEMPERATURE, default 2)
#   --epochs N       training epochs (EPOCHS, default 40)
#   --exp DIR        all generated files go here (EXP, default exp/multilingual)
#   --max-steps N    stop training after N steps (MAX_STEPS; for quick checks)
set -euo pipefail

stage=0
stop_stage=5
nproc=${NPROC:-2}
nj=${NJ:-2}
num_ru=${NUM_RU:-48}
temperature=${TEMPERATURE:-2}
epochs=${EPOCHS:-40}
exp=${EXP:-exp/multilingual}
max_steps=${MAX_STEPS:-}
bucket_size=${BUCKET_SIZE:-1000}  # frames per step over all ranks, as in egs/demo
data=data
langs=(en zh ru)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

. "$(dirname "$0")/local/parse_options.sh"
cd "$(dirname "$0")"

log() { echo "$(date '+%H:%M:%S') [stage $1] ${*:2}"; }
if ! python -c 'import wdsprep' 2>/dev/null || ! command -v wdsprep >/dev/null; then
  echo "$0: error: wdsprep is not installed for this shell's python; from the repository root run" \
    "'make install && . .venv/bin/activate'" >&2
  exit 1
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  if ! command -v espeak-ng >/dev/null; then
    echo "$0: error: stage 0 synthesizes Russian with espeak-ng: apt-get install -y espeak-ng" >&2
    exit 1
  fi
  log 0 "synthesizing $num_ru Russian utterances -> $exp/data/ru"
  python local/synth_russian.py --out "$exp/data/ru" --num-utts "$num_ru" --seed 0
  python local/check_data.py "$data/train" "$data/dev" "$exp/data/ru/train" "$exp/data/ru/dev"
  for part in train dev; do
    mkdir -p "$exp/data/$part"
    for f in wav.scp text utt2spk; do
      # egs/demo's wav.scp paths are relative to egs/demo (this recipe's data/ is that folder).
      cat "$data/$part/$f" "$exp/data/ru/$part/$f" | sort > "$exp/data/$part/$f"
    done
  done
  log 0 "utt2lang and text.prompt for $exp/data/{train,dev}"
  python local/fields.py "$exp/data/train" "$exp/data/dev"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  pack_opts=$(grep -v '^#' conf/pack.conf | tr '\n' ' ')
  for part in train dev; do
    opts=$pack_opts
    [ "$part" = dev ] && opts="--utts-per-shard $(awk '$1 == "--utts-per-shard" {print $2}' conf/pack.conf)"
    log 1 "packing $exp/data/$part with its languages and prompts ($opts) -> $exp/shards/$part"
    # shellcheck disable=SC2086  # $opts is a list of words on purpose
    wdsprep pack-audio --wav-scp "$exp/data/$part/wav.scp" --text "$exp/data/$part/text" \
      --utt2spk "$exp/data/$part/utt2spk" --utt2lang "$exp/data/$part/utt2lang" \
      --field prompt="$exp/data/$part/text.prompt" --out "$exp/shards/$part" --nj "$nj" --overwrite \
      --no-progress $opts
  done
  wdsprep verify "$exp/shards/train/*/data-*.tar" "$exp/shards/dev/data-*.tar"
  wdsprep inspect "$exp/shards/train/*/data-*.tar" --groups-only --max-frames
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  specs=()
  for lang in "${langs[@]}"; do
    grep "^${lang}_" "$exp/data/train/text" > "$exp/data/train/text.$lang"
    spaces=()
    [ "$lang" = zh ] && spaces=(--drop-spaces)  # hanzi without spaces
    log 2 "a char tokenizer for $lang -> $exp/tokenizer.$lang.json"
    wdsprep tokenizer train --kind char "${spaces[@]}" --text "$exp/data/train/text.$lang" \
      --out "$exp/tokenizer.$lang.json" --overwrite
    specs+=("$lang=$exp/tokenizer.$lang.json")
  done
  read -r -a specials <<< "$(python local/fields.py --special-tokens)"
  log 2 "one aggregate tokenizer with the prompt's special tokens (${specials[*]}) -> $exp/tokenizer.json"
  wdsprep tokenizer aggregate "${specs[@]}" --special-tokens "${specials[@]}" --out "$exp/tokenizer.json" \
    --overwrite
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log 3 "writing $exp/hyper-p.json: utterances mixed by language (temperature $temperature), prompt tokenized"
  python local/make_hyper.py --shards "$exp/shards/train" --dev-shards "$exp/shards/dev" \
    --ld mix_by=lang mix_unit=utterance temperature="$temperature" 'text_fields=["prompt"]' streams=4 \
    --tokenizer "$exp/tokenizer.json" --out "$exp/hyper-p.json" --model dropout=0.0 \
    --set epochs="$epochs" lr=1e-3 warmup_steps=50 seed=0 bucket_size="$bucket_size" ld_shuffle_buffer=100
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  log 4 "the plan of 1 epoch for $nproc rank(s), from the index alone: each language's share, the batches mixed"
  wdsprep dry-run --plan --hyper "$exp/hyper-p.json" --world-size "$nproc" --epochs 1
  log 4 "one real epoch on $nproc rank(s) with 2 workers each"
  torchrun --standalone --nproc_per_node="$nproc" -m wdsprep dry-run --hyper "$exp/hyper-p.json" \
    --num-workers 2 --epochs 1 --stats-json "$exp/dry_run.json" --dump-keys "$exp/keys.tsv" | tail -n 8
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  log 5 "training on $nproc rank(s), given the prompt: torchrun local/train.py --prompt prompt"
  extra=()
  [ -n "$max_steps" ] && extra+=(--max-steps "$max_steps")
  torchrun --standalone --nproc_per_node="$nproc" local/train.py \
    --hyper "$exp/hyper-p.json" --exp-dir "$exp" --prompt prompt "${extra[@]}" 2>&1 | tee "$exp/train.log"
fi

echo "$0: done (stages $stage..$stop_stage)"
