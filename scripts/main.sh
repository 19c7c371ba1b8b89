#!/usr/bin/env bash
# Sets up nearlocal in the checkout's .venv (scripts/venv.sh: never in a system interpreter),
# then: probe the box, run a suite (default quick; arguments go to `nearlocal run`), and render
# the report of that run's store beside the papers' figures.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
nearlocal_venv .
out=results  # the store `nearlocal run --out X` writes to is the one the report reads
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --out=*) out=${!i#--out=} ;;
    --out) j=$((i + 1)); out=${!j:-results} ;;
  esac
done
nearlocal probe
nearlocal run "$@"
nearlocal report --out "$out" --html "$out/report.html" --markdown "$out/report.md"  # one line per file
