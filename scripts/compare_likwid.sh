#!/usr/bin/env bash
# nearlocal vs likwid-bench, one thread, 1 GB buffer (likwid's GB = 1e9 bytes; so is ours here).
# Pairs: nt-store ~ store_mem_<isa>, store ~ store_<isa>, load ~ load_<isa>, where <isa> is avx512
# when the CPU has it, else avx. Both count only the bytes of the stream (no RFO, no write-allocate).
# Runs the pairs alternately ROUNDS times and prints GB/s for each.
set -euo pipefail
source "$(dirname "$0")/venv.sh" && nearlocal_on_path  # the checkout's .venv, when there
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/nearlocal-likwid}
command -v likwid-bench >/dev/null || { echo "install likwid (apt-get install likwid)" >&2; exit 2; }
isa=avx; grep -qw avx512f /proc/cpuinfo && isa=avx512
mkdir -p "$OUT"
: > "$OUT/pairs.txt"
printf "%-10s %-18s %10s %10s\n" method "likwid kernel" "nearlocal" "likwid"
for round in $(seq "$ROUNDS"); do
  pairs=("nt-store:store_mem_$isa" "store:store_$isa" "load:load_$isa")
  # where the CPU has AVX-512, likwid's 256-bit load and store kernels too: its two load
  # kernels differ by more than nearlocal differs from either (docs/timing.md), so one alone
  # says little; nearlocal's store is 256-bit (AVX2) where numba vectorizes it so
  [ "$isa" = avx512 ] && pairs+=("load:load_avx" "store:store_avx")
  for pair in "${pairs[@]}"; do
    method=${pair%%:*}; kernel=${pair#*:}
    lk=$(likwid-bench -t "$kernel" -w S0:1GB:1 2>/dev/null | awk '/^MByte\/s:/ {print $2 / 1000}')
    # drain=none: repetitions back to back, as likwid-bench loops (at 1 GB it changes little)
    nearlocal run --method "$method" --size 1GB --param drain=none --budget 3 --quiet \
      --out "$OUT/store" --json "$OUT/$method-$round.json" >/dev/null
    nl=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))[0]['gbps'], 2))" \
      "$OUT/$method-$round.json")
    printf "%-10s %-18s %10s %10s\n" "$method" "$kernel" "$nl" "$lk" | tee -a "$OUT/pairs.txt"
  done
done
# The median over rounds of each tool, and nearlocal's difference from likwid. Where likwid's
# two load kernels disagree, the load figure depends on the loop (vector width, unrolling) more
# than on the memory: nearlocal's lies between them when it is right, and the script says so.
python3 - "$OUT/pairs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    method, kernel, ours, theirs = line.split()
    rows.setdefault((method, kernel), []).append((float(ours), float(theirs)))
print(f"{'method':<10} {'likwid kernel':<18} {'nearlocal':>10} {'likwid':>10} {'diff':>7}  (GB/s, median of rounds)")
for (method, kernel), pairs in rows.items():
    ours = statistics.median(p[0] for p in pairs)
    theirs = statistics.median(p[1] for p in pairs)
    print(f"{method:<10} {kernel:<18} {ours:>10.2f} {theirs:>10.2f} {100 * (ours / theirs - 1):>+6.1f}%")
loads = {kernel: pairs for (method, kernel), pairs in rows.items() if method == "load"}
if len(loads) == 2:
    ours = statistics.median(p[0] for pairs in loads.values() for p in pairs)
    theirs = {k: statistics.median(p[1] for p in pairs) for k, pairs in loads.items()}
    low, high = min(theirs.values()), max(theirs.values())
    where = ("between likwid's two load kernels" if low <= ours <= high else
             "outside likwid's two load kernels: see load_shapes below and docs/timing.md "
             "(on a VM the buffer's pages move one thread's load bandwidth more than the loop)")
    print(f"load: likwid's kernels span {low:.2f}-{high:.2f} GB/s ({high / low - 1:+.1%}); "
          f"nearlocal's {ours:.2f} GB/s lies {where}")
PY
# The load's two loop shapes and two statistics in one process over one buffer (scripts/
# load_shapes.c), the buffer faulted page by page (likwid's way), with MAP_POPULATE (nearlocal's)
# and with THP: what a gap between nearlocal's load and likwid's is made of.
if [ "$isa" = avx512 ] && command -v gcc >/dev/null; then
  gcc -O2 -mavx512f -o "$OUT/load_shapes" "$(dirname "$0")/load_shapes.c"
  for how in touch populate thp; do "$OUT/load_shapes" "$how"; done
fi
