#!/usr/bin/env bash
# nearlocal file-read vs fio (Debian's package) on the same file, block size, queue depth, engine
# (io_uring) and O_DIRECT, in alternating rounds; prints each round's GB/s (1e9 B/s, both tools)
# and the median of the per-round ratios nearlocal / fio.
# Pairs: 1 MiB reads at QD 32 (nearlocal 256x1MiB@1MiB = fio rw=read bs=1M over 256 MiB) and
# 128x20KiB at QD 16 (20 KiB pieces every 40 KiB = fio rw=read:20k bs=20k over 5 MiB).
# A nearlocal sample is one pass over the pattern (its last requests complete at a falling queue
# depth); fio keeps its queue full for the whole run.
set -euo pipefail
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-3}
OUT=${OUT:-/tmp/nearlocal-fio}
FILE=${FILE:-$OUT/fio-file.bin}
command -v fio >/dev/null || { echo "install fio (apt-get install fio)" >&2; exit 2; }
mkdir -p "$OUT"
if [ ! -f "$FILE" ] || [ "$(stat -c %s "$FILE")" -lt $((256 << 20)) ]; then
  head -c $((256 << 20)) /dev/urandom > "$FILE" && sync "$FILE"
fi
echo "box load at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
nearlocal probe --region "storage:$FILE" 2>/dev/null | grep -E "^  storage:|^block devices" || true
: > "$OUT/pairs.txt"
printf "%-16s %5s %10s %10s %7s\n" pattern round nearlocal fio ratio
for round in $(seq "$ROUNDS"); do
  for job in mib kv; do
    if [ "$job" = mib ]; then pattern=256x1MiB@1MiB qd=32 rw=read bs=1M size=256M
    else pattern=128x20KiB qd=16 rw=read:20k bs=20k size=5M; fi
    fio_gbps=$(fio --name=nl --filename="$FILE" --rw="$rw" --bs="$bs" --iodepth="$qd" \
      --ioengine=io_uring --direct=1 --size="$size" --time_based=1 --runtime="$RUNTIME" \
      --output-format=json | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9)")
    nearlocal run --method file-read --region "storage:$FILE" --pattern "$pattern" \
      --param qd="$qd" --param engine=io_uring --budget "$RUNTIME" --processes 1 --quiet \
      --out "$OUT/store" --json "$OUT/nl.json" >/dev/null
    nl_gbps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0]['gbps'])" "$OUT/nl.json")
    python3 -c "import sys; a, b = map(float, sys.argv[3:]); print(f'{sys.argv[1]:<16} {sys.argv[2]:>5} {a:>10.3f} {b:>10.3f} {a / b:>7.3f}')" \
      "$pattern" "$round" "$nl_gbps" "$fio_gbps" | tee -a "$OUT/pairs.txt"
  done
done
echo "box load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT/pairs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    pattern, _, ours, theirs, ratio = line.split()
    rows.setdefault(pattern, []).append((float(ours), float(theirs), float(ratio)))
print(f"{'pattern':<16} {'nearlocal':>10} {'fio':>10} {'ratio':>7}  (GB/s medians; ratio = median of per-round ratios)")
for pattern, found in rows.items():
    print(f"{pattern:<16} {statistics.median(r[0] for r in found):>10.3f} "
          f"{statistics.median(r[1] for r in found):>10.3f} {statistics.median(r[2] for r in found):>7.3f}")
PY
