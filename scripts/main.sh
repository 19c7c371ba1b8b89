#!/usr/bin/env bash
# Installs nearlocal, then: probe the box, run the quick suite, render the report.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e .
nearlocal probe
nearlocal run "$@"
