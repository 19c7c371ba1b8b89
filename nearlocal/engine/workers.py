"""The runner's measuring worker: one process at a time, forked from the fork server and asked
one case at a time over a pipe. It starts the process when first asked (within worker_start's
deadline), turns a worker that crashed or ran past the case timeout into a failed row, removes
the files a dying case left, and stops the process when told (the runner draws a fresh one for
each pass). What to ask, and when, is the runner's."""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from nearlocal.engine.children import start_child
from nearlocal.engine.worker import Origin, WorkerSettings, worker_main
from nearlocal.engine.worker_start import (
    WORKER_START_ENV,
    WorkerStartError,
    own_startup_s,
    worker_start_deadline,
)
from nearlocal.regions import files_to_create, remove_leftovers

if TYPE_CHECKING:
    import multiprocessing

    from nearlocal.core.cases import ResolvedCase


@dataclass
class _Process:
    process: multiprocessing.Process
    conn: object


class MeasuringWorker:
    """The worker process a runner asks. `settings`: what each process gets (its share of the
    budget already taken); `started(pid)` is told each new process before it is ready (where
    the run's CPU time goes), `ready()` once it is (a host probe's moment)."""

    def __init__(self, context, settings: WorkerSettings, case_timeout_s: float,
                 started: Callable[[int], None], ready: Callable[[], None]):
        self.context, self.settings, self.case_timeout_s = context, settings, case_timeout_s
        self.started, self.ready = started, ready
        self._worker: _Process | None = None
        self._creating: list = []  # files the case in flight may create (removed if it dies)
        self._startup_s: float | None = None  # this process's start-up, read at the first worker
        self._last_start_s: float | None = None  # what the last worker took to be ready
        self._start_failure: str | None = None  # a worker that did not start fails the rest
        self.sent = math.nan  # when the request in flight was sent (perf_counter; NaN: none)
        worker_start_deadline(None)  # a malformed NEARLOCAL_WORKER_START_S is bad input: now

    def ask(self, case: ResolvedCase, message) -> tuple | dict:
        """One request about `case`: the worker's reply, or a failed row when the worker did not
        start, crashed or ran past the case timeout. `sent` says when it went (a worker's start
        is not the case's cost)."""
        self.sent = math.nan
        if self._start_failure is not None:
            return {"status": "failed", "reason": self._start_failure}
        if self._worker is None:
            try:
                self._worker = self._start()
            except WorkerStartError as exc:  # each case left fails with it, without more waiting
                self._start_failure = str(exc)
                return {"status": "failed", "reason": self._start_failure}
        worker = self._worker
        self._creating = files_to_create((case.region, case.peer))
        self.sent = time.perf_counter()
        worker.conn.send(message)
        deadline = time.monotonic() + self.case_timeout_s
        while not worker.conn.poll(0.05):
            if not worker.process.is_alive():
                return self._crashed(worker)
            if time.monotonic() > deadline:
                worker.process.kill()
                worker.process.join()
                self._worker = None
                self._remove_leftovers()
                return {"status": "failed", "reason": f"timed out after {self.case_timeout_s:.0f} s"}
        try:
            reply = worker.conn.recv()
        except EOFError:
            return self._crashed(worker)
        self._creating = []
        return reply

    def stop(self, now: bool = False) -> None:
        """Let the process end; `now` (Ctrl-C, SIGTERM, an error): SIGTERM, which unwinds the
        case in flight and removes the files it created, instead of waiting for it to end."""
        if self._worker is None:
            return
        worker, self._worker = self._worker, None
        with contextlib.suppress(BrokenPipeError, OSError):
            worker.conn.send(None)
        if now:
            worker.process.terminate()
        worker.process.join(5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        self._remove_leftovers()

    def _start(self) -> _Process:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=worker_main,
                                       args=(child, self.settings, Origin.here()), daemon=True)
        start_child(process)  # a Ctrl-C during the start is the parent's, raised after it
        child.close()
        self.started(process.pid)
        self._wait_ready(process, parent)
        self.ready()
        return _Process(process, parent)

    def _wait_ready(self, process, parent) -> tuple:
        """The worker's ("ready", ...) message; the stages it reports on the way name what a
        worker that misses its deadline was doing. WorkerStartError when it dies or is late."""
        if self._startup_s is None:
            self._startup_s = own_startup_s()
        limit, why = worker_start_deadline(self._startup_s, self._last_start_s)
        started = time.monotonic()
        stage = "starting Python and importing nearlocal's worker (numpy, numba)"
        while True:
            left = started + limit - time.monotonic()
            if left <= 0:
                process.kill()
                process.join(5)
                raise WorkerStartError(
                    f"the measurement worker did not start within {limit:.4g} s ({why}); it was "
                    f"{stage}; set {WORKER_START_ENV}=SECONDS to wait longer")
            closed = False
            if parent.poll(min(left, 0.5)):
                try:
                    message = parent.recv()
                except EOFError:  # it closed its end: it is dying
                    closed = True
                else:
                    if message[0] == "stage":
                        stage = message[1]
                        continue
                    self._last_start_s = time.monotonic() - started
                    return message
            if closed or not process.is_alive():
                process.join(5)
                raise WorkerStartError(f"the measurement worker died ({_how(process.exitcode)}) "
                                       f"while {stage}")

    def _remove_leftovers(self) -> None:
        """Files the case in flight was creating, when its worker died before removing them."""
        files, self._creating = self._creating, []
        remove_leftovers(files)

    def _crashed(self, worker: _Process) -> dict:
        worker.process.join(10)
        self._worker = None
        self._remove_leftovers()
        code = worker.process.exitcode
        if code is None:
            worker.process.kill()
        return {"status": "failed",
                "reason": f"worker crashed: {'closed its pipe' if code is None else _how(code)}"}


def _how(code: int | None) -> str:
    """A process's exit as a person reads it: the signal's name, or the exit code."""
    return signal.Signals(-code).name if code is not None and code < 0 else f"exit code {code}"


def share_of_budget(settings: WorkerSettings, processes: int) -> WorkerSettings:
    """What each of a case's `processes` processes gets: the case's budget shared."""
    if processes == 1:
        return settings
    return replace(settings, rule=replace(settings.rule,
                                          budget_s=settings.rule.budget_s / processes))
