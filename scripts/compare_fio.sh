#!/usr/bin/env bash
# nearlocal file-read vs fio (Debian's package) on the same file, block size, queue depth, engine
# (io_uring) and O_DIRECT, in alternating rounds; prints each round's GB/s (1e9 B/s, both tools)
# and the median of the per-round ratios nearlocal / fio. fio's bandwidth is its bytes over its
# whole time, so nearlocal's figure here is the same aggregate: bytes per sample over the MEAN
# sample time (its rows' GB/s is per median sample); nl-median prints that one beside it.
# Pairs: 1 MiB reads at QD 32 (nearlocal 256x1MiB@1MiB = fio rw=read bs=1M over 256 MiB) and
# 128x20KiB at QD 16 (20 KiB pieces every 40 KiB = fio rw=read:20k bs=20k over 5 MiB).
# fio is told to submit and time as nearlocal does: one io_uring_enter submits
# every free slot's request and waits for at least one completion (--iodepth_batch_submit=0, i.e.
# the queue depth, --iodepth_batch_complete_max=QD), and no clock is read per request
# (--gtod_reduce=1: nearlocal reads the TSC once per sample). fio's defaults (one enter per
# request, two clock reads per request for its latency statistics) cost it 10-25 % at 20 KiB on
# zram; on a VM's virtual disk they read 15 % faster (the device starts on each request at once).
# Three fio figures per round:
#   fio-pass:   fio reads the pattern once per loop (--loops), waiting for its queue to empty at
#               each loop's end, as a nearlocal sample does (one pass: its last requests complete
#               at a falling queue depth). The like-for-like figure; the ratio is judged on it.
#   fio-steady: fio keeps its queue full for RUNTIME seconds (time_based), for reference.
#   fio-dflt:   fio-pass with fio's own submit and timing defaults, for reference.
# PAGES: the pages of the memory both tools read into, each round run for every kind listed:
#   2M  both on 2 MiB hugetlb pages (fio --iomem=shmhuge, nearlocal --peer dram:2M): the pair the
#       goal is judged on. O_DIRECT pins the buffer's pages for every request, and that costs by
#       how they lie: nearlocal's MAP_POPULATE region is ~84 % physically contiguous pages, fio's
#       malloc buffer ~14 % (/proc/PID/pagemap), so on 4 KiB pages fio spends 2-3x longer pinning
#       (perf: gup_fast 12 % of fio's io_uring_enter, 5 % of nearlocal's). On 2 MiB pages neither
#       tool's allocator decides. Root raises vm.nr_hugepages for the run and restores it.
#   4K  each tool's own 4 KiB-page buffer, for reference.
# MEDIUM=file (default): FILE (default under OUT) on whatever file system holds it.
# MEDIUM=zram (root): ext4 on a new zram device (hot_add, removed at the end; an existing zram
#   device, perhaps the box's swap, is never touched). zram serves a read inside the submitting
#   system call (a copy from RAM, no queue, no kernel thread), so the two tools are compared on
#   their own work with a medium that swings little. 256 MiB of random bytes do not compress.
# MEDIUM=ram (root): a loop device over a file in /dev/shm, ext4 on it (the loop driver's kernel
#   threads compete with the submitter on a small box; swings 2x on 2 vCPUs). Removed at the end.
#
#   bash scripts/compare_fio.sh        ROUNDS=5 RUNTIME=3 MEDIUM=file|zram|ram PAGES="2M 4K"
set -euo pipefail
source "$(dirname "$0")/venv.sh" && nearlocal_on_path  # the checkout's .venv, when there
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-3}
MEDIUM=${MEDIUM:-file}
PAGES=${PAGES:-2M 4K}
OUT=${OUT:-/tmp/nearlocal-fio}
command -v fio >/dev/null || { echo "install fio (apt-get install fio)" >&2; exit 2; }
for kind in $PAGES; do
  case "$kind" in 2M|4K) ;; *) echo "PAGES=$PAGES: each must be 2M or 4K" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
undo=()
cleanup() { local i; for ((i = ${#undo[@]} - 1; i >= 0; i--)); do eval "${undo[i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
need_root() { [ "$(id -u)" = 0 ] || { echo "$1 needs root" >&2; exit 2; }; }
mount_ext4() {  # ext4 on block device $1, mounted under OUT; FILE on it
  mkfs.ext4 -q -F "$1" && mkdir -p "$OUT/mnt" && mount "$1" "$OUT/mnt"
  undo+=("umount $OUT/mnt")
  FILE=$OUT/mnt/fio-file.bin
}
case "$MEDIUM" in
  file) FILE=${FILE:-$OUT/fio-file.bin} ;;
  zram)
    need_root "MEDIUM=zram (zram hot_add, mount)"
    [ -w /sys/class/zram-control/hot_add ] || { echo "MEDIUM=zram: this kernel has no zram-control (zram built in or modprobe zram)" >&2; exit 2; }
    id=$(cat /sys/class/zram-control/hot_add)
    undo+=("echo $id > /sys/class/zram-control/hot_remove" "echo 1 > /sys/block/zram$id/reset")
    echo 320M > "/sys/block/zram$id/disksize"
    mount_ext4 "/dev/zram$id" ;;
  ram)
    need_root "MEDIUM=ram (losetup, mount)"
    image=/dev/shm/nearlocal-fio-$$.img
    truncate -s 320M "$image"
    undo+=("rm -f $image")
    loop=$(losetup --find --show "$image")
    undo+=("losetup -d $loop")
    mount_ext4 "$loop" ;;
  *) echo "MEDIUM=$MEDIUM is not valid: use MEDIUM=file, zram or ram" >&2; exit 2 ;;
esac
if [[ " $PAGES " == *" 2M "* ]]; then  # 128 + 16 pages for the 1 MiB pair, a few for the other
  want=$(( $(awk '/HugePages_Total/ {print $2}' /proc/meminfo) - $(awk '/HugePages_Free/ {print $2}' /proc/meminfo) + 160 ))
  have=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$have" -lt "$want" ]; then
    need_root "PAGES=2M (vm.nr_hugepages: $have, $want needed; or PAGES=4K)"
    undo+=("echo $have > /proc/sys/vm/nr_hugepages")
    echo "$want" > /proc/sys/vm/nr_hugepages
    [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -ge 160 ] ||
      { echo "PAGES=2M: the kernel gave too few 2 MiB pages (vm.nr_hugepages $want asked)" >&2; exit 2; }
  fi
fi
if [ ! -f "$FILE" ] || [ "$(stat -c %s "$FILE")" -lt $((256 << 20)) ]; then
  head -c $((256 << 20)) /dev/urandom > "$FILE" && sync "$FILE"
fi
echo "box load at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs); medium: $MEDIUM; pages: $PAGES"
nearlocal probe --region "storage:$FILE" 2>/dev/null | grep -E "^  storage:|^block devices" || true

fio_gbps() {  # fio's read GB/s (1e9 B/s) for the job options given
  fio --name=nl --filename="$FILE" --ioengine=io_uring --direct=1 --output-format=json "$@" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['read']['bw_bytes'] / 1e9)"
}

: > "$OUT/pairs.txt"
printf "%-16s %5s %5s %10s %10s %10s %10s %10s %7s\n" pattern pages round nearlocal nl-median fio-pass fio-steady fio-dflt ratio
for round in $(seq "$ROUNDS"); do
  for job in mib kv; do
    if [ "$job" = mib ]; then pattern=256x1MiB@1MiB qd=32 rw=read bs=1M size=$((256 << 20))
    else pattern=128x20KiB qd=16 rw=read:20k bs=20k size=$((5 << 20)); fi
    for kind in $PAGES; do
      if [ "$kind" = 2M ]; then fio_mem=(--iomem=shmhuge) peer=dram:2M
      else fio_mem=() peer=dram; fi
      job=("${fio_mem[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" --size="$size")
      as_nl=(--iodepth_batch_submit=0 --iodepth_batch_complete_max="$qd" --gtod_reduce=1)
      steady=$(fio_gbps "${job[@]}" "${as_nl[@]}" --time_based=1 --runtime="$RUNTIME")
      # as many passes as fill RUNTIME at the steady rate (fio's --loops: 1 to 100000)
      loops=$(python3 -c "import sys; print(max(1, min(100000, round(float(sys.argv[1]) * 1e9 * float(sys.argv[2]) / int(sys.argv[3])))))" \
        "$steady" "$RUNTIME" "$size")
      pass=$(fio_gbps "${job[@]}" "${as_nl[@]}" --loops="$loops")
      dflt=$(fio_gbps "${job[@]}" --loops="$loops")
      nearlocal run --method file-read --region "storage:$FILE" --peer "$peer" --pattern "$pattern" \
        --param qd="$qd" --param engine=io_uring --budget "$RUNTIME" --processes 1 --quiet \
        --out "$OUT/store" >/dev/null
      nl_gbps=$(python3 -c "import sys; from nearlocal.store import load; r = load('latest', sys.argv[1]).cases.iloc[0]; print(r.bytes_moved / r.mean_ns, r.gbps)" "$OUT/store")
      python3 -c "import sys; a, m, b, c, d = map(float, sys.argv[4:]); print(f'{sys.argv[1]:<16} {sys.argv[2]:>5} {sys.argv[3]:>5} {a:>10.3f} {m:>10.3f} {b:>10.3f} {c:>10.3f} {d:>10.3f} {a / b:>7.3f}')" \
        "$pattern" "$kind" "$round" $nl_gbps "$pass" "$steady" "$dflt" | tee -a "$OUT/pairs.txt"
    done
  done
done
echo "box load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT/pairs.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    pattern, pages, _, *figures = line.split()
    rows.setdefault((pattern, pages), []).append([float(f) for f in figures])
print(f"{'pattern':<16} {'pages':>5} {'nearlocal':>10} {'nl-median':>10} {'fio-pass':>10}"
      f" {'fio-steady':>10} {'fio-dflt':>10} {'ratio':>7} {'range':>13}  (GB/s, medians over rounds; ratio ="
      " median of the per-round ratios nearlocal (bytes / mean sample time) / fio-pass)")
for (pattern, pages), found in rows.items():
    ratios = [r[5] for r in found]
    print(f"{pattern:<16} {pages:>5} " + " ".join(f"{statistics.median(r[i] for r in found):>10.3f}"
                                                 for i in range(5))
          + f" {statistics.median(ratios):>7.3f} {min(ratios):>6.2f}-{max(ratios):<6.2f}")
PY
