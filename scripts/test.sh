#!/usr/bin/env bash
# Installs nearlocal with its test extra (and the Debian packages the browser test needs), then
# runs ruff and the test suite. Works on a fresh machine; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
    echo "warning: could not install chromium; the HTML report browser test will be skipped" >&2
fi
python3 -m pip install -q -e '.[test]'
python3 -m ruff check nearlocal tests bench
python3 -m pytest -q "$@"
