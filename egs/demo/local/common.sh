#!/usr/bin/env bash
# What every recipe's run.sh shares; sourced after parse_options.sh, from the recipe's folder.

# "HH:MM:SS [stage N] message"
log() { echo "$(date '+%H:%M:%S') [stage $1] ${*:2}"; }

# need PATH STAGE: a stage's input made by an earlier stage; when it is missing, say which stage
# makes it and stop, rather than fail somewhere inside a command.
need() {
  if [ ! -e "$1" ]; then
    echo "$0: error: $1 is missing; stage $2 makes it: run it first (--stage $2 --stop-stage $2)" >&2
    exit 1
  fi
}

# wait_until SECONDS STEP COMMAND: run COMMAND every STEP seconds until it succeeds (status 0), or
# SECONDS have passed (status 1: the caller says what it waited for).
wait_until() {
  local end=$((SECONDS + $1))
  until "$3"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep "$2"
  done
}

# published_shards DIR: how many shards the pack into DIR has published so far.  A published
# shard's index entry is DIR[/GROUP]/.index.parts/NNNNNNNN; one being written is a hidden
# .tmp-NNNNNNNN folder until its rename, and is not published yet (a reader does not see it).
published_shards() { { find "$1" -path '*/.index.parts/[0-9]*/part.json' 2>/dev/null || true; } | wc -l; }

# The stages call `wdsprep`, `python` and `torchrun` from the environment wdsprep is installed in.
if ! python -c 'import wdsprep' 2>/dev/null || ! command -v wdsprep >/dev/null; then
  echo "$0: error: wdsprep is not installed for this shell's python; from the repository root run" \
    "'make install && . .venv/bin/activate'" >&2
  exit 1
fi
