"""The runner: checks every case, runs the runnable ones in a worker process, writes each finished
case to the store as it completes. It never branches on hardware: methods and regions do. Its
parts: workers.py (the worker process it asks, one case at a time), worker_start.py (a worker's
start deadline), processes.py (how many processes a case gets), pooling.py (one row from a
case's processes), metadata.py (run.json's facts of the run)."""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from nearlocal.core.cases import ResolvedCase
from nearlocal.engine.children import interrupt_seen, raise_lost_interrupt, start_fork_server
from nearlocal.engine.pooling import _pooled, global_placements
from nearlocal.engine.processes import processes_to_settle
from nearlocal.engine.worker import WorkerSettings
from nearlocal.engine.workers import MeasuringWorker, share_of_budget
from nearlocal.probe import HostInventory

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nearlocal.engine.plan import PlanEntry
    from nearlocal.engine.sink import RunSink
    from nearlocal.engine.stability.busy import BusyRecorder
    from nearlocal.engine.stability.hostprobe import HostProber

FORK_SERVER_PRELOAD = "nearlocal.engine.forkserver"


class RunEvents:
    """What a runner tells whoever shows its progress, each a no-op here: a front end's
    progress display (frontends.progress.RunProgress) has the same methods."""

    def finished(self, row: dict) -> None:
        """A case's row, stored (after its last process)."""

    def new_pass(self, index: int) -> None:
        """Pass `index` over the cases starts (a fresh worker process)."""

    def measured(self, case_id: str, failed: bool) -> None:
        """One measurement of one pass ended: what progress counts."""

    def compiling(self, done: int, of: int, case_id: str, compiled: int) -> None:
        """Around each step of compile_kernels: `compiled` kernels so far."""

    def settle(self, case_id: str, extra: int) -> None:
        """A case whose processes disagree gets `extra` processes."""


class Runner:
    """Measures cases interleaved in passes: with `processes` = K, pass k (k = 1..K) measures
    every runnable case once, each pass in a fresh worker process (one worker per pass serves
    every case of it, one after another; a new one only after a crash), so a case's K
    measurements come from K processes, the other cases measured in between. Page placement
    and co-tenants are drawn again in each process (code layout once per run: workers fork from
    one preloaded server): their spread is sampled within the run and `nearlocal compare` can
    model it. (pyperf, by contrast, runs all processes of one benchmark before the next.) Each
    process gets budget / K; a row pools every process's samples, tagged by process. A case
    whose K processes disagree gets further passes, up to `max_processes` (processes_to_settle),
    after the K passes; its row is stored after its last."""

    def __init__(self, inventory: HostInventory, settings: WorkerSettings, store: RunSink,
                 events: RunEvents | None = None, *, processes: int = 1,
                 max_processes: int | None = None, case_timeout_s: float | None = None,
                 compile_first: bool = False, probe_host: bool | None = None):
        self.inventory = inventory
        if settings.clock is None:  # one clock per run, calibrated here, before any worker
            from nearlocal.kernels.timer import measure_clock

            settings = replace(settings, clock=measure_clock())
        self.settings = settings
        self.store = store
        self.events = events or RunEvents()
        self.compile_first = compile_first
        self.case_timeout_s = case_timeout_s or max(120.0, 20 * settings.rule.budget_s)
        if type(processes) is not int or processes < 1:  # RunSettings checks what users give
            raise ValueError(f"processes must be a positive integer, got {processes!r}")
        self.processes = processes
        # compare sets the runs' host probes side by side (hostprobe.py): walked as each worker
        # starts, by a prober process laid once per run (None: with 2 or more processes)
        self.probe_host = processes > 1 if probe_host is None else probe_host
        self._prober: HostProber | None = None
        self._busy: BusyRecorder | None = None  # how busy the box was while the run measured
        self._pass = 0  # the pass whose worker starts next: its host probe readings say so
        # a case whose first `processes` disagree gets more, up to this many (processes_to_settle)
        self.max_processes = max(processes, max_processes or processes)
        # Workers are forked from a server that imported numpy, numba and the method modules
        # once (engine/forkserver.py): a spawned worker paid ~2 s of imports and numba start-up
        # per pass on the 2-vCPU VM, a forked one ~0.1 s. Each is still a new process: its
        # regions are mapped (new pages) in it, and the passes are seconds apart; what all
        # workers of a run share is the server's code layout, drawn once per run.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([FORK_SERVER_PRELOAD])
        self.worker = MeasuringWorker(self._context, share_of_budget(settings, processes),
                                      self.case_timeout_s, self._worker_started,
                                      self._worker_ready)

    def _worker_started(self, pid: int) -> None:
        """A new worker process: where it runs is where the run's own CPU time goes."""
        if self._busy is not None:
            self._busy.track(pid)

    def _worker_ready(self) -> None:
        """A new worker is ready: the host probe's reading for its pass (compare sets them
        side by side)."""
        if self._prober is not None:
            reading = self._prober.walk()
            if reading is not None:
                self.store.add_host_reading(self._pass, reading, self._prober.facts)

    def compile_kernels(self, cases: list[ResolvedCase]) -> None:
        """A step of its own before the first pass: one sample of the smallest case of each
        method and parameter set, so numba compiles (or loads from its cache) the kernels the
        run needs while progress says so, in the worker the first pass then uses. A case that
        fails here is left to its own measurement to report."""
        smallest: dict[tuple, tuple[int, ResolvedCase]] = {}
        for case in cases:
            key, size = (case.case.method, case.case.params), case.pattern.total_bytes
            if key not in smallest or size < smallest[key][0]:
                smallest[key] = (size, case)
        chosen = [case for _, case in smallest.values()]
        compiled = 0
        for done, case in enumerate(chosen):
            self.events.compiling(done, len(chosen), case.id, compiled)
            reply = self.worker.ask(case, ("compile", case))
            if isinstance(reply, tuple) and reply[0] == "compiled":
                compiled += int(reply[1])
        self.events.compiling(len(chosen), len(chosen), "", compiled)

    def _measure(self, case: ResolvedCase, chosen: dict | None = None
                 ) -> tuple[dict, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """One process's measurement; `chosen`: what the case's first process chose from its
        timing (passes per sample, ...), which every later one takes (None: this is the first)."""
        message = self.worker.ask(case, ("measure", case, chosen))
        # what this process's part cost the tool: request to reply (NaN: no worker to ask)
        wall = {"wall_s": time.perf_counter() - self.worker.sent}
        if isinstance(message, dict):  # crashed or timed out
            return {**message, **wall}, None, None, None
        if message[0] in ("failed", "skipped"):  # skipped: refused once opened (Unavailable)
            return {"status": message[0], "reason": message[1], **wall}, None, None, None
        _, row, raw, ns, placement = message
        return {**row, **wall}, raw, ns, placement

    def run(self, entries: Sequence[PlanEntry]) -> list[dict]:
        """`entries`: a plan's (engine.plan: each case checked and resolved once; its decisions
        are used as they are). Skipped cases are stored as they come; runnable ones after their
        last process (a failure in any process fails the case). Interrupted, what was measured
        is stored."""
        cases = [entry.resolved for entry in entries]  # None: a case that does not run
        rows: list[dict] = []
        pending: dict[int, tuple[dict, list]] = {}  # case index -> (row, results so far)
        chosen: dict[int, dict] = {}  # case index -> what its first process chose (passes, ...)

        def finish(index: int, row: dict, results: list) -> None:
            raw = ns = tags = placements = None
            if results:
                raw = np.concatenate([r for _, r, _, _ in results])
                ns = np.concatenate([n for _, _, n, _ in results])
                tags = np.concatenate([np.full(len(n), i, np.int32)
                                       for i, (_, _, n, _) in enumerate(results)])
                placements = global_placements([p for _, _, _, p in results])
                row.update(_pooled([r for r, _, _, _ in results], ns, placements,
                                   row["bytes_moved"], self.settings.rule))
            pending.pop(index, None)
            self.store.add_case(row, raw, ns, tags, placements)
            rows.append(row)
            self.events.finished(row)

        try:
            self._start_busy()
            if any(entry.runs for entry in entries):
                start_fork_server()  # SIGINT ignored in it and its workers (children.py)
            if self.probe_host:
                self._start_prober(entries)
            if self.compile_first:
                runnable = [entry for entry in entries if entry.runs]
                self.compile_kernels([entry.resolved for entry in runnable])
            needed = dict.fromkeys(range(len(cases)), self.processes)
            process = 0
            while process < max(needed.values(), default=0):
                self._pass = process
                self.events.new_pass(process)
                for index, case in enumerate(cases):
                    raise_lost_interrupt()
                    if process == 0:
                        row = dict(entries[index].row)
                        reason = entries[index].reason
                        if not entries[index].runs:
                            row.update(status="skipped", reason=reason)
                            finish(index, row, [])
                            continue
                        pending[index] = (row, [])
                    elif index not in pending or needed[index] <= process:
                        continue  # skipped, failed in an earlier process, or settled
                    row, results = pending[index]
                    result, raw, ns, placement = self._measure(case, chosen.get(index))
                    if result["status"] != "ok":
                        self.events.measured(case.id, True)
                        if needed[index] > 1:
                            result["reason"] += f" (process {process + 1} of {needed[index]})"
                        row.update(result)
                        finish(index, row, [])
                        continue
                    # what the first process chose from its timing, every later one takes
                    chosen.setdefault(index, dict(result.pop("chosen", None) or {}))
                    results.append((result, raw, ns, placement))
                    if process == self.processes - 1:
                        needed[index] = processes_to_settle(
                            [n for _, _, n, _ in results], self.processes, self.max_processes)
                        if needed[index] > self.processes:
                            self.events.settle(case.id, needed[index] - self.processes)
                    self.events.measured(case.id, False)  # after on_settle: progress counts those
                    if process == needed[index] - 1:
                        finish(index, row, results)
                for index in range(len(cases)):
                    if index not in pending:
                        needed[index] = 0
                process += 1
                if process < max(needed.values(), default=0):
                    self.worker.stop()  # the next pass draws a fresh process
            raise_lost_interrupt()
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM: keep the processes measured so far
            interrupt_seen()
            self.worker.stop(now=True)
            for index, (row, results) in list(pending.items()):
                if results:
                    finish(index, row, results)
            raise
        except BaseException:
            self.worker.stop(now=True)
            raise
        finally:
            self.worker.stop()
            self._stop_prober()
            self._stop_busy()
        return rows

    def _start_prober(self, entries: list) -> None:
        """The host prober, its memory ring as wide as the run's largest case reaching memory
        (what the plan's rows say) within the bounds hostprobe.memory_ring_bytes sets."""
        from nearlocal.engine.stability.hostprobe import HostProber, ring_sizes
        from nearlocal.regions.memory import memory_available

        span = max((sum(entry.resolved.spans) for entry in entries
                    if entry.runs and entry.row.get("reaches_memory")), default=0)
        sizes = ring_sizes(self.inventory.cpu.llc_bytes, span, memory_available())
        try:
            self._prober = HostProber(self._context, sizes, self.settings.tsc_hz,
                                      self.settings.clock.overhead_ticks,
                                      started=self._busy.track if self._busy is not None else None)
        except OSError as exc:  # no process to be had: the run goes on without probes
            self.store.add_host_failure(f"the host prober did not start: {exc}")

    def _start_busy(self) -> None:
        """/proc/stat and the run's own CPU time at its start, then where its processes run
        (engine/stability/busy.py); a sink that keeps no such record (the bench collector) gets none."""
        from nearlocal.engine.stability.busy import BusyRecorder

        if not self.store.keeps_busy:
            return
        self._busy = BusyRecorder()
        self._busy.start()

    def _stop_busy(self) -> None:
        busy, self._busy = self._busy, None
        if busy is not None:
            self.store.add_busy(busy.stop())

    def _stop_prober(self) -> None:
        prober, self._prober = self._prober, None
        if prober is None:
            return
        prober.close()
        if prober.failure is not None:
            self.store.add_host_failure(prober.failure)
