"""The report as rich tables on the terminal: the same rows as the files, without plots."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

from nearlocal.report.document import Report, Section, Table, header
from nearlocal.report.fmt import NOT_CONVERGED_MEANS, cell_text, collapsed_text, is_reason, numeric
from nearlocal.terminal import print_table


def rich_table(table: Table) -> RichTable:
    out = RichTable(show_lines=False, header_style="bold")
    for column in table.columns:
        out.add_column(escape(header(column)), justify="right" if numeric(column) else "left",
                       overflow="fold")
    for row in table.rows:  # reasons read left to right, dimmed, even in number columns
        out.add_row(*(Text(cell_text(c, v), style="dim", justify="left") if is_reason(v)
                      else Text(cell_text(c, v))
                      for c, v in zip(table.columns, row, strict=True)))
    return out


def print_section(section: Section, console: Console) -> None:
    console.rule(f"[bold]{escape(section.title)}", align="left")
    for lead in section.lead:
        console.print(f"[bold]{escape(lead)}[/]")
    if section.intro:
        console.print(f"[dim]{escape(section.intro)}[/]")
    for ref in section.refs:
        console.print(f"  [cyan]{ref.id}[/] {escape(ref.what)}: [bold]{escape(ref.text)}[/] "
                      f"[dim]({escape(ref.citation)})[/]")
    if section.absent:
        console.print(f"[yellow]{escape(section.absent)}[/]")
    if section.table is not None and section.table.rows:
        print_table(rich_table(section.table), console)
    if section.table is not None:
        for folded in section.table.collapsed:
            console.print(f"  [dim]{escape(collapsed_text(section.table, folded))}[/]")
    for note in section.notes:
        console.print(f"  - {escape(note)}")
    if section.plots:
        console.print(f"  [dim]plots ({', '.join(p.title for p in section.plots)}): "
                      "in the --html / --markdown report[/]")


def print_report(report: Report, console: Console) -> None:
    console.print(f"[bold]nearlocal report[/]: papers' figures (reported by the papers) beside "
                  f"this box's medians; latency cells: median (p10–p90), {NOT_CONVERGED_MEANS}")
    for section in report.sections:
        print_section(section, console)
