"""`nearlocal run` as one run across the ranks of an MPI job (docs/rack.md).

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

import argparse
import contextlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rack.mpi import RankLost, World, world

if TYPE_CHECKING:
    from nearlocal.store.writer import Store

START_TIMEOUT_S = 300.0  # ranks start, import and probe at their own pace
TOKEN_WORDS = 2
RANKS_LOST = 1  # rank 0's exit code when the run is stored without some ranks


@dataclass
class Plan:
    cases: list
    inventory: object
    settings: object
    processes: int
    case_timeout_s: float
    planned: object = None  # the engine.plan.Plan of the cases (each case decided once)

    def plain(self) -> list:
        """The plan's entries of ordinary (not rack) cases, as the runner takes them."""
        from nearlocal.rack.framework import is_rack

        return [e for e in self.planned.entries if not is_rack(e.case)]

    def rack(self) -> list:
        """The plan's entries of rack cases: resolved case, row facts and decision each."""
        from nearlocal.rack.framework import is_rack

        return [e for e in self.planned.entries if is_rack(e.case)]


def run_job(args: argparse.Namespace) -> int:
    """The MPI form of `nearlocal run`: rank 0 stores the run, the others measure for it."""
    job = world()
    try:
        return _run_job(job, args)
    except RankLost as exc:  # before the run was stored (the start), or on a follower
        print(f"nearlocal: rank {job.rank}: {exc}", flush=True)
        return 1


def _run_job(job: World, args: argparse.Namespace) -> int:
    held = job.bcast(_held_llcs(args) if job.rank == 0 else None, START_TIMEOUT_S,
                     "hearing the LLC the store holds for each host")
    local, plan = _check_here(args, job.rank, held)
    answers = job.gather(local, START_TIMEOUT_S, "checking every host before the run")
    problem = _first_problem(answers) if job.rank == 0 else None
    problem = job.bcast(problem, START_TIMEOUT_S, "hearing whether the run goes ahead")
    if problem:
        if job.rank == 0:
            raise UsageError(problem)
        return 2
    hosts = job.bcast(answers, START_TIMEOUT_S, "hearing every host's answer")
    pools = _open_pools(job, plan, args.allow_write, hosts)
    try:
        pingpong = job.pingpong_us(1 - job.rank) if job.rank < 2 else None
        code = _lead(job, args, plan, hosts, pools, pingpong) if job.rank == 0 \
            else _follow(job, plan, hosts, pools)
    finally:
        for region in pools.values():  # rank 0's pool file goes with it
            region.close()
    if job.rank == 0 and code == RANKS_LOST:
        job.abort(code)  # ranks that hang, or were left behind, would keep the job alive
    return code


# --- before the run: every host checks, rank 0 decides --------------------------------------

def _held_llcs(args: argparse.Namespace) -> dict:
    """Per box, the LLC rank 0's store holds (engine.plan.settle_llc): the ranks on other hosts
    have no store of their own to read it from."""
    from nearlocal.store.boxes import held_llcs

    return held_llcs(Path(args.out))


def _check_here(args: argparse.Namespace, rank: int, held: dict) -> tuple[dict, Plan | None]:
    """This rank's answer: who it is, and the first problem it found with the command line here
    (as the line a plain `nearlocal run` would print, exit 2). Its cases are classified by the
    LLC the store holds for its box, as a plain run's are."""
    import socket

    from nearlocal import __version__
    from nearlocal.engine.plan import settle_llc
    from nearlocal.probe import probe

    answer = {"rank": rank, "version": __version__, "hostname": socket.gethostname(),
              "pid": os.getpid(), "host_id": "", "kernel_id": _kernel_id(), "error": "",
              "case_ids": [], "inventory": {},
              "skips": {}}
    plan = None
    try:
        inventory = settle_llc(probe(), held)
        answer["host_id"] = inventory.host_id
        answer["inventory"] = inventory.to_dict()
        plan = _plan(args, inventory)
        answer["case_ids"] = [c.id for c in plan.cases]
        answer["skips"] = _rack_skips(plan)
        answer["cpus"] = len(os.sched_getaffinity(0))
    except UsageError as exc:
        answer["error"] = str(exc)
    return answer, plan


def _kernel_id() -> str:
    """Which host a rank runs on: its running kernel (the boot id, new at every boot). Not the
    inventory's host_id, which names a kind of hardware: a rack of identical servers shares
    one, and ranks on two of them are not on one coherent host."""
    import socket

    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"host {socket.gethostname()}"


def _one_kernel(hosts: list[dict]) -> bool:
    """Every rank on one running kernel: their caches are coherent (one host)."""
    return len({h["kernel_id"] for h in hosts}) == 1


def _plan(args: argparse.Namespace, inventory) -> Plan:
    from nearlocal.engine.plan import Refuse, plan_cases
    from nearlocal.frontends.selection import run_settings, selected_cases
    from nearlocal.rack.framework import is_rack, shares_pool

    settings = run_settings(args)
    from nearlocal.reporters import json_path

    target = json_path(args)
    if target and not Path(target).resolve().parent.is_dir():
        raise UsageError(f"--json: directory {Path(target).parent} does not exist")
    planned = plan_cases(selected_cases(args, inventory), inventory, settings)
    for entry in planned.entries:
        if isinstance(entry.decision, Refuse):
            raise UsageError(entry.decision.error)
        if is_rack(entry.case) and entry.reason and shares_pool(entry.case):
            raise UsageError(f"pool {entry.case.region}: {entry.reason}")  # every host has it
    return Plan(planned.cases, inventory, planned.worker_settings(),  # this host's one clock
                settings.processes, max(120.0, 20 * settings.budget_s), planned)


def _rack_skips(plan: Plan) -> dict[str, str]:
    """The rack cases this host cannot run, with probe's reason (an rdma-* case on a host
    without a usable RDMA device): every host must decide each the same way."""
    return {entry.case.id: entry.reason for entry in plan.rack() if entry.reason}


def _what_it_needs(case_id: str) -> str:
    """What every host of the job must have for the case, as its rack method declares it."""
    from nearlocal.rack.framework import RACK_METHODS

    method = case_id.split("/")[0]  # a case id begins with its method
    needs = RACK_METHODS[method].every_host_needs
    if needs:
        return f"every rank of {method} needs {needs}"
    return f"every rank of {method} runs its part: every host needs what this one lacks"


def _first_problem(answers: list[dict]) -> str | None:
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
                    f"{first['skips'][case_id]}: {_what_it_needs(case_id)}")
    return None


def _pool_sizes(plan: Plan, size: int, shared: bool = True) -> dict[str, int]:
    """Bytes to map of each region the rack cases use: the shared pools, or (shared=False) the
    regions each rank maps for itself (RDMA registers them)."""
    from nearlocal.rack.framework import RACK_METHODS

    sizes: dict[str, int] = {}
    for entry in plan.rack():
        method = RACK_METHODS[entry.case.method]
        if method.shared_pool == shared and entry.runs:
            need = method.pool_bytes(entry.resolved, size)
            region = entry.case.region
            sizes[region] = max(sizes.get(region, 4096), -(-need // 4096) * 4096)
    return sizes


def _open_pools(job: World, plan: Plan, allow_write: bool, hosts: list[dict]) -> dict:
    """Every rack pool mapped on every rank, proven to be one memory; else exit 2 for all."""
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.rpc.sync import FLUSH, flush_written

    sizes = _pool_sizes(plan, job.size)
    pools: dict = {}
    local_problem = ""  # a region each rank maps for itself (rdma-*): told like a pool's
    for text, size in _pool_sizes(plan, job.size, shared=False).items():
        spec = parse_region(text)
        try:
            pools[text] = region_kind(spec).open(spec, size, "wb", allow_write)
        except (UsageError, OSError) as exc:
            local_problem = (f"on host {hosts[job.rank]['hostname']} (rank {job.rank}): cannot "
                             f"map {text}: {exc}")
            break
    tokens = {}
    problem = local_problem if job.rank == 0 else ""
    if job.rank == 0 and not problem:
        try:
            for text, size in sizes.items():
                spec = parse_region(text)
                pools[text] = region_kind(spec).open(spec, size, "wb", allow_write)
                token = np.frombuffer(secrets.token_bytes(8 * TOKEN_WORDS), np.uint64).copy()
                words = pools[text].array.view(np.uint64)
                words[:TOKEN_WORDS] = token
                flush_written(pools[text].array, 0, TOKEN_WORDS, FLUSH)
                tokens[text] = token.tolist()
        except (UsageError, OSError) as exc:
            problem = f"pool {text} cannot be mapped on host {hosts[0]['hostname']} (rank 0): {exc}"
    tokens = job.bcast((tokens, problem), START_TIMEOUT_S, "hearing the pool's token")
    tokens, problem = tokens
    if job.rank and not problem:
        problem = local_problem or _attach(pools, sizes, tokens, hosts[job.rank])
    problems = job.gather(problem, START_TIMEOUT_S, "checking the pool on every host")
    first = next((p for p in problems if p), "") if job.rank == 0 else ""
    first = job.bcast(first, START_TIMEOUT_S, "hearing whether the pool is one memory")
    if first:
        for region in pools.values():
            region.close()
        if job.rank == 0:
            raise UsageError(first)
        raise SystemExit(2)
    return pools


def _attach(pools: dict, sizes: dict, tokens: dict, me: dict) -> str:
    """Map each pool on this host by the same name; "" or the problem, naming this host."""
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.rpc.sync import FLUSH, invalidate

    for text, size in sizes.items():
        spec = parse_region(text)
        where = f"on host {me['hostname']} (rank {me['rank']})"
        kind = region_kind(spec)  # a file: the same one must be there on every host
        if kind.creates is not None and not kind.creates(spec).exists():
            return (f"pool {text} does not exist {where}: every rank needs the same pool "
                    "(a shared device or file)")
        try:
            pools[text] = region_kind(spec).open(spec, size, "wb", True)
        except (UsageError, OSError) as exc:
            return f"pool {text} cannot be mapped {where}: {exc}"
        raw = pools[text].array
        words = raw.view(np.uint64)
        invalidate(raw, words, 0, TOKEN_WORDS, FLUSH)
        if words[:TOKEN_WORDS].tolist() != tokens[text]:
            return (f"pool {text} {where} is not the memory rank 0 mapped (its token is not "
                    "there): a different device or file of the same name")
    return ""


# --- the run ---------------------------------------------------------------------------------

def _host_columns(hosts: list[dict], rank: int) -> dict:
    """What every row of `rank` says about where it was measured."""
    me = hosts[rank]
    sharing = [h["rank"] for h in hosts if h["kernel_id"] == me["kernel_id"]]
    coherent = _one_kernel(hosts)
    note = "coherent host: every rank on one host" if coherent else (
        f"shares its host with ranks {', '.join(map(str, sharing))}" if len(sharing) > 1 else "")
    return {"host": me["hostname"], "rank": rank, "host_id": me["host_id"], "host_note": note}


def _tagged(row: dict, hosts: list[dict], rank: int) -> dict:
    return {**row, **_host_columns(hosts, rank), "case_id": f"{row['case_id']}/rank={rank}"}


class _RankStore:
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
            self.store.add_case(_tagged(row, self.hosts, 0), raw, ns, process, placement)
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


def _lead(job: World, args, plan: Plan, hosts: list[dict], pools: dict,
          pingpong_us: float | None) -> int:
    from nearlocal.engine.metadata import run_metadata
    from nearlocal.engine.runner import Runner
    from nearlocal.frontends import console
    from nearlocal.rack.framework import is_rack
    from nearlocal.store import load
    from nearlocal.store.writer import Store

    meta = run_metadata(plan.inventory, plan.settings, args.suite, processes=plan.processes)
    coherent = _one_kernel(hosts)
    hosts[0]["pingpong_us"] = pingpong_us  # rows made here carry it (the report's note)
    meta["mpi"] = {"ranks": job.size, "coherent_host": coherent, "pingpong_us": pingpong_us,
                   "hosts": [{k: h[k] for k in ("rank", "hostname", "host_id", "kernel_id", "pid",
                                                "version")}
                             for h in hosts]}
    meta["host_inventories"] = {str(h["rank"]): h["inventory"] for h in hosts}
    store = Store.create(Path(args.out), meta)
    lost: dict[int, str] = {}
    waiting = [0]  # the rank rank 0 is waiting on (named if the launcher ends the job)
    plain = [c for c in plan.cases if not is_rack(c)]
    try:
        if plain:
            for rank in range(job.size):
                waiting[0] = rank
                if rank == 0:
                    Runner(plan.inventory, plan.settings, _RankStore(job, hosts, store),
                           case_timeout_s=plan.case_timeout_s,
                           processes=plan.processes).run(plan.plain())
                    continue
                try:
                    _collect_plain(job, rank, store, hosts, plan, len(plain))
                except RankLost as exc:
                    lost[rank] = _lost_line(exc, hosts)
        for entry in _rack_order(plan.rack()):
            _rack_case(job, entry, plan, hosts, pools, store, lost, waiting)
    except KeyboardInterrupt:  # SIGTERM from the launcher: a rank died (no ULFM)
        why = _who_died(hosts, waiting[0])
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
    run = load(path)
    from nearlocal.reporters import emit, side_console

    try:
        emit(console.RUN_FORMATS, console.RunRows(run.meta, run.cases), args,
             text=not args.quiet)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # the reader of stdout went away: not the file
            raise
        raise UsageError(f"cannot write --json {args.json}: {exc.strerror}; the run is "
                         f"stored in {path}") from None
    side_console(args).print(f"stored {path} ({job.size} ranks on "
                             f"{len({h['kernel_id'] for h in hosts})} host(s))"
                             + (f" (incomplete: {store.meta['incomplete_reason']})" if lost
                                else ""))
    return RANKS_LOST if lost else 0


def _rack_order(entries: list) -> list:
    """The rack cases in the plan's order, those that may lose a host (host loss under the VM
    rig) after every other: a lost host skips every rack case after it."""
    from nearlocal.rack.framework import RACK_METHODS

    return sorted(entries, key=lambda entry: RACK_METHODS[entry.case.method].may_lose_host)


def _lost_line(exc: RankLost, hosts: list[dict]) -> str:
    if 0 <= exc.rank < len(hosts):
        return f"rank {exc.rank} on host {hosts[exc.rank]['hostname']} {exc.why}"
    return str(exc)


def _who_died(hosts: list[dict], waiting: int) -> str:
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


def _collect_plain(job: World, rank: int, store, hosts: list[dict], plan: Plan, count: int) -> None:
    job.send(("plain",), rank, START_TIMEOUT_S, "starting its cases")
    per_message = plan.case_timeout_s * plan.processes + 120  # one case, compile included
    while True:
        message = job.recv(rank, per_message, "measuring its cases")
        if message[0] == "done":
            return
        _, row, raw, ns, process, placement = message
        store.add_case(_tagged(row, hosts, rank), raw, ns, process, placement)


def _rack_context(job: World, resolved, plan: Plan, hosts: list[dict], pools: dict):
    """What this rank's part of a rack case gets, from the case as rank 0's plan resolved it."""
    from nearlocal.rack.framework import RackContext

    return RackContext(job, resolved.case, resolved.pattern, pools[resolved.case.region],
                       [h["kernel_id"] for h in hosts], [h["hostname"] for h in hosts],
                       plan.settings.tsc_hz, plan.settings.overhead_ticks, plan.settings.rule,
                       dict(resolved.params), plan.case_timeout_s)


def _run_part(ctx) -> tuple[str, object]:
    """This rank's part of a rack case: ("ok", result) or ("failed", one line)."""
    import traceback

    from nearlocal.rack.framework import RACK_METHODS

    try:
        return "ok", RACK_METHODS[ctx.case.method].run(ctx)
    except Exception as exc:  # RankLost too: a barrier another rank never reached
        return "failed", traceback.format_exception_only(type(exc), exc)[-1].strip()


def _rack_case(job: World, entry, plan: Plan, hosts: list[dict], pools: dict, store,
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
        store.add_case({**_tagged(base, hosts, 0), "status": "skipped", "reason": why})
        return
    for rank in range(1, job.size):
        job.send(("rack", entry.resolved), rank, START_TIMEOUT_S, "starting a rack case")
    ctx = _rack_context(job, entry.resolved, plan, hosts, pools)
    results, gone = _gather_parts(job, method, ctx, plan, hosts, waiting)
    lost.update(gone)
    failures = [f"rank {r}: {got[1]}" for r, got in enumerate(results)
                if got is not None and got[0] != "ok"]
    if gone and not failures and method.rows_after_loss is not None:
        _store_rows(method.rows_after_loss(ctx, [None if got is None else got[1]
                                               for got in results], gone),
                    ctx, base, hosts, store)
        return
    if gone or failures:
        store.add_case({**_tagged(base, hosts, 0), "status": "failed",
                        "reason": "; ".join([*gone.values(), *failures])})
        return
    _store_rows(method.rows(ctx, [value for _, value in results]), ctx, base, hosts, store)


def _gather_parts(job: World, method, ctx, plan: Plan, hosts: list[dict],
                  waiting: list) -> tuple[list, dict[int, str]]:
    """Rank 0's own part, then every other rank's result: [(status, value) or None for a lost
    rank], and {lost rank: line}. Once rank 0's part finished, the others get the method's
    straggler wait (the ranks met at its barriers); after a failure of rank 0's part the others
    may still be waiting at a barrier, so they get the case's whole timeout."""
    from nearlocal.rack.framework import straggler_s

    results: list = [None] * job.size
    results[0] = _run_part(ctx)
    wait = straggler_s(method, ctx, results[0][1]) if results[0][0] == "ok" \
        else plan.case_timeout_s + 60
    deadline = time.monotonic() + wait
    gone: dict[int, str] = {}
    for rank in range(1, job.size):
        waiting[0] = rank
        try:
            results[rank] = job.recv(rank, max(deadline - time.monotonic(), 1.0),
                                     f"measuring {ctx.case.id}")
        except RankLost as exc:
            gone[rank] = _lost_line(exc, hosts)
    return results, gone


def _store_rows(rows: list, ctx, base: dict, hosts: list[dict], store) -> None:
    """A rack case's rows, each with its rank's host columns, statistics and samples."""
    from nearlocal.core.sampling import summarize

    for row in rows:
        stats = summarize(row.ns, base["bytes_moved"]) if len(row.ns) else {"n_samples": 0}
        info = {**row.info, **_host_columns(hosts, row.rank),
                "mpi_pingpong_us": hosts[0].get("pingpong_us")}
        store.add_case({**_tagged(base, hosts, row.rank), **stats, **row.extra,
                        "status": "failed" if row.failed else "ok", "reason": row.failed,
                        "clock": "tsc", "converged": bool(row.info.get("converged", True)),
                        "elapsed_s": row.info.get("elapsed_s"), "info": info,
                        "timer_overhead_ns": ctx.overhead_ticks * 1e9 / ctx.tsc_hz},
                       row.raw if len(row.ns) else None, row.ns if len(row.ns) else None)


def _follow(job: World, plan: Plan, hosts: list[dict], pools: dict) -> int:
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
            Runner(plan.inventory, plan.settings, _RankStore(job, hosts),
                   case_timeout_s=plan.case_timeout_s, processes=plan.processes).run(plan.plain())
            job.send(("done",), 0, START_TIMEOUT_S, "ending its cases")
        elif message[0] == "rack":  # rank 0's resolved case: nothing of it is parsed here
            reply = _run_part(_rack_context(job, message[1], plan, hosts, pools))
            job.send(reply, 0, START_TIMEOUT_S, "sending a rack result")


