#!/usr/bin/env bash
# The GPU check, for a box with a CUDA GPU and no network (its image has python 3.12, numpy,
# cupy with NVRTC, numba, pytest, pytest-benchmark, pandas, pyarrow, rich; torch for one
# comparison). Runs from this checkout with PYTHONPATH. The preflight requires only what the GPU
# path imports; wheels/ (scripts/gpu_wheels.sh, carried with carry=["wheels"]) is optional and,
# when present, installed offline into a scratch folder, never into the image.
#
# Steps: preflight (the optional wheels, then every import the later steps make, with
# versions; torch and matplotlib are located, not imported); probe (which also compiles the CUDA
# module once, with NVRTC directly); then, only when the probe found a GPU and the module
# compiled (else every later step is skipped with that one line and the check exits 1): the GPU
# tests for real (NEARLOCAL_REAL_GPU=1); scripts/gpu_check.py (every row measured by nearlocal's
# runner and stored under $OUT/work/check-results: the side-by-side table, the
# thresholds, the PCIe floor, the HBM figure, prime=1 / prime=0 / lone copy at 64 KiB, B10:
# cudaMemcpy and gather-kernel at 16 / 64 KiB from write-combined beside write-back pinned
# memory, and uncached through the nearlocal_pool module where it is loaded); the
# `gpu` and `swiftcache` suites (one worker process, so one CUDA start per suite; storage cases
# read a file made once in the scratch folder) and their verdict "every case of the suite
# present, ok or skipped with a reason"; the `gpu` suite under pytest-benchmark. Each step has
# its own cap and the caps add up to less than TOTAL_S, so the last step always gets its time;
# a step's cap is also cut to what is left. Exit 1 if any failed.
#
# Every step keeps what it measured when killed at its cap: gpu_check.py appends each row,
# figure and verdict to $OUT/rows.jsonl as it is measured (and a killed check step's report is
# rendered from it), the suites' results store takes every case as it finishes, and log.txt
# holds every line printed.
#
# Writes nothing outside $OUT (default /tmp/out) but a scratch folder under $TMPDIR that it
# removes on exit: cupy's kernel cache, numba's cache, the CUDA JIT cache, TMPDIR of every step
# (pytest's tmp_path, the CPU shim), the storage file, the installed wheels; no __pycache__
# (PYTHONDONTWRITEBYTECODE). $OUT receives at most 7 files: steps.txt, log.txt, report.md,
# gpu_check.json, rows.jsonl, whatif.md (the gpu suite's run for serving), gpu-check.tgz
# (everything else: preflight, probe, the check's and the suites' results stores, suite JSON,
# whatif JSON, JUnit XML, benchmark JSON).
#   bash scripts/gpu_check.sh            (PYTHON=... to choose the interpreter; TOTAL_S=...)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
WORK="$OUT/work"
PY="${PYTHON:-python3}"
WHEELS="${NEARLOCAL_WHEELS:-$PWD/wheels}"
TOTAL_S="${TOTAL_S:-450}"
# name:cap in seconds, in order; the caps must leave TAIL_S of TOTAL_S for packing up
STEPS=(preflight:15 probe:20 tests:60 check:80 replay-gpu:20 suite-gpu:60 whatif:15
       whatif-check:110 suite-swiftcache:25 suites-verdict:10 bench-gpu:25)
BUDGET=0.05  # per case; one worker process per suite (a check, not a comparison of runs)
STORAGE_BYTES=$((64 << 20))  # the storage cases' file (64x1MiB@1MiB): made once, never rewritten
TAIL_S=5

caps_total=0
for entry in "${STEPS[@]}"; do caps_total=$((caps_total + ${entry#*:})); done
if [ $((caps_total + TAIL_S)) -gt "$TOTAL_S" ]; then
  echo "gpu_check.sh: the step caps add up to ${caps_total} s, more than TOTAL_S=${TOTAL_S} s" \
       "less ${TAIL_S} s: raise TOTAL_S or lower a cap" >&2
  exit 2
fi

mkdir -p "$WORK" || exit 2
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/nearlocal-gpu-check.XXXXXX")" || exit 2
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$SCRATCH/tmp"
export TMPDIR="$SCRATCH/tmp" CUPY_CACHE_DIR="$SCRATCH/cupy-cache" \
  NUMBA_CACHE_DIR="$SCRATCH/numba-cache" CUDA_CACHE_PATH="$SCRATCH/cuda-cache" \
  XDG_CACHE_HOME="$SCRATCH/cache" MPLCONFIGDIR="$SCRATCH/matplotlib" PYTHONDONTWRITEBYTECODE=1 \
  PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 NEARLOCAL_REAL_GPU=1 \
  NEARLOCAL_STORAGE="$SCRATCH/storage.bin"
export PYTHONPATH="$SCRATCH/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
deadline=$((SECONDS + TOTAL_S))
status=0
skip_reason=""
rm -f "$OUT/steps.txt" "$OUT/report.md" "$OUT/gpu_check.json" "$OUT/rows.jsonl" "$OUT/whatif.md"

cap_of() {
  local entry
  for entry in "${STEPS[@]}"; do [ "${entry%%:*}" = "$1" ] && echo "${entry#*:}" && return; done
  echo 0
}

step() {  # [OK_CODES="0 3"] step NAME COMMAND...: run it under its cap, record its verdict
  local name=$1 limit start=$SECONDS rc=0 left verdict ok_codes=" ${OK_CODES:-0} "
  shift
  limit=$(cap_of "$name")
  if [ -n "$skip_reason" ]; then
    echo "=== $name: skipped ($skip_reason)" | tee -a "$OUT/steps.txt"
    return 0
  fi
  left=$((deadline - SECONDS - TAIL_S))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== $name (timeout ${limit} s)"
  if [ "$limit" -le 0 ]; then
    rc=124
  else
    timeout -k 5 "$limit" "$@" || rc=$?
  fi
  if [ "$rc" = 0 ]; then
    verdict=ok
  elif [[ "$ok_codes" == *" $rc "* ]]; then
    verdict="ok (exit $rc)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    verdict="FAILED (timed out after ${limit} s)"
  else
    verdict="FAILED (exit $rc)"
  fi
  echo "=== $name: $verdict in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  [[ "$verdict" == ok* ]] || status=1
  return $rc
}

NL=("$PY" -m nearlocal)
main() {
  local rc=0
  # exit 3: only the CUDA stack is missing, which the probe names in its own words
  OK_CODES="0 3" step preflight bash -o pipefail -c "'$PY' scripts/gpu_preflight.py \
    --wheels '$WHEELS' --target '$SCRATCH/site' | tee '$WORK/preflight.txt'" || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
    skip_reason="the preflight failed: nearlocal cannot import what it needs (see above)"
  fi
  step probe bash -o pipefail -c "${NL[*]} probe --json > '$WORK/probe.json'"  # one probe: slow
  if [ -z "$skip_reason" ]; then
    local gate
    gate="$("$PY" scripts/gpu_preflight.py --gate "$WORK/probe.json")" || skip_reason="${gate#GPU steps skipped: }"
    echo "$gate" | tee -a "$OUT/steps.txt"
    [ -n "$skip_reason" ] && status=1
  fi
  if [ -z "$skip_reason" ]; then  # the storage cases' file, in the scratch folder, made once
    head -c "$STORAGE_BYTES" /dev/urandom > "$NEARLOCAL_STORAGE" || true
  fi
  step tests "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$WORK/gpu-tests.xml" \
    tests/test_gpu_kernels.py tests/test_gpu_real.py
  step check "$PY" scripts/gpu_check.py --out "$OUT"
  if [ -z "$skip_reason" ] && [ ! -e "$OUT/report.md" ]; then  # killed at its cap, or crashed:
    "$PY" scripts/gpu_check.py --out "$OUT" --partial > /dev/null || true  # report its rows
  fi
  # issue 57: host->gpu replayed with 1, 2 and 4 streams against the simulation fed movers=k
  # rows, simulated vs replayed P50 / P99 appended to report.md and gpu_check.json
  step replay-gpu "$PY" scripts/gpu_check.py --out "$OUT" --replay
  step suite-gpu "${NL[@]}" run --suite gpu --processes 1 --budget "$BUDGET" \
    --out "$WORK/results" --json "$WORK/suite-gpu.json"
  # the gpu suite's run (the latest) in the units of serving: each path's reload per turn for
  # Beluga's B16 request and the papers' claims recomputed from this box's rows (docs/whatif.md)
  step whatif bash -o pipefail -c "${NL[*]} whatif --out '$WORK/results' --claims \
    --markdown '$OUT/whatif.md' && ${NL[*]} whatif --out '$WORK/results' --claims --json \
    > '$WORK/whatif.json' && ${NL[*]} whatif --out '$WORK/results' --claims"
  # the model against a real measurement of the read it predicts: B16's whole 4 GiB read
  # (131072 x 32 KiB) measured with the methods the gpu suite's rows fitted (scripts/whatif_check.py;
  # each run maps 8 GiB of pinned memory: ~30 s a method on the H200 of 2026-12-04)
  step whatif-check "$PY" scripts/whatif_check.py --out "$WORK/results" --run latest \
    --method gather-kernel --method cuda-memcpy-batch --method cuda-memcpy-async \
    --region pinned --peer gpu:0 --budget 0.3 --json-out "$WORK"
  step suite-swiftcache "${NL[@]}" run --suite swiftcache --processes 1 --budget "$BUDGET" \
    --out "$WORK/results" --json "$WORK/suite-swiftcache.json"
  step suites-verdict "$PY" scripts/gpu_check.py --out "$OUT" --suites-only \
    --suite "gpu=$WORK/suite-gpu.json" --suite "swiftcache=$WORK/suite-swiftcache.json"
  step bench-gpu "$PY" -m pytest -q -p no:cacheprovider bench/test_gpu.py \
    --nearlocal-suite gpu --nearlocal-processes 1 --benchmark-max-time 0.02 --benchmark-json "$WORK/bench-gpu.json" \
    --benchmark-storage "file://$SCRATCH/benchmarks"
  if [ -n "$skip_reason" ] && [ ! -e "$OUT/report.md" ]; then
    printf '# nearlocal GPU check\n\nNot run: %s\n' "$skip_reason" > "$OUT/report.md"
  fi
  return $status
}

main 2>&1 | tee "$OUT/log.txt"
status=${PIPESTATUS[0]}
tar czf "$OUT/gpu-check.tgz" -C "$OUT" work && rm -rf "$WORK"
echo "steps in $OUT/steps.txt; report.md, gpu_check.json; everything else in gpu-check.tgz"
exit "$status"
