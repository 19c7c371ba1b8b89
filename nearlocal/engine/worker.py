"""The worker process: maps regions, opens a method's session and takes samples in phases
(check -> warm-up -> trials -> summary). A case that crashes it (SIGBUS from a vanished dax device,
SIGSEGV) takes down only this process; the parent records the signal and starts a new one."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from nearlocal.core.cases import Case, ResolvedCase, resolve
from nearlocal.core.methods import (
    Session,
    SessionContext,
    load_methods,
    ops_per_sample,
)
from nearlocal.core.methods import chosen as chosen_by
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import (
    DEFAULT_PLACEMENTS,
    StoppingRule,
    log_spread,
    run_trials,
    summarize,
)
from nearlocal.engine.children import ignore_interrupts, resend_swallowed
from nearlocal.engine.stability.placement import describe_placement
from nearlocal.errors import Unavailable, UsageError
from nearlocal.probe import HostInventory
from nearlocal.regions import MappedRegion, check_capacity, region_kind

if TYPE_CHECKING:
    from nearlocal.kernels.timer import ClockCalibration

# Placements are held at once only while all of them take at most this share of the memory
# available (else one a process: the kernel would hand a released placement's pages back)
PLACEMENT_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class Origin:
    """The parent's environment, working directory and import path at the worker's start: a
    worker forked from the run's fork server (started once, at the first worker) takes these
    instead of the server's, so a variable set between runs (NEARLOCAL_PLUGINS, a test's
    monkeypatch) reaches it as it reached a spawned one."""

    environ: dict[str, str]
    cwd: str
    sys_path: list[str]

    @classmethod
    def here(cls) -> Origin:
        return cls(dict(os.environ), os.getcwd(), list(sys.path))

    def enter(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        with contextlib.suppress(OSError):  # a directory gone since: the server's stays
            os.chdir(self.cwd)
        sys.path[:] = self.sys_path


@dataclass(frozen=True)
class WorkerSettings:
    rule: StoppingRule
    tsc_hz: float
    allow_write: bool
    # The run's clock (timer overhead, step), calibrated once in the parent: every worker
    # process of a run subtracts the same overhead and states the same step, so processes
    # differ only in what they measure. None: the runner calibrates it before its first worker.
    clock: ClockCalibration | None = None
    # the box as the parent probed it, once per run: sessions read it instead of probing again
    inventory: HostInventory | None = None
    placements: int = DEFAULT_PLACEMENTS  # drawn per process where the case's regions allow

    @property
    def overhead_ticks(self) -> float:
        return self.clock.overhead_ticks if self.clock is not None else 0.0

    @property
    def quantum_ticks(self) -> float:
        return self.clock.quantum_ticks if self.clock is not None else 1.0


@dataclass
class OpenCase:
    """A case ready to sample: its pattern, the mapped region under test and the open session."""

    case: Case
    pattern: Pattern
    region: MappedRegion
    session: Session
    peer: MappedRegion
    peer_bytes: int = 0  # what was mapped of the peer (one line for a method that never uses it)

    @property
    def info(self) -> dict:
        return {**self.region.info, "peer_bytes": self.peer_bytes, **self.session.info}


def resolved(case: Case | ResolvedCase) -> ResolvedCase:
    """A plan's resolved case as it is; a bare case (a library caller, a test) resolved here."""
    return case if isinstance(case, ResolvedCase) else resolve(case)


@contextmanager
def open_case(case: Case | ResolvedCase, tsc_hz: float, overhead_ticks: float, allow_write: bool,
              inventory: HostInventory | None = None,
              quantum_ticks: float = 1.0, chosen: dict | None = None,
              keep: contextlib.ExitStack | None = None) -> Iterator[OpenCase]:
    """Map the case's region and peer and open its method's session; all closed on exit.
    Shared by the worker process and the in-process pytest-benchmark front end. `case`: as the
    plan resolved it (nothing of it is parsed again here). `inventory`: the run's (sessions
    that need the box's NUMA nodes or DSA queues read it); `chosen`: what the case's first
    process chose (SessionContext.chosen); `keep`: the mappings stay until it closes (the
    session still closes here), so the next open of the case lands on other pages."""
    facts = resolved(case)
    case, method = facts.case, facts.case.method_entry
    # a write: scattered pieces land in the region, packed in the peer
    pattern = facts.pattern.swapped() if case.access == "write" else facts.pattern
    region_spec, peer_spec = facts.region, facts.peer
    region_size, peer_size = facts.spans
    for spec, size in ((region_spec, region_size), (peer_spec, peer_size)):
        check_capacity(spec, size)  # again here: free memory may have gone since planning
    with contextlib.ExitStack() as own:
        mappings = keep if keep is not None else own
        region = region_kind(region_spec).open(region_spec, region_size, case.attr, allow_write)
        mappings.callback(region.close)
        # the peer is a region too: a user's file there is written only with --allow-write
        peer = region_kind(peer_spec).open(peer_spec, peer_size, "wb", allow_write)
        mappings.callback(peer.close)
        src, dst = (region, peer) if case.access == "read" else (peer, region)
        ctx = SessionContext(case, pattern, src, dst, tsc_hz, overhead_ticks,
                             dict(facts.params), inventory, quantum_ticks, chosen)
        session = method.open_session(ctx)
        own.callback(session.close)
        yield OpenCase(case, pattern, region, session, peer, peer_size)


def placements_held(case: Case | ResolvedCase, placements: int, llc_bytes: int | None = None) -> int:
    """How many placements one process draws of `case`: `placements` when both its region and
    its peer map fresh anonymous pages (RegionKind.fresh_pages), their span is within the LLC
    (`llc_bytes`; None: not known) and all of them fit at once in PLACEMENT_MEMORY_SHARE of the
    memory available now (a placement is held while the next is mapped, else the kernel hands
    the same pages back); else 1. A named file or device maps the same pages however often it
    is opened. A span beyond the LLC is drawn once a process: a second placement of it costs as
    much as measuring it (laying the 1 GiB chase's ring took 2 s a placement on the VM; the
    quick run went from 48 s to 80 s), and the case's K processes draw it K times. Its
    placement does matter in a VM (one process's own load kernel read three 1 GB buffers at
    20.6-27.5 GB/s on the 2-vCPU guest: docs/timing.md)."""
    from nearlocal.regions.memory import memory_available

    facts = resolved(case)
    if placements <= 1 or not all(region_kind(spec).fresh_pages for spec in (facts.region, facts.peer)):
        return 1
    if llc_bytes and sum(facts.spans) > llc_bytes:
        return 1
    available = memory_available()
    if available is None or placements * sum(facts.spans) > PLACEMENT_MEMORY_SHARE * available:
        return 1
    return placements


def measure(case: Case | ResolvedCase, settings: WorkerSettings,
            chosen: dict | None = None) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """One process's measurement of `case` on the run's clock: (the row's measured fields, raw
    samples, ns, the placement of each sample). What every front end measures with: a worker
    process for `run` and `accept`, pytest's own process for `pytest bench/`. The process draws
    `placements_held` placements (fresh mappings of region and peer, each held while the next
    is drawn), each with its share of the budget, its own warm-up and its facts
    (engine/stability/placement.py) in the row's info `placements`. `chosen`: what the case's first
    process chose (None: this is the first; then the first placement chooses for the rest); the
    row's `chosen` is what this process measured with."""
    case = resolved(case)
    llc = settings.inventory.cpu.llc_bytes if settings.inventory is not None else None
    count = placements_held(case, settings.placements, llc)
    rule = replace(settings.rule, budget_s=settings.rule.budget_s / count) if count > 1 \
        else settings.rule
    raws, nss, tags, facts, elapsed = [], [], [], [], 0.0
    with contextlib.ExitStack() as held:
        for placement in range(count):
            with open_case(case, settings.tsc_hz, settings.overhead_ticks, settings.allow_write,
                           settings.inventory, settings.quantum_ticks, chosen,
                           keep=held if count > 1 else None) as opened:
                raw, ns, seconds, converged = run_trials(opened.session, rule)
                chosen = chosen if chosen is not None else chosen_by(opened.session)
                # what the session says of itself, read while it is open (the same every placement)
                clock, info, ops = opened.session.clock, opened.info, ops_per_sample(opened.session)
                facts.append({"placement": placement,
                              "median_ns": float(np.median(ns)) if len(ns) else None,
                              **describe_placement({"region": opened.region.array,
                                                    "peer": opened.peer.array})})
            raws.append(np.asarray(raw, np.float64))
            nss.append(np.asarray(ns, np.float64))
            tags.append(np.full(len(ns), placement, np.int32))
            elapsed += seconds
    raw, ns = np.concatenate(raws), np.concatenate(nss)
    row = {"status": "ok", "reason": "", "clock": clock,
           # several placements: converged when their pooled samples meet the whole rule
           "converged": settings.rule.converged(ns) if count > 1 else converged,
           "elapsed_s": elapsed, "ops_per_sample": ops, "info": {**info, "placements": facts},
           "chosen": chosen, "placements": count,
           "placement_spread": log_spread(nss), **summarize(ns, case.bytes_moved)}
    clock = settings.clock
    if row["clock"] == "tsc" and clock is not None:  # the run's one clock
        row.update(timer_overhead_ns=clock.overhead_ticks * 1e9 / settings.tsc_hz,
                   clock_resolution_ns=clock.step_ns(settings.tsc_hz),
                   sample_steps=sample_steps(raw, clock))
    else:  # a session on another clock (CUDA events) states its own overhead and resolution
        row.update(timer_overhead_ns=row["info"].get("timer_overhead_ns"),
                   clock_resolution_ns=row["info"].get("clock_resolution_ns"))
    return row, raw, ns, np.concatenate(tags)


def sample_steps(raw: np.ndarray, clock) -> float:
    """How many steps of the run's clock one sample spans (its median, the timer overhead
    taken off): a figure of a few steps is the clock's as much as the case's."""
    body = float(np.median(np.asarray(raw, np.float64))) - clock.overhead_ticks
    return max(body, 0.0) / clock.quantum_ticks


def compile_case(case: Case | ResolvedCase, settings: WorkerSettings) -> tuple[int, float]:
    """Open the case and take one sample: numba compiles (or loads from its cache) the kernels
    its measurement will use. Returns the kernels numba really compiled and the seconds taken."""
    from numba.core import event

    class Counter(event.Listener):  # top-level compilations only (a kernel compiles its callees)
        count, depth = 0, 0

        def on_start(self, ev) -> None:
            self.count += self.depth == 0
            self.depth += 1

        def on_end(self, ev) -> None:
            self.depth -= 1

    counter, start = Counter(), time.perf_counter()
    with event.install_listener("numba:compile", counter), \
            open_case(case, settings.tsc_hz, settings.overhead_ticks, settings.allow_write,
                      settings.inventory, settings.quantum_ticks) as opened:
        opened.session.sample(1)
    return counter.count, time.perf_counter() - start


def _stopped(signum: int, frame: object) -> None:
    """SIGTERM from the parent: unwind (open_case removes the files it created), once; a second
    SIGTERM while unwinding is ignored, so the clean-up is not cut short."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _stop_again(kind: type) -> int | None:
    """_stopped's SystemExit, swallowed by C code it was raised in (a numba callback, which
    printed a traceback): _stopped armed again, and SIGTERM sent again (resend_swallowed)."""
    import signal

    if not issubclass(kind, SystemExit):
        return None
    signal.signal(signal.SIGTERM, _stopped)
    return signal.SIGTERM


def worker_main(conn, settings: WorkerSettings, origin: Origin | None = None) -> None:
    """A stopped worker ends quietly: SIGTERM (SystemExit) or the parent gone (a broken pipe)
    anywhere, even before the first case, is no traceback on the user's terminal."""
    import signal

    if origin is not None:
        origin.enter()
    # Ctrl-C reaches the whole process group: the parent stops this worker (and stores what was
    # measured); a KeyboardInterrupt traceback from here would only be noise. The parent stops
    # it with SIGTERM: SystemExit unwinds open_case, so the files it created are removed.
    ignore_interrupts()
    signal.signal(signal.SIGTERM, _stopped)
    sys.unraisablehook = resend_swallowed(sys.unraisablehook, _stop_again)
    code = 0
    try:
        _serve(conn, settings)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except (BrokenPipeError, EOFError, ConnectionError):
        code = 0  # the parent went away: nothing left to report to
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # no traceback from the exit itself
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)  # skip multiprocessing's own exit path: nothing of it is left to run


def _serve(conn, settings: WorkerSettings) -> None:
    """Measure what the parent asks: ("measure", case, ops) or ("compile", case); None ends."""
    conn.send(("stage", "loading the method modules"))
    load_methods()
    if settings.clock is None:  # the runner calibrates the run's clock before any worker
        raise ValueError("a worker needs the run's clock (WorkerSettings.clock)")
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone (killed): nothing left to measure for
            return
        if message is None:
            return
        kind, case = message[0], message[1]  # a ResolvedCase: nothing to parse again
        try:
            reply = (("compiled", *compile_case(case, settings)) if kind == "compile"
                     else ("ok", *measure(case, settings, message[2])))
        except Unavailable as exc:  # refused only once opened: a skipped row, its reason
            reply = ("skipped", str(exc))
        except UsageError as exc:
            reply = ("failed", str(exc))
        except Exception as exc:  # a method's own error fails that case, not the run
            reply = ("failed", traceback.format_exception_only(type(exc), exc)[-1].strip())
        try:
            conn.send(reply)
        except OSError:  # the parent is gone (killed) while this case ran
            return
