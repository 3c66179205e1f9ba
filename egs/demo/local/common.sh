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

# The stages call `wdsprep`, `python` and `torchrun` from the environment wdsprep is installed in.
if ! python -c 'import wdsprep' 2>/dev/null || ! command -v wdsprep >/dev/null; then
  echo "$0: error: wdsprep is not installed for this shell's python; from the repository root run" \
    "'make install && . .venv/bin/activate'" >&2
  exit 1
fi
