# The VM rig's shell library (docs/vm-rig.md), sourced by scripts/vm_check.sh on the host and by
# every guest script (scripts/vm_*_guest.sh, from the copy vm_check.sh puts beside them in the
# guest's folder). Sourcing it only defines: functions, and the two hosts' addresses.
#
# A guest's stages reach the host as files OUT/stage-NN holding one line: mark() writes them in
# the guest, relay_stages() prints and removes them on the host. The guest functions read OUT
# (the guest's folder, shared with the host) and MOUNTS, set by the guest script first.

# --- the two-host stage's guests: one place for their addresses (vm_check.sh's QEMU NICs and
# slurm.conf, vm_hosts_guest.sh's own address, /etc/hosts and sshd)
declare -gA HOST_ADDRESS=([a]=10.78.0.1 [b]=10.78.0.2 [c]=10.78.0.9)  # c: no guest (bad input)
declare -gA HOST_MAC=([a]=52:54:00:4e:4c:01 [b]=52:54:00:4e:4c:02)

# --- the stage relay: the guest marks, the host prints ------------------------------------------
MARK_N=0
mark() {  # TEXT: the guest's next stage; written whole, then renamed (the host relays a stage
  # file as soon as it sees one)
  MARK_N=$((MARK_N + 1))
  printf '%s\n' "$1" >"$OUT/.stage" && mv "$OUT/.stage" "$OUT/stage-$(printf %02d "$MARK_N")"
}
relay_stages() {  # DIR LABEL: on the host, each finished stage of the guest writing DIR, in
  # order, through vm_check.sh's stage() under LABEL; each file removed once printed
  local dir=$1 label=$2 done_stage
  for done_stage in "$dir"/stage-*; do
    [ -e "$done_stage" ] || continue
    stage "$label$(cat "$done_stage")"
    rm -f "$done_stage"
  done
}

# --- in a guest ---------------------------------------------------------------------------------
log() { echo "guest: $*"; }
wait_for() {  # TRIES GLOB: bash globs and one external sleep a second (every exec crosses 9p)
  local tries=$1; shift
  for _ in $(seq "$tries"); do
    compgen -G "$1" >/dev/null && return 0
    sleep 1
  done
  return 1
}
mount_image() {  # MOUNTS: mounts the packed image (interpreter, venv, checkout; vm_pack.py) over
  # the host's paths; sets VENV, REPO, PY, PATH and the numba cache
  local mounts=$1 disk="" block folder path
  modprobe -a virtio_blk ext4 2>/dev/null
  for _ in $(seq 100); do
    for block in /sys/block/vd*; do
      [ "$(cat "$block/serial" 2>/dev/null)" = nearlocal ] && disk=/dev/$(basename "$block")
    done
    [ -n "$disk" ] && [ -b "$disk" ] && break
    sleep 0.2
  done
  [ -n "$disk" ] || { log "the nearlocal image disk did not appear"; return 1; }
  [ -s "$mounts" ] || { log "no mount table at $mounts"; return 1; }
  mkdir -p /tmp/nearlocal-image
  mount -t ext4 -o ro "$disk" /tmp/nearlocal-image || { log "cannot mount $disk"; return 1; }
  while read -r folder path; do
    # a path under the guest's own /tmp or /var/tmp (tmpfs, not the host's) is made first: the
    # venv of a checkout without .venv lives in the host's work folder there
    [ -d "$path" ] || mkdir -p "$path" || { log "cannot make $path"; return 1; }
    mount --bind "/tmp/nearlocal-image/$folder" "$path" || { log "cannot bind $folder on $path"; return 1; }
  done <"$mounts"
  VENV=$(awk '$1 == "venv" {print $2}' "$mounts")
  REPO=$(awk '$1 == "repo" {print $2}' "$mounts")
  export PATH="$VENV/bin:$PATH" NUMBA_CACHE_DIR=/tmp/numba-cache NEARLOCAL_WORKER_START_S=900
  PY=$VENV/bin/python
}
guest_up() {  # every guest's start: says it booted, mounts the image from MOUNTS, takes the
  # kernels an earlier guest compiled (OUT/numba-cache.tar, where the host handed one over)
  echo booted >"$OUT/booted"
  mount_image "$MOUNTS" || return 1
  [ -e "$OUT/numba-cache.tar" ] && tar -C /tmp -xf "$OUT/numba-cache.tar"
  mark "mount image"
}
keep_numba_cache() {  # the kernels this guest compiled, for the next guests (one file across 9p)
  tar -C /tmp -cf "$OUT/numba-cache.tar" numba-cache 2>/dev/null
}
guest_done() {  # every guest's end: the image unmounted, then OUT/done (what the host waits for)
  umount -R /tmp/nearlocal-image 2>/dev/null
  echo done >"$OUT/done"
}

# --- the nvdimm as device-dax -------------------------------------------------------------------
nvdimm_modules() {  # [MODULE...]: the nvdimm's and device-dax's drivers, and any more named
  modprobe -a nfit libnvdimm nd_pmem dax_pmem device_dax "$@" 2>&1
}
raw_namespace() {  # [REGION]: the name of the last namespace*.0 (of REGION where named), else
  # namespace0.0 (QEMU's nvdimm without a label area has one raw namespace)
  local ns found=""
  for ns in /sys/bus/nd/devices/${1:+$1/}namespace*.0; do [ -e "$ns" ] && found=${ns##*/}; done
  echo "${found:-namespace0.0}"
}
make_devdax() {  # NAMESPACE NAME: ndctl reconfigures it as device-dax, 2 MiB aligned; its output
  # in OUT/NAME.json and OUT/NAME.err
  ndctl create-namespace -f -e "$1" -m devdax -a 2M >"$OUT/$2.json" 2>"$OUT/$2.err"
}
share_pool() {  # the guest that makes a shared pool: the nvdimm's namespace as device-dax (its
  # info block lands in the shared host file), then OUT/namespace-ready (the host starts the
  # other guest on it)
  wait_for 60 "/sys/bus/nd/devices/namespace*.0" || { log "no nvdimm namespace"; return 1; }
  make_devdax "$(raw_namespace)" ndctl || { log "ndctl create-namespace failed: $(cat "$OUT/ndctl.err")"; return 1; }
  echo ready >"$OUT/namespace-ready"
}
find_pool() {  # sets DAX: the pool's device-dax (/dev/daxN.M, the last there is) once it shows
  local d
  DAX=""
  wait_for 60 "/dev/dax*" || { ls /sys/bus/nd/devices >"$OUT/nd-devices.txt" 2>&1; log "no /dev/dax*"; return 1; }
  for d in /dev/dax*; do DAX=$d; done
}
