#!/usr/bin/env bash
# Runs inside each guest of the VM rig's pair stage (scripts/vm_check.sh): the two guests map one
# host file as an nvdimm. ROLE writer (guest A) makes its namespace device-dax (the info block
# lands in the shared file) and writes records until the host kills its QEMU; ROLE reader (guest
# B, booted once A's namespace exists) finds the same device-dax and reads (scripts/vm_pair.py).
set -u
ROLE=$1
OUT=$2
MOUNTS=$3
echo booted >"$OUT/booted"
source "$(dirname "${BASH_SOURCE[0]}")/vm_mount.sh"
mount_image "$MOUNTS" || exit 1
[ -e "$OUT/numba-cache.tar" ] && tar -C /tmp -xf "$OUT/numba-cache.tar"  # the first guest's kernels
modprobe -a nfit libnvdimm nd_pmem dax_pmem device_dax 2>&1
if [ "$ROLE" = writer ]; then
  wait_for 60 "/sys/bus/nd/devices/namespace*.0" || { log "no nvdimm namespace"; exit 1; }
  ns=""
  for n in /sys/bus/nd/devices/namespace*.0; do ns=${n##*/}; done
  ndctl create-namespace -f -e "$ns" -m devdax -a 2M >"$OUT/ndctl.json" 2>"$OUT/ndctl.err" \
    || { log "ndctl create-namespace failed: $(cat "$OUT/ndctl.err")"; exit 1; }
  echo ready >"$OUT/namespace-ready"
fi
wait_for 60 "/dev/dax*" || { ls /sys/bus/nd/devices >"$OUT/nd-devices.txt" 2>&1; log "no /dev/dax*"; exit 1; }
dax=""
for d in /dev/dax*; do dax=$d; done
log "$ROLE on $dax"
"$PY" "$REPO/scripts/vm_pair.py" "$ROLE" "$dax" "$OUT" >"$OUT/$ROLE.log" 2>&1
echo $? >"$OUT/$ROLE.rc"
echo done >"$OUT/done"
