#!/usr/bin/env bash
# The GPU check, for a box with a CUDA GPU and no network (its image already has cupy with NVRTC,
# pytest, pytest-benchmark, pandas, pyarrow, rich; torch for one comparison). Installs nothing:
# runs from this checkout with PYTHONPATH. Steps: probe; the GPU tests for real
# (NEARLOCAL_REAL_GPU=1: kernels' bytes against numpy on the device, every session); the `gpu`
# scripts/gpu_check.py: the side-by-side table and the "what must hold" ratios; the `gpu` and
# `swiftcache` suites (nearlocal run) and the verdict "every case ok or skipped with a reason";
# the `gpu` suite under pytest-benchmark. Under 5 minutes in all (each step's timeout is cut to
# what is left of TOTAL_S). Every step runs regardless; exit 1 if any failed.
# $OUT (default /tmp/out) receives at most 5 files: steps.txt, log.txt, report.md,
# gpu_check.json and gpu-check.tgz (everything else: results store, JSON, JUnit XML, probe).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
WORK="$OUT/work"
mkdir -p "$WORK"
export NEARLOCAL_REAL_GPU=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
TOTAL_S="${TOTAL_S:-285}"
deadline=$((SECONDS + TOTAL_S))
status=0
rm -f "$OUT/steps.txt"

step() {
  local name=$1 limit=$2 start=$SECONDS rc=0 left
  shift 2
  left=$((deadline - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== $name (timeout ${limit} s)"
  if [ "$limit" -le 0 ]; then
    rc=124
  else
    timeout "$limit" "$@" || rc=$?
  fi
  local verdict
  verdict=$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")
  echo "=== $name: $verdict in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  [ $rc = 0 ] || status=1
}

NL="python3 -m nearlocal.cli"
main() {
  step probe 30 bash -c "$NL probe | tee '$WORK/probe.txt' && $NL probe --json > '$WORK/probe.json'"
  step tests 90 python3 -m pytest -q -p no:cacheprovider --junitxml="$WORK/gpu-tests.xml" \
    tests/test_gpu_kernels.py tests/test_gpu_real.py
  step check 85 python3 scripts/gpu_check.py --out "$OUT"
  step suite-gpu 70 $NL run --suite gpu --budget 0.05 --out "$WORK/results" \
    --json "$WORK/suite-gpu.json"
  step suite-swiftcache 25 $NL run --suite swiftcache --budget 0.05 --out "$WORK/results" \
    --json "$WORK/suite-swiftcache.json"
  step suites-verdict 10 python3 scripts/gpu_check.py --out "$OUT" --suites-only \
    --suite-json "$WORK/suite-gpu.json" --suite-json "$WORK/suite-swiftcache.json"
  step bench-gpu 45 python3 -m pytest -q -p no:cacheprovider bench/test_gpu.py \
    --nearlocal-suite gpu --benchmark-max-time 0.02 --benchmark-json "$WORK/bench-gpu.json"
  return $status
}

main 2>&1 | tee "$OUT/log.txt"
status=${PIPESTATUS[0]}
tar czf "$OUT/gpu-check.tgz" -C "$OUT" work && rm -rf "$WORK"
echo "steps in $OUT/steps.txt; report.md, gpu_check.json; everything else in gpu-check.tgz"
exit $status
