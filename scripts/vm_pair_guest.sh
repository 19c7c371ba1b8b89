#!/usr/bin/env bash
# Runs inside each guest of the VM rig's pair stage (scripts/vm_check.sh): the two guests map one
# host file as an nvdimm. ROLE writer (guest A) makes its namespace device-dax (the info block
# lands in the shared file) and writes records until the host kills its QEMU; ROLE reader (guest
# B, booted once A's namespace exists) finds the same device-dax and reads (scripts/vm_pair.py).
set -u
ROLE=$1
OUT=$2
MOUNTS=$3
source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"
guest_up || exit 1  # with the first guest's kernels
nvdimm_modules
if [ "$ROLE" = writer ]; then
  share_pool || exit 1
fi
find_pool || exit 1
log "$ROLE on $DAX"
"$PY" "$REPO/scripts/vm_pair.py" "$ROLE" "$DAX" "$OUT" >"$OUT/$ROLE.log" 2>&1
echo $? >"$OUT/$ROLE.rc"
guest_done
