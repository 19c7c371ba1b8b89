"""The facts the VM rig's two-host stage must show (scripts/vm_hosts_guest.sh): mpiexec with a
hostfile started one rank on each guest over ssh; bad input across hosts was one line from rank 0
naming the host, exit 2, within its deadline, nothing stored; one run of `--suite pool-vs-rdma`
holds rows from both hostnames, every rack method's rows ok, RDMA rows between the two kernels
in both SGE variants (max_sge and work requests stated, every data check equal), both RPC
transports, a second path MTU; its report fills B1, B13, B14 and B15's two columns from its own
measured rows and says they are an emulated box's; the what-if's pool and RDMA paths come from
it; and with B's whole QEMU killed during rack-host-loss, A's readers judged the owner lost with
no torn record and the run names the lost host. Interfaces and protocols under TCG, never speed.

    python scripts/vm_hosts.py OUT_A OUT_B   (exit 1 naming every fact that does not hold)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from vm_lib import Facts, decoded, hop_fact, latest_run, param, read_json, text, whatif_of

HOSTS = ("nlhost-a", "nlhost-b")
PATTERNS = {"16KiB": 1, "128x20KiB": 128, "1024x160B": 1024}
BAD_INPUT_S = 120  # the bad-input jobs' deadline: each must end well within it
COMPARED = ("B1", "B13", "B14", "B15")


def _job(out: Path, name: str) -> tuple[int | None, int | None]:
    """A job's exit code and wall seconds (vm_hosts_guest.sh's NAME.rc)."""
    try:
        rc, wall = text(out / f"{name}.rc").split()
        return int(rc), int(wall)
    except ValueError:
        return None, None


def _error_lines(out: Path, name: str) -> list[str]:
    said = text(out / f"{name}.err") + "\n" + text(out / f"{name}.out")
    return [line for line in said.splitlines() if line.startswith("nearlocal: error:")]


def _counts(column) -> dict[str, int]:
    return {str(k): int(v) for k, v in column.value_counts().items()}


def check_launch(out: Path, fact: Facts) -> None:
    rc, wall = _job(out, "hostnames")
    names = text(out / "hostnames.out").split()
    fact(rc == 0 and sorted(names) == list(HOSTS),
         f"mpiexec --hostfile (nlhost-a, nlhost-b) --map-by node -n 2 over ssh: rc {rc}, ranks "
         f"on {', '.join(names)} ({wall} s)")


def check_bad_input(out: Path, fact: Facts) -> None:
    results = out / "bad-results"
    stored = [p for p in results.glob("*") if p.is_dir()] if results.is_dir() else []
    rc, wall = _job(out, "bad-host")
    err = text(out / "bad-host.err", 600)
    fact(rc not in (0, None) and wall is not None and wall < BAD_INPUT_S and "nlhost-c" in err,
         f"a hostfile naming an unreachable host (nlhost-c): mpiexec exits {rc} in {wall} s "
         f"naming it (no rank starts, so the launcher's lines are what is said): "
         f"{' | '.join(line.strip() for line in err.splitlines() if 'nlhost-c' in line)[:300]}")
    for name, host, words in (("bad-pool", "nlhost-b", ("pool", "does not exist")),
                              ("bad-rdma", "nlhost-b", ("RDMA",))):
        rc, wall = _job(out, name)
        lines = _error_lines(out, name)
        fact(rc == 2 and wall is not None and wall < BAD_INPUT_S and len(lines) == 1
             and host in lines[0] and all(w in lines[0] for w in words),
             f"{name}: exit {rc} in {wall} s, {len(lines)} line(s) from rank 0: "
             f"{lines[0] if lines else text(out / f'{name}.err', 300)}")
    fact(not stored, f"bad input stored nothing ({len(stored)} run folder(s) in bad-results)")


def check_run(out: Path, fact: Facts):
    rc, wall = _job(out, "run")
    fact(rc == 0, f"mpiexec --hostfile nearlocal run --suite pool-vs-rdma --region devdax: exits "
                  f"{rc} in {wall} s: {text(out / 'run.err', 300)}")
    run = latest_run(out / "results")
    if not fact(run is not None, "one run stored in results/"):
        return None
    cases = run.cases
    hosts = sorted(set(cases["host"].dropna()))
    fact(hosts == list(HOSTS), f"the run's rows come from both hostnames: {', '.join(hosts)}")
    show = text(out / "show.txt")
    fact(all(h in show for h in HOSTS), "`nearlocal show` of the run lists both hostnames")
    from nearlocal.units import format_number

    mpi = run.meta.get("mpi", {})
    fact(mpi.get("ranks") == 2 and mpi.get("coherent_host") is False,
         f"run.json mpi: {mpi.get('ranks')} ranks, coherent host {mpi.get('coherent_host')} "
         f"(two kernels), MPI ping-pong {format_number(mpi.get('pingpong_us'))} us")
    pool = cases[~cases["method"].str.startswith(("rack-", "rdma-"))]
    per_host = {h: int((pool["host"] == h).sum()) for h in HOSTS}
    fact(len(pool) > 0 and all(per_host.values()) and (pool["status"] == "ok").all(),
         f"the pool's own transfers on the shared device-dax, each host alone: {per_host} rows, "
         f"status {_counts(pool['status'])}")
    rack = cases[cases["method"].str.startswith("rack-")]
    for method in sorted(set(rack["method"])):
        rows = rack[rack["method"] == method]
        bad = rows[rows["status"] != "ok"]
        fact(bad.empty, f"{method}: {len(rows)} rows, all ok" if bad.empty else
             f"{method}: {len(bad)} of {len(rows)} rows not ok: "
             f"{'; '.join(str(r) for r in bad['reason'].head(3))}")
    fact(len(set(rack["method"])) >= 5, f"every rack method ran: {', '.join(sorted(set(rack['method'])))}")
    from nearlocal.whatif.contention import contention_of

    ways = {w: sorted(ks) for w, ks in contention_of(cases, run.samples).items()
            if "rack-aggregate" in w}
    fact(any(ks[0] == 1 and 2 in ks and "one per host" in w for w, ks in ways.items()),
         f"contention: the fit takes the ranks reading the pool as its movers at k = 1 and 2: {ways}")
    check_rdma(cases, fact)
    return run


def check_rdma(cases, fact: Facts) -> None:
    rdma = cases[cases["method"].str.startswith("rdma-")]
    infos = [decoded(i) for i in rdma["info"]]
    for method in ("rdma-write", "rdma-read"):
        for pattern, pieces in PATTERNS.items():
            for variant in ("one", "batched"):
                rows = [(row, info) for (_, row), info in zip(rdma.iterrows(), infos, strict=True)
                        if row["method"] == method and row["pattern"] == pattern
                        and info.get("sge") == variant
                        and param(row, "mtu", "1024") == "1024"
                        and param(row, "movers", "1") == "1"]  # one transfer, not k at once
                if len(rows) != 1:
                    fact(False, f"{method} {pattern} sge={variant}: {len(rows)} rows")
                    continue
                row, info = rows[0]
                limit = info.get("max_sge_rd" if method == "rdma-read" else "max_sge") or 1
                want = pieces if variant == "one" else math.ceil(pieces / limit)
                fact(row["status"] == "ok" and info.get("work_requests_per_sample") == want
                     and str(info.get("data_check", "")).startswith("ok"),
                     f"{method} {pattern} sge={variant} nlhost-a -> nlhost-b: {row['status']} "
                     f"{row['reason'] or ''}, max_sge {limit}, {info.get('work_requests_per_sample')} "
                     f"WRs (want {want}), {info.get('data_check')}")
    mtus = {(row["method"], param(row, "mtu", "1024"), info.get("path_mtu"), row["status"])
            for (_, row), info in zip(rdma.iterrows(), infos, strict=True)
            if row["method"] in ("rdma-write", "rdma-read")}
    second = [m for m in mtus if m[1] != "1024"]
    fact(bool(second) and all(m[3] == "ok" for m in second),
         f"a second path MTU: {sorted(second)}")
    rpc = [(row, info) for (_, row), info in zip(rdma.iterrows(), infos, strict=True)
           if row["method"] == "rdma-rpc"]
    transports = {param(row, "transport", "write"): (row["status"], info.get("data_check"))
                  for row, info in rpc}
    fact(set(transports) >= {"write", "send"}
         and all(s == "ok" and str(c).startswith("ok") for s, c in transports.values()),
         f"rdma-rpc between the hosts, both transports: {transports}")


def check_report(out: Path, run, fact: Facts) -> None:
    report = text(out / "report.md")
    start = report.find("Pool vs RDMA")
    section = report[start:report.find("\n#", start + 1)] if start >= 0 else ""
    lines = [line for line in section.splitlines() if line.startswith("| B")]
    filled = {fig: [line for line in lines if line.startswith(f"| {fig} ")] for fig in COMPARED}
    empty = [fig for fig, rows in filled.items()
             if not rows or any("no pool row" in r or "no RDMA row" in r for r in rows)]
    fact(start >= 0 and not empty,
         f"report: Pool vs RDMA has both columns measured for {', '.join(COMPARED)}"
         + (f" (missing: {', '.join(empty)}; {text(out / 'report.err', 200)})" if empty else ""))
    fact("emulated" in section.lower(),
         "report: the Pool vs RDMA section says its figures are an emulated box's")
    result = whatif_of(run)
    for name in ("cxl-pool", "rdma"):  # their host hop; host->gpu needs a GPU, the rig has none
        hop_fact(fact, result, name)


def check_slurm(out: Path, fact: Facts) -> None:
    """Where the host handed the guests a slurm.conf: `salloc -N 2 mpiexec` stored one run with
    rows from both hosts, every row ok."""
    if not (out / "slurm.conf").exists():
        print("vm_hosts: Slurm: not installed on this host, its job did not run")
        return
    rc, wall = _job(out, "slurm")
    run = latest_run(out / "slurm-results")
    hosts = sorted(set(run.cases["host"].dropna())) if run is not None else []
    statuses = _counts(run.cases["status"]) if run is not None else {}
    fact(rc == 0 and hosts == list(HOSTS) and set(statuses) == {"ok"},
         f"Slurm (slurmctld on nlhost-a, slurmd on both): salloc -N 2 -n 2 mpiexec nearlocal run "
         f"exits {rc} in {wall} s, rows from {', '.join(hosts) or 'no host'}, {statuses}: "
         f"{'' if rc == 0 else text(out / 'slurm.err', 300)}")


def check_loss(out_a: Path, out_b: Path, fact: Facts) -> None:
    killed = read_json(out_b / "killed.json")
    fact(bool(killed.get("pid")), f"B's QEMU killed by the host during rack-host-loss ({killed})")
    rc, wall = _job(out_a, "loss")
    run = latest_run(out_a / "loss-results")
    if not fact(run is not None, f"the host-loss run is stored (mpiexec ended after {wall} s, "
                                 f"exit {rc}: it does not return once a host is gone)"):
        return
    cases = run.cases
    reason = run.meta.get("incomplete_reason", "")
    fact("nlhost-b" in reason, f"run.json names the lost host: {reason}")
    rows = cases[cases["method"] == "rack-host-loss"]
    survivor = rows[rows["host"] == "nlhost-a"]
    lost = rows[rows["host"] == "nlhost-b"]
    if fact(len(survivor) == 1, f"a row from the survivor nlhost-a ({len(survivor)})"):
        row = survivor.iloc[0]
        fact(row["status"] == "ok" and (row.get("detections") or 0) >= 1
             and row.get("torn_reads") == 0,
             f"nlhost-a's readers: {row['status']} {row['reason'] or ''}, owner loss detected "
             f"{int(row.get('detections') or 0)} time(s), torn reads {row.get('torn_reads'):g}")
    fact(len(lost) == 1 and lost.iloc[0]["status"] != "ok" and "nlhost-b" in str(lost.iloc[0]["reason"]),
         f"the killed host's row says so: {lost.iloc[0]['reason'] if len(lost) else 'no row'}")


def main(out_a: Path, out_b: Path) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fact = Facts()
    check_launch(out_a, fact)
    check_bad_input(out_a, fact)
    run = check_run(out_a, fact)
    if run is not None:
        check_report(out_a, run, fact)
    check_slurm(out_a, fact)
    check_loss(out_a, out_b, fact)
    failed = fact.report("vm_hosts: ok: ", "vm_hosts: FAILED: ")
    print("vm_hosts: two kernels, one pool, one network, under TCG: interfaces and protocols, never speed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
