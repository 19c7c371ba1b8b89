#!/usr/bin/env bash
# Runs inside each guest of the VM rig's two-host stage (scripts/vm_check.sh, docs/vm-rig.md step
# 8): two kernels that share one pool (the same host file as an nvdimm, made device-dax by A) and
# one network (a QEMU socket netdev between the two QEMUs: local addresses only). Each guest takes
# its hostname and address, starts sshd (the MPI launcher's way in) and soft-RoCE on its NIC.
# Guest A is the launch node: it runs every mpiexec with a hostfile naming both guests, as a
# cluster does. The host relays the guests' signals (a file `to-a-*` / `to-b-*` in one guest's
# folder is moved into the other's) and kills B's QEMU when A asks (`kill-b`).
#
#   vm_hosts_guest.sh ROLE OUT MOUNTS SSH     ROLE a or b; SSH: the keys the host made
set -u
ROLE=$1
OUT=$2
MOUNTS=$3
SSH=$4
source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"  # HOST_ADDRESS, HOST_MAC
say() { : >"$OUT/to-$1-$2"; }  # a signal to the other guest (the host moves it there)
heard() { wait_for "$1" "$OUT/$2" || { log "no '$2' from the other guest within $1 s"; exit 1; }; }
guest_up || exit 1

# --- who this guest is: hostname, address (the NIC by its MAC), /etc/hosts -------------------
ADDRESS=${HOST_ADDRESS[$ROLE]}
hostname "nlhost-$ROLE"
modprobe virtio_net 2>/dev/null
nic=""
for _ in $(seq 50); do
  for dev in /sys/class/net/*; do
    [ "$(cat "$dev/address" 2>/dev/null)" = "${HOST_MAC[$ROLE]}" ] && nic=${dev##*/}
  done
  [ -n "$nic" ] && break
  sleep 0.2
done
[ -n "$nic" ] || { log "no NIC with MAC ${HOST_MAC[$ROLE]}"; exit 1; }
ip link set lo up
ip link set "$nic" mtu 9000  # soft-RoCE's active MTU follows the netdev's: 4096 needs > 4096
ip addr add "$ADDRESS/24" dev "$nic" && ip link set "$nic" up
printf '127.0.0.1 localhost\n%s nlhost-a\n%s nlhost-b\n' "${HOST_ADDRESS[a]}" "${HOST_ADDRESS[b]}" >/tmp/nl-hosts
mount --bind /tmp/nl-hosts /etc/hosts  # the root is the host's, read-only
mark "nlhost-$ROLE on $nic $ADDRESS"

# --- sshd: how mpiexec (PRRTE's ssh agent) starts its daemon on the other guest ---------------
mkdir -p /tmp/nl-ssh /run/sshd
cp "$SSH"/id "$SSH"/id.pub "$SSH"/host "$SSH"/host.pub /tmp/nl-ssh/
chmod 600 /tmp/nl-ssh/id /tmp/nl-ssh/host
cp /tmp/nl-ssh/id.pub /tmp/nl-ssh/authorized_keys
cat >/tmp/nl-ssh/sshd_config <<EOF
ListenAddress $ADDRESS
HostKey /tmp/nl-ssh/host
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile /tmp/nl-ssh/authorized_keys
StrictModes no
UsePAM no
PidFile /tmp/nl-ssh/sshd.pid
EOF
cat >/tmp/nl-ssh/config <<EOF
Host *
  IdentityFile /tmp/nl-ssh/id
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 10
  BatchMode yes
EOF
# root's login by key only: the guest's shadow entry for root is locked (sshd without PAM
# refuses a locked account), so root gets one that holds no password ("*")
sed 's/^root:[^:]*:/root:*:/' /etc/shadow >/tmp/nl-shadow 2>/dev/null || echo 'root:*:19000:0:99999:7:::' >/tmp/nl-shadow
grep -q '^root:' /tmp/nl-shadow || echo 'root:*:19000:0:99999:7:::' >>/tmp/nl-shadow
chmod 600 /tmp/nl-shadow && mount --bind /tmp/nl-shadow /etc/shadow
# the host's root's ~/.bashrc (read by bash for ssh's commands) is the host's own set-up
: >/tmp/nl-empty && [ -e /root/.bashrc ] && mount --bind /tmp/nl-empty /root/.bashrc
/usr/sbin/sshd -f /tmp/nl-ssh/sshd_config -E "$OUT/sshd.log" || { log "sshd did not start"; exit 1; }

# --- the pool: A makes the shared nvdimm device-dax (its info block lands in the shared file),
# B boots after that and finds the same device-dax -------------------------------------------
nvdimm_modules
if [ "$ROLE" = a ]; then
  share_pool || exit 1
fi
find_pool || exit 1
echo "$DAX" >"$OUT/dax"
modprobe rdma_rxe 2>"$OUT/modprobe.err"
mark "sshd, $DAX"

rxe() {  # soft-RoCE on this guest's NIC: RC queue pairs between the two guests' kernels
  rdma link add rxe0 type rxe netdev "$nic" 2>"$OUT/rdma-link.err" || return 1
  wait_for 30 "/sys/class/infiniband/rxe0/ports/1/gids/1" || return 1
  ibv_devinfo -v -d rxe0 >"$OUT/ibv_devinfo.txt" 2>&1
}

slurm_daemons() {  # where the host handed a slurm.conf: slurmctld on A, slurmd on both
  [ -e "$OUT/slurm.conf" ] || return 1
  mkdir -p /tmp/nl-slurm/state /tmp/nl-slurm/spool
  cp "$OUT/slurm.conf" /tmp/nl-slurm/slurm.conf
  export SLURM_CONF=/tmp/nl-slurm/slurm.conf
  # slurmd 22.05 sets up its cgroup plugin whatever the task plugin, and its cgroup/v2 wants
  # systemd: the guest gets cgroup v1 hierarchies, which it autodetects (a tmpfs root)
  mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
  for controller in cpuset memory freezer devices cpu,cpuacct pids; do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller" 2>>"$OUT/cgroup.err"
  done
  mkdir -p /sys/fs/cgroup/systemd  # it stats this one too
  mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd 2>>"$OUT/cgroup.err"
  # in the foreground (-D), in the background here: their logs land in OUT
  [ "$ROLE" = a ] && { slurmctld -D -f "$SLURM_CONF" >"$OUT/slurmctld.out" 2>&1 & }
  slurmd -D -f "$SLURM_CONF" >"$OUT/slurmd.out" 2>&1 &
  return 0
}

if [ "$ROLE" = b ]; then
  say a ready
  heard 900 add-rxe  # A checks a missing RDMA device on this host first
  rxe || { log "soft-RoCE on $nic failed: $(cat "$OUT/rdma-link.err")"; exit 1; }
  say a rxe-ready
  mark "soft-RoCE rxe0 on $nic"
  slurm_daemons && mark "slurmd"
  # until the host kills this QEMU (A's host-loss run) or A is done
  while [ ! -e "$OUT/stop" ]; do sleep 1; done
  guest_done
  exit 0
fi

# --- A: the launch node ----------------------------------------------------------------------
rxe || { log "soft-RoCE on $nic failed: $(cat "$OUT/rdma-link.err")"; exit 1; }
heard 900 ready
printf 'nlhost-a slots=1\nnlhost-b slots=1\n' >"$OUT/hostfile"
# mpiexec as an operator runs it: a hostfile, one rank per host, the ranks started over ssh
NL=$VENV/bin/nearlocal
# MPI's own messages over TCP (ob1): left to itself, Open MPI picks UCX where it finds an RDMA
# device, so with rxe0 on one host only (the bad-input job) the two ranks chose different
# transports and MPI_Init never returned; and the RDMA device under test carries no MPI traffic
MPI_TRANSPORT=(--mca pml ob1 --mca btl tcp,self,sm)
RUN=(run --budget 0.02 --processes 1 --quiet)
job() {  # NAME LIMIT_S HOSTFILE ARGS...: one mpiexec as an operator runs it (a hostfile, one
  # rank per host, the ranks started over ssh); its output, exit code and wall time in OUT
  local name=$1 limit=$2 hostfile=$3 start rc
  shift 3
  start=$(date +%s)
  timeout -k 10 "$limit" mpiexec --allow-run-as-root --hostfile "$hostfile" -n 2 --map-by node \
    --prtemca plm_ssh_agent "ssh -F /tmp/nl-ssh/config" "${MPI_TRANSPORT[@]}" \
    -x NUMBA_CACHE_DIR -x NEARLOCAL_WORKER_START_S "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  rc=$?
  echo "$rc $(($(date +%s) - start))" >"$OUT/$name.rc"
}
job hostnames 120 "$OUT/hostfile" hostname
mark "mpiexec --hostfile: $(tr '\n' ' ' <"$OUT/hostnames.out")"
job mpi4py 180 "$OUT/hostfile" "$PY" -c "from mpi4py import MPI; c = MPI.COMM_WORLD; \
print(MPI.Get_processor_name(), c.allgather(c.rank), len(c.bcast(bytes(1 << 20))), flush=True)"
mark "mpi4py across the hosts: rc $(cat "$OUT/mpi4py.rc"): $(tr '\n' ' ' <"$OUT/mpi4py.out")"

# bad input across hosts: one line from rank 0 naming the host, exit 2, no run stored
printf 'nlhost-a slots=1\nnlhost-c slots=1\n' >"$OUT/hostfile-unreachable"
echo "${HOST_ADDRESS[c]} nlhost-c" >>/tmp/nl-hosts  # on the link's subnet, no guest there
job bad-host 120 "$OUT/hostfile-unreachable" "$NL" "${RUN[@]}" \
  --suite rack --method rack-rpc-roundtrip --out "$OUT/bad-results"
truncate -s 1M /tmp/nl-pool-a-only.bin  # a file pool that exists on A, not on B
job bad-pool 300 "$OUT/hostfile" "$NL" "${RUN[@]}" --suite rack --method rack-rpc-roundtrip \
  --region file:/tmp/nl-pool-a-only.bin --allow-write --out "$OUT/bad-results"
job bad-rdma 300 "$OUT/hostfile" "$NL" "${RUN[@]}" --suite rdma --method rdma-write --size 16KiB \
  --out "$OUT/bad-results"
mark "bad input: unreachable host, pool on one host, RDMA device on one host"
say b add-rxe
heard 300 rxe-ready

# the run: the pool's transfers, the rack suite on the shared device-dax, RDMA between the hosts
job run 1500 "$OUT/hostfile" "$NL" "${RUN[@]}" --suite pool-vs-rdma \
  --region "devdax:$DAX" --allow-write --out "$OUT/results"
mark "mpiexec --hostfile nearlocal run --suite pool-vs-rdma"
"$NL" show "$(ls -d "$OUT"/results/*/ | tail -1)" >"$OUT/show.txt" 2>&1
"$NL" report "$(ls -d "$OUT"/results/*/ | tail -1)" --markdown "$OUT/report.md" >/dev/null 2>"$OUT/report.err"

# Slurm: the same launch under a workload manager, `salloc -N 2 mpiexec ...` (PRRTE starts its
# daemon on the other node through srun inside the allocation, not ssh)
if slurm_daemons; then
  for _ in $(seq 120); do
    [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c -E '^(idle|mixed|allocated)')" = 2 ] && break
    sleep 1
  done
  sinfo -N -l >"$OUT/sinfo.txt" 2>&1
  start=$(date +%s)
  # --immediate: a node that never came up is an error within 120 s, not a job left pending
  timeout -k 10 900 salloc --immediate=120 -N 2 -n 2 mpiexec --allow-run-as-root --map-by node "${MPI_TRANSPORT[@]}" \
    -x NUMBA_CACHE_DIR -x NEARLOCAL_WORKER_START_S "$NL" "${RUN[@]}" --suite pool-vs-rdma \
    --method memcpy,rack-handoff,rdma-write --size 16KiB --region "devdax:$DAX" --allow-write \
    --out "$OUT/slurm-results" >"$OUT/slurm.out" 2>"$OUT/slurm.err"
  echo "$? $(($(date +%s) - start))" >"$OUT/slurm.rc"
  mark "salloc -N 2 mpiexec nearlocal run (Slurm)"
fi

# host loss: B's whole kernel goes (the host kills its QEMU) while rack-host-loss runs
# Once B is gone, rank 0 stores the run and calls MPI_Abort; mpiexec then never returns (its
# daemon on B cannot be told to stop): it is ended 30 s after the run is stored
(sleep 1; while ! compgen -G "$OUT/loss-results/*" >/dev/null; do sleep 1; done
 sleep 20; : >"$OUT/kill-b"
 for _ in $(seq 600); do grep -q '^stored ' "$OUT/loss.out" 2>/dev/null && break; sleep 1; done
 sleep 30; pkill -f "mpiexec .*loss-results") &
job loss 900 "$OUT/hostfile" "$NL" "${RUN[@]}" --suite rack --method rack-host-loss --region "devdax:$DAX" \
  --allow-write --param kills=500 --param duration=60s --out "$OUT/loss-results"
mark "rack-host-loss with B's QEMU killed"
keep_numba_cache
guest_done
