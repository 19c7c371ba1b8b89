#!/usr/bin/env bash
# Runs inside the VM rig's pool-module guest (scripts/vm_check.sh; facts: scripts/vm_poolmod.py):
# builds kmod/nearlocal_pool against this kernel's own headers, shows its refusals (a range
# device-dax still holds, System RAM, a size of 0), frees the nvdimm's device-dax range, loads the
# module on it and measures the pool's B7 rows at 16 KiB with attr uc and wc through
# ncmem:/dev/nearlocal-pool0, each row's memtype read back from PAT. Then a write-back mapping held
# by another process: uc refused naming PAT, rmmod refused; after the last close rmmod succeeds and
# nothing is left mapped. Types and protocol only: TCG has no cache timing.
set -u
OUT=$1
MOUNTS=$2
source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"
guest_up || exit 1

nvdimm_modules
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug
wait_for 30 "/sys/bus/nd/devices/region*"
raw=$(raw_namespace)
make_devdax "$raw" ndctl
wait_for 30 "/sys/bus/dax/devices/dax*"
dax=""
for d in /sys/bus/dax/devices/dax*; do [ -e "$d" ] && dax=${d##*/}; done
start=$(cat "/sys/bus/dax/devices/$dax/resource" 2>/dev/null)
size=$(printf '%#x' "$(cat "/sys/bus/dax/devices/$dax/size" 2>/dev/null || echo 0)")
echo "$dax $start $size" >"$OUT/dax.txt"
mark "devices ($dax at $start, $size bytes)"

kmsg_last() { dmesg | grep 'nearlocal_pool: ' | tail -1 | sed 's/^\[[^]]*\] //'; }
# --- build against this kernel's headers, as docs/memory-types.md gives it ------------------
cp -r "$REPO/kmod/nearlocal_pool" /tmp/kmod
make -C "/lib/modules/$(uname -r)/build" M=/tmp/kmod modules >"$OUT/build.log" 2>&1
echo $? >"$OUT/build.rc"
ko=/tmp/kmod/nearlocal_pool.ko
mark "build the module"
nearlocal probe --json >"$OUT/probe-unloaded.json" 2>"$OUT/probe-unloaded.err"

# --- refusals: each insmod fails with its errno and one line in the kernel log ---------------
refuse() {  # NAME ARGS...: insmod's rc, its message and the module's kernel-log line
  local name=$1; shift
  insmod "$ko" "$@" >"$OUT/insmod-$name.out" 2>&1
  echo $? >"$OUT/insmod-$name.rc"
  kmsg_last >"$OUT/insmod-$name.kmsg"
}
refuse held "start=$start" "size=$size"  # device-dax still holds the range
# nearlocal asked to map through the module the insmod above could not load: one line, exit 2
nearlocal run --method load --region ncmem:/dev/nearlocal-pool0 --attr uc --size 16KiB \
  --budget 0.05 --processes 1 --out "$OUT/held-results" --quiet >"$OUT/held.out" 2>"$OUT/held.err"
echo $? >"$OUT/held.rc"
ram=$(awk -F"[- :]+" '/^[0-9a-f].*System RAM/ {last = "0x" $1} END {print last}' /proc/iomem)  # top-level ranges
refuse ram "start=$(printf '%#x' $((ram + 0x100000)))" size=0x100000
refuse zero "start=$start" size=0
mark "refusals"

# --- free the range from device-dax, load the module on it ----------------------------------
ndctl disable-namespace "$raw" >"$OUT/disable.out" 2>&1
insmod "$ko" "start=$start" "size=$size" >"$OUT/insmod.out" 2>&1
echo $? >"$OUT/insmod.rc"
kmsg_last >"$OUT/insmod.kmsg"
wait_for 10 /dev/nearlocal-pool0
grep -i nearlocal /proc/iomem >"$OUT/iomem-loaded.txt"
nearlocal probe --json >"$OUT/probe.json" 2>"$OUT/probe.err"
mark "load the module"

# --- the pool's B7 rows with attr uc and wc (and wb beside them) -----------------------------
nearlocal run --method load,store,nt-store,clflush-load --region ncmem:/dev/nearlocal-pool0 \
  --attr uc,wc,wb --size 16KiB --allow-write --budget 0.05 --processes 1 --out "$OUT/results" \
  --quiet >"$OUT/run.out" 2>"$OUT/run.err"
echo $? >"$OUT/run.rc"
mark "nearlocal run: B7 rows uc, wc, wb"

# --- bad input while loaded: a window past the range, a size of 0, an attr the module lacks --
bad() {  # NAME ARGS...: a nearlocal run that must be one line and exit 2
  local name=$1; shift
  nearlocal run --method load --size 16KiB --budget 0.05 --processes 1 --out "$OUT/bad-results" \
    --quiet "$@" >"$OUT/bad-$name.out" 2>"$OUT/bad-$name.err"
  echo $? >"$OUT/bad-$name.rc"
}
bad beyond --region "ncmem:/dev/nearlocal-pool0@$((size)),4KiB" --attr uc
bad zero --region "ncmem:/dev/nearlocal-pool0@0,0" --attr uc
bad attr --region ncmem:/dev/nearlocal-pool0 --attr wt
mark "bad input"

# --- another process holds a write-back mapping: uc refused naming PAT, rmmod refused --------
"$PY" - "$OUT/holder" <<'EOF' &
import mmap, os, sys, time
fd = os.open("/dev/nearlocal-pool0", os.O_RDWR)
held = mmap.mmap(fd, 1 << 20, flags=mmap.MAP_SHARED, offset=0)  # window 0: write-back
held[0] = held[0]
open(sys.argv[1], "w").write("mapped\n")
while not os.path.exists(sys.argv[1] + ".stop"):
    time.sleep(0.2)
held.close()
os.close(fd)
EOF
holder=$!
wait_for 120 "$OUT/holder"
cat /sys/class/misc/nearlocal-pool0/mappings >"$OUT/mappings-held.txt" 2>&1
nearlocal run --method load --region ncmem:/dev/nearlocal-pool0 --attr uc --size 16KiB \
  --budget 0.05 --processes 1 --out "$OUT/conflict-results" --quiet >"$OUT/conflict.out" 2>"$OUT/conflict.err"
echo $? >"$OUT/conflict.rc"
rmmod nearlocal_pool >"$OUT/rmmod-busy.out" 2>&1
echo $? >"$OUT/rmmod-busy.rc"
touch "$OUT/holder.stop"
wait $holder
mark "a write-back mapping held: uc refused, rmmod refused"

# --- unloaded: nothing left -------------------------------------------------------------------
cat /sys/class/misc/nearlocal-pool0/mappings >"$OUT/mappings-closed.txt" 2>&1
rmmod nearlocal_pool >"$OUT/rmmod.out" 2>&1
echo $? >"$OUT/rmmod.rc"
[ -e /sys/module/nearlocal_pool ] && echo loaded >"$OUT/left-module.txt"
grep -i nearlocal /proc/iomem >"$OUT/left-iomem.txt"
cp /sys/kernel/debug/x86/pat_memtype_list "$OUT/pat-after-unload.txt" 2>/dev/null
bad missing --region ncmem:/dev/nearlocal-pool0 --attr uc
mark "unloaded"
guest_done
