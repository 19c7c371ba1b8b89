#!/usr/bin/env bash
# Runs inside the VM rig's cpu guest (scripts/vm_check.sh), booted with a CPU model that lacks
# AVX2, AVX-512, clflushopt, clwb and movdir64b: one small case of every CPU method
# (scripts/vm_cpu.py run), so the host can check that each was measured or skipped naming the
# flag its CPU lacks, and that no kernel stopped the process (LLVM aborts on an instruction it
# cannot select). Writes its results to OUT; the host checks them (scripts/vm_cpu.py check).
set -u
OUT=$1
MOUNTS=$2
source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"
guest_up || exit 1
grep -m1 '^flags' /proc/cpuinfo >"$OUT/cpuinfo-flags.txt"
grep -m1 '^model name' /proc/cpuinfo >>"$OUT/cpuinfo-flags.txt"
# the storage methods' file (.nearlocal-storage in the working folder) on the ext4 disk the host
# made (serial nlstorage): file-read / file-write open it with O_DIRECT, which /tmp here refuses
storage=""
for block in /sys/block/vd*; do
  [ "$(cat "$block/serial" 2>/dev/null)" = nlstorage ] && storage=/dev/$(basename "$block")
done
mkdir -p /tmp/nl-storage
if [ -n "$storage" ] && mount -t ext4 "$storage" /tmp/nl-storage; then
  cd /tmp/nl-storage || exit 1
else
  log "no storage disk (serial nlstorage): the storage methods' file lands in /tmp"
  cd /tmp || exit 1
fi
"$PY" "$REPO/scripts/vm_cpu.py" run "$OUT" >"$OUT/cpu.out" 2>"$OUT/cpu.err"
echo $? >"$OUT/cpu.rc"
mark "every CPU method"
cd / && umount /tmp/nl-storage 2>/dev/null
guest_done
