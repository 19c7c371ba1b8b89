"""What a rack method is and what runs it: each is a `Method` (so `--method`, `probe` and case
ids work as for any other) and a `RackMethod`: what every rank does (`run`, on every rank at once,
through the pool), and how rank 0 turns every rank's result into rows (`rows`; `rows_after_loss`
when a rank was lost during the case). The job itself (engine/mpi_job.py, rack/parts.py) looks methods up in
`RACK_METHODS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nearlocal.core.cases import Case, ResolvedCase
from nearlocal.core.methods import Delivery, Method, register_method
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import StoppingRule
from nearlocal.errors import UsageError
from nearlocal.rack.mpi import WITHOUT_MPI, World, in_mpi_job, needs_mpi
from nearlocal.rpc.protocols import protocol_code


@dataclass
class RackContext:
    """What every rank's part of a rack case gets: the world, the case as rank 0's plan resolved
    it (its pattern and merged params; nothing of it is parsed on a rank), the pool (mapped on
    this host at the same name), every rank's host id and name, this host's clock."""

    world: World
    case: Case
    pattern: Pattern
    pool: object  # the MappedRegion of the pool on this host
    host_ids: list[str]  # each rank's running kernel (boot id): one id, one coherent host
    hostnames: list[str]
    tsc_hz: float
    overhead_ticks: float
    rule: StoppingRule
    params: dict
    timeout_s: float

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def timer_overhead_ticks(self) -> float:  # what RpcSession.sample subtracts
        return self.overhead_ticks

    @property
    def coherent(self) -> bool:
        """Every rank on one host: caches are coherent, the flush protocol is not proven needed."""
        return len(set(self.host_ids)) == 1

    def ns(self, ticks: np.ndarray, per: int = 1) -> np.ndarray:
        raw = np.asarray(ticks, dtype=np.float64)
        return np.maximum(raw - self.overhead_ticks, 0.0) * 1e9 / self.tsc_hz / per

    def barrier(self, what: str) -> None:
        self.world.barrier(self.timeout_s, what)


@dataclass(frozen=True)
class RackRow:
    """One row rank 0 stores: the measuring rank, its samples, what else the row says."""

    rank: int
    raw: np.ndarray
    ns: np.ndarray
    info: dict = field(default_factory=dict)
    failed: str = ""  # a reason: the row is stored as failed (e.g. torn reads)
    extra: dict = field(default_factory=dict)  # further columns (counts)


@dataclass(frozen=True)
class RackMethod:
    name: str
    run: Callable[[RackContext], dict]  # every rank, at once
    rows: Callable[[RackContext, list[dict]], list[RackRow]]  # rank 0, from every rank's result
    # bytes of the pool the case uses, for N ranks (from the plan's resolved case: its pattern)
    pool_bytes: Callable[[ResolvedCase, int], int]
    min_ranks: int = 2
    # False: each rank maps its own region by the case's name (RDMA registers it), no token
    # proves it is one memory
    shared_pool: bool = True
    # what the host itself lacks for the method (no RDMA device), MPI aside: a method alone
    # outside MPI on such a host is skipped with this reason, not refused
    host_needs: Callable[[object], str | None] | None = None
    # what host_needs asks of every host, in words ("an RDMA device"): the line that refuses a job
    # whose hosts differ in it (rack/hosts.py)
    every_host_needs: str = ""
    # rank 0's wait for the other ranks' results once its own part finished (given its result):
    # None is straggler_s()'s default, STRAGGLER_S plus twice the budget
    straggler_s: Callable[[RackContext, dict], float] | None = None
    # rows when some ranks were lost during the case but rank 0's part and every survivor's
    # finished: (ctx, results with None for a lost rank, {lost rank: line naming it and its host});
    # None: one failed row naming the lost ranks
    rows_after_loss: Callable[[RackContext, list, dict[int, str]], list[RackRow]] | None = None
    # the case may lose a host on purpose (host loss under the VM rig): it runs after every
    # other rack case of the run, so that nothing else is skipped for it
    may_lose_host: bool = False


# Rank 0's wait, after its own part of a rack case finished, for the others' results. The ranks
# meet at barriers, so the others finish about when rank 0 does: what is left is a last batch of
# samples (the budget), pickling and sending. A rank silent that long is lost (its host stopped
# answering: no RST, no launcher notice); docs/rack.md "Deadlines and lost ranks".
STRAGGLER_S = 60.0


def straggler_s(method: RackMethod, ctx: RackContext, own: dict) -> float:
    """How long rank 0 waits for the others once its own part finished, with `own` its result."""
    if method.straggler_s is not None:
        return method.straggler_s(ctx, own)
    return STRAGGLER_S + 2 * ctx.rule.budget_s


RACK_METHODS: dict[str, RackMethod] = {}


def is_rack(case: Case) -> bool:
    return case.method in RACK_METHODS


def shares_pool(case: Case) -> bool:
    """A rack case whose ranks meet in one pool (every host maps the same memory)."""
    return RACK_METHODS[case.method].shared_pool


def refuse_without_mpi(cases: list[Case], inventory=None) -> None:
    """Only rack cases asked for, outside an MPI job: bad input, one line saying how to launch
    (the first case's method's line). Where the host lacks what every one of them needs besides
    MPI (no RDMA device), they are skipped rows with that reason instead."""
    if not cases or in_mpi_job() or not all(is_rack(case) for case in cases):
        return
    if inventory is not None and all(
            RACK_METHODS[c.method].host_needs and RACK_METHODS[c.method].host_needs(inventory)
            for c in cases):
        return
    from nearlocal.core.methods import get_method

    needs = get_method(cases[0].method).needs
    raise UsageError((needs(None) if needs else None) or WITHOUT_MPI)


def register_rack(rack: RackMethod, summary: str, params: dict, check_params=None,
                  check_pattern=None, accesses: tuple[str, ...] = ("write",), sample_bytes=None,
                  needs=needs_mpi, check_case=None, case_needs=None,
                  cpu_flags: tuple[str, ...] = ("rdtscp", "clflushopt"),
                  stores_in_region: bool = False, delivery: Delivery | None = None) -> None:
    """A rack method: a `Method` (--method, probe, case ids) and what its ranks do."""
    def check(values: dict) -> None:
        if "protocol" in params:
            protocol_code(str(values.get("protocol", "flush")))
        if check_params:
            check_params(values)

    register_method(Method(
        cacheable=False,
        name=rack.name, marker="cpu", summary=summary, accesses=accesses, state="-",
        open_session=_not_in_a_worker, cpu_flags=cpu_flags, params=params,
        needs=needs, markers=("cpu",), check_params=check, check_pattern=check_pattern,
        check_case=check_case, case_needs=case_needs, sample_bytes=sample_bytes,
        stores_in_region=stores_in_region, delivery=delivery))
    RACK_METHODS[rack.name] = rack


def _not_in_a_worker(ctx):
    raise UsageError(f"{ctx.case.method} runs across the ranks of an MPI job, not in a worker")
