#!/usr/bin/env bash
# Runs inside the VM rig's guest (scripts/vm_check.sh): mounts the packed image over the host's
# paths, builds the devices (nvdimm devdax, CXL region + devdax), then runs nearlocal as few
# times as it can (each start costs minutes under TCG): probe --json, one run over every region,
# faults on the devdax. Writes its results to OUT; the host checks them (scripts/vm_facts.py).
set -u
OUT=$1
MOUNTS=$2
n=0
mark() { n=$((n + 1)); printf '%s\n' "$1" >"$OUT/stage-$(printf %02d $n)"; }
log() { echo "guest: $*"; }
echo booted >"$OUT/booted"

# --- the image: interpreter, venv and checkout at the host's paths -------------------------
modprobe -a virtio_blk ext4 2>/dev/null
disk=""
for _ in $(seq 100); do
  for block in /sys/block/vd*; do
    [ "$(cat "$block/serial" 2>/dev/null)" = nearlocal ] && disk=/dev/$(basename "$block")
  done
  [ -n "$disk" ] && [ -b "$disk" ] && break
  sleep 0.2
done
[ -n "$disk" ] || { log "the nearlocal image disk did not appear"; exit 1; }
[ -s "$MOUNTS" ] || { log "no mount table at $MOUNTS"; exit 1; }
mkdir -p /tmp/nearlocal-image
mount -t ext4 -o ro "$disk" /tmp/nearlocal-image || { log "cannot mount $disk"; exit 1; }
while read -r folder path; do
  # a path under the guest's own /tmp or /var/tmp (tmpfs, not the host's) is made first: the
  # venv of a checkout without .venv lives in the host's work folder there
  [ -d "$path" ] || mkdir -p "$path" || { log "cannot make $path"; exit 1; }
  mount --bind "/tmp/nearlocal-image/$folder" "$path" || { log "cannot bind $folder on $path"; exit 1; }
done <"$MOUNTS"
VENV=$(awk '$1 == "venv" {print $2}' "$MOUNTS")
REPO=$(awk '$1 == "repo" {print $2}' "$MOUNTS")
export PATH="$VENV/bin:$PATH" NUMBA_CACHE_DIR=/tmp/numba-cache NEARLOCAL_WORKER_START_S=900
PY=$VENV/bin/python
mark "mount image"

# --- devices ---------------------------------------------------------------------------------
modprobe -a nfit libnvdimm nd_pmem dax_pmem device_dax cxl_acpi cxl_pci cxl_port cxl_mem cxl_pmem 2>&1
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug
wait_for() {  # bash globs and one external sleep a second: every exec crosses 9p
  local tries=$1; shift
  for _ in $(seq "$tries"); do
    compgen -G "$1" >/dev/null && return 0
    sleep 1
  done
  return 1
}
wait_for 60 /sys/bus/cxl/devices/decoder0.0
wait_for 30 /sys/bus/cxl/devices/mem0
wait_for 30 "/sys/bus/nd/devices/region*"
nd_regions() { local r; for r in /sys/bus/nd/devices/region*; do [ -e "$r" ] && echo "${r##*/}"; done; }
nvregion=$(nd_regions | head -1)
log "nvdimm region: ${nvregion:-none}"
raw=""
for ns in /sys/bus/nd/devices/"${nvregion:-region0}"/namespace*.0; do [ -e "$ns" ] && raw=${ns##*/}; done
log "nvdimm raw namespace: ${raw:-none}"
ndctl create-namespace -f -e "${raw:-namespace0.0}" -m devdax -a 2M >"$OUT/ndctl-nvdimm.json" 2>"$OUT/ndctl-nvdimm.err"
before=" $(nd_regions | tr '\n' ' ') "
cxl create-region -m -d decoder0.0 -t pmem -w 1 -g 256 mem0 >"$OUT/cxl-region.json" 2>"$OUT/cxl-region.err"
cxlnd=""
for _ in $(seq 30); do
  for r in $(nd_regions); do
    case "$before" in *" $r "*) ;; *) cxlnd=$r ;; esac
  done
  [ -n "$cxlnd" ] && break
  sleep 1
done
log "CXL nd region: ${cxlnd:-none}"
[ -n "$cxlnd" ] && ndctl create-namespace -r "$cxlnd" -m devdax -a 2M >"$OUT/ndctl-cxl.json" 2>"$OUT/ndctl-cxl.err"
ls /sys/bus/dax/devices/ >"$OUT/dax-devices.txt" 2>&1
for dax in /sys/bus/dax/devices/dax*; do
  name=$(basename "$dax")
  echo "$name $(readlink -f "$dax")" >>"$OUT/dax-paths.txt"
done
mark "devices"

# --- nearlocal: as few invocations as possible ---------------------------------------------
"$PY" "$REPO/scripts/record_trees.py" /tmp/trees --map-bar "0000:00:0b.0" 2 wc 2>&1
tar -C /tmp -cf "$OUT/trees.tar" trees  # one file across 9p, not hundreds
mark "record trees"
nearlocal probe --json >"$OUT/probe.json" 2>"$OUT/probe.err"
echo $? >"$OUT/probe.rc"
mark "nearlocal probe --json"
regions="numa:1"
cxldax=""
for dax in $(cat "$OUT/dax-paths.txt" 2>/dev/null | awk '{print $1 "=" $2}'); do
  name=${dax%%=*}; path=${dax#*=}
  regions="$regions,devdax:/dev/$name"
  case "$path" in *"/$cxlnd/"*) [ -n "$cxlnd" ] && cxldax=$name ;; esac
done
echo "$cxldax" >"$OUT/cxl-dax.txt"
nearlocal run --method load --region "$regions,pcibar:0000:00:0b.0/2" --attr wb,uc,wc --size 4KiB \
  --budget 0.05 --out "$OUT/results" --quiet >"$OUT/run.out" 2>"$OUT/run.err"
echo $? >"$OUT/run.rc"
mark "nearlocal run"
nvdax=$(awk -v cxl="$cxldax" '$1 != cxl {print $1; exit}' "$OUT/dax-paths.txt")
# small: under TCG every respawned writer pays its imports again; its own limit, so a slow box
# is a named failed fact, not a guest past the rig's limit
timeout -k 5 "${NEARLOCAL_VM_FAULTS_S:-420}" nearlocal faults --region "devdax:/dev/$nvdax" \
  --allow-write --kills 1 --readers 1 --records 8 --record-size 4KiB --lease 2s --duration 30s --json \
  >"$OUT/faults.json" 2>"$OUT/faults.err"
echo $? >"$OUT/faults.rc"
mark "nearlocal faults"
echo "accept: skipped: the acceptance spec has no region override on this branch (the Beluga spec names its own pool)" >"$OUT/accept.txt"
umount -R /tmp/nearlocal-image 2>/dev/null
echo done >"$OUT/done"
