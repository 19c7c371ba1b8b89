"""The hosts of an MPI job (`nearlocal run` under mpiexec / srun, docs/rack.md): what each rank
answers before the run and the one line every rank exits with when a host cannot run the command
line, the host columns every row of a rank carries, and the line naming a lost rank. Plain data
between the ranks; the job itself is engine/mpi_job.py."""

from __future__ import annotations

from pathlib import Path

from nearlocal.rack.mpi import RankLost

START_TIMEOUT_S = 300.0  # ranks start, import and probe at their own pace


def kernel_id() -> str:
    """Which host a rank runs on: its running kernel (the boot id, new at every boot). Not the
    inventory's host_id, which names a kind of hardware: a rack of identical servers shares
    one, and ranks on two of them are not on one coherent host."""
    import socket

    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"host {socket.gethostname()}"


def one_kernel(hosts: list[dict]) -> bool:
    """Every rank on one running kernel: their caches are coherent (one host)."""
    return len({h["kernel_id"] for h in hosts}) == 1


def what_it_needs(case_id: str) -> str:
    """What every host of the job must have for the case, as its rack method declares it."""
    from nearlocal.rack.framework import RACK_METHODS

    method = case_id.split("/")[0]  # a case id begins with its method
    needs = RACK_METHODS[method].every_host_needs
    if needs:
        return f"every rank of {method} needs {needs}"
    return f"every rank of {method} runs its part: every host needs what this one lacks"


def first_problem(answers: list[dict]) -> str | None:
    """The one line every rank exits with, or None when every host can run the command."""
    lead = answers[0]
    for answer in answers[1:]:
        if answer["version"] != lead["version"]:
            return (f"rank {answer['rank']} on host {answer['hostname']} runs nearlocal "
                    f"{answer['version']}, rank 0 on {lead['hostname']} runs {lead['version']}: "
                    "install the same version on every host")
    for answer in answers:
        if answer["error"]:
            return f"on host {answer['hostname']} (rank {answer['rank']}): {answer['error']}"
    for answer in answers[1:]:
        if answer["case_ids"] != lead["case_ids"]:
            return (f"rank {answer['rank']} on host {answer['hostname']} selected other cases "
                    "than rank 0: every rank must run the same command line")
    for case_id in lead["case_ids"]:  # skipped on one host, run on another: refused
        skipping = [a for a in answers if case_id in a.get("skips", {})]
        if skipping and len(skipping) < len(answers):
            first = skipping[0]
            return (f"on host {first['hostname']} (rank {first['rank']}): "
                    f"{first['skips'][case_id]}: {what_it_needs(case_id)}")
    return None


def host_columns(hosts: list[dict], rank: int) -> dict:
    """What every row of `rank` says about where it was measured."""
    me = hosts[rank]
    sharing = [h["rank"] for h in hosts if h["kernel_id"] == me["kernel_id"]]
    coherent = one_kernel(hosts)
    note = "coherent host: every rank on one host" if coherent else (
        f"shares its host with ranks {', '.join(map(str, sharing))}" if len(sharing) > 1 else "")
    return {"host": me["hostname"], "rank": rank, "host_id": me["host_id"], "host_note": note}


def tagged(row: dict, hosts: list[dict], rank: int) -> dict:
    return {**row, **host_columns(hosts, rank), "case_id": f"{row['case_id']}/rank={rank}"}


def lost_line(exc: RankLost, hosts: list[dict]) -> str:
    if 0 <= exc.rank < len(hosts):
        return f"rank {exc.rank} on host {hosts[exc.rank]['hostname']} {exc.why}"
    return str(exc)


def who_died(hosts: list[dict], waiting: int) -> str:
    """Ranks on this host whose process is gone (or a zombie); else the rank waited on."""
    import socket

    here = socket.gethostname()
    gone = []
    for host in hosts[1:]:
        if host["hostname"] != here:
            continue
        try:
            state = Path(f"/proc/{host['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("gone", "Z", "X"):
            gone.append(f"rank {host['rank']} on host {host['hostname']} (pid {host['pid']}) died")
    if gone:
        return "; ".join(gone)
    return f"while rank 0 waited on rank {waiting} (host {hosts[waiting]['hostname']})"
