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

import math
import sys
from pathlib import Path

from vm_lib import Facts, decoded, exit_fact, hop_fact, latest_run, read_json, text, whatif_of

PATTERNS = {"16KiB": 1, "128x20KiB": 128, "1024x160B": 1024}
MOVERS = 2  # the rdma suite's 16 KiB rows by k queue pairs at once


def _integer(value) -> int | None:
    """A stored count (a float column in the frame) as the integer it is; None when missing."""
    return int(value) if value == value and value is not None else None


def check(out: Path) -> tuple[list[str], list[str]]:
    fact = Facts()
    rdma = (read_json(out / "probe.json").get("inventory") or {}).get("rdma") or {}
    device = next((d for d in rdma.get("devices", []) if d.get("name") == "rxe0"), None)
    fact(device is not None and device["limits"].get("max_sge", 0) > 0,
         f"probe: rxe0 listed with its limits ({device and device['limits']})")
    if device is not None:
        port = device["ports"][0]
        fact(port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet" and port["gids"],
             f"probe: rxe0 port 1 ACTIVE, Ethernet (RoCE), GIDs {port['gids'][:2]}")
        fact(port.get("active_mtu", 0) in (256, 512, 1024, 2048, 4096),
             f"probe: rxe0 port 1 active MTU {port.get('active_mtu')}, max "
             f"{port.get('max_mtu')} (ibv_query_port)")
    exit_fact(fact, out, "run", "mpiexec -n 2 nearlocal run --suite rdma exits 0")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    run = latest_run(out / "results")
    if run is None:
        fact(False, "no stored run in results/")
        return fact.held, fact.failed
    cases = run.cases
    cases["info_d"] = cases["info"].map(decoded)
    variants = cases["info_d"].map(lambda i: i.get("sge", ""))  # info says it, param or default
    params = cases["params"].map(decoded)
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
                    fact(False, f"{method} {pattern} sge={variant}: {len(rows)} rows")
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
            fact(False, f"{method} 16KiB mtu=4096: {len(rows)} rows")
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
            fact(False, f"{method} 16KiB movers={MOVERS}: {len(rows)} rows")
            continue
        row = rows.iloc[0]
        fact(*_movers_fact(method, row, row["info_d"]))
    fact(*_contention_fact(run))
    perftest = text(out / "perftest.txt")
    fact(text(out / "perftest.rc") == "0" and "ib_write_lat" in perftest
         and "ib_read_lat" in perftest and " nan " not in perftest,
         f"compare_perftest.sh ran ib_write_lat, ib_read_lat, ib_write_bw:\n{perftest}\n"
         f"{text(out / 'perftest.err', 300)}")
    # the what-if's RDMA hop from this run's own rows (an emulated box's: never a speed)
    hop_fact(fact, whatif_of(run), "rdma",
             row_ok=lambda row: row.startswith(("rdma-read/", "rdma-write/")))
    for ok, said in replay_facts(out):
        fact(ok, said)
    return fact.held, fact.failed


def replay_facts(out: Path) -> list[tuple[bool, str]]:
    """The RDMA replay (`nearlocal replay --method rdma-read`, 2 queue pairs) of a small trace
    window: it ran, every request with hits was moved by a queue pair, the data check held, the
    output says the box is emulated, and replay_check.py gave the simulation's P50 / P99 from
    the suite's rdma-read rows beside the replay's (figures shown, never compared: TCG)."""
    rc = text(out / "replay.rc")
    replay = read_json(out / "replay.json")
    if not replay:
        return [(False, f"RDMA replay: no replay.json (rc {rc}: "
                        f"{text(out / 'replay.err', 400)})")]
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
    check = read_json(out / "replay-check.json")
    loads = check.get("loads") or []
    if len(loads) != 1 or not isinstance(loads[0], dict):
        facts.append((False, "RDMA replay: replay_check.py gave no prediction "
                             f"({text(out / 'replay-check.err', 400)})"))
        return facts
    (load,) = loads
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
    held, problems = check(out)
    for line in held:
        print(f"vm_rdma: ok: {line}")
    for line in problems:
        print(f"vm_rdma: FAILED: {line}")
    print("vm_rdma: interfaces, work-request splitting and the protocol under TCG; never speed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
