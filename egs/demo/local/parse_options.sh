#!/usr/bin/env bash
# Self-contained stand-in for Kaldi's utils/parse_options.sh (no Kaldi install needed).
#
# Source it after declaring the script's variables with their defaults:
#     stage=0; nj=2; . local/parse_options.sh
# Each `--some-option VALUE` (or `--some-option=VALUE`) sets the existing variable
# `some_option`; options that name no declared variable are an error, as in Kaldi, so a
# typo never passes silently.  Parsing stops at the first argument not starting with `--`;
# the remaining arguments stay in "$@" for the caller.  `--help` prints the caller's header.

while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h)
      # The calling script's leading comment block is its help text.
      sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
      exit 0 ;;
    --*=*)
      _po_name="${1%%=*}"; _po_value="${1#*=}"; shift ;;
    --*)
      if [ $# -lt 2 ]; then
        echo "$0: option $1 needs a value" >&2; exit 1
      fi
      _po_name="$1"; _po_value="$2"; shift 2 ;;
    *)
      break ;;
  esac
  _po_var="${_po_name#--}"; _po_var="${_po_var//-/_}"
  # Only variables the script declared may be set: `declare -p` fails for unknown names.
  if ! [[ "$_po_var" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || ! declare -p "$_po_var" >/dev/null 2>&1; then
    echo "$0: unknown option $_po_name (see $0 --help)" >&2; exit 1
  fi
  printf -v "$_po_var" '%s' "$_po_value"
done
unset _po_name _po_value _po_var
true
