#!/usr/bin/env bash
# First contact on a stock box (issue 46), as CI's stage: a fresh clone of this checkout's HEAD,
# PATH holding only the system directories (here Debian 12's own python3, PEP 668 marker and
# all), then
#   1. `bash scripts/main.sh` (a short run: load 64 KiB) makes .venv, probes, runs, reports;
#      a second call reuses the venv (both timed);
#   2. `nearlocal probe` from that venv;
#   3. a non-editable install into a fresh venv, then `pytest --pyargs nearlocal.bench` from a
#      directory outside the checkout, and `nearlocal import` of the JSON it wrote;
#   4. nothing changed in the system interpreter's directories (stdlib, site-packages, user
#      site, scripts): the files there are listed before and after, and compared.
# A box whose system Python cannot make the venv gets main.sh's one line and the stage is
# skipped (exit 0); anything else that fails fails the stage.
#   bash scripts/install_check.sh            NEARLOCAL_SKIP_INSTALL_CHECK=1 in .ci/run leaves it out
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SYSPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORK=$(mktemp -d /var/tmp/nearlocal-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
say() { echo "install check: $*"; }
fail() { say "FAILED: $*"; exit 1; }
plain() { env -i PATH="$SYSPATH" HOME="$HOME" LANG=C "$@"; }  # a login's bare environment

SYSPY=$(PATH=$SYSPATH command -v python3 || true)
[ -n "$SYSPY" ] || { say "skipped: no python3 in $SYSPATH"; exit 0; }
say "system interpreter $SYSPY ($(plain "$SYSPY" -V 2>&1)); PEP 668 marker:" \
    "$(plain "$SYSPY" -c 'import sysconfig, os; p = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"); print("yes" if os.path.exists(p) else "no")')"

snapshot() {  # every file under the system interpreter's directories: path, size, mtime
  plain "$SYSPY" - <<'EOF'
import os, site, sysconfig
roots = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
for root in sorted(r for r in roots if r and os.path.isdir(r)):
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            print(path, st.st_size, int(st.st_mtime))
scripts = sysconfig.get_path("scripts")
for name in sorted(os.listdir(scripts)) if os.path.isdir(scripts) else ():
    st = os.lstat(os.path.join(scripts, name))
    print(os.path.join(scripts, name), st.st_size, int(st.st_mtime))
EOF
}
snapshot > "$WORK/before"

git clone -q "$REPO" "$WORK/clone"
cd "$WORK/clone"
start=$(date +%s)
if ! plain bash scripts/main.sh --method load --size 64KiB --budget 0.05 >"$WORK/main.log" 2>&1; then
  if [ "$(tail -1 "$WORK/main.log" | cut -c1-7)" = "error: " ] && ! [ -d .venv ]; then
    say "skipped: $(tail -1 "$WORK/main.log")"
    exit 0
  fi
  tail -20 "$WORK/main.log"
  fail "scripts/main.sh from a fresh clone"
fi
first=$(( $(date +%s) - start ))
[ -s results/report.html ] && [ -s results/report.md ] || fail "main.sh wrote no report"
start=$(date +%s)
plain bash scripts/main.sh --method load --size 64KiB --budget 0.05 >"$WORK/main2.log" 2>&1 \
  || { tail -20 "$WORK/main2.log"; fail "scripts/main.sh, second call"; }
second=$(( $(date +%s) - start ))
say "scripts/main.sh from a fresh clone ${first} s (new .venv; a run of one case), again ${second} s (.venv reused)"
plain .venv/bin/nearlocal probe >"$WORK/probe.log" 2>&1 || { cat "$WORK/probe.log"; fail "nearlocal probe"; }
say "nearlocal probe: ok ($(wc -l < "$WORK/probe.log") lines)"

# the pytest front end with no checkout: a wheel install, run from elsewhere
plain "$SYSPY" -m venv "$WORK/plain"
plain "$WORK/plain/bin/python" -m pip install -q --disable-pip-version-check "$WORK/clone" \
  >"$WORK/pip.log" 2>&1 || { tail -20 "$WORK/pip.log"; fail "pip install (not editable)"; }
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
[ "$(plain "$WORK/plain/bin/python" -c 'import nearlocal, os; print(os.path.dirname(nearlocal.__file__))')" \
  != "$WORK/clone/nearlocal" ] || fail "the wheel install imported the checkout"
plain "$WORK/plain/bin/python" -m pytest -q -p no:cacheprovider \
  --pyargs 'nearlocal.bench.test_cpu::test_cpu[load-dram-wb-4KiB]' --nearlocal-processes 1 \
  --benchmark-max-time 0.05 --benchmark-json out.json >"$WORK/pytest.log" 2>&1 \
  || { tail -20 "$WORK/pytest.log"; fail "pytest --pyargs nearlocal.bench"; }
plain "$WORK/plain/bin/nearlocal" import out.json --out store >"$WORK/import.log" 2>&1 \
  || { cat "$WORK/import.log"; fail "nearlocal import of pytest --pyargs' JSON"; }
say "pytest --pyargs nearlocal.bench (wheel install, outside the checkout): $(plain "$WORK/plain/bin/python" -c 'import json; print(len(json.load(open("out.json"))["benchmarks"]))') benchmark(s); $(head -1 "$WORK/import.log")"

snapshot > "$WORK/after"
if ! diff -q "$WORK/before" "$WORK/after" >/dev/null; then
  diff "$WORK/before" "$WORK/after" | head -20
  fail "the system interpreter's directories changed"
fi
say "ok: nothing written under the system interpreter's directories ($(wc -l < "$WORK/after") files listed)"
