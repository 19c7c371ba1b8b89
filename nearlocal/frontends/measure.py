"""Measuring a plan with the run's progress on the terminal: the front end's side of `run` (the
engine's Runner measures; this shows it and takes turns)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nearlocal.engine import runner
from nearlocal.engine.plan import Plan
from nearlocal.frontends.progress import RunProgress


@dataclass
class MeasuredRun:
    """A run just measured and stored: where, whether an interrupt stopped it, its run.json as
    stored (the self-check included) and the rows the runner returned, in the order stored (None
    when it was interrupted: then only the stored run has every row it kept)."""

    path: Path
    interrupted: KeyboardInterrupt | None
    meta: dict
    rows: list[dict] | None


def measure_into(plan: Plan, out: Path, meta: dict, *, quiet: bool = False,
                 turns=None) -> tuple[Path, KeyboardInterrupt | None]:
    """`measure_run`'s path and interrupt, for a front end that reads the stored run back."""
    measured = measure_run(plan, out, meta, quiet=quiet, turns=turns)
    return measured.path, measured.interrupted


def measure_run(plan: Plan, out: Path, meta: dict, *, quiet: bool = False,
                turns=None, on_row: Callable[[dict], None] | None = None) -> MeasuredRun:
    """`run`'s and `accept`'s one way to measure: a new run in the store under `out` with
    `meta`, the plan measured into it (progress unless quiet), finished with its self-check.
    `on_row` is handed each row as it is stored (a script keeping its own log as it goes).
    A Ctrl-C even before the first case is an interrupted run, stored."""
    from nearlocal.engine.stability.selfcheck import checked
    from nearlocal.store.writer import Store

    store = None
    rows = None
    try:
        store = Store.create(out, meta)
        interrupted, rows = measure(plan, store, quiet=quiet, turns=turns, on_row=on_row)
    except BaseException as exc:
        if turns is not None:  # the other arms go on without this one
            turns.finish()
        if store is None or not isinstance(exc, KeyboardInterrupt):
            raise
        interrupted = exc  # before measure's own handler: still an interrupted run, stored
    path = store.finish(ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        interrupted=bool(interrupted), derive=checked)
    return MeasuredRun(path, interrupted, store.meta, rows)


def measure(plan: Plan, store, *, quiet: bool = False, compile_first: bool = True,
            case_timeout_s: float | None = None, turns=None,
            on_row: Callable[[dict], None] | None = None
            ) -> tuple[KeyboardInterrupt | None, list[dict] | None]:
    """Run the plan into `store` with run's progress display; the store is left open. Returns
    the interrupt (Ctrl-C, SIGTERM) that stopped it, or None: what was measured is stored; and
    the rows the runner returned (None when interrupted). `turns` (engine.stability.turns.Turns): each
    pass waits for this arm's slot of a turn-taking group, and the arm is done when this
    returns or raises."""
    settings = plan.settings
    worker = plan.worker_settings()
    try:  # a Ctrl-C anywhere in here, even before the first case, is an interrupted run
        with RunProgress([e.case.id for e in plan.entries], [e.runs for e in plan.entries],
                                 settings.budget_s, enabled=not quiet,
                                 processes=settings.processes,
                                 patterns=[e.case.pattern for e in plan.entries],
                                 arms=turns.arms if turns is not None else 1) as progress:
            # runner.Runner is looked up here, at the call: tests stand a double in for it
            events = progress if turns is None else _TakingTurns(progress, turns)
            if on_row is not None:
                events = _AlsoHanded(events, on_row)
            measuring = runner.Runner(plan.inventory, worker, store, events,
                                      case_timeout_s=case_timeout_s,
                                      processes=settings.processes, compile_first=compile_first,
                                      max_processes=settings.max_processes)
            rows = measuring.run(plan.entries)
    except KeyboardInterrupt as exc:
        return exc, None
    finally:
        if turns is not None:
            turns.finish()
    return None, rows


class _AlsoHanded:
    """The progress display's events, each stored row also handed to `on_row`."""

    def __init__(self, events, on_row: Callable[[dict], None]) -> None:
        self.events, self.on_row = events, on_row

    def __getattr__(self, name: str):  # new_pass, measured, compiling, settle: as they are
        return getattr(self.events, name)

    def finished(self, row: dict) -> None:
        self.events.finished(row)
        self.on_row(row)


class _TakingTurns:
    """The progress display's events, each pass first waiting for this arm's slot."""

    def __init__(self, progress, turns) -> None:
        self.progress, self.turns = progress, turns

    def __getattr__(self, name: str):  # finished, measured, compiling, settle: as they are
        return getattr(self.progress, name)

    def new_pass(self, index: int) -> None:
        self.progress.waiting(f"waiting for its turn (arm {self.turns.arm} of {self.turns.arms}, "
                              f"taking turns in {self.turns.directory})")
        try:
            self.turns.take()
        finally:
            self.progress.waiting("")
        self.progress.new_pass(index)
