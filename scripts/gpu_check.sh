#!/usr/bin/env bash
# The GPU check, for a box with a CUDA GPU and no network (its image already has cupy, numba,
# numba-cuda, pytest, pandas, rich). Installs nearlocal in place without dependencies, then:
# probe, the GPU tests on the real GPU (NEARLOCAL_REAL_GPU=1), the short `gpu` and `swiftcache`
# suites, and the two comparisons (64 MiB pinned H2D vs torch's copy_, gather-kernel vs
# cuda-memcpy-async for 1024 x 160 B). Everything goes to ${OUT:-/tmp/out}; under 5 minutes.
# Exit status 1 if any step failed; every step runs regardless.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export NEARLOCAL_REAL_GPU=1
status=0

step() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "=== $name"
  "$@" || rc=$?
  echo "=== $name: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start)) s"
  [ $rc = 0 ] || status=1
}

[ "${NEARLOCAL_SKIP_INSTALL:-0}" = 1 ] ||
  step install python3 -m pip install -q --no-deps --no-build-isolation -e .
step probe bash -c "nearlocal probe | tee '$OUT/probe.txt' && nearlocal probe --json > '$OUT/probe.json'"
step tests timeout 110 python3 -m pytest -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" \
  tests/test_gpu_kernels.py tests/test_gpu_methods.py tests/test_gpu_sessions.py \
  tests/test_gpu_real.py
step suite-gpu timeout 75 nearlocal run --suite gpu --budget 0.05 --out "$OUT/results" \
  --json "$OUT/suite-gpu.json"
step suite-swiftcache timeout 45 nearlocal run --suite swiftcache --budget 0.05 \
  --out "$OUT/results" --json "$OUT/suite-swiftcache.json"
step compare timeout 50 python3 scripts/gpu_check.py --out "$OUT"
echo "results, JSON and report.md are in $OUT"
exit $status
