"""Verdicts laid out: the terminal table, JUnit XML, --json and the figures as text, all from
the plain records (verdicts.py) a run keeps, so a stored verdict prints as it did when judged.
Printers only format what judge.py decided."""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO

from nearlocal.acceptance.verdicts import AcceptanceRecord, VerdictRecord
from nearlocal.reporters import (
    ConsoleReporter,
    JUnitCase,
    Reporters,
    TextReporter,
    json_reporter,
    junit_xml,
)
from nearlocal.units import format_ns


def figure_text(value: float, verdict: VerdictRecord) -> str:
    """A figure in the verdict's unit: a ratio to its reference, req/s, GB/s or a duration."""
    if math.isnan(value):
        return "-"
    if verdict.reference is not None:
        return f"{value:.3f}x"
    if verdict.metric in ("requests_per_s", "capacity_qps"):
        return f"{value:.3g} req/s"
    return f"{value:.2f} GB/s" if verdict.metric == "gbps" else format_ns(value)


def bound_text(verdict: VerdictRecord) -> str:
    sign = "<=" if verdict.is_max else ">="
    text = f"{verdict.metric} {sign} {figure_text(verdict.bound, verdict)}"
    if verdict.derived:
        return f"{text} ({verdict.case})"
    return text + (f" of {verdict.reference}" if verdict.reference is not None else "")


def missed_text(verdict: VerdictRecord) -> str:
    """Why a requirement failed: its reason (not measured), else measured against the bound."""
    return verdict.reason or (f"measured {figure_text(verdict.measured, verdict)}, bound "
                              f"{bound_text(verdict)}")


def print_verdicts(record: AcceptanceRecord, file: IO[str] | None = None) -> None:
    """The verdicts as a table, the counts, each not-measured reason once and the rows derived
    figures came from; on stdout's console, or as plain text into `file`."""
    from rich.table import Table

    from nearlocal.terminal import console as stdout_console
    from nearlocal.terminal import file_console

    console = stdout_console if file is None else file_console(file)

    verdicts = record.verdicts
    table = Table(title=f"{record.title}: run {record.run_id}", title_justify="left")
    for column in ("requirement", "measured", "bound", "verdict", "margin"):
        table.add_column(column, justify="right" if column in ("measured", "margin") else "left")
    for v in verdicts:
        verdict = "[green]pass[/]" if v.passed else "[red]fail: not measured[/]" if v.reason \
            else "[red]fail[/]"
        margin = "-" if math.isnan(v.margin) else f"{v.margin:+.1%}"
        table.add_row(v.requirement, figure_text(v.measured, v), bound_text(v), verdict, margin)
    console.print(table)
    failed = len(record.failed)
    console.print(f"{len(verdicts) - failed} passed, {failed} failed")
    for reason, numbers in reasons(verdicts).items():
        console.print(f"  {reason} (requirement{'s' if len(numbers) > 1 else ''} "
                      f"{', '.join(map(str, numbers))})", markup=False, highlight=False)
    for number, v in enumerate(verdicts, 1):
        if v.derived_from:
            console.print(f"  requirement {number} derived from rows {', '.join(v.derived_from)}",
                          markup=False, highlight=False)


def reasons(verdicts: tuple[VerdictRecord, ...]) -> dict[str, list[int]]:
    """Each distinct not-measured reason with the (1-based) numbers of the requirements it
    failed: one line per reason, however many requirements share it."""
    found: dict[str, list[int]] = {}
    for number, v in enumerate(verdicts, 1):
        if v.reason:
            found.setdefault(v.reason, []).append(number)
    return found


def json_data(record: AcceptanceRecord) -> dict:
    """--json: the record as the run keeps it, with the run's id."""
    return {"run": record.run_id, **record.to_dict()}


def render_junit(record: AcceptanceRecord) -> str:
    """A test case per requirement (its time what measuring its cases took), failed where it
    failed, its figure against the bound (or why not measured) as the detail; the run as a
    property."""
    spec = Path(record.spec)
    cases = []
    for v in record.verdicts:
        detail = (v.reason or f"measured {figure_text(v.measured, v)}, "
                  f"bound {bound_text(v)}, margin {v.margin:+.1%}")
        if v.derived_from:
            detail += f"; derived from rows {', '.join(v.derived_from)}"
        cases.append(JUnitCase(v.requirement, f"nearlocal.accept.{spec.stem}", v.seconds, detail,
                               "passed" if v.passed else "failed", "requirement"))
    return junit_xml(f"nearlocal accept {spec.name}", cases, [("run", record.run_id)])


# accept's formats: the table on the terminal (the default), the others each an option --NAME PATH
ACCEPT_FORMATS: Reporters[AcceptanceRecord] = Reporters("accept")
ACCEPT_FORMATS.register(ConsoleReporter("table", "the verdicts as a table", print_verdicts))
ACCEPT_FORMATS.register(TextReporter("junit", "also write a JUnit XML report here", render_junit))
ACCEPT_FORMATS.register(json_reporter(json_data, "also write the verdicts as JSON here"))
