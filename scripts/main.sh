#!/usr/bin/env bash
# Installs nearlocal, then: probe the box, run a suite (default quick; arguments go to
# `nearlocal run`), and render the report beside the papers' figures.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
nearlocal probe
nearlocal run "$@"
nearlocal report --html results/report.html --markdown results/report.md  # one line per file
