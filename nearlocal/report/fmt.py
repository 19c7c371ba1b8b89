"""Cell formatting shared by the terminal, Markdown and HTML printers: by column kind only."""

from __future__ import annotations

import math

from nearlocal.report.document import Cell, Collapsed, Column, NoValue, Stat, Table
from nearlocal.units import format_ns, format_size

NOT_CONVERGED = "†"
NOT_CONVERGED_MEANS = (f"{NOT_CONVERGED} ±x% = not converged: the median's 95% confidence "
                       "interval is ±x%, wider than the run's target within the budget; the "
                       "figure stands, known that closely")

_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"), (1.0, "ns"))


def _time(stat: Stat) -> str:
    """`4.82 us (4.34–5.78)`; a figure below the clock's step reads `<10` (the clock cannot
    tell it from zero: 0.4 ns on a 10 ns TSC is no figure)."""
    shown = max(stat.median_ns, stat.clock_step_ns or 0.0)
    scale, unit = next(((s, u) for s, u in _UNITS if shown >= s), (1.0, "ns"))
    digits = 1 if unit == "ns" else 2
    step = stat.clock_step_ns

    def value(ns: float) -> str:
        if step and ns < step:
            return f"<{step / scale:.3g}"
        return f"{ns / scale:.{digits}f}"

    text = f"{value(stat.median_ns)} {unit} ({value(stat.p10_ns)}–{value(stat.p90_ns)})"
    if stat.converged:
        return text
    width = f" ±{stat.rel_ci * 100:.2g}%" if stat.rel_ci is not None else ""
    return f"{text} {NOT_CONVERGED}{width}"


def _number(value: float, kind: str) -> str:
    if kind == "ratio":
        return f"{value:.2f}×" if value >= 0.1 else f"{value:.3g}×"
    if kind in ("gbps", "mops"):
        return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"
    if kind == "size":
        return format_size(int(value))
    if kind == "count":
        return str(int(value))
    if kind == "time":
        return format_ns(value)
    return f"{value:g}"


def cell_text(column: Column, value: Cell) -> str:
    """The text a printer shows for one cell."""
    if value is None:
        return ""
    if isinstance(value, NoValue):
        return value.reason
    if isinstance(value, Stat):
        return _time(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float) and column.kind != "text":
        return "" if isinstance(value, float) and math.isnan(value) else _number(value, column.kind)
    return str(value)


def is_reason(value: Cell) -> bool:
    return isinstance(value, NoValue)


def numeric(column: Column) -> bool:
    """Right-align this column."""
    return column.kind != "text"


def collapsed_text(table: Table, folded: Collapsed, shown: int = 6) -> str:
    """`184 rows without a number (method: gather-kernel, ...): skipped: no GPU: ...`."""
    examples = ", ".join(folded.examples[:shown]) + (", ..." if len(folded.examples) > shown
                                                     else "")
    what = table.columns[0].name if table.columns else "row"
    return (f"{folded.count} rows without a number ({what}: {examples}): {folded.reason}")
