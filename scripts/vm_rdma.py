"""The facts the VM rig's RDMA guest must show (scripts/vm_rdma_guest.sh): soft-RoCE's device in
probe with its limits and its port's active MTU, rdma-write / rdma-read rows for 16KiB, 128x20KiB
and 1024x160B in both SGE variants (at the default path MTU) with the device's max_sge and the
work requests per sample that max_sge gives, the data read back on rank 1 equal to rank 0's, the
RPC's rows (RDMA write + poll, and send/recv), the 16 KiB rows at path MTU 4096 (run where the
port's active MTU allows it, else skipped rows saying so), the 16 KiB rows by 2 queue pairs at
once (movers=2: k and each mover's figures in the row, the aggregate, both movers' data checked,
and the contention fit taking them beside the k = 1 rows), the RDMA replay of a small trace
window (every request moved, its data checked, labelled emulated, the simulation's figures from
the rdma-read rows beside it), perftest beside them. Never speeds (TCG).

    python scripts/vm_rdma.py OUT   (exit 1 naming every fact that does not hold)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

PATTERNS = {"16KiB": 1, "128x20KiB": 128, "1024x160B": 1024}
MOVERS = 2  # the rdma suite's 16 KiB rows by k queue pairs at once


def _text(path: Path) -> str:
    return path.read_text().strip() if path.exists() else "missing"


def _integer(value) -> int | None:
    """A stored count (a float column in the frame) as the integer it is; None when missing."""
    return int(value) if value == value and value is not None else None


def _params(value) -> dict:
    """A row's own parameters (stored as JSON text; defaults are not in them)."""
    if isinstance(value, dict):
        return value
    return json.loads(value) if isinstance(value, str) and value else {}


def check(out: Path) -> tuple[list[str], list[str]]:
    facts: list[str] = []
    problems: list[str] = []

    def fact(ok: bool, text: str) -> None:
        (facts if ok else problems).append(text)

    try:
        rdma = json.loads((out / "probe.json").read_text())["inventory"]["rdma"]
        device = next(d for d in rdma["devices"] if d["name"] == "rxe0")
    except (OSError, ValueError, KeyError, StopIteration):
        rdma, device = {}, None
    fact(device is not None and device["limits"].get("max_sge", 0) > 0,
         f"probe: rxe0 listed with its limits ({device and device['limits']})")
    if device is not None:
        port = device["ports"][0]
        fact(port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet" and port["gids"],
             f"probe: rxe0 port 1 ACTIVE, Ethernet (RoCE), GIDs {port['gids'][:2]}")
        fact(port.get("active_mtu", 0) in (256, 512, 1024, 2048, 4096),
             f"probe: rxe0 port 1 active MTU {port.get('active_mtu')}, max "
             f"{port.get('max_mtu')} (ibv_query_port)")
    rc = _text(out / "run.rc")
    fact(rc == "0", f"mpiexec -n 2 nearlocal run --suite rdma exits 0 (rc {rc}: "
         f"{_text(out / 'run.err')[-400:]})")
    runs = sorted((out / "results").glob("*/run.json"))
    if not runs:
        problems.append("no stored run in results/")
        return facts, problems
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nearlocal.store import load

    cases = load(runs[-1].parent).cases
    cases["info_d"] = [i if isinstance(i, dict) else json.loads(i or "{}") for i in cases["info"]]
    variants = cases["info_d"].map(lambda i: i.get("sge", ""))  # info says it, param or default
    params = cases["params"].map(_params)
    mtus = params.map(lambda p: str(p.get("mtu", "1024")))  # the default path MTU's rows here
    transports = params.map(lambda p: p.get("transport", "write"))
    movers = params.map(lambda p: str(p.get("movers", "1")))
    limits = device["limits"] if device else {}
    for method in ("rdma-write", "rdma-read"):
        limit = limits.get("max_sge_rd" if method == "rdma-read" else "max_sge", 0)
        for pattern, pieces in PATTERNS.items():
            for variant in ("one", "batched"):
                rows = cases[(cases["method"] == method) & (cases["pattern"] == pattern)
                             & (variants == variant) & (mtus == "1024") & (movers == "1")]
                if len(rows) != 1:
                    problems.append(f"{method} {pattern} sge={variant}: {len(rows)} rows")
                    continue
                row = rows.iloc[0]
                info = row["info_d"]
                want = pieces if variant == "one" else math.ceil(pieces / max(limit, 1))
                fact(row["status"] == "ok" and info.get("work_requests_per_sample") == want
                     and str(info.get("data_check", "")).startswith("ok"),
                     f"{method} {pattern} sge={variant}: {row['status']} {row['reason'] or ''}, "
                     f"max_sge {_integer(row.get('max_sge'))}, {info.get('work_requests_per_sample')} WRs "
                     f"per sample (want {want}), median {row['median_ns']:.0f} ns, data "
                     f"movement {info.get('data_movement_ns', float('nan')):.0f} ns, check: "
                     f"{info.get('data_check')}")
    for transport in ("write", "send"):
        rpc = cases[(cases["method"] == "rdma-rpc") & (transports == transport)]
        ok = len(rpc) == 1 and rpc.iloc[0]["status"] == "ok"
        info = rpc.iloc[0]["info_d"] if len(rpc) else {}
        outcome = (f"{rpc.iloc[0]['status']} {rpc.iloc[0]['reason'] or ''}" if len(rpc)
                   else f"{len(rpc)} rows")
        fact(ok and str(info.get("data_check", "")).startswith("ok")
             and info.get("transport") == transport,
             f"rdma-rpc 64B transport={transport}: {outcome}, median "
             f"{rpc.iloc[0]['median_ns'] if len(rpc) == 1 else float('nan'):.0f} ns, served "
             f"{info.get('requests_served')}, check: {info.get('data_check')}, timed: "
             f"{info.get('timed')}")
    active = int(device["ports"][0].get("active_mtu") or 0) if device else 0
    for method in ("rdma-write", "rdma-read"):
        rows = cases[(cases["method"] == method) & (cases["pattern"] == "16KiB") & (mtus == "4096")
                     & (movers == "1")]
        if len(rows) != 1:
            problems.append(f"{method} 16KiB mtu=4096: {len(rows)} rows")
            continue
        row = rows.iloc[0]
        info = row["info_d"]
        if active >= 4096:  # the port takes it: the row runs at that path MTU
            fact(row["status"] == "ok" and info.get("path_mtu") == 4096
                 and str(info.get("data_check", "")).startswith("ok"),
                 f"{method} 16KiB mtu=4096 (active MTU {active}): {row['status']} "
                 f"{row['reason'] or ''}, path_mtu {info.get('path_mtu')}, check: "
                 f"{info.get('data_check')}")
        else:  # soft-RoCE on a 1500 B netdev: 1024; the suite goes on without it
            fact(row["status"] == "skipped" and f"active MTU {active}" in str(row["reason"]),
                 f"{method} 16KiB mtu=4096 (active MTU {active}): {row['status']}, "
                 f"{row['reason']}")
    for method in ("rdma-write", "rdma-read"):
        rows = cases[(cases["method"] == method) & (cases["pattern"] == "16KiB")
                     & (movers == str(MOVERS))]
        if len(rows) != 1:
            problems.append(f"{method} 16KiB movers={MOVERS}: {len(rows)} rows")
            continue
        row = rows.iloc[0]
        fact(*_movers_fact(method, row, row["info_d"]))
    fact(*_contention_fact(load(runs[-1].parent)))
    perftest = _text(out / "perftest.txt")
    fact(_text(out / "perftest.rc") == "0" and "ib_write_lat" in perftest
         and "ib_read_lat" in perftest and " nan " not in perftest,
         f"compare_perftest.sh ran ib_write_lat, ib_read_lat, ib_write_bw:\n{perftest}\n"
         f"{_text(out / 'perftest.err')[-300:]}")
    # the what-if's RDMA hop from this run's own rows (an emulated box's: never a speed)
    from nearlocal.whatif import Request, inputs_of, whatif

    rdma = next(p for p in whatif(inputs_of(load(runs[-1].parent)), Request()).paths
                if p.path == "rdma")
    hop = rdma.terms[0]
    fact(hop.source == "measured" and bool(hop.rows)
         and all(r.startswith(("rdma-read/", "rdma-write/")) for r in hop.rows),
         f"whatif: the RDMA path's rdma hop predicted from the run's rdma rows "
         f"({hop.way}; rows {', '.join(hop.rows) or hop.source})")
    for ok, text in replay_facts(out):
        fact(ok, text)
    return facts, problems


def replay_facts(out: Path) -> list[tuple[bool, str]]:
    """The RDMA replay (`nearlocal replay --method rdma-read`, 2 queue pairs) of a small trace
    window: it ran, every request with hits was moved by a queue pair, the data check held, the
    output says the box is emulated, and replay_check.py gave the simulation's P50 / P99 from
    the suite's rdma-read rows beside the replay's (figures shown, never compared: TCG)."""
    rc = _text(out / "replay.rc")
    try:
        replay = json.loads((out / "replay.json").read_text())
    except (OSError, ValueError):
        return [(False, f"RDMA replay: no replay.json (rc {rc}: "
                        f"{_text(out / 'replay.err')[-400:]})")]
    records = replay.get("per_request") or []
    moved = [r for r in records if r.get("bytes", 0) > 0]
    served = [r for r in moved if r.get("mover", -1) in range(int(replay.get("movers") or 0))
              and r.get("transfer_ns", 0) > 0]
    facts = [
        (rc == "0" and replay.get("method") == "rdma-read" and replay.get("movers") == MOVERS,
         f"RDMA replay: mpiexec -n 2 nearlocal replay --method rdma-read exits {rc}, "
         f"{replay.get('movers')} queue pairs, path {replay.get('path')}"),
        (bool(moved) and len(served) == len(moved),
         f"RDMA replay: every request moved ({len(served)} of {len(moved)} with hits by a queue "
         f"pair, {replay.get('requests')} requests, {replay.get('bytes')} bytes in "
         f"{replay.get('fragments')} fragments; wait P50 "
         f"{(replay.get('wait') or {}).get('p50_ns')} ns, transfer P50 "
         f"{(replay.get('transfer') or {}).get('p50_ns')} ns)"),
        (str(replay.get("data_check", "")).startswith("ok"),
         f"RDMA replay: data check {replay.get('data_check')}"),
        (bool(replay.get("emulated")),
         f"RDMA replay: labelled emulated ({replay.get('emulated') or 'not said'})"),
    ]
    try:
        check = json.loads((out / "replay-check.json").read_text())
        (load,) = check["loads"]
    except (OSError, ValueError, KeyError, TypeError):
        facts.append((False, "RDMA replay: replay_check.py gave no prediction "
                             f"({_text(out / 'replay-check.err')[-400:]})"))
        return facts
    sim, real = load.get("simulated_reload") or {}, load.get("replay_reload") or {}
    facts.append((
        check.get("way") == "rdma/rdma-read" and bool(check.get("transfer_rows"))
        and all(sim.get(q) for q in ("p50_ns", "p99_ns"))
        and all(real.get(q) for q in ("p50_ns", "p99_ns")),
        f"RDMA replay: the simulation fed the suite's rdma-read rows ({check.get('way')}: "
        f"{', '.join(check.get('transfer_rows') or []) or 'none'}) predicts P50 "
        f"{sim.get('p50_ns')} / P99 {sim.get('p99_ns')} ns beside the replay's "
        f"{real.get('p50_ns')} / {real.get('p99_ns')} ns (shown, never compared: "
        f"{check.get('emulated') or 'emulated'})"))
    return facts


def _movers_fact(method: str, row, info: dict) -> tuple[bool, str]:
    """A movers=k row: ok, k in it, each mover's median and GB/s, the aggregate, every mover's
    samples kept, one work request a transfer, both movers' bytes checked (figures shown, never
    judged: TCG)."""
    per = info.get("per_mover") or []
    kept = info.get("mover_samples_ns") or []
    ok = (row["status"] == "ok" and info.get("movers") == MOVERS and len(per) == MOVERS
          and all(m.get("median_ns") and m.get("gbps") for m in per)
          and bool(info.get("aggregate_gbps")) and len(kept) == MOVERS and all(kept)
          and info.get("bytes_per_mover") == 16384 and info.get("work_requests_per_sample") == 1
          and str(info.get("data_check", "")).startswith(f"ok: {MOVERS * 16384} bytes"))
    figures = ", ".join(f"qp {m.get('qp')}: {m.get('median_ns', float('nan')):.0f} ns "
                        f"{m.get('gbps') or 0:.3f} GB/s" for m in per)
    return ok, (f"{method} 16KiB movers={MOVERS}: {row['status']} {row['reason'] or ''}, k "
                f"{info.get('movers')}, per mover [{figures}], aggregate "
                f"{info.get('aggregate_gbps') or 0:.3f} GB/s, samples kept "
                f"{[len(k) for k in kept]}, check: {info.get('data_check')}; "
                f"{info.get('concurrency', 'no concurrency said')}")


def _contention_fact(run) -> tuple[bool, str]:
    """The contention fit (whatif/contention.py) takes each way's movers=2 row beside its k = 1
    row of the same parameters, with service times from the raw samples."""
    from nearlocal.whatif.contention import contention_of

    got = contention_of(run.cases, run.samples)
    ways = {way: figures for way, figures in got.items()
            if way.endswith(("/rdma-write", "/rdma-read"))}
    ok = len(ways) == 2 and all(
        sorted(figures) == [1, MOVERS] and figures[MOVERS]["service_ns"].get("n", 0) > 0
        and figures[MOVERS]["aggregate_gbps"] for figures in ways.values())
    text = "; ".join(f"{way}: " + ", ".join(
        f"k={k} per mover {(f.get('per_mover_gbps') or 0):.3f} GB/s aggregate "
        f"{(f.get('aggregate_gbps') or 0):.3f} GB/s ({f['service_ns'].get('n', 0)} samples, "
        f"rows {', '.join(f['rows'])})" for k, f in figures.items())
        for way, figures in ways.items())
    return ok, f"contention: the RDMA ways at k = 1 and {MOVERS} ({text or 'none'})"


def main(out: Path) -> int:
    facts, problems = check(out)
    for text in facts:
        print(f"vm_rdma: ok: {text}")
    for text in problems:
        print(f"vm_rdma: FAILED: {text}")
    print("vm_rdma: interfaces, work-request splitting and the protocol under TCG; never speed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
