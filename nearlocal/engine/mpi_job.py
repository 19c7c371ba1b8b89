"""`nearlocal run` as one run across the ranks of an MPI job (docs/rack.md): the job's engine
work. The front end (rack's command face, nearlocal/rack/commands.py) hands it a `JobRequest`:
the command line's cases and settings on a host, where the run is stored, and how rank 0 shows
it; the rack family holds the hosts' answers (rack/hosts.py), the pools (rack/pools.py) and a
rack case's parts (rack/parts.py).

Every rank probes its own host and checks the command line there; rank 0 gathers the answers and
either refuses the run for every rank (one line naming the host, exit 2: a missing pool, another
nearlocal version, --threads beyond a host's CPUs, an rdma-* case one host would skip and another
run) or goes on; nothing is stored for a refused run. The pool is opened under the same
name on every host and proven to be one memory (rank 0 writes a random token, every rank reads
it back). Ordinary cases are measured host by host (each host alone, by the usual runner, from its
own plan); rack cases on every rank at once, each rank given the case as rank 0's plan resolved it
(its pattern and params: nothing is parsed or described again on a rank), rank 0 building the
rows from its plan's row facts. Rank 0 stores ONE run: every rank's rows with `host` and `rank`
columns, every host's inventory in run.json. A rank that dies or stops answering leaves the run
stored and marked incomplete, naming it: once rank 0's part of a rack case finished it waits the
method's straggler time (rack/framework.py), and a method's rows_after_loss gives the survivors'
rows and a lost row for each lost rank (host loss, whose case runs after every other rack case).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rack import parts
from nearlocal.rack.hosts import (
    START_TIMEOUT_S,
    first_problem,
    host_columns,
    kernel_id,
    lost_line,
    one_kernel,
    tagged,
    who_died,
)
from nearlocal.rack.mpi import RankLost, World, world
from nearlocal.rack.pools import open_pools

if TYPE_CHECKING:
    from nearlocal.core.cases import Case
    from nearlocal.engine.plan import Plan, PlanEntry, RunSettings
    from nearlocal.engine.worker import WorkerSettings
    from nearlocal.probe import HostInventory
    from nearlocal.store.writer import Store

RANKS_LOST = 1  # rank 0's exit code when the run is stored without some ranks


@dataclass(frozen=True)
class JobRequest:
    """What the front end hands the job. `select(inventory) -> (cases, settings)`: the command
    line's cases and run settings on this rank's host (bad input: UsageError, refused for every
    rank); `out`: the store rank 0 writes; `suite`: the run's; `allow_write`: a region of the
    user's may be written; `announce(stored)`: rank 0 shows the stored run."""

    select: Callable[[Any], tuple[list, RunSettings]]
    out: Path
    suite: str
    allow_write: bool
    announce: Callable[[Stored], None]


@dataclass(frozen=True)
class Stored:
    """Rank 0's run as stored: its path, the job's size, its hosts and why it is incomplete."""

    path: Path
    ranks: int
    hosts: int
    incomplete: str | None


@dataclass
class JobPlan:
    """This host's part of the job: its cases as the engine planned them (`planned`, each case
    decided once), the box they run on, the worker settings (this host's one clock) and the
    runner's limits."""

    cases: list[Case]
    inventory: HostInventory
    settings: WorkerSettings
    processes: int
    case_timeout_s: float
    planned: Plan

    def plain(self) -> list[PlanEntry]:
        """The plan's entries of ordinary (not rack) cases, as the runner takes them."""
        from nearlocal.rack.framework import is_rack

        return [e for e in self.planned.entries if not is_rack(e.case)]

    def rack(self) -> list[PlanEntry]:
        """The plan's entries of rack cases: resolved case, row facts and decision each."""
        from nearlocal.rack.framework import is_rack

        return [e for e in self.planned.entries if is_rack(e.case)]


def run_job(request: JobRequest) -> int:
    """The MPI form of `nearlocal run`: rank 0 stores the run, the others measure for it."""
    job = world()
    try:
        return _run_job(job, request)
    except RankLost as exc:  # before the run was stored (the start), or on a follower
        print(f"nearlocal: rank {job.rank}: {exc}", flush=True)
        return 1


def _run_job(job: World, request: JobRequest) -> int:
    held = job.bcast(_held_llcs(request.out) if job.rank == 0 else None, START_TIMEOUT_S,
                     "hearing the LLC the store holds for each host")
    local, plan = check_here(request, job.rank, held)
    answers = job.gather(local, START_TIMEOUT_S, "checking every host before the run")
    problem = first_problem(answers) if job.rank == 0 else None
    problem = job.bcast(problem, START_TIMEOUT_S, "hearing whether the run goes ahead")
    if problem:
        if job.rank == 0:
            raise UsageError(problem)
        return 2
    hosts = job.bcast(answers, START_TIMEOUT_S, "hearing every host's answer")
    pools = open_pools(job, plan.rack(), request.allow_write, hosts)
    try:
        pingpong = job.pingpong_us(1 - job.rank) if job.rank < 2 else None
        code = lead(job, request, plan, hosts, pools, pingpong) if job.rank == 0 \
            else follow(job, plan, hosts, pools)
    finally:
        for region in pools.values():  # rank 0's pool file goes with it
            region.close()
    if job.rank == 0 and code == RANKS_LOST:
        job.abort(code)  # ranks that hang, or were left behind, would keep the job alive
    return code


def _held_llcs(out: Path) -> dict:
    """Per box, the LLC rank 0's store holds (engine.plan.settle_llc): the ranks on other hosts
    have no store of their own to read it from."""
    from nearlocal.store.boxes import held_llcs

    return held_llcs(out)


def check_here(request: JobRequest, rank: int, held: dict) -> tuple[dict, JobPlan | None]:
    """This rank's answer: who it is, and the first problem it found with the command line here
    (as the line a plain `nearlocal run` would print, exit 2). Its cases are classified by the
    LLC the store holds for its box, as a plain run's are."""
    import socket

    from nearlocal import __version__
    from nearlocal.engine.plan import settle_llc
    from nearlocal.probe import probe

    answer = {"rank": rank, "version": __version__, "hostname": socket.gethostname(),
              "pid": os.getpid(), "host_id": "", "kernel_id": kernel_id(), "error": "",
              "case_ids": [], "inventory": {},
              "skips": {}}
    plan = None
    try:
        inventory = settle_llc(probe(), held)
        answer["host_id"] = inventory.host_id
        answer["inventory"] = inventory.to_dict()
        plan = plan_job(*request.select(inventory), inventory)
        answer["case_ids"] = [c.id for c in plan.cases]
        answer["skips"] = rack_skips(plan)
        answer["cpus"] = len(os.sched_getaffinity(0))
    except UsageError as exc:
        answer["error"] = str(exc)
    return answer, plan


def plan_job(cases: list[Case], settings: RunSettings, inventory: HostInventory) -> JobPlan:
    """This host's plan of the command line's cases: a case refused, or a pool this host lacks,
    is the one line every rank exits 2 with."""
    from nearlocal.engine.plan import Refuse, plan_cases
    from nearlocal.rack.framework import is_rack, shares_pool

    planned = plan_cases(cases, inventory, settings)
    for entry in planned.entries:
        if isinstance(entry.decision, Refuse):
            raise UsageError(entry.decision.error)
        if is_rack(entry.case) and entry.reason and shares_pool(entry.case):
            raise UsageError(f"pool {entry.case.region}: {entry.reason}")  # every host has it
    return JobPlan(planned.cases, inventory, planned.worker_settings(),  # this host's one clock
                   settings.processes, max(120.0, 20 * settings.budget_s), planned)


def rack_skips(plan: JobPlan) -> dict[str, str]:
    """The rack cases this host cannot run, with probe's reason (an rdma-* case on a host
    without a usable RDMA device): every host must decide each the same way."""
    return {entry.case.id: entry.reason for entry in plan.rack() if entry.reason}


class RankStore:
    """The sink (engine/sink.py RunSink) a rank's Runner writes to: rank 0's rows into the run,
    tagged; the others' sent to rank 0 (between cases, never during one)."""

    def __init__(self, job: World, hosts: list[dict], store: Store | None = None):
        self.job, self.hosts, self.store = job, hosts, store

    @property
    def keeps_busy(self) -> bool:
        """Rank 0 only: the others' record would be dropped (add_busy), so they run no recorder."""
        return self.store is not None

    def add_case(self, row: dict, raw: np.ndarray | None = None, ns: np.ndarray | None = None,
                 process: np.ndarray | None = None, placement: np.ndarray | None = None) -> None:
        if self.store is not None:
            self.store.add_case(tagged(row, self.hosts, 0), raw, ns, process, placement)
        else:
            self.job.send(("row", row, raw, ns, process, placement), 0, START_TIMEOUT_S,
                          "sending a row")

    def add_host_reading(self, pass_index: int, readings: dict[str, list[float]],
                         facts: dict[str, dict]) -> None:
        """Rank 0's host probes only: the run's probes describe one host."""
        if self.store is not None:
            self.store.add_host_reading(pass_index, readings, facts)

    def add_host_failure(self, reason: str) -> None:
        if self.store is not None:
            self.store.add_host_failure(reason)

    def add_busy(self, record: dict) -> None:
        """Rank 0's record only, as its host probes: the run's `busy` describes one host."""
        if self.store is not None:
            self.store.add_busy(record)


def lead(job: World, request: JobRequest, plan: JobPlan, hosts: list[dict], pools: dict,
          pingpong_us: float | None) -> int:
    from nearlocal.engine.metadata import run_metadata
    from nearlocal.engine.runner import Runner
    from nearlocal.rack.framework import is_rack
    from nearlocal.store.writer import Store

    meta = run_metadata(plan.inventory, plan.settings, request.suite, processes=plan.processes)
    coherent = one_kernel(hosts)
    hosts[0]["pingpong_us"] = pingpong_us  # rows made here carry it (the report's note)
    meta["mpi"] = {"ranks": job.size, "coherent_host": coherent, "pingpong_us": pingpong_us,
                   "hosts": [{k: h[k] for k in ("rank", "hostname", "host_id", "kernel_id", "pid",
                                                "version")}
                             for h in hosts]}
    meta["host_inventories"] = {str(h["rank"]): h["inventory"] for h in hosts}
    store = Store.create(request.out, meta)
    lost: dict[int, str] = {}
    waiting = [0]  # the rank rank 0 is waiting on (named if the launcher ends the job)
    plain = [c for c in plan.cases if not is_rack(c)]
    try:
        if plain:
            for rank in range(job.size):
                waiting[0] = rank
                if rank == 0:
                    Runner(plan.inventory, plan.settings, RankStore(job, hosts, store),
                           case_timeout_s=plan.case_timeout_s,
                           processes=plan.processes).run(plan.plain())
                    continue
                try:
                    collect_plain(job, rank, store, hosts, plan, len(plain))
                except RankLost as exc:
                    lost[rank] = lost_line(exc, hosts)
        for entry in parts.rack_order(plan.rack()):
            rack_case(job, entry, plan, hosts, pools, store, lost, waiting)
    except KeyboardInterrupt:  # SIGTERM from the launcher: a rank died (no ULFM)
        why = who_died(hosts, waiting[0])
        store.mark_incomplete(f"the launcher ended the job: {why}")  # first: a SIGKILL may
        # follow at once
        store.finish(interrupted=True, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        raise
    for rank in range(1, job.size):
        if rank not in lost:
            with contextlib.suppress(RankLost):
                job.send(("stop",), rank, 30, "ending the run")
    if lost:
        store.mark_incomplete("ranks lost: " + "; ".join(lost.values()), lost_ranks=sorted(lost))
    path = store.finish(interrupted=bool(lost), ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    request.announce(Stored(path, job.size, len({h["kernel_id"] for h in hosts}),
                            store.meta["incomplete_reason"] if lost else None))
    return RANKS_LOST if lost else 0


def collect_plain(job: World, rank: int, store, hosts: list[dict], plan: JobPlan, count: int) -> None:
    job.send(("plain",), rank, START_TIMEOUT_S, "starting its cases")
    per_message = plan.case_timeout_s * plan.processes + 120  # one case, compile included
    while True:
        message = job.recv(rank, per_message, "measuring its cases")
        if message[0] == "done":
            return
        _, row, raw, ns, process, placement = message
        store.add_case(tagged(row, hosts, rank), raw, ns, process, placement)


def rack_case(job: World, entry, plan: JobPlan, hosts: list[dict], pools: dict, store,
               lost: dict, waiting: list) -> None:
    """One rack case on every rank: `entry`, rank 0's plan's, gives the resolved case every rank
    is sent and the row facts (described with this box's cache sizes) each row starts from.
    Ranks lost during it are added to `lost`: the method's rows_after_loss, where it has one,
    gives the survivors' rows and one for each lost rank; else one failed row names them."""
    from nearlocal.rack.framework import RACK_METHODS

    case = entry.case
    method = RACK_METHODS[case.method]
    base = dict(entry.row)
    skipped = entry.reason or ""  # an rdma-* case on a host without an RDMA device: probe's reason
    if lost or job.size < method.min_ranks or skipped:
        why = skipped or (f"needs every rank, and {'; '.join(lost.values())}" if lost else
                          f"needs at least {method.min_ranks} ranks, the job has {job.size}")
        store.add_case({**tagged(base, hosts, 0), "status": "skipped", "reason": why})
        return
    for rank in range(1, job.size):
        job.send(("rack", entry.resolved), rank, START_TIMEOUT_S, "starting a rack case")
    ctx = parts.rack_context(job, entry.resolved, plan, hosts, pools)
    results, gone = parts.gather_parts(job, method, ctx, plan, hosts, waiting)
    lost.update(gone)
    failures = [f"rank {r}: {got[1]}" for r, got in enumerate(results)
                if got is not None and got[0] != "ok"]
    if gone and not failures and method.rows_after_loss is not None:
        store_rows(method.rows_after_loss(ctx, [None if got is None else got[1]
                                               for got in results], gone),
                    ctx, base, hosts, store)
        return
    if gone or failures:
        store.add_case({**tagged(base, hosts, 0), "status": "failed",
                        "reason": "; ".join([*gone.values(), *failures])})
        return
    store_rows(method.rows(ctx, [value for _, value in results]), ctx, base, hosts, store)


def store_rows(rows: list, ctx, base: dict, hosts: list[dict], store) -> None:
    """A rack case's rows, each with its rank's host columns, statistics and samples."""
    from nearlocal.core.sampling import summarize

    for row in rows:
        stats = summarize(row.ns, base["bytes_moved"]) if len(row.ns) else {"n_samples": 0}
        info = {**row.info, **host_columns(hosts, row.rank),
                "mpi_pingpong_us": hosts[0].get("pingpong_us")}
        store.add_case({**tagged(base, hosts, row.rank), **stats, **row.extra,
                        "status": "failed" if row.failed else "ok", "reason": row.failed,
                        "clock": "tsc", "converged": bool(row.info.get("converged", True)),
                        "elapsed_s": row.info.get("elapsed_s"), "info": info,
                        "timer_overhead_ns": ctx.overhead_ticks * 1e9 / ctx.tsc_hz},
                       row.raw if len(row.ns) else None, row.ns if len(row.ns) else None)


def follow(job: World, plan: JobPlan, hosts: list[dict], pools: dict) -> int:
    """Ranks 1..N-1: measure what rank 0 asks, send it the results, until it says stop."""
    from nearlocal.engine.runner import Runner

    patience = (len(plan.cases) + 2) * (plan.case_timeout_s * plan.processes + 120) * job.size
    while True:
        try:
            message = job.recv(0, patience, "waiting for rank 0")
        except RankLost as exc:
            print(f"nearlocal: rank {job.rank}: {exc}; the run stops here", flush=True)
            return 1
        if message[0] == "stop":
            return 0
        if message[0] == "plain":
            Runner(plan.inventory, plan.settings, RankStore(job, hosts),
                   case_timeout_s=plan.case_timeout_s, processes=plan.processes).run(plan.plain())
            job.send(("done",), 0, START_TIMEOUT_S, "ending its cases")
        elif message[0] == "rack":  # rank 0's resolved case: nothing of it is parsed here
            reply = parts.run_part(parts.rack_context(job, message[1], plan, hosts, pools))
            job.send(reply, 0, START_TIMEOUT_S, "sending a rack result")
