# Sourced by the VM rig's guest scripts (vm_guest.sh, vm_pair_guest.sh): mounts the packed image
# (interpreter, venv, checkout; scripts/vm_pack.py) over the host's paths, and the helpers both use.
log() { echo "guest: $*"; }
wait_for() {  # TRIES GLOB: bash globs and one external sleep a second (every exec crosses 9p)
  local tries=$1; shift
  for _ in $(seq "$tries"); do
    compgen -G "$1" >/dev/null && return 0
    sleep 1
  done
  return 1
}
mount_image() {  # MOUNTS: sets VENV, REPO, PY, PATH and the numba cache
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
