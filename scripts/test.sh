#!/usr/bin/env bash
# Sets up nearlocal with its test extra in the checkout's .venv (scripts/venv.sh: never in a
# system interpreter), then runs ruff and the test suite. Works on a fresh machine; safe to run
# again (the venv and its install are reused).
#   - As root with apt-get and no chromium: apt-installs Debian's chromium (~100 MB) for the HTML
#     report's browser test. NEARLOCAL_NO_APT=1 skips that (the browser test is then skipped).
#   - The test extra pulls nvidia-cuda-nvrtc (~140 MB, no GPU needed) for the NVRTC compile test.
#   - Two pytest-xdist workers, each taking whole files (a file's tests share its fixed names:
#     pools, stores); most tests wait on the processes they start. `-n 0` runs them in one.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
nearlocal_venv '.[test]'  # first: a box that cannot make it says so before apt-get runs
if [ "${NEARLOCAL_NO_APT:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "scripts/test.sh: installing chromium with apt-get for the browser test" \
       "(NEARLOCAL_NO_APT=1 skips this)" >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
    echo "warning: could not install chromium; the HTML report browser test will be skipped" >&2
fi
python -m ruff check nearlocal tests bench
python -m pytest -q -n 2 --dist loadfile "$@"
