#!/usr/bin/env bash
# The VM rig: boots one QEMU guest (TCG, Debian's kernel through virtme-ng, the host's root over
# 9p read-only, nearlocal's interpreter + venv + checkout packed in a read-only ext4 image) with
# a CPU-less NUMA node, an nvdimm as device-dax, a CXL type-3 device with a region (device-dax
# on it) and an ivshmem BAR; runs nearlocal in it (scripts/vm_guest.sh) and checks the facts it
# reports (scripts/vm_facts.py): interfaces, mappings and protocols, never speed.
#
#   bash scripts/vm_check.sh [--no-install] [--keep-trees DIR]
#
# Installs what it needs (qemu-system-x86, linux-image-amd64, ndctl from Debian; virtme-ng from
# PyPI) unless --no-install. Prints its stage times. A missing qemu or kernel, or a guest that
# does not boot within NEARLOCAL_VM_BOOT_S (default 300 s): one line, exit 2. It leaves no QEMU
# process and no file behind (its work folder is removed, its QEMU killed by PID;
# NEARLOCAL_VM_KEEP=DIR copies the guests' folders and logs there first, backing files aside).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
source "$REPO/scripts/vm_lib.sh"  # relay_stages, the two hosts' addresses (the guests' library too)
BOOT_LIMIT=${NEARLOCAL_VM_BOOT_S:-300}
GUEST_LIMIT=${NEARLOCAL_VM_LIMIT_S:-1500}
INSTALL=1
TREES=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) INSTALL=0 ;;
    --keep-trees) TREES=$2; shift ;;
    *) echo "vm_check: unknown option $1 (valid: --no-install, --keep-trees DIR)" >&2; exit 2 ;;
  esac
  shift
done
START=$(date +%s)
LAST=$START
stage() {  # the time the stage just finished took, and the total so far
  local now; now=$(date +%s)
  printf 'vm_check: %-28s %4d s (total %4d s)\n' "$1" $((now - LAST)) $((now - START))
  LAST=$now
}
fail() {
  echo "vm_check: $*" >&2
  local log
  for log in "$WORK"/pair-?/*.log; do  # the two-guest stage's own logs, before they are removed
    [ -n "$WORK" ] && [ -s "$log" ] && { echo "vm_check: ${log#"$WORK"/}:" >&2; tail -8 "$log" >&2; }
  done
  exit 2
}

QEMU=${NEARLOCAL_VM_QEMU:-qemu-system-x86_64}
KERNEL=${NEARLOCAL_VM_KERNEL:-}
WORK=""
QEMU_PIDS=()
cleanup() {
  local pid
  [ -n "$WORK" ] || return 0
  for pid in $(pgrep -f -- "$WORK/" 2>/dev/null); do  # our QEMU only: its command line names $WORK
    [ "$pid" != $$ ] && kill -KILL "$pid" 2>/dev/null
  done
  for pid in "${QEMU_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  if [ -n "${NEARLOCAL_VM_KEEP:-}" ]; then  # the guests' folders and logs, for a look afterwards
    mkdir -p "$NEARLOCAL_VM_KEEP" && (cd "$WORK" && tar -cf - --exclude='*.img' --exclude=nearlocal.img \
      --exclude=stage --exclude=venv --exclude='pool0' --exclude=rackpool --exclude=poolmod-nvdimm \
      --exclude='nvdimm0' --exclude='cxl-*' --exclude='ivshmem0' . 2>/dev/null) | tar -C "$NEARLOCAL_VM_KEEP" -xf - 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$INSTALL" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v qemu-system-x86_64 >/dev/null || need="$need qemu-system-x86"
  ls /boot/vmlinuz-* >/dev/null 2>&1 || need="$need linux-image-amd64"
  command -v ndctl >/dev/null && command -v cxl >/dev/null || need="$need ndctl"
  command -v mke2fs >/dev/null || need="$need e2fsprogs"
  dpkg -s busybox-static >/dev/null 2>&1 || need="$need busybox-static"  # virtme-ng's initramfs
  # the RDMA stages: libibverbs + the rxe provider, rdma (iproute2), ibv_devinfo, perftest; the
  # two-host stage's ssh (mpiexec starts the other host's ranks through it)
  for pkg in rdma-core ibverbs-providers ibverbs-utils perftest iproute2 openssh-server openssh-client \
      slurmctld slurmd slurm-client; do
    dpkg -s $pkg >/dev/null 2>&1 || need="$need $pkg"
  done
  if [ -n "$need" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends $need) >/dev/null 2>&1 || fail "could not install$need from Debian"
  fi
fi
command -v "$QEMU" >/dev/null || fail "$QEMU is missing (apt-get install qemu-system-x86)"
[ -n "$KERNEL" ] || KERNEL=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1)
[ -n "$KERNEL" ] && [ -r "$KERNEL" ] || fail "no kernel ${KERNEL:-in /boot} (apt-get install linux-image-amd64)"
WORK=$(mktemp -d /var/tmp/nearlocal-vm.XXXXXX)
# the interpreter the guest runs: the checkout's .venv (as the README sets it up), else a venv
# made for this check in the work folder (removed with it)
PY=${NEARLOCAL_VM_PYTHON:-$REPO/.venv/bin/python}
if [ ! -x "$PY" ]; then
  # [mpi]: mpiexec beside the interpreter, for the RDMA stage's two ranks
  python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q -e "$REPO[mpi]" >/dev/null 2>&1 \
    || fail "could not make a venv with nearlocal for the guest"
  PY=$WORK/venv/bin/python
fi
if [ "$INSTALL" = 1 ]; then
  "$PY" -c "import virtme_ng" 2>/dev/null || "$PY" -m pip install -q virtme-ng >/dev/null 2>&1 \
    || fail "could not install virtme-ng from PyPI"
fi
stage "install"
KVER=${KERNEL#/boot/vmlinuz-}
# the pool-module stage builds kmod/nearlocal_pool in the guest against this kernel's headers
if [ "$INSTALL" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -d "/lib/modules/$KVER/build" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "linux-headers-$KVER" make gcc) >/dev/null 2>&1 || echo "vm_check: linux-headers-$KVER could not be installed from Debian"
fi
[ -d "/lib/modules/$KVER/kernel/drivers/cxl" ] || fail "kernel $KVER has no CXL modules in /lib/modules/$KVER"
VNG=$(dirname "$PY")/vng
[ -x "$VNG" ] || VNG=$(command -v vng || true)
[ -n "$VNG" ] || fail "virtme-ng (vng) is missing: pip install virtme-ng"
export PATH="$(dirname "$VNG"):$PATH"  # vng runs its virtme-run from there
command -v ndctl >/dev/null && command -v cxl >/dev/null || fail "ndctl / cxl are missing (apt-get install ndctl)"
command -v mke2fs >/dev/null || fail "mke2fs is missing (apt-get install e2fsprogs)"


# --- pack the interpreter, the venv and the checkout: Python over 9p is far too slow ---------
IMAGE="$WORK/nearlocal.img"
mkdir -p "$WORK/out"
"$PY" "$REPO/scripts/vm_pack.py" "$REPO" "$WORK/stage" "$WORK/out/mounts" || fail "packing the image failed"
SIZE_MB=$(( $(du -sm "$WORK/stage" | cut -f1) * 12 / 10 + 64 ))
mke2fs -q -t ext4 -O ^has_journal -L nearlocal -d "$WORK/stage" "$IMAGE" "${SIZE_MB}M" >/dev/null \
  || fail "mke2fs could not build the image"
rm -rf "$WORK/stage"
stage "pack image (${SIZE_MB} MiB)"

# --- the guest's devices: backing files in $WORK (removed on exit) ---------------------------
truncate -s 256M "$WORK/nvdimm0" "$WORK/cxl-mem0"
truncate -s 1M "$WORK/ivshmem0"
truncate -s 256M "$WORK/cxl-lsa0"
mkdir -p "$WORK/out"
QEMU_OPTS=(
  -machine nvdimm=on,cxl=on -m 1536M,slots=2,maxmem=4G
  -object memory-backend-ram,id=m0,size=1G -object memory-backend-ram,id=m1,size=512M
  -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,memdev=m1
  -object "memory-backend-file,id=nv0,share=on,mem-path=$WORK/nvdimm0,size=256M,align=2M"
  -device nvdimm,id=nvdimm0,memdev=nv0  # no label area: one raw namespace, reconfigured as devdax
  -device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
  -device cxl-rp,port=0,bus=cxl.1,id=cxl_rp0,chassis=0,slot=2
  -object "memory-backend-file,id=cxlmem0,share=on,mem-path=$WORK/cxl-mem0,size=256M"
  -object "memory-backend-file,id=cxllsa0,share=on,mem-path=$WORK/cxl-lsa0,size=256M"
  -device cxl-type3,bus=cxl_rp0,memdev=cxlmem0,lsa=cxllsa0,id=cxl-pmem0
  -M cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G
  -object "memory-backend-file,id=shm0,share=on,mem-path=$WORK/ivshmem0,size=1M"
  -device ivshmem-plain,memdev=shm0,bus=pcie.0,addr=0xb
  -drive "file=$IMAGE,if=none,id=nlimg,format=raw,readonly=on"
  -device virtio-blk-pci,drive=nlimg,bus=pcie.0,serial=nearlocal
)
# the later guests' image (their extra devices need no bus named)
IMAGE_OPTS=(
  -drive "file=$IMAGE,if=none,id=nlimg,format=raw,readonly=on"
  -device virtio-blk-pci,drive=nlimg,serial=nearlocal
)
pool_opts() {  # FILE SIZE MEMORY MAXMEM: GUEST_OPTS for a guest with MEMORY of RAM whose nvdimm
  # is the host file FILE (SIZE of it; two guests' QEMUs can map one), and the image
  GUEST_OPTS=(
    -machine nvdimm=on -m "$3,slots=2,maxmem=$4"
    -object "memory-backend-file,id=pool,share=on,mem-path=$1,size=$2,align=2M"
    -device nvdimm,id=nvdimm0,memdev=pool
    "${IMAGE_OPTS[@]}"
  )
}
stage "devices"

# --- boot and run; the guest writes $WORK/out/booted first, then its results ----------------
start_guest() {  # NAME CPUS MEMORY COMMAND; QEMU options from GUEST_OPTS; its rwdir is $WORK/NAME
  local name=$1 cpus=$2 memory=$3 command=$4
  mkdir -p "$WORK/$name/scripts"
  # the guest reads its script before the image is mounted, through the host's root over 9p;
  # a checkout under /tmp or /var/tmp is not there (the guest's own tmpfs): run a copy from the
  # guest's rwdir
  cp "$REPO/scripts/vm_lib.sh" "$REPO"/scripts/vm_*guest.sh "$WORK/$name/scripts/"
  command=${command//"$REPO/scripts/"/"$WORK/$name/scripts/"}
  (cd "$WORK" && exec timeout -k 10 "$GUEST_LIMIT" "$VNG" -r "$KERNEL" --qemu "$(command -v "$QEMU")" --force-9p --disable-kvm \
    --disable-microvm --cpus "$cpus" --memory "$memory" --rwdir "$WORK/$name" \
    --append="iomem=relaxed" --qemu-opts="${GUEST_OPTS[*]}" \
    --exec "$command" 2>&1 | cat >"$WORK/$name.log") &
  RUNNER=$!
  QEMU_PIDS+=("$RUNNER")
}
await_file() {  # FILE LIMIT_S RUNNER WHAT: wait for FILE while that guest runs, else fail naming WHAT
  local file=$1 limit=$2 runner=$3 what=$4 waited=0
  while [ ! -e "$file" ]; do
    kill -0 "$runner" 2>/dev/null || { tail -5 "${file%/*}.log" >&2; fail "$what: the guest exited first (its log: ${file%/*}.log, tail above)"; }
    [ "$waited" -ge "$limit" ] && fail "$what: not within $limit s"
    sleep 1; waited=$((waited + 1))
  done
}
follow_guest() {  # DIR LABEL: relay the guest's finished stages while it runs, then wait for it
  local dir=$1 label=$2
  while kill -0 "$RUNNER" 2>/dev/null; do
    sleep 1
    relay_stages "$dir" "$label"
  done
  wait "$RUNNER"
  relay_stages "$dir" "$label"
}
hand_over() {  # NAME WARM: the guest folder $WORK/NAME with the image's mount table and, where
  # WARM is 1, the kernels the main guest compiled (run without it, developing a later stage:
  # NEARLOCAL_VM_NUMBA_CACHE, a numba-cache.tar a guest left)
  local name=$1 warm=$2
  mkdir -p "$WORK/$name"
  cp "$WORK/out/mounts" "$WORK/$name/mounts"
  [ "$warm" = 1 ] || return 0
  if [ -e "$WORK/out/numba-cache.tar" ]; then cp "$WORK/out/numba-cache.tar" "$WORK/$name/"
  elif [ -n "${NEARLOCAL_VM_NUMBA_CACHE:-}" ]; then cp "$NEARLOCAL_VM_NUMBA_CACHE" "$WORK/$name/numba-cache.tar"
  fi
  return 0
}
guest_stage() {  # NAME CPUS MEMORY LABEL WARM CHECK...: one guest running scripts/vm_NAME_guest.sh
  # in its folder $WORK/NAME (with the main guest's numba cache when WARM is 1), its stages
  # relayed under LABEL; then the CHECK command, whose exit status is left in STAGE_RC
  local name=$1 cpus=$2 memory=$3 label=$4 warm=$5
  shift 5
  hand_over "$name" "$warm"
  start_guest "$name" "$cpus" "$memory" "bash $REPO/scripts/vm_${name}_guest.sh $WORK/$name $WORK/$name/mounts"
  await_file "$WORK/$name/booted" "$BOOT_LIMIT" "$RUNNER" "the $label's boot"
  stage "$label: boot"
  follow_guest "$WORK/$name" "$label: "
  [ -e "$WORK/$name/done" ] || { tail -20 "$WORK/$name.log" >&2; fail "the $label stopped before it finished (limit $GUEST_LIMIT s); its last lines are above"; }
  "$@"
  STAGE_RC=$?
  stage "$label: facts checked"
}
judge() {  # WHAT FILE...: after a stage's facts were checked (their exit status in STAGE_RC):
  # where one failed, the last lines of FILE...; rc keeps the first failure
  [ "$STAGE_RC" = 0 ] || { echo "vm_check: $1, last lines:" >&2; shift; tail -n 20 "$@" >&2; }
  [ "$rc" = 0 ] && rc=$STAGE_RC
  return 0
}
wanted() {  # LABEL VARIABLE [MISSING]: whether a stage runs: not where VARIABLE (NEARLOCAL_VM_*)
  # is 0, nor where the function MISSING names what this host lacks; one line says which
  local label=$1 variable=$2 missing=${3:-} why
  if [ "${!variable:-1}" != 1 ]; then
    echo "vm_check: $label: skipped ($variable=0)"
    return 1
  fi
  if [ -n "$missing" ] && why=$("$missing") && [ -n "$why" ]; then
    echo "vm_check: $label: skipped: $why"
    return 1
  fi
  return 0
}
GUEST_OPTS=("${QEMU_OPTS[@]}")
GUEST_LOG="$WORK/out.log"
rc=0
if [ "${NEARLOCAL_VM_MAIN:-1}" = 1 ]; then  # 0: only the later stages (developing them)
start_guest out 2 1536M "bash $REPO/scripts/vm_guest.sh $WORK/out $WORK/out/mounts"
await_file "$WORK/out/booted" "$BOOT_LIMIT" "$RUNNER" "the guest's boot (NEARLOCAL_VM_BOOT_S)"
stage "boot"
follow_guest "$WORK/out" "guest: "
[ -e "$WORK/out/done" ] || { tail -20 "$GUEST_LOG" >&2; fail "the guest stopped before it finished (limit $GUEST_LIMIT s, NEARLOCAL_VM_LIMIT_S); its last lines are above"; }
if [ -n "$TREES" ] && [ -e "$WORK/out/trees.tar" ]; then
  rm -rf "$TREES" && mkdir -p "$TREES" && tar -C "$TREES" --strip-components=1 -xf "$WORK/out/trees.tar"
fi
"$PY" "$REPO/scripts/vm_facts.py" "$WORK/out"
STAGE_RC=$?
judge "the guest's log" "$GUEST_LOG"
stage "facts checked"
fi

# --- another CPU: a model lacking AVX2, AVX-512, clflushopt, clwb and movdir64b runs one small
# case of every CPU method (scripts/vm_cpu.py); each is measured or skipped naming the flag its
# CPU lacks, and no kernel aborts the process (LLVM does when it cannot select an instruction)
CPU_MODEL=${NEARLOCAL_VM_CPU_MODEL:-Westmere,+rdtscp}
if wanted "another CPU" NEARLOCAL_VM_CPU; then
  # the storage methods' file: on a small ext4 disk (the guest's /tmp cannot do O_DIRECT)
  truncate -s 64M "$WORK/cpu-storage.img"
  mke2fs -q -t ext4 -L nlstorage "$WORK/cpu-storage.img" >/dev/null || fail "mke2fs could not build the cpu guest's disk"
  GUEST_OPTS=(
    -cpu "$CPU_MODEL"  # after virtme-ng's own -cpu max: QEMU takes the last
    "${IMAGE_OPTS[@]}"
    -drive "file=$WORK/cpu-storage.img,if=none,id=nlstore,format=raw"
    -device virtio-blk-pci,drive=nlstore,serial=nlstorage
  )
  echo "vm_check: cpu guest: -cpu $CPU_MODEL"
  guest_stage cpu 2 1G "cpu guest" 0 "$PY" "$REPO/scripts/vm_cpu.py" check "$WORK/cpu"
  judge "cpu guest's run" "$WORK/cpu/cpu.err"
fi
# --- the pool module (issue 58; scripts/vm_poolmod_guest.sh, facts: scripts/vm_poolmod.py): the
# guest builds kmod/nearlocal_pool against its kernel's headers, loads it on its nvdimm's range
# once device-dax let it go, maps the pool uc and wc, shows the refusals and leaves nothing behind
poolmod_missing() {
  [ -d "/lib/modules/$KVER/build" ] || { echo "kernel $KVER's headers are missing (apt-get install linux-headers-$KVER)"; return; }
  command -v make >/dev/null && command -v gcc >/dev/null || { echo "make / gcc are missing (apt-get install make gcc)"; return; }
}
if wanted "pool module" NEARLOCAL_VM_POOLMOD poolmod_missing; then
  truncate -s 256M "$WORK/poolmod-nvdimm"
  pool_opts "$WORK/poolmod-nvdimm" 256M 1G 3G
  guest_stage poolmod 2 1G "pool-module guest" 1 "$PY" "$REPO/scripts/vm_poolmod.py" "$WORK/poolmod"
  judge "pool-module guest's run" "$WORK/poolmod/run.err" "$WORK/poolmod.log"
fi
# --- RDMA: one guest, soft-RoCE (rdma_rxe) on a dummy netdev, `mpiexec -n 2 nearlocal run --suite
# rdma` inside it (loopback RDMA between the two ranks) and compare_perftest.sh beside it
# (scripts/vm_rdma_guest.sh, facts: scripts/vm_rdma.py). Interfaces, WR splitting, the protocol;
# never speed (TCG). Skipped, with the reason, where its parts are missing.
rdma_missing() {
  [ -e "/lib/modules/$KVER/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] \
    || ls /lib/modules/"$KVER"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1 \
    || { echo "kernel $KVER has no rdma_rxe module"; return; }
  local tool
  for tool in rdma ibv_devinfo ib_write_lat; do
    command -v $tool >/dev/null || { echo "$tool is missing (apt-get install rdma-core ibverbs-utils perftest iproute2)"; return; }
  done
  ls /usr/lib/*/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || { echo "the rxe provider is missing (apt-get install ibverbs-providers)"; return; }
  # the guest's PATH has the interpreter's folder, not the host's shims: mpiexec must be there
  [ -x "$(dirname "$PY")/mpiexec" ] || { echo "mpiexec is missing beside $PY (pip install 'nearlocal[mpi]' into it)"; return; }
}
if wanted RDMA NEARLOCAL_VM_RDMA rdma_missing; then
  GUEST_OPTS=("${IMAGE_OPTS[@]}")
  guest_stage rdma 2 1536M "rdma guest" 1 "$PY" "$REPO/scripts/vm_rdma.py" "$WORK/rdma"
  judge "RDMA guest's run" "$WORK/rdma/run.err" "$WORK/rdma/run.out"
fi
# --- two hosts (scripts/vm_hosts_guest.sh, facts: scripts/vm_hosts.py): two guests, one pool
# (a host file as an nvdimm, device-dax), one network between their QEMUs (a socket netdev on
# 127.0.0.1: nothing else is reached), each its hostname, address, sshd and soft-RoCE on its NIC.
# Guest A launches `mpiexec --hostfile` over ssh as a cluster does: bad input across the hosts,
# then `nearlocal run --suite pool-vs-rdma` (pool rows, rack rows, RDMA rows between the two
# kernels: one run), then rack-host-loss with B's whole QEMU killed by the host.
hosts_missing() {
  local why
  why=$(rdma_missing) && [ -n "$why" ] && { echo "$why"; return; }
  [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null \
    || { echo "sshd / ssh are missing (apt-get install openssh-server openssh-client)"; return; }
}
if wanted "two hosts" NEARLOCAL_VM_HOSTS hosts_missing; then
  truncate -s 512M "$WORK/rackpool"
  mkdir -p "$WORK/hosts-ssh"
  ssh-keygen -q -t ed25519 -N '' -C nearlocal-rig -f "$WORK/hosts-ssh/id" \
    && ssh-keygen -q -t ed25519 -N '' -C nearlocal-rig -f "$WORK/hosts-ssh/host" \
    || fail "ssh-keygen could not make the two hosts' keys"
  for guest in hosts-a hosts-b; do  # the guest sees its own folder, not the host's $WORK
    hand_over "$guest" 1
    cp -r "$WORK/hosts-ssh" "$WORK/$guest/ssh"
  done
  # Slurm, where Debian's packages are installed (or can be): slurmctld on A, slurmd on both, the
  # same hostnames; auth/none: two guests on one host's loopback link, no munge key to share
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v salloc >/dev/null; then
    for guest in hosts-a hosts-b; do
      cat >"$WORK/$guest/slurm.conf" <<EOF
ClusterName=nearlocal-rig
SlurmctldHost=nlhost-a(${HOST_ADDRESS[a]})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
StateSaveLocation=/tmp/nl-slurm/state
SlurmdSpoolDir=/tmp/nl-slurm/spool
SlurmctldPidFile=/tmp/nl-slurm/slurmctld.pid
SlurmdPidFile=/tmp/nl-slurm/slurmd.pid
SlurmctldLogFile=/tmp/nl-slurm/slurmctld.log
SlurmdLogFile=/tmp/nl-slurm/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=nlhost-a NodeAddr=${HOST_ADDRESS[a]} CPUs=2 State=UNKNOWN
NodeName=nlhost-b NodeAddr=${HOST_ADDRESS[b]} CPUs=2 State=UNKNOWN
PartitionName=rack Nodes=nlhost-a,nlhost-b Default=YES MaxTime=INFINITE State=UP
EOF
    done
  else
    echo "vm_check: two hosts: Slurm: skipped: slurmctld / slurmd / salloc are not installed (apt-get install slurmctld slurmd slurm-client)"
  fi
  PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  host_opts() {  # ROLE NETDEV: one guest of the two (a or b): the pool, the image, its NIC on the link
    pool_opts "$WORK/rackpool" 512M 1536M 4G
    GUEST_OPTS+=(-netdev "socket,id=rack,$2" -device "virtio-net-pci,netdev=rack,mac=${HOST_MAC[$1]}")
  }
  HOSTS_LIMIT=${NEARLOCAL_VM_HOSTS_S:-2400}
  host_opts a "listen=127.0.0.1:$PORT"
  start_guest hosts-a 2 1536M "bash $REPO/scripts/vm_hosts_guest.sh a $WORK/hosts-a $WORK/hosts-a/mounts $WORK/hosts-a/ssh"
  HOST_A=$RUNNER
  await_file "$WORK/hosts-a/namespace-ready" "$BOOT_LIMIT" "$HOST_A" "guest A (nlhost-a) making the pool device-dax"
  stage "two hosts: A booted, pool devdax"
  host_opts b "connect=127.0.0.1:$PORT"
  start_guest hosts-b 2 1536M "bash $REPO/scripts/vm_hosts_guest.sh b $WORK/hosts-b $WORK/hosts-b/mounts $WORK/hosts-b/ssh"
  HOST_B=$RUNNER
  await_file "$WORK/hosts-b/booted" "$BOOT_LIMIT" "$HOST_B" "guest B's (nlhost-b) boot"
  stage "two hosts: B booted"
  waited=0
  while kill -0 "$HOST_A" 2>/dev/null; do  # relay the guests' signals, kill B when A asks
    sleep 1; waited=$((waited + 1))
    for signal in "$WORK"/hosts-a/to-b-* "$WORK"/hosts-b/to-a-*; do
      [ -e "$signal" ] || continue
      name=${signal##*/to-?-}
      case $signal in */hosts-a/*) mv "$signal" "$WORK/hosts-b/$name" ;; *) mv "$signal" "$WORK/hosts-a/$name" ;; esac
    done
    for guest in hosts-a hosts-b; do
      relay_stages "$WORK/$guest" "two hosts: ${guest#hosts-}: "
    done
    if [ -e "$WORK/hosts-a/kill-b" ] && [ ! -e "$WORK/hosts-b/killed.json" ]; then
      qemu_b=$(pgrep -f -- "^$(command -v "$QEMU") .*$WORK/hosts-b" | head -1)
      [ -n "$qemu_b" ] && kill -KILL "$qemu_b"
      echo "{\"pid\": ${qemu_b:-null}, \"at_s\": $waited}" >"$WORK/hosts-b/killed.json"
    fi
    [ "$waited" -ge "$HOSTS_LIMIT" ] && { kill -KILL "$HOST_A" 2>/dev/null; break; }
  done
  wait "$HOST_A" 2>/dev/null
  : >"$WORK/hosts-b/stop"  # B ends on its own where it was not killed
  for _ in $(seq 60); do kill -0 "$HOST_B" 2>/dev/null || break; sleep 1; done
  kill -KILL "$HOST_B" 2>/dev/null; wait "$HOST_B" 2>/dev/null
  [ -e "$WORK/hosts-a/done" ] || { tail -20 "$WORK/hosts-a.log" >&2; fail "guest A (nlhost-a) stopped before it finished (limit $HOSTS_LIMIT s, NEARLOCAL_VM_HOSTS_S); its last lines are above"; }
  "$PY" "$REPO/scripts/vm_hosts.py" "$WORK/hosts-a" "$WORK/hosts-b"
  STAGE_RC=$?
  judge "guest A's run" "$WORK/hosts-a/run.err"
  stage "two hosts: facts checked"
fi
wanted "two guests" NEARLOCAL_VM_PAIR || exit $rc

# --- two guests on one host file as device-dax (scripts/vm_pair.py): A writes records, B reads
# them; A's QEMU is killed by its PID while it writes; B must judge the owner lost, tear nothing
truncate -s 256M "$WORK/pool0"
pool_opts "$WORK/pool0" 256M 1G 3G
PAIR_LIMIT=${NEARLOCAL_VM_PAIR_S:-420}
hand_over pair-a 1  # the mount table, and the kernels the first guest compiled
hand_over pair-b 1
start_guest pair-a 1 1G "bash $REPO/scripts/vm_pair_guest.sh writer $WORK/pair-a $WORK/pair-a/mounts"
WRITER=$RUNNER
await_file "$WORK/pair-a/namespace-ready" "$PAIR_LIMIT" "$WRITER" "guest A making its pool device-dax"
stage "two guests: A's devdax"
start_guest pair-b 1 1G "bash $REPO/scripts/vm_pair_guest.sh reader $WORK/pair-b $WORK/pair-b/mounts"
READER=$RUNNER
await_file "$WORK/pair-b/reads-ok" "$PAIR_LIMIT" "$READER" "guest B reading A's records"
kill -0 "$WRITER" 2>/dev/null || fail "guest A stopped before it was killed (its log: $WORK/pair-a.log)"
stage "two guests: B reads A's"
sleep 3  # B reads while A writes
qemu_a=$(pgrep -f -- "^$(command -v "$QEMU") .*$WORK/pair-a" | head -1)  # QEMU itself, not vng
[ -n "$qemu_a" ] || fail "guest A's QEMU process is not found"
reads_before=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["reads_ok"])' "$WORK/pair-b/reader.json")
kill -KILL "$qemu_a"
echo "{\"pid\": $qemu_a, \"reads_ok_before\": $reads_before}" >"$WORK/pair-a/killed.json"
wait "$WRITER" 2>/dev/null
await_file "$WORK/pair-b/done" "$PAIR_LIMIT" "$READER" "guest B after A's loss"
wait "$READER" 2>/dev/null
stage "two guests: A killed, B read on"
"$PY" "$REPO/scripts/vm_pair.py" check "$WORK/pair-a" "$WORK/pair-b"
STAGE_RC=$?
judge "guest B's log" "$WORK/pair-b.log"
stage "two guests: facts checked"
exit $rc
