"""Judged requirements laid out: the terminal table, JUnit XML, the figures as text. Printers
only format what judge.py decided."""

from __future__ import annotations

import math
import time
import xml.etree.ElementTree as ET

from nearlocal.acceptance.judge import RequirementResult
from nearlocal.acceptance.spec import Requirement, Spec
from nearlocal.store.runs import RunData
from nearlocal.units import format_ns


def figure_text(value: float, req: Requirement) -> str:
    if math.isnan(value):
        return "-"
    if req.reference is not None:
        return f"{value:.3f}x"
    if req.metric == "requests_per_s":
        return f"{value:.3g} req/s"
    return f"{value:.2f} GB/s" if req.metric == "gbps" else format_ns(value)


def bound_text(req: Requirement) -> str:
    sign = "<=" if req.is_max else ">="
    text = f"{req.metric} {sign} {figure_text(req.bound, req)}"
    if req.derived is not None:
        return f"{text} ({req.derived.id})"
    return text + (f" of {req.reference.id}" if req.reference is not None else "")




def print_verdicts(spec: Spec, run: RunData, verdicts: list[RequirementResult]) -> None:
    from rich.table import Table

    from nearlocal.terminal import console

    table = Table(title=f"{spec.title}: run {run.run_id}", title_justify="left")
    for column in ("requirement", "measured", "bound", "verdict", "margin"):
        table.add_column(column, justify="right" if column in ("measured", "margin") else "left")
    for v in verdicts:
        verdict = "[green]pass[/]" if v.passed else "[red]fail: not measured[/]" if v.reason \
            else "[red]fail[/]"
        margin = "-" if math.isnan(v.margin) else f"{v.margin:+.1%}"
        table.add_row(v.requirement.name, figure_text(v.measured, v.requirement),
                      bound_text(v.requirement), verdict, margin)
    console.print(table)
    failed = sum(not v.passed for v in verdicts)
    console.print(f"{len(verdicts) - failed} passed, {failed} failed")
    for reason, numbers in reasons(verdicts).items():
        console.print(f"  {reason} (requirement{'s' if len(numbers) > 1 else ''} "
                      f"{', '.join(map(str, numbers))})", markup=False, highlight=False)
    for number, v in enumerate(verdicts, 1):
        if v.rows:
            console.print(f"  requirement {number} derived from rows {', '.join(v.rows)}",
                          markup=False, highlight=False)


def reasons(verdicts: list[RequirementResult]) -> dict[str, list[int]]:
    """Each distinct not-measured reason with the (1-based) numbers of the requirements it
    failed: one line per reason, however many requirements share it."""
    found: dict[str, list[int]] = {}
    for number, v in enumerate(verdicts, 1):
        if v.reason:
            found.setdefault(v.reason, []).append(number)
    return found


def render_junit(spec: Spec, run: RunData, verdicts: list[RequirementResult]) -> str:
    failed = sum(not v.passed for v in verdicts)
    suite = ET.Element("testsuite", name=f"nearlocal accept {spec.path.name}", tests=str(len(verdicts)),
                       failures=str(failed), errors="0", skipped="0",
                       timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="run", value=run.run_id)
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"nearlocal.accept.{spec.path.stem}",
                             name=v.requirement.name, time=f"{v.seconds:.3f}")
        detail = (v.reason or f"measured {figure_text(v.measured, v.requirement)}, "
                  f"bound {bound_text(v.requirement)}, margin {v.margin:+.1%}")
        if v.rows:
            detail += f"; derived from rows {', '.join(v.rows)}"
        if v.passed:
            ET.SubElement(case, "system-out").text = detail
        else:
            ET.SubElement(case, "failure", message=detail, type="requirement").text = detail
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
