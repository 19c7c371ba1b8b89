"""The report's "Rack" section, rack's own: a face of the family (it imports the report, so only
the report loads it, through the entry-point group nearlocal.report_sections). An MPI run's hosts
side by side, cross-host RPC beside B15, aggregate bandwidth (each host alone and while the others
load the pool: compared with nothing of the paper's, whose 1 TB/s is its switch box's stated total
for up to 16 servers, not a measurement), the handoff's publish -> usable, and the host-loss
figures. Built from the prepared frames of
report.rows; the figures were computed when the rows were made (each rack method's `rows`,
nearlocal/rack/)."""

from __future__ import annotations

import pandas as pd

from nearlocal.report.document import (
    Cell,
    Column,
    NoValue,
    RunInfo,
    Section,
    Stat,
    keyed_table,
)
from nearlocal.report.papers import figure, statement
from nearlocal.report.registry import register_frames_section
from nearlocal.report.rows import stat_of

RACK_PREFIX = "rack-"
RACK_RPC_ROUNDTRIP, RACK_RPC_THROUGHPUT = "rack-rpc-roundtrip", "rack-rpc-throughput"  # B15
RACK_HANDOFF, RACK_AGGREGATE = "rack-handoff", "rack-aggregate"
RACK_HOST_LOSS = "rack-host-loss"
RDMA_RPC = "rdma-rpc"  # the RDMA RC RPC between ranks 0 and 1, beside the pool's (B15)


def _info(row) -> dict:
    info = row.get("info")
    return info if isinstance(info, dict) else {}


def _mpi_rank(row) -> str:
    """The MPI rank that measured a row: the stored `rank` column (an MPI job's rows carry it;
    the region's pool class rank is `pool_rank`), "-" where there is none."""
    rank = row.get("rank")
    try:
        return str(int(rank))
    except (TypeError, ValueError):  # None, NaN: a row of no MPI job
        return "-"


def _what(row, params: dict) -> str:
    """The measurement's name; `params` are the row's effective ones (what the case ran with),
    so a method's protocol and queue depth show whether or not the case set them."""
    method = row["method"].removeprefix(RACK_PREFIX)
    detail = [row["pattern"]]
    if "protocol" in params:
        detail.append(str(params["protocol"]))
    if "qd" in params:
        detail.append(f"qd {params['qd']}")
    if "transport" in params:  # rdma-rpc: RDMA write + poll, or send/recv
        detail.append(str(params["transport"]))
    if str(params.get("mtu", "1024")) != "1024":
        detail.append(f"path MTU {params['mtu']}")
    if method == "aggregate":
        detail.append(row["access"])
    if params.get("recheck") == "off":
        detail.append("recheck off (negative control)")
    return f"{method} {' '.join(detail)}"


def section_rack(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    b15, switch = figure("B15"), statement("beluga-switch")
    rtt, mops = b15.value("64 B round trip"), b15.value("throughput at qd 128")
    rdma_rtt = b15.value("RDMA RC RPC round trip")
    ceiling = switch.value("aggregate bandwidth")
    section = Section(
        "rack", "Rack — hosts sharing one pool (an MPI job)",
        "One run across the ranks of an MPI job (docs/rack.md): cross-host RPC (client on rank "
        f"k, server on rank 0) beside B15's {rtt.text()} round trip and {mops.text()} at qd "
        f"128, and the RDMA RC RPC (rdma-rpc, server on rank 1) beside B15's {rdma_rtt.text()}; "
        "handoff from the writer's announce to every reader's acknowledgement (usable: "
        "less half the flag round trip); aggregate bandwidth of every rank at once beside "
        "each alone (no × paper: Beluga reports no measured aggregate; its switch box's "
        f"{ceiling.text()} for {switch.value('servers').text()} servers is a ceiling "
        f"{switch.provenance}); host loss: the writer killed mid-write.",
        [b15])
    if not any(("host" in df and df["host"].notna().any()) for df in frames):
        section.absent = ("No MPI run: launch `mpiexec -n N nearlocal run --suite rack` "
                          "(docs/rack.md).")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        rows = df[df["method"].str.startswith(RACK_PREFIX) | (df["method"] == RDMA_RPC)]
        for _, row in rows.iterrows():
            info = _info(row)
            params = row["effective"]
            stat = stat_of(row)
            key = (_what(row, params), _mpi_rank(row), str(row.get("host") or "-"))
            cells[key] = _cells(row, info, stat, rtt, mops, rdma_rtt)
        per_run.append(cells)
    section.table = keyed_table(
        [Column("measurement"), Column("rank"), Column("host")],
        [Column("median (p10–p90)", "time"), Column("usable / alone", "time"),
         Column("Mops", "mops"), Column("GB/s", "gbps"), Column("alone GB/s", "gbps"),
         Column("× paper", "ratio"), Column("note")], runs, per_run)
    section.table.collapse = False
    for df in frames:
        hosts = _hosts_line(df)
        if hosts:
            section.notes.append(hosts)
        pingpong = next((i.get("mpi_pingpong_us") for i in df["info"] if isinstance(i, dict)
                         and i.get("mpi_pingpong_us")), None)
        if pingpong:
            section.notes.append(f"MPI's own ping-pong, rank 0 <-> 1: {pingpong:.1f} us (what "
                                 "one coordination step costs; never inside a timed interval).")
    return section


def _cells(row, info: dict, stat, rtt, mops, rdma_rtt) -> list[Cell]:
    method = row["method"]
    median = stat.median_ns if isinstance(stat, Stat) else None
    usable = ops = gbps = alone = ratio = None
    note = str(info.get("host_note") or "")
    if method == RACK_RPC_ROUNDTRIP:
        ratio = median / rtt.ns() if median and int(row["fragment_bytes"]) == 64 else None
        note = f"server on rank 0 ({info.get('server_host', '?')}); {note}"
    elif method == RDMA_RPC:
        ratio = median / rdma_rtt.ns() if median and int(row["fragment_bytes"]) == 64 else None
        note = (f"RDMA RC, server on rank 1, × paper against B15's RDMA figure; "
                f"{info.get('data_check', '')}; {note}")
    elif method == RACK_RPC_THROUGHPUT:
        ops = 1000 / median if median else None
        qd = str(row["effective"].get("qd"))
        ratio = ops / mops.central if ops and qd == "128" else None
    elif method == RACK_HANDOFF:
        usable = info.get("usable_ns")
        note = f"{info.get('records', '?')} records of {info.get('record_bytes', '?')} B to " \
               f"ranks {info.get('readers', '?')}; {note}"
    elif method == RACK_AGGREGATE:
        gbps, alone = info.get("together_gbps"), info.get("alone_gbps")
        total = info.get("total_gbps")
        share = info.get("share")  # no × paper: the paper reports no measured aggregate
        note = (f"total {total:.2f} GB/s over {info.get('ranks')} ranks, this host's share "
                f"{share:.0%}" if total and share is not None else note)
    elif method == RACK_HOST_LOSS and info.get("lost"):
        note = f"rank lost during the case ({info.get('role')}): {info.get('lost_why')}"
    elif method == RACK_HOST_LOSS and info.get("role") == "reader":  # the writer's host was lost
        stat = stat if isinstance(stat, NoValue) else NoValue(info.get("detect_note") or "")
        note = (f"this reader's counters: detections {_count(row.get('detections'))}, "
                f"owner judged lost {'yes' if info.get('owner_judged_lost') else 'NO'}, "
                f"torn reads {_count(row.get('torn_reads'))} "
                f"(returned {_count(row.get('torn_reads_returned'))}), "
                f"reads ok {_count(row.get('reads_ok'))}, fallbacks {info.get('fallbacks_stale')} "
                f"stale; {info.get('fallback', '')}")
    elif method == RACK_HOST_LOSS:
        detect = info.get("detect_ms") or {}
        stat = Stat(detect["median"] * 1e6, detect["min"] * 1e6, detect["p99"] * 1e6) \
            if detect else (stat if isinstance(stat, NoValue) else
                            NoValue(info.get("detect_note") or "no detection timed"))
        note = (f"kills {_count(row.get('kills'))}, detections {_count(row.get('detections'))}, "
                f"torn reads {_count(row.get('torn_reads'))}, "
                f"writes retried {info.get('idempotent_retries')}, "
                f"invalidated {info.get('invalidated')}, fallbacks {info.get('fallbacks')}; "
                f"{info.get('fallback', '')}")
    return [stat, usable, ops, gbps, alone, ratio, note]


def _count(value) -> str:
    return str(int(value)) if isinstance(value, int | float) and value == value else "-"


def _hosts_line(df: pd.DataFrame) -> str:
    """Which rank ran where, and whether the caches were coherent (one host)."""
    if "host" not in df:
        return ""
    ranks = {}
    for _, row in df[df["host"].notna()].iterrows():
        ranks.setdefault(_mpi_rank(row), str(row["host"]))
    if not ranks:
        return ""
    hosts = ", ".join(f"rank {r} on {h}" for r, h in sorted(ranks.items()))
    coherent = len(set(ranks.values())) == 1
    return f"Ranks: {hosts}." + (" Coherent host: every rank on one host, so the flush "
                                  "protocol runs but is not proven necessary here." if coherent
                                  else "")


# ------------------------------------------------------------- registered, in the report's order

register_frames_section('rack', 160, section_rack)
