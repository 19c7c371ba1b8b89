#!/usr/bin/env bash
# Code CI (docs/ci.md), a regression gate that holds on a shared box: the baseline's code (a checkout at BASE)
# and this checkout's measure the same cases in turns, pass by pass (`nearlocal run --take-turns`),
# so both see one host; then `nearlocal compare` judges this checkout's run against the
# baseline's. Both trees run on this checkout's .venv (`scripts/main.sh` makes it; $PYTHON or the
# python3 on PATH where there is none), each tree's own code first on the path.
#
#   bash scripts/take_turns.sh BASE [nearlocal run options]     e.g. ../base --suite quick
#
# The runs are stored under $NEARLOCAL_STORE (default results); compare's Markdown goes to
# stdout. Exit status: compare's (0: no case slower, 1: a regression, 2: bad input).
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1/nearlocal" ]; then
    echo "usage: bash scripts/take_turns.sh BASE [nearlocal run options]: BASE is a checkout of" \
         "nearlocal (a directory holding nearlocal/)" >&2
    exit 2
fi
base=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
cand=$PWD
store=${NEARLOCAL_STORE:-results}
source scripts/venv.sh && nearlocal_on_path
python=${PYTHON:-python3}
meet=$(mktemp -d "${TMPDIR:-/tmp}/nearlocal-turns.XXXXXX")
trap 'rm -rf "$meet"' EXIT  # the meeting place and the runs' logs (shown when a run fails)
nearlocal() {  # nearlocal from the checkout $1 (its command line before and since frontends/):
    # -P: python -c would put the current directory (this checkout) first on the path, ahead
    # of PYTHONPATH, and the baseline's run would import the candidate's code
    PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" "$python" -P -c 'import sys
try:
    from nearlocal.frontends.cli import main
except ImportError:
    from nearlocal.cli import main
sys.exit(main())' "${@:2}"
}
stored() { sed -n 's#^stored .*/##p' "$1" | tail -1; }

gate() {  # the processes code CI needs (`run --for-gate code`); a tree from before the option
    # gave them by default
    if grep -qs -- '"--for-gate"' "$1/nearlocal/frontends/cli.py" "$1/nearlocal/cli.py"; then
        echo --for-gate code
    fi
}

echo "baseline $base and candidate $cand take turns (meeting in $meet), store $store" >&2
# shellcheck disable=SC2046  # gate's words are options
nearlocal "$base" run --out "$store" --quiet --take-turns "$meet" --turn 0/2 $(gate "$base") \
    "$@" > "$meet/base.log" 2>&1 &
base_pid=$!
# shellcheck disable=SC2046
nearlocal "$cand" run --out "$store" --quiet --take-turns "$meet" --turn 1/2 $(gate "$cand") \
    "$@" > "$meet/cand.log" 2>&1 &
cand_pid=$!
# whichever ends first: if it failed (bad input, a tree without an option), the other would
# wait for it to check in: stop it
for _ in 1 2; do
    status=0
    wait -n || status=$?  # the two runs are this shell's only jobs
    if [ "$status" != 0 ]; then
        kill "$base_pid" "$cand_pid" 2> /dev/null || true
        wait 2> /dev/null || true
        cat "$meet/base.log" "$meet/cand.log" | awk '!seen[$0]++' >&2  # one line, not two
        exit 2
    fi
done
echo "baseline run $(stored "$meet/base.log"), candidate run $(stored "$meet/cand.log")" >&2
trees=()  # compare checks each run measured its own tree's code, where both runs say which
if grep -qs '"code":' "$store/$(stored "$meet/base.log")/run.json"; then
    trees=(--trees "$base" "$cand")
fi
nearlocal "$cand" compare "$(stored "$meet/base.log")" "$(stored "$meet/cand.log")" --out "$store" \
    --mode code "${trees[@]}"
