"""A comparison as a table, Markdown, JSON or JUnit, and in a GitHub job summary. Printers
only lay out what gate/verdict.py decided; the mode's line comes first in every format."""

from __future__ import annotations

import math

from nearlocal.gate.verdict import VERDICT_ORDER, CaseComparison, Comparison
from nearlocal.reporters import (
    ConsoleReporter,
    JUnitCase,
    Reporters,
    TextReporter,
    json_reporter,
    junit_xml,
)
from nearlocal.units import format_ns

CHANGE_VERDICTS = ("slower", "faster")  # what a job summary lists


def _ratio_text(c: CaseComparison) -> tuple[str, str, str]:
    ratio = f"{c.ratio:.3f}x" if math.isfinite(c.ratio) else "-"
    ci = f"[{c.ci_low:.3f}, {c.ci_high:.3f}]".replace("inf", "∞") if not math.isnan(c.ci_low) \
        else "-"
    p = f"{c.p_value:.2g}" if math.isfinite(c.p_value) else "-"
    return ratio, ci, p


def _rest_line(result: Comparison, shown: list[CaseComparison]) -> str:
    """One line counting the cases not listed one by one."""
    listed = {id(c) for c in shown}
    rest = [c for c in result.cases if id(c) not in listed]
    if not rest:
        return ""
    counts = {v: sum(c.verdict == v for c in rest) for v in VERDICT_ORDER}
    text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    margin = f" (within ±{result.margin:.1%})" if counts["same"] and math.isfinite(result.margin) \
        else ""
    return f"{len(rest)} more cases not listed: {text}{margin}"


def _listed(result: Comparison, verdicts: tuple[str, ...] | None = None) -> list[CaseComparison]:
    """The cases printed one per line, changed ones first: every verdict but `same`, or only
    `verdicts`."""
    return [c for c in result.sorted_cases()
            if (c.verdict in verdicts if verdicts else c.verdict != "same")]


def render_table(result: Comparison, file=None) -> None:
    """The mode's line, the changed cases as a table, then one line counting the rest. On a
    terminal a rich table; anywhere else the full-width Markdown table run and show print."""
    from rich.console import Console
    from rich.table import Table

    from nearlocal.terminal import console as stdout_console
    from nearlocal.terminal import identifier_column, print_table

    colours = {"slower": "red", "faster": "green", "ambiguous": "yellow", "missing": "magenta",
               "new": "cyan", "same": "default"}
    target = Console(file=file, color_system=None, highlight=False) if file else stdout_console
    target.print(result.head_line(), markup=False, highlight=False, soft_wrap=True)
    listed = _listed(result)
    table = Table(title=f"compare {result.base} -> {result.candidate}", title_justify="left")
    table.add_column("verdict", no_wrap=True)
    identifier_column(table, "case", [c.case_id for c in listed])
    for column in ("base", "candidate", "ratio", "CI", "p", "n", "note"):
        table.add_column(column, justify="right" if column in ("base", "candidate", "ratio", "p")
                         else "left", no_wrap=column not in ("note", "n"))
    for c in listed:
        ratio, ci, p = _ratio_text(c)
        verdict = f"[{colours[c.verdict]}]{c.verdict}[/]" if target.is_terminal else c.verdict
        table.add_row(verdict, c.case_id, format_ns(c.base_median_ns),
                      format_ns(c.cand_median_ns), ratio, ci, p,
                      (f"{c.n_base}/{c.n_cand}" + (f" in {c.processes} proc" if c.processes else "")
                      + (f" ({c.placements} placements)" if c.placements else ""))
                      if c.n_base else "-", c.note)
    if listed:
        print_table(table, target)
    for line in (_rest_line(result, listed), result.host_note, result.host_line(),
                 result.summary()):
        if line:
            target.print(line, markup=False, highlight=False, soft_wrap=True)


def render_markdown(result: Comparison, verdicts: tuple[str, ...] | None = None) -> str:
    """Markdown: the mode's line, the verdict and summary, the listed cases (changed first;
    only `verdicts` when given), then one line counting the rest."""
    head = "**regression**" if result.regressions else "no regression"
    lines = [f"### nearlocal compare: `{result.base}` → `{result.candidate}`", "",
             f"**{result.head_line()}**", "", f"{head}: " + result.summary(), ""]
    for line in (result.host_note, result.host_line()):
        if line:
            lines += [f"> {line}", ""]
    listed = _listed(result, verdicts)
    if listed:
        lines += ["| verdict | case | base | candidate | ratio | CI | p | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in listed:
            ratio, ci, p = _ratio_text(c)
            lines.append(f"| {c.verdict} | `{c.case_id}` | {format_ns(c.base_median_ns)} | "
                         f"{format_ns(c.cand_median_ns)} | {ratio} | {ci} | {p} | {c.note} |")
        lines.append("")
    rest = _rest_line(result, listed)
    if rest:
        lines += [rest, ""]
    return "\n".join(lines)


def append_job_summary(result: Comparison, path: str) -> None:
    """GitHub Actions' job summary ($GITHUB_STEP_SUMMARY): the slower and faster cases only.
    A summary that cannot be written is said on stderr and does not change the verdict."""
    try:
        with open(path, "a") as handle:
            handle.write(render_markdown(result, CHANGE_VERDICTS) + "\n")
    except OSError as exc:
        from nearlocal.terminal import err_console

        err_console.print(f"GITHUB_STEP_SUMMARY {path}: cannot append the job summary: "
                          f"{exc.strerror}", markup=False)


JUNIT_OUTCOMES = {"slower": "failed", "missing": "skipped", "new": "skipped"}  # else passed


def render_junit(result: Comparison) -> str:
    """A test case per case (its time the candidate's median), failed where slower, skipped where
    missing or new; the mode, pairing, head line and any note on the host as properties."""
    cases = []
    for c in result.sorted_cases():
        ratio, ci, p = _ratio_text(c)
        seconds = c.cand_median_ns / 1e9 if math.isfinite(c.cand_median_ns) else 0.0
        cases.append(JUnitCase(c.case_id, f"nearlocal.compare.{c.method or 'case'}", seconds,
                               f"{c.verdict}: ratio {ratio} CI {ci} p {p}"
                               + (f"; {c.note}" if c.note else ""),
                               JUNIT_OUTCOMES.get(c.verdict, "passed"), "regression"))
    return junit_xml(f"nearlocal compare {result.base} -> {result.candidate}", cases,
                     [("mode", result.mode), ("paired", str(result.paired).lower()),
                      ("head", result.head_line()),
                      *([("note", result.host_note)] if result.host_note else [])], time_digits=9)


# compare's --format choices, in this order; the first is the default
COMPARE_FORMATS: Reporters[Comparison] = Reporters("compare")
COMPARE_FORMATS.register(ConsoleReporter(
    "table", "a table on a terminal, full-width Markdown in a pipe or CI log", render_table))
COMPARE_FORMATS.register(TextReporter("markdown", "Markdown, for a pull request or a file",
                                      render_markdown))
COMPARE_FORMATS.register(json_reporter(Comparison.to_dict, "every case's figures and verdict"))
COMPARE_FORMATS.register(TextReporter("junit", "JUnit XML for CI: slower cases fail",
                                      render_junit))


def write_output(result: Comparison, fmt: str, output: str | None) -> None:
    """To stdout, or to `output` whole or not at all (a full disk leaves no partial file)."""
    reporter = COMPARE_FORMATS[fmt]
    if output:
        reporter.write(result, output, "--output")
    else:
        reporter.show(result)
