#!/usr/bin/env bash
# Download, where there is network, the optional cp312 manylinux x86_64 wheels for the GPU box
# (the check needs none: scripts/gpu_wheels.txt: scipy for `nearlocal compare`, ~35 MB; --plots
# adds matplotlib and its dependencies from scripts/gpu_wheels_plots.txt, ~23 MB more) into
# wheels/ (git-ignored; never committed). The GPU box has no network: scripts/gpu_check.sh installs them offline from there
# (scripts/gpu_preflight.py: pip install --no-index --no-deps --target, only what the image lacks),
# so the device run tool's `carry` must name the folder: carry=["wheels"].
#   bash scripts/gpu_wheels.sh [--plots] [DIR]      (DIR defaults to wheels/)
set -euo pipefail
cd "$(dirname "$0")/.."
lists=(scripts/gpu_wheels.txt)
if [ "${1:-}" = "--plots" ]; then
  lists+=(scripts/gpu_wheels_plots.txt)
  shift
fi
dir="${1:-wheels}"
mkdir -p "$dir"
requirements=()
for list in "${lists[@]}"; do
  while read -r line; do
    line="${line%%#*}"
    [ -n "${line// }" ] && requirements+=("$line")
  done < "$list"
done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  --disable-pip-version-check --dest "$dir" "${requirements[@]}"
du -sh "$dir"
echo "carry this folder to the GPU box: run(..., carry=[\"$dir\"]); gpu_check.sh installs from it"
