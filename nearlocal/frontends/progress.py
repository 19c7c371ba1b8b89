"""A run's progress on the terminal or in a CI log: passes, the case in flight, an ETA, the
compile step and a heartbeat when the log would be quiet (the runner's RunEvents)."""

from __future__ import annotations

import threading
import time

from rich.console import Console

from nearlocal.terminal import err_console


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


BEAT_POLL_S = 0.5  # how often the CI heartbeat looks whether the log has been quiet


def plural(count: int, noun: str) -> str:
    """`1 case`, `2 cases`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class RunProgress:
    """Progress of `nearlocal run` on stderr, counting only what will be measured (skipped cases
    cost nothing): compiling kernels as a step of its own, then every measurement of every pass
    (K processes per case = K passes), the case in flight and an ETA (engine.eta: what each case
    took in the last pass). On a terminal a live bar; otherwise (a CI log) lines: at each step,
    for every failed case, and a heartbeat so the log is never silent for more than `interval_s`.
    `clock` and `heartbeat=False` let a test drive it."""

    def __init__(self, case_ids: list[str], runnable: list[bool], budget_s: float,
                 enabled: bool = True, target: Console | None = None, interval_s: float = 3.0,
                 processes: int = 1, clock=time.monotonic, heartbeat: bool = True,
                 patterns: list[str] | None = None, arms: int = 1):
        """arms: the runs of a turn-taking group (run --take-turns) this one's passes alternate
        with: the ETA counts their passes too, as long as this run's own."""
        from nearlocal.engine.eta import OPEN_PRIOR_S, EtaModel

        kept = [i for i, run in enumerate(runnable) if run]
        self.ids = [case_ids[i] for i in kept]
        self.skipped = len(case_ids) - len(self.ids)
        self.total = len(self.ids)  # cases to measure
        self.processes = self.passes = max(1, processes)  # passes: with the settling ones
        self.settling: list[str] = []  # cases given processes beyond `processes`
        self.eta = EtaModel(self.ids, self.processes, budget_s / self.processes + OPEN_PRIOR_S,
                            [patterns[i] for i in kept] if patterns else None)
        self.budget_s = budget_s
        self.enabled, self.target, self.interval_s = enabled, target or err_console, interval_s
        self.clock, self.heartbeat = clock, heartbeat
        self.pass_index, self.pass_label, self.position = 0, "", 0
        self.compiling_text = ""  # while kernels compile: "compiling kernels ...: k of n"
        self.arms, self.waiting_text = max(1, arms), ""  # "waiting for its turn ..." meanwhile
        self.started = self.last_event = self.last_line = 0.0
        self._live = self._task = self._beat = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @property
    def in_ci(self) -> bool:
        return self.enabled and self._live is None

    def current_id(self) -> str:
        """The case being measured: the next one of this pass still to measure."""
        return next((case_id for case_id in self.ids[self.position:]
                     if self.eta.left.get(case_id, 0) > 0), "")

    def current(self) -> str:
        if self.waiting_text:
            return self.waiting_text
        case_id = self.current_id()
        if case_id:
            return self.pass_label + case_id
        # a pass's last case ended and the next pass has not begun: "done" only at the end
        return "done" if self.eta.done >= self.eta.total else "starting the next process"

    def eta_s(self, now: float) -> float:
        return self.arms * self.eta.remaining_s(self.current_id(), now - self.last_event)

    def waiting(self, text: str) -> None:
        """While a turn-taking run waits for its next pass: what the log says it is doing."""
        with self._lock:
            self.waiting_text = text

    def status(self, now: float) -> str:
        """The line a CI log gets: counts, elapsed, ETA, what is happening now."""
        if self.compiling_text:
            return f"{_duration(now - self.started)}: {self.compiling_text}"
        return (f"[{self.eta.done}/{self.eta.total}] {_duration(now - self.started)}, ETA "
                f"{_duration(self.eta_s(now))}: {self.current()}")

    def _line(self, text: str, now: float) -> None:
        self.last_line = now
        self.target.print(text, markup=False, highlight=False)

    def __enter__(self) -> RunProgress:
        self.started = self.last_event = self.last_line = self.clock()
        if not self.enabled:
            return self
        measurements = self.total * self.processes
        header = (f"measuring {plural(self.total, 'case')} ({self.skipped} skipped: they cannot "
                  f"run here), " + (f"each in {self.processes} processes ({measurements} "
                                    "measurements), " if self.processes > 1 else "") +
                  f"up to {self.budget_s:g} s per case")
        if not self.target.is_terminal:
            self._line(header, self.started)
            if self.heartbeat:
                self._beat = threading.Thread(target=self._beat_loop, daemon=True)
                self._beat.start()
            return self
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        class _Eta(ProgressColumn):  # counts down between measurements, from the last estimate
            def render(self, task) -> Text:
                eta_at = task.fields["eta_at"]
                return Text("" if eta_at is None else "ETA " + _duration(eta_at - time.monotonic()))

        self.target.print(header, markup=False, highlight=False)
        self._live = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), _Eta(),
                              TextColumn("{task.fields[case]}", markup=False),
                              console=self.target, transient=True)
        self._live.__enter__()
        self._task = self._live.add_task("measuring", total=max(1, measurements),
                                         eta_at=self.started + self.eta_s(self.started),
                                         case=self.current())
        return self

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_POLL_S):
            self.beat()

    def beat(self) -> None:
        """A CI log line when nothing was printed for nearly `interval_s` (the heartbeat
        thread wakes every BEAT_POLL_S, so no gap in the log exceeds `interval_s`)."""
        with self._lock:
            now = self.clock()
            if self.in_ci and now - self.last_line >= self.interval_s - BEAT_POLL_S:
                self._line(self.status(now), now)

    def compiling(self, done: int, of: int, case_id: str, compiled: int) -> None:
        """The runner's compile step: `done` of `of` kernel sets ready, `compiled` by numba."""
        with self._lock:
            now = self.clock()
            if done < of:
                self.compiling_text = (f"compiling kernels (first run only): {done} of {of} "
                                       f"({case_id})")
                if self._live is not None:
                    self._live.update(self._task, description="compiling kernels (first run "
                                      "only)", completed=done, total=of, eta_at=None, case=case_id)
                elif self.in_ci and (done == 0 or now - self.last_line >= self.interval_s):
                    self._line(self.status(now), now)
                return
            self.compiling_text = ""
            self.last_event = now  # the ETA counts measurements only
            if self.enabled and of:
                text = (f"{_duration(now - self.started)}: kernels ready ({of} sets; "
                        f"{plural(compiled, 'kernel')} compiled, the rest from numba's cache)")
                if self._live is not None:
                    self._live.update(self._task, description="measuring", completed=0,
                                      total=max(1, self.eta.total), case=self.current(),
                                      eta_at=now + self.eta_s(now))
                    self.target.print(text, markup=False, highlight=False)
                else:
                    self._line(text, now)

    def new_pass(self, index: int) -> None:
        """With --processes K the runner makes K passes over the cases; rows finish in the last
        pass (or when they fail)."""
        with self._lock:
            self.pass_index, self.position = index, 0
            self.eta.new_pass()
            if self.processes <= 1 or not self.enabled:
                return
            now = self.clock()
            self.pass_label = f"process {index + 1} of {self.passes}: "
            if self._live is not None:
                self._live.update(self._task, case=self.current())
                return
            settling = index == self.processes and self.settling
            if settling:
                from nearlocal.core.sampling import SETTLED_SPREAD

                self._line(f"{_duration(now - self.started)}: "
                           f"{plural(len(self.settling), 'case')} whose {self.processes} processes "
                           f"disagree by over {SETTLED_SPREAD:.0%} "
                           f"{'gets' if len(self.settling) == 1 else 'get'} "
                           f"up to {self.passes}: {', '.join(self.settling)}", now)
            if index and not settling and now - self.last_line < self.interval_s:
                return  # passes of a few cases take well under a second: a line per 3 s
            over = "over the cases" if index < self.processes else \
                f"over {plural(sum(self.eta.left[c] > 0 for c in self.settling), 'case')}"
            self._line(f"{_duration(now - self.started)}: pass {index + 1} of {self.passes} "
                       f"{over}, ETA {_duration(self.eta_s(now))}", now)

    def settle(self, case_id: str, extra: int) -> None:
        """The runner gives `case_id` `extra` processes more (processes.processes_to_settle)."""
        with self._lock:
            self.eta.more(case_id, extra)
            self.settling.append(case_id)
            self.passes = max(self.passes, self.processes + extra)

    def measured(self, case_id: str, failed: bool) -> None:
        """One measurement (one case in one pass) ended."""
        with self._lock:
            now = self.clock()
            self.eta.measured(case_id, now - self.last_event, failed)
            self.last_event = now
            if case_id in self.ids:
                self.position = self.ids.index(case_id) + 1
            if self._live is not None:
                self._live.update(self._task, completed=self.eta.done, total=max(1, self.eta.total),
                                  eta_at=now + self.eta_s(now), case=self.current())
            elif self.in_ci and (now - self.last_line >= self.interval_s
                                 or self.eta.done == self.eta.total):
                self._line(self.status(now), now)

    def finished(self, row: dict) -> None:
        """One case's row is stored (measured, failed or skipped): failures get a line."""
        with self._lock:
            if self.in_ci and row.get("status") == "failed":
                now = self.clock()
                self._line(f"[{self.eta.done}/{self.eta.total}] {_duration(now - self.started)}: "
                           f"{row.get('case_id')} failed: {row.get('reason', '')}", now)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(2)
        if self._live is not None:
            self._live.__exit__(*exc)
