#!/usr/bin/env bash
# Runs inside the VM rig's RDMA guest (scripts/vm_check.sh): soft-RoCE (rdma_rxe) on a dummy
# netdev with an address, then `nearlocal run --suite rdma` as an MPI job of 2 ranks in this one
# guest (rank 0 posts, rank 1 is the target / RPC server: loopback RDMA through rxe0; the suite
# holds 16 KiB rows by 2 queue pairs at once, movers=2, the contention fit's RDMA case), then
# a replay of a small trace window by RDMA reads (`nearlocal replay --method rdma-read`, 2 queue
# pairs) with replay_check.py's prediction from the suite's rdma-read rows, then
# scripts/compare_perftest.sh (ib_write_lat, ib_read_lat, ib_write_bw) beside its rows. Under TCG
# this proves the interfaces, the work-request splitting and the protocol, never speed. Writes its
# results to OUT; the host checks them (scripts/vm_rdma.py).
set -u
OUT=$1
MOUNTS=$2
source "$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh"
guest_up || exit 1
modprobe rdma_rxe 2>"$OUT/modprobe.err"
ip link add nlrdma0 type dummy && ip link set nlrdma0 mtu 9000 && ip addr add 10.77.0.1/24 dev nlrdma0 \
  && ip link set nlrdma0 up  # MTU 9000: rxe0's active MTU 4096, so the suite's mtu=4096 rows run
rdma link add rxe0 type rxe netdev nlrdma0 2>"$OUT/rdma-link.err"
wait_for 30 "/sys/class/infiniband/rxe0/ports/1/gids/1"
rdma link show >"$OUT/rdma-link.txt" 2>&1
ibv_devinfo -v -d rxe0 >"$OUT/ibv_devinfo.txt" 2>&1
mark "soft-RoCE rxe0"
nearlocal probe --json >"$OUT/probe.json" 2>"$OUT/probe.err"
mark "nearlocal probe --json"
timeout -k 5 "${NEARLOCAL_VM_RDMA_RUN_S:-600}" mpiexec --allow-run-as-root --oversubscribe -n 2 \
  nearlocal run --suite rdma --budget 0.02 --processes 1 --out "$OUT/results" --quiet \
  >"$OUT/run.out" 2>"$OUT/run.err"
echo $? >"$OUT/run.rc"
mark "mpiexec -n 2 nearlocal run --suite rdma"
# the RDMA replay: a small trace window (3 s from 600 s, 2 layers) read by 2 queue pairs out of
# rank 1's pool into rank 0's buffers, then predicted from the suite's rdma-read rows (the
# simulation's figures; never compared for speed: TCG)
timeout -k 5 "${NEARLOCAL_VM_RDMA_REPLAY_S:-300}" mpiexec --allow-run-as-root --oversubscribe -n 2 \
  nearlocal replay --method rdma-read --movers 2 --start 600 --seconds 3 --layers 0-1 \
  --trace "$REPO/nearlocal/data/traces/mooncake-conversation.jsonl" --out "$OUT/replay.json" \
  >"$OUT/replay.out" 2>"$OUT/replay.err"
echo $? >"$OUT/replay.rc"
RUN_DIR=$(dirname "$(ls -d "$OUT"/results/*/run.json 2>/dev/null | tail -1)")
timeout -k 5 120 "$PY" "$REPO/scripts/replay_check.py" --replay "$OUT/replay.json" \
  --run "$RUN_DIR" --method rdma-read --json >"$OUT/replay-check.json" 2>"$OUT/replay-check.err"
echo $? >"$OUT/replay-check.rc"
mark "mpiexec -n 2 nearlocal replay --method rdma-read"
RESULTS=$OUT/results DEVICE=rxe0 SIZES="16384" ITERS=200 timeout -k 5 300 \
  bash "$REPO/scripts/compare_perftest.sh" >"$OUT/perftest.txt" 2>"$OUT/perftest.err"
echo $? >"$OUT/perftest.rc"
mark "compare_perftest.sh"
guest_done
