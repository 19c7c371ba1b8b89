"""The report's formats, each a Reporter (nearlocal/reporters.py) wrapping its renderer: the
terminal's tables (the default), one self-contained HTML file, Markdown with PNG plots beside
it, and JSON (the report's model as plain data: its runs, sections, tables' cells, notes and
plot data). `nearlocal report` takes an option --NAME PATH for each but the first (`--json`
alone: on stdout). The renderers load
matplotlib, so each is imported when its format is used, not when the command line is built."""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING

from nearlocal.reporters import ConsoleReporter, Reporters, TextReporter, json_reporter

if TYPE_CHECKING:
    from nearlocal.report.document import Report  # pandas: not at the command line's start


def _print(report: Report, file: IO[str] | None) -> None:
    from nearlocal.report.render_terminal import print_report
    from nearlocal.terminal import console, file_console

    print_report(report, console if file is None else file_console(file))


def _html(report: Report) -> str:
    from nearlocal.report.render_html import report_html

    return report_html(report)


def _markdown(report: Report) -> str:
    """The Markdown alone (its plots named as beside a report.md, not drawn into files)."""
    from nearlocal.report.render_markdown import markdown

    return markdown(report, Path("report.md"))[0]


def _write_markdown(report: Report, path: Path, option: str) -> list[Path]:
    from nearlocal.report.render_markdown import write_markdown

    return write_markdown(report, path, option)


REPORT_FORMATS: Reporters[Report] = Reporters("report")
REPORT_FORMATS.register(ConsoleReporter("terminal", "the tables on the terminal", _print))
REPORT_FORMATS.register(TextReporter(
    "html", "write one self-contained HTML file (plots inline)", _html))
REPORT_FORMATS.register(TextReporter(
    "markdown", "write Markdown, with PNG plots beside it", _markdown, _write_markdown))
REPORT_FORMATS.register(json_reporter(
    help="write the report as JSON: its runs, sections, tables' cells, notes and plot data"))
