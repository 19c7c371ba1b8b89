#!/usr/bin/env bash
# Does the CI gate hold on this box, in both modes? See scripts/gate_check.py (the checks,
# their goals and the settings); this wrapper runs it with this checkout first on the path.
#   bash scripts/gate_check.sh [STORE]
#   GATE_RUN_ARGS="--budget 0.05 --processes 4" bash scripts/gate_check.sh    a quick try
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
exec "$python" scripts/gate_check.py "$@"
