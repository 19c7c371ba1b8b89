#!/usr/bin/env bash
# The MLC-style figures against anchors measured in the same run (Intel MLC itself is not
# redistributable and literature figures come from other boxes):
#  1. chase idle latency of a 1 GiB ring (dram, 4 KiB pages) vs the same ring walked by a
#     pointer chase written in C (scripts/chase.c, gcc -O2): the same estimator on both sides,
#     the median over samples of 4096 dependent loads (C: clock_gettime around each sample);
#  2. --threads 2 load bandwidth of 1 GB vs likwid-bench -t load_<isa> -w S0:1GB:2
#     (1 GB = 10^9 bytes for both; likwid splits it over the 2 threads, as nearlocal does).
# Pairs run alternately ROUNDS times; the medians and ratios are printed at the end.
set -euo pipefail
source "$(dirname "$0")/venv.sh" && nearlocal_on_path  # the checkout's .venv, when there
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/nearlocal-mlc}
SIZE=$((1 << 30))
mkdir -p "$OUT"
command -v gcc >/dev/null || { echo "gcc is needed for the C pointer chase" >&2; exit 2; }
gcc -O2 -o "$OUT/chase" "$(dirname "$0")/chase.c"
have_likwid=1; command -v likwid-bench >/dev/null || have_likwid=0
[ $have_likwid = 1 ] || echo "likwid-bench not found (apt-get install likwid): bandwidth pair skipped" >&2
isa=avx; grep -qw avx512f /proc/cpuinfo && isa=avx512
threads=2; [ "$(nproc)" -ge 2 ] || { echo "needs 2 CPUs for --threads 2" >&2; exit 2; }
: > "$OUT/pairs.txt"
gb() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]; print(round(r[sys.argv[2]], 2))" "$@"; }
for round in $(seq "$ROUNDS"); do
  c=$("$OUT/chase" "$SIZE" 4096 2001 | awk '{print $1}')
  nearlocal run --method chase --size 1GiB --budget 2 --quiet --out "$OUT/store" \
    --json "$OUT/chase-$round.json" >/dev/null
  printf "chase-1GiB ns %s %s\n" "$(gb "$OUT/chase-$round.json" median_ns)" "$c" | tee -a "$OUT/pairs.txt"
  if [ $have_likwid = 1 ]; then
    lk=$(likwid-bench -t "load_$isa" -w "S0:1GB:$threads" 2>/dev/null | awk '/^MByte\/s:/ {print $2 / 1000}')
    nearlocal run --method load --size 1GB --threads $threads --budget 3 --quiet --out "$OUT/store" \
      --json "$OUT/load-$round.json" >/dev/null
    printf "load-threads-2 GB/s %s %s\n" "$(gb "$OUT/load-$round.json" gbps)" "$lk" | tee -a "$OUT/pairs.txt"
  fi
done
python3 - "$OUT/pairs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, unit, ours, theirs = line.split()
    rows.setdefault((name, unit), []).append((float(ours), float(theirs)))
print(f"{'pair':<16} {'unit':<5} {'nearlocal':>10} {'anchor':>10} {'ratio':>7}  (median of rounds)")
for (name, unit), pairs in rows.items():
    ours = statistics.median(p[0] for p in pairs)
    theirs = statistics.median(p[1] for p in pairs)
    anchor = "C chase" if name.startswith("chase") else "likwid"
    print(f"{name:<16} {unit:<5} {ours:>10.2f} {theirs:>10.2f} {ours / theirs:>7.3f}  vs {anchor}")
PY
