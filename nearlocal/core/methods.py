"""The method registry: how bytes move. Each method is declared once with what it needs, so
`probe` can say why it cannot run and the runner never branches on hardware.

A method's `open_session(ctx)` runs in the worker and returns a Session whose `sample(n)` returns
(raw, ns): n samples in the clock's own unit and in nanoseconds with the timer's overhead removed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from nearlocal.lazy import lazy_import
from nearlocal.plugins import declare

np = lazy_import("numpy")


if TYPE_CHECKING:
    from nearlocal.core.cases import Case
    from nearlocal.core.patterns import Pattern
    from nearlocal.probe import HostInventory
    from nearlocal.regions import MappedRegion


@dataclass
class SessionContext:
    """What a method gets in the worker: the case, its pattern, mapped regions and the clock."""

    case: Case
    pattern: Pattern
    src: MappedRegion
    dst: MappedRegion
    tsc_hz: float
    timer_overhead_ticks: float
    params: dict = field(default_factory=dict)
    inventory: HostInventory | None = None  # the run's, probed once in the parent
    clock_quantum_ticks: float = 1.0  # the step the TSC moves in (timer.ClockCalibration)
    # what the case's first process chose from its timing (a session's `chosen`: passes per
    # sample, the drain cost it subtracts); later processes take it as it is, so every process
    # of a case measures the same thing. None: this process is the first.
    chosen: dict | None = None

    @property
    def numa(self) -> list | None:
        """The run's NUMA nodes (None: not given; a session probes them itself)."""
        return list(self.inventory.numa) if self.inventory is not None else None


class Session(Protocol):
    clock: str  # "tsc", "cuda-event", ...
    info: dict  # recorded on the case row (e.g. overhead, launch geometry)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]: ...

    def close(self) -> None: ...


def chosen(session: Session) -> dict:
    """What a session chose from timing that every later process of its case must take
    (SessionContext.chosen): plain data; {} for a session that chooses nothing."""
    return dict(getattr(session, "chosen", None) or {})


def ops_per_sample(session: Session) -> int:
    """How many operations one sample's ns is divided by (a chase's hops, an RPC batch's
    requests): the clock's resolution and the timer overhead of one timed interval shrink by the
    same count in that figure. A session states it as `ops_per_sample`; 1 when it does not."""
    return max(1, int(getattr(session, "ops_per_sample", 1)))


def _per_work_request(n: int, facts: dict) -> int:
    """RDMA: one work request carries up to max_sge pieces (sge=one: one piece each)."""
    if str(facts.get("sge", "")) == "one":
        return n
    try:
        per_request = int(facts.get("max_sge") or 0)
    except (TypeError, ValueError):
        per_request = 0
    return -(-n // per_request) if per_request > 0 else n


# How many calls (launches, copies, descriptors, work requests) one read of n fragments costs a
# method: the per-call term of the what-if's path model (whatif/fit.py). `facts` are the row's
# effective params and info (RDMA's max_sge).
CALL_RULES: dict[str, Callable[[int, dict], int]] = {
    "one": lambda n, facts: 1,  # one launch / one compiled loop moves every fragment
    "per-fragment": lambda n, facts: n,  # one copy, descriptor or I/O per fragment
    "per-work-request": _per_work_request,
}
# What moves a method's bytes: the hops of a serving path are made of these (whatif/paths.py)
MOVERS = ("cpu", "dsa", "gpu", "nic", "storage")


@dataclass(frozen=True)
class Delivery:
    """That a method delivers a read's bytes to the other side (a copy, not loads kept in
    registers), what moves them and how many calls a read of n fragments costs: what the
    what-if needs to stand its rows for a hop of a serving path."""

    mover: str  # a MOVERS entry
    calls: str  # a CALL_RULES key

    def __post_init__(self) -> None:
        if self.mover not in MOVERS or self.calls not in CALL_RULES:
            raise ValueError(f"Delivery({self.mover!r}, {self.calls!r}): mover is one of "
                             f"{', '.join(MOVERS)}, calls one of {', '.join(CALL_RULES)}")


@dataclass(frozen=True)
class Method:
    name: str
    marker: str  # "cpu", "dsa", "gpu": the pytest marker of its bench test (what runs it)
    summary: str
    accesses: tuple[str, ...]  # "read" (region -> peer), "write" (peer -> region)
    state: str  # cache state of the region when timing starts: "warm", "cold", "-"
    open_session: Callable[[SessionContext], Session]
    region_spaces: frozenset[str] = frozenset({"host"})
    peer_spaces: frozenset[str] = frozenset({"host"})
    cpu_flags: tuple[str, ...] = ()
    needs: Callable[[HostInventory], str | None] | None = None
    params: dict = field(default_factory=dict)  # default method parameters
    moves_bytes: bool = True  # False for phases that move no data (no bytes_moved, no GB/s)
    markers: tuple[str, ...] = ()
    # bad parameter values -> UsageError, checked before anything runs (defaults merged in)
    check_params: Callable[[dict], None] | None = None
    # a pattern the method cannot use -> UsageError, checked before the run (e.g. rpc-* need rpc:)
    check_pattern: Callable[[Pattern], None] | None = None
    # a parameter whose limit comes from the pattern (qd <= a ring's slots) -> UsageError
    check_case: Callable[[dict, Pattern], None] | None = None
    # why this box's device cannot take one case's parameters (an RDMA path MTU above the port's
    # active MTU), from its params (defaults merged) and the probed box; None when it can. The
    # case is a skipped row among others (a suite's), bad input when every case selected is one
    # (engine/plan.py): the user named it
    case_needs: Callable[[dict, HostInventory], str | None] | None = None
    # bytes one sample moves when that is not the pattern's total (one RPC of a ring, a round trip)
    sample_bytes: Callable[[Pattern], int] | None = None
    # writes into the region even when it reads it (chase lays its pointer ring there)
    stores_in_region: bool = False
    # False: the kernel never reads or writes the peer (loads kept in registers, stores of a
    # constant, a ring inside the region), so the peer is mapped at PEER_STUB_BYTES, not at the
    # pattern's span: a 1 GiB chase mapped and filled a 1 GiB peer it never touched, 1-4 s of
    # each worker process on the 2-vCPU VM
    touches_peer: bool = True
    # True: its accesses may be served by the CPU caches when the case's span is below the
    # last-level cache's size (plain loads, stores, copies, chases). False: every
    # timed access reaches memory or a device whatever the size (nontemporal stores, flushes,
    # DMA, GPU). A row says which (`reaches_memory`): compare judges such cases against the
    # host's memory probe. Every method declares it (None is refused): a default either way
    # judged some plugin's cases against the wrong host probe.
    cacheable: bool | None = None
    # its loads of the source may be served by the CPU caches although its stores reach memory
    # (nt-copy, movdir64b: plain loads of the peer, then nontemporal or direct stores): a row
    # then says `reaches_memory` (its stores land in memory) while its source was read from a
    # cache below the LLC's size (`source_reaches_memory` false). None: as `cacheable`
    cacheable_loads: bool | None = None
    # the suites whose generic grid the method joins ("quick": local DRAM over quick's sizes)
    suites: tuple[str, ...] = ()
    # what it measures on the pool regions (cpu/pool.py): "read" (quick's pool rows),
    # "bandwidth" (mlc's peak with every CPU), "latency" (idle latency), "loaded-latency"
    pool_roles: frozenset[str] = frozenset()
    # what one sample's time is (a row's `measures`): "transfer", moving the pattern's bytes
    # (sizes, GB/s, fragment plots), or "operation", one operation that is no such transfer
    # (a dependent load, an RPC, a metadata phase)
    measures: str = "transfer"
    # None: its transfer does not land a read's bytes on the other side (loads, flushes, an RPC,
    # a chase), so no serving path's hop stands on its rows
    delivery: Delivery | None = None

    def __post_init__(self) -> None:
        if self.cacheable is None:
            raise TypeError(f"method {self.name!r}: declare cacheable=True (its accesses may hit "
                            "the CPU caches below the LLC's size) or False (they always reach "
                            "memory or a device)")

    @property
    def loads_cacheable(self) -> bool:
        """Whether its loads of the source may hit the CPU caches (`cacheable_loads`, else
        `cacheable`)."""
        return bool(self.cacheable if self.cacheable_loads is None else self.cacheable_loads)

    def bytes_moved(self, pattern: Pattern) -> int:
        """Bytes one sample moves: what GB/s is derived from (0: no GB/s)."""
        if not self.moves_bytes:
            return 0
        return self.sample_bytes(pattern) if self.sample_bytes else pattern.total_bytes

    def unavailable(self, inventory: HostInventory) -> str | None:
        lacks = inventory.cpu.lacks(self.cpu_flags)  # the CPU's flags and numba's target
        if lacks:
            return lacks
        return self.needs(inventory) if self.needs else None


METHODS: dict[str, Method] = {}
PEER_STUB_BYTES = 64  # the peer of a method that does not touch it: one line

# The modules that declare methods (and their suites) are found, never named here: each is
# listed in the entry-point group plugins.METHOD_GROUP, nearlocal's own in its pyproject.toml,
# in the order methods are listed and declared; NEARLOCAL_PLUGINS adds more (plugins.py).


def register_method(method: Method) -> Method:
    return declare(METHODS, method.name, method, "method")


def load_methods() -> dict[str, Method]:
    """Every method: the modules of the method group imported once (nearlocal.plugins)."""
    from nearlocal.plugins import METHOD_GROUP, load_group

    load_group(METHOD_GROUP)
    return METHODS


def methods_joining(suite: str) -> list[str]:
    """The methods that join `suite`'s generic grid, in the order they were declared."""
    return [m.name for m in load_methods().values() if suite in m.suites]


def methods_with_param(name: str, marker: str | None = None) -> list[str]:
    """The registered methods (of `marker`, or all) that take parameter `name`: what help texts
    and errors list, so a method that gains one is named there without another edit."""
    return [method.name for method in load_methods().values()
            if name in method.params and marker in (None, method.marker)]


def methods_in_role(role: str) -> list[str]:
    """The methods that play `role` on the pool regions, in the order they were declared."""
    return [m.name for m in load_methods().values() if role in m.pool_roles]


def get_method(name: str) -> Method:
    from nearlocal.errors import UsageError

    methods = load_methods()
    if name not in methods:
        raise UsageError(f"unknown method {name!r}: valid methods are {', '.join(methods)}")
    return methods[name]
