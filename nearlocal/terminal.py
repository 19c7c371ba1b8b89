"""The terminal beneath every printer: rich consoles that keep a CI log's lines whole and print
tables as Markdown when nobody reads them on a terminal. A utility below every layer that prints
(gate, report, the front ends); console.py holds the front ends' printers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from nearlocal.safeio import owns_terminal


class _Console(Console):
    """A rich console that does not wrap long lines when its output is not a terminal: a CI log
    or a file keeps each line whole (grep finds a reason on one line), and a table printed on
    it becomes a full-width Markdown table (print_table), whichever command prints it. Whether
    it is a terminal is owns_terminal's answer, asked at each use (pytest swaps sys.stdout), or
    the `force_terminal` given."""

    def __init__(self, *args, force_terminal: bool | None = None, **kwargs) -> None:
        self._terminal_given = force_terminal
        super().__init__(*args, force_terminal=force_terminal, **kwargs)

    @property
    def is_terminal(self) -> bool:
        if self._terminal_given is not None:
            return self._terminal_given
        return owns_terminal(self.file)

    def print(self, *objects, soft_wrap: bool | None = None, **kwargs) -> None:
        if not self.is_terminal:
            if len(objects) == 1 and isinstance(objects[0], Table) and not kwargs:
                print_table(objects[0], self)
                return
            if soft_wrap is None:
                soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)

    @contextlib.contextmanager
    def into(self, file: IO[str]) -> Iterator[None]:
        """Print into `file` for a while, as into a pipe (a reporter's text of a printer that
        prints on this console); after it, where it printed before (stdout as it is then)."""
        before = self._file  # rich's own: None is sys.stdout at each print
        self._file = file
        try:
            yield
        finally:
            self._file = before

    def on_broken_pipe(self) -> None:
        """The reader went away (`nearlocal probe | head -1`): rich would exit 1, as if we had
        failed; the command line turns this into its quiet exit 141 instead."""
        self.quiet = True
        raise BrokenPipeError(32, "the reader of stdout went away")


console = _Console()
err_console = _Console(stderr=True)


def file_console(file: IO[str]) -> Console:
    """A console printing into a file as into a pipe: no colour, whole lines, tables as Markdown
    (what a reporter's text is when it is not shown on the terminal)."""
    return _Console(file=file, force_terminal=False, color_system=None, highlight=False)


def print_table(table: Table, target: Console | None = None) -> None:
    """Print a table; when the output is not a terminal (a pipe, a CI log) it has no width to
    respect, so the table is a Markdown table at its natural width: one line per row, every
    identifier whole, greppable and pasteable."""
    target = target or console
    if target.is_terminal:
        target.print(table)
        return
    title, table_box = table.title, table.box
    table.title, table.box = None, box.MARKDOWN
    try:
        natural = Measurement.get(target, target.options.update_width(1_000_000), table).maximum
        wide = Console(width=natural, color_system=None, highlight=False)
        with wide.capture() as captured:
            wide.print(table)
    finally:
        table.title, table.box = title, table_box
    lines = [line.rstrip() for line in captured.get().splitlines() if line.strip()]
    target.file.write("\n".join([*([str(title)] if title else []), *lines, ""]))
    target.file.flush()


def identifier_column(table: Table, name: str, values: list[str]) -> None:
    """A column of names (methods, regions, run ids...): never cut with an ellipsis, so that
    `clflush-load` and `clflushopt-load` stay two different words on a narrow terminal. Short
    names keep their width; long ones fold onto a second line rather than lose characters."""
    longest = max([len(name), *(len(str(v)) for v in values)])
    table.add_column(name, overflow="fold", min_width=min(longest, 16))
