"""Builds the report from stored runs: each run's rows prepared once (report.rows), then every
registered section in its order (report.registry: nearlocal's own in report/sections/ and the
families' report_section.py, a plugin's in its distribution, all found by entry point). Several runs become
side-by-side columns, one group per run. The document (cells, columns, sections) is report.document;
the terminal, Markdown and HTML renderers only format it."""

from __future__ import annotations

from nearlocal.report import document
from nearlocal.report.document import NoValue, Report, Stat, collapse_unmeasured
from nearlocal.report.registry import SectionInputs, ordered_sections
from nearlocal.report.rows import prepare, run_info
from nearlocal.report.sections.beluga import crossover_size
from nearlocal.store import RunData

__all__ = ["NoValue", "Report", "Stat", "build_report", "crossover_size", "document", "prepare"]



def build_report(data: list[RunData], reference: str | None = None) -> Report:
    """Every registered section for one or more runs (several runs: side-by-side columns);
    `reference`, a reference box the serving figures fill the runs' missing hops from."""
    if not data:
        raise ValueError("build_report needs at least one run")
    runs = [run_info(i, run) for i, run in enumerate(data)]
    inputs = SectionInputs(runs, [prepare(run) for run in data], data, reference)
    sections = []
    for spec in ordered_sections():
        section = spec.build(inputs)
        if spec.drop_when_absent and section.absent:
            continue
        sections.append(section)
    for section in sections:
        if section.table is not None and section.table.collapse:
            collapse_unmeasured(section.table)
    return Report(runs, sections)
