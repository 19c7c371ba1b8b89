"""The report's model: cells, columns, tables, plot data, sections and the report itself, plain
data that sections fill and renderers format (by column kind only), with the one table builder
that sets several runs side by side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from nearlocal.report.papers import Figure

# ---------------------------------------------------------------------------------------------
# Cells, columns, tables


@dataclass(frozen=True)
class Stat:
    """A measured latency: the median with its 10th-90th percentile spread."""

    median_ns: float
    p10_ns: float
    p90_ns: float
    converged: bool = True
    clock_step_ns: float | None = None  # the clock's resolution: figures below it are not figures
    rel_ci: float | None = None  # the median's 95% CI half-width over the median (its † shows it)


@dataclass(frozen=True)
class NoValue:
    """A cell without a number, and why (a skip reason, a failure, not in this run)."""

    reason: str


Cell = Stat | NoValue | float | int | str | None

# Column kinds the printers know how to format:
#   text, time (Stat or ns float), ratio (x), gbps, mops, size (bytes), count
KINDS = ("text", "time", "ratio", "gbps", "mops", "size", "count")


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = "text"
    run: str | None = None  # the run label of a per-run column; None for key columns

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind {self.kind!r} is not one of {KINDS}")


@dataclass(frozen=True)
class Collapsed:
    """Rows of a table that all lack a number for the same reason, shown as one line."""

    count: int
    reason: str
    examples: tuple[str, ...]  # the distinct first key values of those rows (e.g. methods)


@dataclass
class Table:
    columns: list[Column]
    rows: list[list[Cell]]
    keys: int = 0  # how many leading columns are keys (the rest are values)
    collapse: bool = True  # rows without a number may be folded into one line per reason
    collapsed: list[Collapsed] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame with one column per header (cells unformatted)."""
        return pd.DataFrame(self.rows, columns=[header(c) for c in self.columns])


def header(column: Column) -> str:
    return f"{column.name} [{column.run}]" if column.run else column.name


@dataclass(frozen=True)
class Series:
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    run: int = 0  # run index: the line style


@dataclass(frozen=True)
class RefPoint:
    """A paper's figure drawn as a marked point (x in bytes or count, y in the plot's unit)."""

    label: str
    x: float
    y: float


@dataclass(frozen=True)
class RefLine:
    label: str
    value: float
    axis: str = "y"  # "y": horizontal line; "x": vertical line


@dataclass
class PlotData:
    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    points: list[RefPoint] = field(default_factory=list)
    lines: list[RefLine] = field(default_factory=list)
    x_is_size: bool = True
    connect: bool = True  # False: markers only (points of one series are not one sweep)
    linear: bool = False  # True: linear axes (a curve over a narrow range, e.g. loaded latency)
    categories: tuple[str, ...] = ()  # x tick labels at x = 1..n: a categorical x axis
    unmeasured: tuple[str, ...] = ()  # categories this run has no value for (the caption says so)


@dataclass
class Section:
    key: str
    title: str
    intro: str
    refs: list[Figure] = field(default_factory=list)
    table: Table | None = None
    absent: str | None = None  # one line when this run has no data for the section
    notes: list[str] = field(default_factory=list)
    plots: list[PlotData] = field(default_factory=list)
    lead: list[str] = field(default_factory=list)  # the verdict: paragraphs printed first


@dataclass(frozen=True)
class RunInfo:
    label: str
    run_id: str
    host: str
    suite: str
    started: str
    path: str
    counts: dict


@dataclass
class Report:
    runs: list[RunInfo]
    sections: list[Section]

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(key)


# ---------------------------------------------------------------------------------------------
# Building per-run column groups

NOT_IN_RUN = NoValue("not in this run")


def keyed_table(key_columns: list[Column], value_columns: list[Column], runs: list[RunInfo],
                per_run: list[dict[tuple, list[Cell]]],
                sort_key: Callable[[tuple], object] | None = None) -> Table:
    """Rows keyed by a tuple, one group of value columns per run; missing keys say so."""
    keys: list[tuple] = []
    for cells in per_run:
        for key in cells:
            if key not in keys:
                keys.append(key)
    if sort_key:
        keys.sort(key=sort_key)
    multi = len(runs) > 1
    columns = list(key_columns)
    for run in runs:
        columns += [Column(c.name, c.kind, run.label if multi else None) for c in value_columns]
    rows = []
    for key in keys:
        row = list(key)
        for cells in per_run:
            row += cells.get(key, [NOT_IN_RUN] + [None] * (len(value_columns) - 1))
        rows.append(row)
    return Table(columns, rows, keys=len(key_columns))



def collapse_unmeasured(table: Table, min_rows: int = 2) -> None:
    """Rows with no number at all (every value cell a reason or empty) that share their reasons
    become one line per reason: a box without a GPU shows "184 rows: no GPU: ..." once instead
    of 184 identical rows."""
    if not table.keys:
        return
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, row in enumerate(table.rows):
        values = row[table.keys:]
        if any(v is not None and not isinstance(v, NoValue) for v in values):
            continue
        reasons = tuple(dict.fromkeys(v.reason for v in values if isinstance(v, NoValue)))
        if reasons:
            groups.setdefault(reasons, []).append(index)
    folded = set()
    for reasons, indexes in groups.items():
        if len(indexes) < min_rows:
            continue
        folded.update(indexes)
        examples = tuple(dict.fromkeys(str(table.rows[i][0]) for i in indexes))
        table.collapsed.append(Collapsed(len(indexes), "; ".join(reasons), examples))
    table.rows = [row for index, row in enumerate(table.rows) if index not in folded]

