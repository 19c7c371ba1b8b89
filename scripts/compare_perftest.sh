#!/usr/bin/env bash
# nearlocal's rdma-write / rdma-read rows beside perftest (Debian's package: ib_write_lat,
# ib_read_lat, ib_write_bw) for the same size on the same device; prints each figure and the
# ratio nearlocal / perftest. The two time different intervals, named in docs/rdma.md:
#   rdma-write median  vs ib_write_lat t_typical: nearlocal times post -> the WR's completion
#       (the responder's ACK is back: a round trip); ib_write_lat reports half a ping-pong of
#       writes (one way). Ratio ~2 is the like-for-like expectation.
#   rdma-read median   vs ib_read_lat t_typical: both a read's round trip.
#   rdma-write data_movement_ns vs ib_write_bw: size / perftest's average bandwidth (MB/s, 2^20
#       bytes), both a transfer's time with the pipeline full.
# Loopback by default (server and client on this host: soft-RoCE in the rig); SERVER=host runs
# each tool's client against a server already started there (two hosts).
#
#   RESULTS=results/RUN DEVICE=mlx5_0 SIZES="16384" ITERS=1000 bash scripts/compare_perftest.sh
set -uo pipefail
source "$(dirname "$0")/venv.sh" && nearlocal_on_path  # the checkout's .venv, when there
RESULTS=${RESULTS:?RESULTS=<a stored run with rdma-write / rdma-read rows>}
DEVICE=${DEVICE:-}
SIZES=${SIZES:-16384}
ITERS=${ITERS:-1000}
SERVER=${SERVER:-}
PY=${PY:-python3}
for tool in ib_write_lat ib_read_lat ib_write_bw; do
  command -v $tool >/dev/null || { echo "compare_perftest: $tool is missing (apt-get install perftest)" >&2; exit 2; }
done
if [ ! -e "$RESULTS/run.json" ]; then  # a store folder: its newest run
  RESULTS=$(ls -d "$RESULTS"/*/ 2>/dev/null | while read -r d; do [ -e "$d/run.json" ] && echo "$d"; done | sort | tail -1)
  [ -n "$RESULTS" ] || { echo "compare_perftest: no stored run in ${RESULTS:-the folder given}" >&2; exit 2; }
fi
[ -n "$DEVICE" ] || DEVICE=$(ls /sys/class/infiniband 2>/dev/null | head -1)
[ -n "$DEVICE" ] || { echo "compare_perftest: no RDMA device in /sys/class/infiniband" >&2; exit 2; }
GID=""  # a RoCE device needs a GID index: the first RoCE v2 one (what nearlocal's QPs use)
for t in /sys/class/infiniband/$DEVICE/ports/1/gid_attrs/types/*; do
  [ "$(cat "$t" 2>/dev/null)" = "RoCE v2" ] && { GID=${t##*/}; break; }
done
run_tool() {  # TOOL SIZE: the tool's result line (the row under its header)
  local tool=$1 size=$2 args=(-d "$DEVICE" -s "$size" -n "$ITERS" -F)
  [ -n "$GID" ] && args+=(-x "$GID")
  if [ -n "$SERVER" ]; then
    $tool "${args[@]}" "$SERVER" 2>&1
    return
  fi
  $tool "${args[@]}" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  $tool "${args[@]}" 127.0.0.1 2>&1
  wait $server 2>/dev/null
}
field() {  # OUTPUT COLUMN: the column of the line starting with the size
  awk -v size="$2" -v col="$3" '$1 == size && NF >= col {print $col; exit}' <<<"$1"
}
for size in $SIZES; do
  wlat=$(run_tool ib_write_lat "$size"); rlat=$(run_tool ib_read_lat "$size")
  wbw=$(run_tool ib_write_bw "$size")
  w_typ=$(field "$wlat" "$size" 5); r_typ=$(field "$rlat" "$size" 5); bw=$(field "$wbw" "$size" 4)
  echo "perftest on $DEVICE (gid index ${GID:-default}), $size B, $ITERS iterations:"
  echo "  ib_write_lat t_typical ${w_typ:-none} us; ib_read_lat t_typical ${r_typ:-none} us; ib_write_bw average ${bw:-none} MB/s"
  [ -n "$w_typ" ] && [ -n "$r_typ" ] && [ -n "$bw" ] || { echo "$wlat" "$rlat" "$wbw" | tail -n 30 >&2; }
  "$PY" - "$RESULTS" "$size" "$DEVICE" "${w_typ:-nan}" "${r_typ:-nan}" "${bw:-nan}" <<'PYEOF'
import math, sys
from nearlocal.store import load

path, size, device, w_typ, r_typ, bw = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(float, sys.argv[4:])
run = load(path)
rows = run.cases[(run.cases["status"] == "ok") & (run.cases["bytes_moved"] == size)
                 & run.cases["method"].isin(["rdma-write", "rdma-read"])]
def row(method):
    got = rows[rows["method"] == method]
    got = got[~got["case_id"].str.contains("movers=")]  # one transfer alone, as perftest's
    batched = got[~got["case_id"].str.contains("sge=one")]  # batched: the default, no param
    return (batched if len(batched) else got).iloc[0] if len(got) else None
def ratio(a, b):
    return f"{a / b:.2f}" if b and not math.isnan(a) and not math.isnan(b) else "-"
write, read = row("rdma-write"), row("rdma-read")
wire = size / (bw * 1048576) * 1e6 if bw == bw and bw > 0 else float("nan")
nl = lambda r, col: float(r[col]) / 1000 if r is not None and r.get(col) == r.get(col) else float("nan")
print(f"device {device}, {size} B")
print(f"{'figure':44} {'nearlocal us':>13} {'perftest us':>12} {'ratio':>6}")
for name, mine, theirs in (
        ("rdma-write median vs ib_write_lat t_typical", nl(write, "median_ns"), w_typ),
        ("rdma-read median vs ib_read_lat t_typical", nl(read, "median_ns"), r_typ),
        ("rdma-write data movement vs ib_write_bw", nl(write, "data_movement_ns"), wire)):
    print(f"{name:44} {mine:13.2f} {theirs:12.2f} {ratio(mine, theirs):>6}")
PYEOF
done
