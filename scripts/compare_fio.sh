#!/usr/bin/env bash
# nearlocal file-read vs fio (Debian's package) on the same file, block size, queue depth, engine
# (io_uring) and O_DIRECT, in alternating rounds; prints each round's GB/s (1e9 B/s, both tools)
# and the median of the per-round ratios nearlocal / fio. fio's bandwidth is its bytes over its
# whole time, so nearlocal's figure here is the same aggregate: bytes per sample over the MEAN
# sample time (its rows' GB/s is per median sample, which on a medium that swings 2x between
# samples reads higher than any bytes-over-time figure); nl-median prints that one beside it.
# Pairs: 1 MiB reads at QD 32 (nearlocal 256x1MiB@1MiB = fio rw=read bs=1M over 256 MiB) and
# 128x20KiB at QD 16 (20 KiB pieces every 40 KiB = fio rw=read:20k bs=20k over 5 MiB).
# Two fio figures per round:
#   fio-pass:   fio reads the pattern once per loop (--loops), waiting for its queue to empty at
#               each loop's end, as a nearlocal sample does (one pass: its last requests complete
#               at a falling queue depth). The like-for-like figure; the ratio is judged on it.
#   fio-steady: fio keeps its queue full for RUNTIME seconds (time_based), for reference.
# MEDIUM=file (default): FILE (default under OUT) on whatever file system holds it.
# MEDIUM=ram (root): a loop device over a file in /dev/shm, ext4 on it, the file there: a block
#   device the page cache never answers for (O_DIRECT) whose speed does not swing with a
#   hypervisor's disk path, so the two tools' agreement is seen apart from the medium's drift.
#   Removed again at the end.
#
#   bash scripts/compare_fio.sh                 ROUNDS=5 RUNTIME=3 MEDIUM=file|ram
set -euo pipefail
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-3}
MEDIUM=${MEDIUM:-file}
OUT=${OUT:-/tmp/nearlocal-fio}
command -v fio >/dev/null || { echo "install fio (apt-get install fio)" >&2; exit 2; }
mkdir -p "$OUT"
case "$MEDIUM" in
  file) FILE=${FILE:-$OUT/fio-file.bin} ;;
  ram)
    [ "$(id -u)" = 0 ] || { echo "MEDIUM=ram needs root (losetup, mount)" >&2; exit 2; }
    image=/dev/shm/nearlocal-fio-$$.img mnt=$OUT/ram-mnt
    truncate -s 320M "$image"
    loop=$(losetup --find --show "$image")
    cleanup() { umount "$mnt" 2>/dev/null || true; losetup -d "$loop" 2>/dev/null || true; rm -f "$image"; }
    trap cleanup EXIT
    mkfs.ext4 -q -F "$loop" && mkdir -p "$mnt" && mount "$loop" "$mnt"
    FILE=$mnt/fio-file.bin ;;
  *) echo "MEDIUM=$MEDIUM is not valid: use MEDIUM=file or MEDIUM=ram" >&2; exit 2 ;;
esac
if [ ! -f "$FILE" ] || [ "$(stat -c %s "$FILE")" -lt $((256 << 20)) ]; then
  head -c $((256 << 20)) /dev/urandom > "$FILE" && sync "$FILE"
fi
echo "box load at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs); medium: $MEDIUM"
nearlocal probe --region "storage:$FILE" 2>/dev/null | grep -E "^  storage:|^block devices" || true

fio_gbps() {  # fio's read GB/s (1e9 B/s) for the job options given
  fio --name=nl --filename="$FILE" --ioengine=io_uring --direct=1 --output-format=json "$@" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9)"
}

: > "$OUT/pairs.txt"
printf "%-16s %5s %10s %10s %10s %10s %7s\n" pattern round nearlocal nl-median fio-pass fio-steady ratio
for round in $(seq "$ROUNDS"); do
  for job in mib kv; do
    if [ "$job" = mib ]; then pattern=256x1MiB@1MiB qd=32 rw=read bs=1M size=$((256 << 20))
    else pattern=128x20KiB qd=16 rw=read:20k bs=20k size=$((5 << 20)); fi
    steady=$(fio_gbps --rw="$rw" --bs="$bs" --iodepth="$qd" --size="$size" --time_based=1 \
      --runtime="$RUNTIME")
    # as many passes as fill RUNTIME at the steady rate (fio's --loops: 1 to 100000)
    loops=$(python3 -c "import sys; print(max(1, min(100000, round(float(sys.argv[1]) * 1e9 * float(sys.argv[2]) / int(sys.argv[3])))))" \
      "$steady" "$RUNTIME" "$size")
    pass=$(fio_gbps --rw="$rw" --bs="$bs" --iodepth="$qd" --size="$size" --loops="$loops")
    nearlocal run --method file-read --region "storage:$FILE" --pattern "$pattern" \
      --param qd="$qd" --param engine=io_uring --budget "$RUNTIME" --processes 1 --quiet \
      --out "$OUT/store" --json "$OUT/nl.json" >/dev/null
    nl_gbps=$(python3 -c "import sys; from nearlocal.results import load; r = load('latest', sys.argv[1]).cases.iloc[0]; print(r.bytes_moved / r.mean_ns, r.gbps)" "$OUT/store")
    python3 -c "import sys; a, m, b, c = map(float, sys.argv[3:]); print(f'{sys.argv[1]:<16} {sys.argv[2]:>5} {a:>10.3f} {m:>10.3f} {b:>10.3f} {c:>10.3f} {a / b:>7.3f}')" \
      "$pattern" "$round" $nl_gbps "$pass" "$steady" | tee -a "$OUT/pairs.txt"
  done
done
echo "box load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT/pairs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    pattern, _, *figures = line.split()
    rows.setdefault(pattern, []).append([float(f) for f in figures])
print(f"{'pattern':<16} {'nearlocal':>10} {'nl-median':>10} {'fio-pass':>10} {'fio-steady':>10}"
      f" {'ratio':>7}  (GB/s, medians over rounds; ratio = median of the per-round ratios"
      " nearlocal (bytes / mean sample time) / fio-pass)")
for pattern, found in rows.items():
    print(f"{pattern:<16} " + " ".join(f"{statistics.median(r[i] for r in found):>10.3f}"
                                      for i in range(4))
          + f" {statistics.median(r[4] for r in found):>7.3f}")
PY
