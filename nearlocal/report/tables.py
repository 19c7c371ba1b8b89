"""The report's content: every section's rows and plot data, computed from stored runs.

All arithmetic lives here (ratios to the papers, crossover sizes, near-local ratios, Mops, which
region stands for "the pool"); the terminal, Markdown and HTML printers only format cells by
their column's kind. Several runs become side-by-side columns, one group per run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nearlocal.report.papers import Figure, figure, figures
from nearlocal.results import RunData
from nearlocal.units import format_ns, format_size

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
# Rows of one run, with the derived columns every section uses

GPU_COPY_METHODS = ("cuda-memcpy", "cuda-memcpy-async", "cuda-memcpy-batch", "cuda-memcpy-2d",
                    "gather-kernel", "scatter-kernel", "zero-copy-kernel")
KERNEL_METHODS = ("gather-kernel", "scatter-kernel")
RPC_METHODS = ("rpc-roundtrip", "rpc-throughput")
# Rows that time something other than moving their pattern's bytes: no bandwidth, no size plots.
NOT_TRANSFERS = (*RPC_METHODS, "kv-metadata", "chase", "loaded-chase")
SHARED_CLASS = 3  # shm: / file: mappings: this box's own DRAM; lower ranks are other memory
LOCAL_CLASS = 9
GPU_CLASS = 10


def region_class(region: str, cpuless_nodes: frozenset[int] = frozenset()) -> tuple[int, str]:
    """(rank, description): how pool-like a region is; lower ranks stand for the pool first."""
    inner = str(region).removeprefix("registered:")
    kind, _, rest = inner.partition(":")
    if kind == "devdax":
        return 0, "CXL pool (device-dax)"
    if kind == "numa":
        if rest.isdigit() and int(rest) in cpuless_nodes:
            return 1, "CPU-less NUMA node (CXL in system-ram mode)"
        return 2, "NUMA node"
    if kind in ("file", "shm"):
        return SHARED_CLASS, "shared mapping"
    if kind in ("dram", "pinned"):
        return LOCAL_CLASS, "local DRAM"
    if kind == "gpu":
        return GPU_CLASS, "GPU memory"
    return 5, "other region"


def _params(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}


def _params_text(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(params.items())) or "-"


def _with_attr(region: str, attr: str) -> str:
    return region if attr in ("wb", "", None) else f"{region}[{attr}]"


_TEXT_DEFAULTS = {"case_id": "", "method": "", "family": "", "region": "", "attr": "wb",
                  "pattern": "", "peer": "dram", "access": "read", "params": "{}",
                  "status": "failed", "reason": ""}


def _texts(values: Iterable, index: pd.Index) -> pd.Series:
    return pd.Series(list(values), index=index, dtype=object)


def prepare(run: RunData) -> pd.DataFrame:
    """The run's case rows plus src / dst / path / pool rank / parsed params."""
    df = run.cases.copy()
    inventory = run.meta.get("inventory") or {}
    cpuless = frozenset(int(n.get("node", -1)) for n in inventory.get("numa", [])
                        if not n.get("cpus"))
    for column, default in _TEXT_DEFAULTS.items():  # hand-made or partial rows: fill the gaps
        values = df[column] if column in df else [None] * len(df)
        df[column] = _texts((str(v) if isinstance(v, str) and v else default
                             for v in values), df.index)
    for column in ("size_bytes", "fragment_count", "fragment_bytes"):
        df[column] = pd.to_numeric(df[column], errors="coerce").fillna(0).astype("int64")
    for column in ("median_ns", "p10_ns", "p90_ns", "gbps", "ci_low_ns", "ci_high_ns",
                   "n_samples"):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("float64")
    write = (df["access"] == "write").tolist()
    region_text = [_with_attr(r, a) for r, a in zip(df["region"], df["attr"], strict=True)]
    src = [p if w else r for p, r, w in zip(df["peer"], region_text, write, strict=True)]
    dst = [r if w else p for p, r, w in zip(df["peer"], region_text, write, strict=True)]
    df["src"], df["dst"] = _texts(src, df.index), _texts(dst, df.index)
    df["path"] = _texts((f"{a} -> {b}" for a, b in zip(src, dst, strict=True)), df.index)
    rank = [region_class(r, cpuless)[0] for r in df["region"]]
    df["region_what"] = _texts((region_class(r, cpuless)[1] for r in df["region"]), df.index)
    peer_rank = [region_class(r, cpuless)[0] for r in df["peer"]]
    df["rank"] = pd.Series(rank, index=df.index, dtype="int64")
    df["peer_rank"] = pd.Series(peer_rank, index=df.index, dtype="int64")
    df["src_rank"] = pd.Series([p if w else r for r, p, w in zip(rank, peer_rank, write,
                                                                 strict=True)],
                               index=df.index, dtype="int64")
    df["src_kind"] = _texts((s.split("[")[0].split(":")[0] for s in src), df.index)
    df["params_d"] = _texts((_params(p) for p in df["params"]), df.index)
    df["n_params"] = pd.Series([len(p) for p in df["params_d"]], index=df.index,
                               dtype="int64")  # prefer a method's default settings
    df["ok"] = (df["status"] == "ok").astype(bool)
    df["transfer"] = (~df["method"].isin(NOT_TRANSFERS)).astype(bool)
    df["contiguous"] = ((df["fragment_count"] <= 1)
                        & ~df["pattern"].map(lambda p: ":" in p).astype(bool) & df["transfer"])
    return df


def stat_of(row) -> Stat | NoValue:
    """A row's latency cell: its statistics, or why it has none."""
    if row["status"] != "ok":
        return NoValue(f"{row['status']}: {row['reason']}" if row["reason"] else row["status"])
    converged = row.get("converged")
    return Stat(float(row["median_ns"]), float(row["p10_ns"]), float(row["p90_ns"]),
                bool(converged) if converged is not None and converged == converged else True,
                _clock_step(row))


def _clock_step(row) -> float | None:
    """The smallest step this row's figures can move by: the clock's resolution over the
    operations one sample is divided by (a chase sample is 4096 loads). Unknown for a row that
    times several operations per sample but does not say how many."""
    step = pd.to_numeric(row.get("clock_resolution_ns"), errors="coerce")
    ops = pd.to_numeric(row.get("ops_per_sample"), errors="coerce")
    if not (step == step and step and step > 0):
        return None
    if not (ops == ops and ops and ops >= 1):
        if row.get("method") in NOT_TRANSFERS:  # per operation, count not stored
            return None
        ops = 1
    return float(step) / float(ops)


def _best(rows: pd.DataFrame, order: Iterable[str] = ("rank", "n_params")) -> pd.Series | None:
    """The row to show: an ok row first, then the most pool-like region."""
    if rows.empty:
        return None
    ordered = rows.assign(_notok=~rows["ok"]).sort_values(["_notok", *order], kind="stable")
    return ordered.iloc[0]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    if not (denominator > 0) or math.isnan(numerator):
        return None
    return numerator / denominator


def _ns(cell: Cell) -> float | None:
    return cell.median_ns if isinstance(cell, Stat) else None


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


def _refs(*ids: str) -> list[Figure]:
    return [figure(i) for i in ids]


def _absent(runs: list[RunInfo], frames: list[pd.DataFrame], methods: Iterable[str],
            what: str) -> str:
    methods = list(methods)
    parts = []
    for run, df in zip(runs, frames, strict=True):
        rows = df[df["method"].isin(methods)]
        name = f"run {run.label}: " if len(runs) > 1 else ""
        if rows.empty:
            parts.append(f"{name}the run has no {what} rows")
        else:
            outcomes = rows.loc[~rows["ok"], ["status", "reason"]].value_counts()
            if len(outcomes):
                status, reason = outcomes.index[0]
                parts.append(f"{name}{what} rows were {status}: {reason}")
            else:
                parts.append(f"{name}the {what} rows that ran do not cover this table")
    return "; ".join(parts) + "."


# ---------------------------------------------------------------------------------------------
# Sections

B7_ROWS = (  # (figure, method, access, attr or None for any, label)
    ("B7a", "nt-store", "write", "wb", "nt-store, wb"),
    ("B7a", "nt-copy", "write", "wb", "nt-copy, wb"),  # Beluga's CPU write path is a copy
    ("B7b", "store", "write", "uc", "store, uc"),
    ("B7c", "clflush-load", "read", "wb", "clflush-load, wb"),
    ("B7d", "load", "read", "uc", "load, uc"),
    ("B7e", "dsa-memmove", "write", None, "dsa-memmove, write"),
    ("B7e", "dsa-memmove", "read", None, "dsa-memmove, read"),
)
SIZE_16K = 16 * 1024
SIZE_64K = 64 * 1024


def _isolated(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows timed as isolated transfers (drain=before, the CPU methods' default): what the
    papers' single-operation figures time. Methods without a drain parameter count as isolated."""
    return rows[rows["params_d"].map(lambda p: p.get("drain", "before") == "before").astype(bool)]


def _host_only(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["rank"] < GPU_CLASS) & (df["peer_rank"] < GPU_CLASS)]


def _declared_params(method: str) -> dict:
    """A method's default parameters: a case stores only the params that differ from them."""
    from nearlocal.errors import UsageError
    from nearlocal.harness.methods import get_method

    try:
        return dict(get_method(method).params)
    except UsageError:
        return {}


def section_b7(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("b7", "B7 — CPU access to the pool, 16 KB",
                      "Each row times one 16 KiB transfer between a host region and local DRAM. "
                      "The region is the most pool-like one the run measured (device-dax, then "
                      "a CPU-less NUMA node, other NUMA nodes, shm/file, and local dram last).",
                      _refs("B7a", "B7b", "B7c", "B7d", "B7e"))
    per_run = []
    for run, df in zip(runs, frames, strict=True):
        at16 = _host_only(df[(df["size_bytes"] == SIZE_16K) & df["contiguous"]])
        cells: dict[tuple, list[Cell]] = {}
        used = set()
        for fig_id, method, access, attr, label in B7_ROWS:
            paper = figure(fig_id).value()
            key = (fig_id, label, paper.text())
            rows = at16[(at16["method"] == method) & (at16["access"] == access)]
            rows = _isolated(rows)
            if attr:
                rows = rows[rows["attr"] == attr]
            row = _best(rows, ("rank", "n_params", "attr"))
            if row is None:
                what = f"{method} {attr}" if attr else method
                cells[key] = [NoValue(f"no {what} 16KiB row in this run"), None, None]
                continue
            stat = stat_of(row)
            if row["ok"]:
                used.add(row["region"])
            # the paper's figure is its pool's: local memory set beside it would read as a pool
            versus = (_ratio(_ns(stat), paper.ns()) if row["rank"] < SHARED_CLASS or not row["ok"]
                      else NoValue(f"{row['region_what']}, not a pool"))
            cells[key] = [stat, versus, _with_attr(row["region"], row["attr"])]
        per_run.append(cells)
        pools = sorted({r for r in used if region_class(r)[0] < LOCAL_CLASS})
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        if pools:
            section.notes.append(f"{name}: rows measured on {', '.join(pools)}")
        elif used:
            section.notes.append(f"{name}: no pool region measured; the rows use "
                                 f"{', '.join(sorted(used))}, which is not a pool, so they "
                                 "get no × paper")
    section.table = keyed_table(
        [Column("ID"), Column("case"), Column("paper")],
        [Column("median (p10–p90)", "time"), Column("× paper", "ratio"), Column("region")],
        runs, per_run)
    section.table.collapse = False  # one row per paper figure, measured or not
    section.notes.append("CPU rows are isolated transfers (drain=before: an mfence drains the "
                         "previous repetition before each sample starts), as the paper times one "
                         "16 KB operation; back-to-back rows (drain=none) are not compared here.")
    section.notes.append("× paper = this box's median / the paper's figure (B7e: the midpoint "
                         "of its 1.69 – 2.12 us range); above 1 means slower than the paper.")
    section.plots.append(latency_plot(runs, frames))
    return section


def _crossover(sizes: list[int], size: int | None) -> str:
    """The crossover_size result in words."""
    if not sizes:
        return "no size has both a CPU and a DSA median"
    if size is None:
        return f"the CPU is faster up to the largest measured size ({format_size(sizes[-1])})"
    if size == sizes[0]:
        return f"DSA is faster at every measured size ({format_size(sizes[0])} and up)"
    return f"DSA is faster from {format_size(size)} up; the CPU wins below {format_size(size)}"


def crossover_size(sizes: list[int], cpu: list[float], dsa: list[float]) -> int | None:
    """The smallest size from which DSA beats the CPU at that size and every larger one."""
    faster = [d < c for c, d in zip(cpu, dsa, strict=True)]
    if not faster or not faster[-1]:
        return None
    first = max((i for i, f in enumerate(faster) if not f), default=-1) + 1
    return sizes[first]


B8_SERIES = (("CPU write (nt-store)", "nt-store", "write"), ("DSA write", "dsa-memmove", "write"),
             ("CPU read (clflush-load)", "clflush-load", "read"),
             ("DSA read", "dsa-memmove", "read"))


def section_b8(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("b8", "B8 — CPU vs DSA over size",
                      "The CPU's best non-coherent-safe paths (nt-store to write, clflush + load "
                      "to read) against one DSA memmove, on the same region; the crossover is "
                      "found from the medians.", _refs("B8", "B7e"))
    if not any(((df["method"] == "dsa-memmove") & df["ok"]).any() for df in frames):
        section.absent = "No DSA measurement: " + _absent(runs, frames, ["dsa-memmove"],
                                                          "dsa-memmove")
        return section
    per_run = []
    cpu_below = figure("B8").value("CPU wins below")
    plot = PlotData("b8-crossover", "CPU vs DSA over size", "transfer size", "median (us)", [],
                    [], [RefLine(f"B8: {v.name} {v.text()}", v.bytes(), "x")
                         for v in figure("B8").values])
    plot.points = [RefPoint(f"{i} {figure(i).value().text()}", SIZE_16K, figure(i).value().ns()
                            / 1e3) for i in ("B7a", "B7c", "B7e")]
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        host = _host_only(df[df["contiguous"]])
        dsa_ok = host[(host["method"] == "dsa-memmove") & host["ok"]]
        pool = dsa_ok.sort_values("rank").iloc[0]["region"] if len(dsa_ok) else None
        rows = host[host["region"] == pool] if pool else host.iloc[0:0]
        cells: dict[tuple, list[Cell]] = {}
        medians: dict[str, dict[int, float]] = {}
        for label, method, access in B8_SERIES:
            chosen = _isolated(rows[(rows["method"] == method) & (rows["access"] == access)])
            chosen = chosen[(chosen["attr"] == "wb")] if method != "dsa-memmove" else chosen
            chosen = chosen.assign(_notok=~chosen["ok"]).sort_values(
                ["size_bytes", "_notok", "n_params"]).drop_duplicates("size_bytes")
            medians[label] = {}
            for _, row in chosen.iterrows():
                key = (int(row["size_bytes"]),)
                cells.setdefault(key, [NOT_IN_RUN] * len(B8_SERIES) + [None])
                cells[key][[s[0] for s in B8_SERIES].index(label)] = stat_of(row)
                if row["ok"]:
                    medians[label].setdefault(int(row["size_bytes"]), float(row["median_ns"]))
            if medians[label]:
                xs = sorted(medians[label])
                plot.series.append(Series(f"{label} {pool}" + (f" #{run.label}" if len(runs) > 1
                                                                 else ""),
                                          tuple(xs), tuple(medians[label][x] / 1e3 for x in xs),
                                          index))
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        for direction, cpu_label, dsa_label in (("write", B8_SERIES[0][0], B8_SERIES[1][0]),
                                                ("read", B8_SERIES[2][0], B8_SERIES[3][0])):
            sizes = sorted(set(medians[cpu_label]) & set(medians[dsa_label]))
            cpu = [medians[cpu_label][s] for s in sizes]
            dsa = [medians[dsa_label][s] for s in sizes]
            size = crossover_size(sizes, cpu, dsa)
            section.notes.append(f"{name}, {direction} on {pool}: {_crossover(sizes, size)}"
                                 f" (paper: CPU wins only below {cpu_below.text()})")
            if size:
                plot.lines.append(RefLine(f"{direction} crossover {format_size(size)}", size,
                                          "x"))
        for key, row in cells.items():
            faster = [("CPU" if _ns(row[i]) < _ns(row[i + 1]) else "DSA")
                      for i in (0, 2) if _ns(row[i]) is not None and _ns(row[i + 1]) is not None]
            row[-1] = " / ".join(faster) if faster else None
            cells[key] = row
        per_run.append(cells)
    section.table = keyed_table([Column("size", "size")],
                                [*(Column(s[0], "time") for s in B8_SERIES),
                                 Column("faster (write / read)")],
                                runs, per_run, sort_key=lambda k: k[0])
    section.plots.append(plot)
    return section


def _gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["method"].isin(GPU_COPY_METHODS)]


def section_b9(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("b9", "B9–B10 — GPU: cudaMemcpy vs one gather kernel",
                      "Each GPU copy method over size and fragment count on every path measured; "
                      "kernel / memcpy = the one-launch kernel's median over cuda-memcpy's.",
                      _refs("B9", "B10"))
    b10_below, b10_latency = figure("B10").value("below size"), figure("B10").value("latency")
    if not any((_gpu_rows(df)["ok"]).any() for df in frames):
        section.absent = "No GPU measurement: " + _absent(runs, frames, GPU_COPY_METHODS,
                                                          "GPU copy")
        return section
    methods = [m for m in GPU_COPY_METHODS if any(
        ((df["method"] == m)).any() for df in frames)]
    per_run = []
    for run, df in zip(runs, frames, strict=True):
        rows = _gpu_rows(df)
        cells: dict[tuple, list[Cell]] = {}
        for (path, pattern), group in rows.groupby(["path", "pattern"], sort=False):
            first = group.iloc[0]
            key = (path, pattern, int(first["size_bytes"]), int(first["fragment_count"]))
            values: list[Cell] = []
            for method in methods:
                row = _best(group[group["method"] == method])
                values.append(stat_of(row) if row is not None else None)
            kernel = next((values[methods.index(m)] for m in KERNEL_METHODS if m in methods
                           and isinstance(values[methods.index(m)], Stat)), None)
            memcpy = values[methods.index("cuda-memcpy")] if "cuda-memcpy" in methods else None
            cells[key] = [*values, _ratio(_ns(kernel), _ns(memcpy))]
        per_run.append(cells)
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        small_uc = rows[(rows["method"] == "cuda-memcpy") & rows["ok"] & (rows["attr"] == "uc")
                        & (rows["size_bytes"] < b10_below.bytes())]
        if len(small_uc):
            worst = small_uc.sort_values("median_ns").iloc[-1]
            section.notes.append(
                f"{name}: cuda-memcpy from uncacheable host memory below {b10_below.text()}: "
                f"slowest median {format_ns(worst['median_ns'])} at {worst['pattern']} "
                f"({_ratio(worst['median_ns'], b10_latency.ns()):.2f}× the "
                f"paper's ~{b10_latency.text()})")
        else:
            section.notes.append(f"{name}: no cuda-memcpy row from an uncacheable host region "
                                 f"below {b10_below.text()} (B10 needs a UC pool mapping)")
    section.table = keyed_table(
        [Column("path"), Column("pattern"), Column("bytes", "size"), Column("fragments",
                                                                               "count")],
        [*(Column(m, "time") for m in methods), Column("kernel / memcpy", "ratio")],
        runs, per_run, sort_key=lambda k: (k[0], k[3], k[2]))
    plot = fragment_plot("b9-fragments", "GPU: time against fragment count", runs,
                         [_gpu_rows(df) for df in frames])
    if plot.series:
        section.plots.append(plot)
    return section


def _pool_and_local_to_gpu(df: pd.DataFrame) -> dict[str, tuple]:
    """Per GPU copy method, B11's pair of 64 KiB rows into a GPU: (from the most pool-like host
    region, from local host memory: pinned first, then registered dram, then dram)."""
    local_order = {"pinned": 0, "registered:dram": 1, "dram": 2}
    rows = _gpu_rows(df)
    rows = rows[(rows["size_bytes"] == SIZE_64K) & rows["contiguous"]
                & rows["dst"].str.startswith("gpu:")]
    rows = rows.assign(local_rank=[local_order.get(s.split("[")[0], 9) for s in rows["src"]])
    return {method: (_best(group[group["src_rank"] < LOCAL_CLASS], ("src_rank",)),
                     _best(group[group["src_rank"] == LOCAL_CLASS], ("local_rank",)))
            for method, group in rows.groupby("method", sort=False)}


def section_b11(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    fig = figure("B11")
    paper_ratio = fig.value("pool -> GPU").ns() / fig.value("local DRAM -> GPU").ns()
    section = Section("b11", "B11 — pool -> GPU vs local DRAM -> GPU at 64 KB",
                      "One 64 KiB copy into GPU memory from the most pool-like host region and "
                      "from local host memory (pinned first, then dram); near-local = pool / "
                      "local.", [fig])
    if not any((_gpu_rows(df)["ok"] & (_gpu_rows(df)["size_bytes"] == SIZE_64K)).any()
               for df in frames):
        section.absent = "No 64 KiB GPU copy: " + _absent(runs, frames, GPU_COPY_METHODS,
                                                          "GPU copy")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for method, (pool, local) in _pool_and_local_to_gpu(df).items():
            pool_cell = stat_of(pool) if pool is not None else NoValue("no pool -> GPU row")
            local_cell = stat_of(local) if local is not None else NoValue("no local -> GPU row")
            cells[(method, f"{fig.value('pool -> GPU').text()} vs "
                           f"{fig.value('local DRAM -> GPU').text()} ({paper_ratio:.2f}×)")] = [
                pool_cell, pool["src"] if pool is not None else None, local_cell,
                local["src"] if local is not None else None,
                _ratio(_ns(pool_cell), _ns(local_cell))]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("method"), Column("paper")],
        [Column("pool -> GPU", "time"), Column("pool region"), Column("local -> GPU", "time"),
         Column("local region"), Column("near-local", "ratio")], runs, per_run)
    return section


def _peak(rows: pd.DataFrame) -> pd.Series | None:
    ok = rows[rows["ok"] & rows["gbps"].notna()]
    if ok.empty:
        return None
    return ok.sort_values("gbps", ascending=False).iloc[0]


def section_b12(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    cap = figure("B12").value("per CXL adapter")
    section = Section("b12", "B12 — bandwidth per path",
                      "The highest bandwidth each method reached on each path over the "
                      "contiguous sizes measured (bytes moved / median time). Paths between a "
                      f"non-local host region and a GPU are compared with the paper's "
                      f"{cap.text()} per-adapter cap.", _refs("B12", "S2"))
    if not any((df["ok"] & df["contiguous"]).any() for df in frames):
        section.absent = "No contiguous transfer ran in " + (
            "these runs." if len(runs) > 1 else "this run.")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        rows = df[df["contiguous"]]
        for (method, path), group in rows.groupby(["method", "path"], sort=False):
            peak = _peak(group)
            if peak is None:  # never ran on this path: the skipped section says why
                continue
            pool_gpu = ({peak["rank"], peak["peer_rank"]} & {GPU_CLASS}
                        and min(peak["rank"], peak["peer_rank"]) < LOCAL_CLASS)
            cells[(method, path)] = [float(peak["gbps"]), int(peak["size_bytes"]),
                                     _ratio(float(peak["gbps"]), cap.central) if pool_gpu
                                     else None]
        per_run.append(cells)
    section.table = keyed_table([Column("method"), Column("path")],
                                [Column("peak GB/s", "gbps"), Column("at size", "size"),
                                 Column(f"× {cap.text()} cap", "ratio")], runs, per_run)
    section.plots.append(bandwidth_plot(runs, frames))
    return section


def _kv_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Fragmented transfers and the kv-metadata phase: rows with many fragments or a kind:
    pattern (a chase ring is one contiguous pattern that is no transfer: not a fragment list)."""
    fragmented = (df["fragment_count"] > 1) | df["pattern"].str.contains(":", regex=False)
    return df[fragmented & ~df["method"].isin((*RPC_METHODS, "layer-stream"))]


def section_kv(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("b13", "B13/B14 — KV fragment transfers",
                      "Fragmented transfers: KV-cache layouts (kv: patterns) and COUNTxSIZE "
                      "fragment lists, every method and path. B14's sparse read is 1,024 "
                      "fragments of 160 B. Decision → ready = the kv-metadata phase (block "
                      "table -> fragment list) + the transfer, for the same pattern.",
                      _refs("B13", "B14", "B2"))
    if not any(_kv_rows(df)["ok"].any() for df in frames):
        section.absent = "No fragmented (KV) transfer ran: " + (
            "the runs have" if len(runs) > 1 else "this run has") + \
            " no kv: or COUNTxSIZE pattern rows that completed."
        return section
    per_run = []
    for df in frames:
        # decision to data-ready = the metadata phase (block table -> fragment list) + the transfer
        done = df[df["ok"]]
        metadata = dict(zip(done.loc[done["method"] == "kv-metadata", "pattern"],
                            done.loc[done["method"] == "kv-metadata", "median_ns"], strict=True))
        cells: dict[tuple, list[Cell]] = {}
        for _, row in _kv_rows(df).iterrows():
            key = (row["method"], row["path"], row["pattern"], int(row["fragment_count"]),
                   int(row["fragment_bytes"]), int(row["size_bytes"]),
                   _params_text(row["params_d"]))
            stat = stat_of(row)
            ready = float(row["median_ns"]) + float(metadata[row["pattern"]]) \
                if row["ok"] and row["transfer"] and row["pattern"] in metadata else None
            cells[key] = [stat, ready,
                          float(row["gbps"]) if row["ok"] and row["transfer"] else None]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("method"), Column("path"), Column("pattern"), Column("fragments", "count"),
         Column("fragment", "size"), Column("bytes", "size"), Column("params")],
        [Column("median (p10–p90)", "time"), Column("decision → ready", "time"),
         Column("GB/s", "gbps")], runs, per_run,
        sort_key=lambda k: (k[0], k[1], k[3], k[4]))
    plot = fragment_plot("kv-fragments", "Fragmented transfers: time against fragment count",
                         runs, [_kv_rows(df) for df in frames])
    if plot.series:
        section.plots.append(plot)
    return section


def section_b15(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    fig = figure("B15")
    rtt, mops = fig.value("64 B round trip"), fig.value("throughput at qd 128")
    section = Section("b15", "B15 — metadata RPC over shared memory",
                      "rpc-roundtrip: one request/response through shared-memory slots; "
                      "rpc-throughput: operations per second of one server thread at queue "
                      "depth qd (Mops = 1000 / median ns per operation). × paper: round trip "
                      f"over {rtt.text()} at 64 B; throughput over {mops.text()} at qd 128.",
                      [fig])
    if not any(df[df["method"].isin(RPC_METHODS)]["ok"].any() for df in frames):
        section.absent = "No RPC measurement: " + _absent(runs, frames, RPC_METHODS, "rpc")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for _, row in df[df["method"].isin(RPC_METHODS)].iterrows():
            params = {**_declared_params(row["method"]), **row["params_d"]}  # defaults are implicit
            qd = params.get("qd")
            key = (row["method"], str(params.get("protocol", "-")), str(qd or "-"),
                   row["pattern"], _with_attr(row["region"], row["attr"]))
            stat = stat_of(row)
            ops = 1000 / stat.median_ns if isinstance(stat, Stat) and stat.median_ns > 0 \
                else None
            if row["method"] == "rpc-throughput":
                ratio = _ratio(ops, mops.central) if str(qd) == "128" else None
            else:
                ratio = _ratio(_ns(stat), rtt.ns()) if int(row["fragment_bytes"]) == 64 else None
                ops = None
            cells[key] = [stat, ops, ratio]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("method"), Column("protocol"), Column("qd"), Column("message"),
         Column("region")],
        [Column("median per op (p10–p90)", "time"), Column("Mops", "mops"),
         Column("× paper", "ratio")], runs, per_run,
        sort_key=lambda k: (k[0], k[1], int(k[2]) if k[2].isdigit() else 0, k[3]))
    return section


S2_ROWS = (  # (medium, paper value name or None, paper figure)
    ("NVLink peer GPU (peer-memcpy)", "NVLink", "S2"),
    ("Host DRAM over PCIe (cuda-memcpy pinned -> GPU)", "PCIe host", "S2"),
    ("CXL pool -> GPU (cuda-memcpy)", "per CXL adapter", "B12"),
    ("NVMe SSD", "NVMe SSD", "S2"),
)
STORAGE_READS = ("file-read", "file-read-gpu", "file-read-gds")  # the SSD row's candidates


def section_s2(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("s2", "S2 — reload media",
                      "Where a KV cache can be reloaded from, at the best bandwidth measured "
                      "(any size). The CXL pool row compares with Beluga's per-adapter cap.",
                      _refs("S2", "B12"))
    gpu_methods = ("peer-memcpy", "cuda-memcpy")
    if not any(df[df["method"].isin(gpu_methods)]["ok"].any() for df in frames):
        section.absent = "No GPU reload path measured: " + _absent(
            runs, frames, gpu_methods, "peer-memcpy / cuda-memcpy")
    per_run = []
    for df in frames:
        gpu_dst = df["dst"].str.startswith("gpu:")
        choices = {
            S2_ROWS[0][0]: df[(df["method"] == "peer-memcpy")],
            S2_ROWS[1][0]: df[(df["method"] == "cuda-memcpy") & gpu_dst
                              & (df["src_kind"] == "pinned")],
            S2_ROWS[2][0]: df[(df["method"] == "cuda-memcpy") & gpu_dst
                              & (df["src_rank"] < LOCAL_CLASS)],
            S2_ROWS[3][0]: df[df["method"].isin(STORAGE_READS)  # the disk, not a warm cache
                              & df["params_d"].map(lambda p: p.get("cache") != "warm")],
        }
        cells: dict[tuple, list[Cell]] = {}
        for medium, value_name, fig_id in S2_ROWS:
            paper = figure(fig_id).value(value_name)
            key = (medium, f"{paper.text()} ({fig_id})")
            peak = _peak(choices[medium])
            if peak is None:
                rows = choices[medium]
                why = (f"{rows.iloc[0]['status']}: {rows.iloc[0]['reason']}" if len(rows)
                       else "no such rows in this run")
                cells[key] = [NoValue(why), None, None, None]
                continue
            path = peak["path"]
            if medium == S2_ROWS[3][0]:  # which reads: pattern, qd, cache, engine
                info = peak.get("info") if isinstance(peak.get("info"), dict) else {}
                params = {**_declared_params(peak["method"]), **peak["params_d"],
                          **({"engine": info["engine"]} if "engine" in info else {})}  # ran
                path = f"{peak['method']}: {path} {peak['pattern']} {_params_text(params)}"
            cells[key] = [float(peak["gbps"]), int(peak["size_bytes"]), path,
                          _ratio(float(peak["gbps"]), paper.central)]
        per_run.append(cells)
    section.table = keyed_table([Column("medium"), Column("paper")],
                                [Column("peak GB/s", "gbps"), Column("at size", "size"),
                                 Column("path"), Column("× paper", "ratio")], runs, per_run)
    section.table.collapse = False  # one row per medium, measured or not
    section.plots.append(reload_media_plot(runs, per_run))
    return section


S2_PLOT = ((1, "host memory\n(PCIe)"), (2, "CXL pool"), (0, "peer GPU\n(NVLink)"),
           (3, "NVMe SSD"))  # (S2_ROWS index, x label): memory, pool, peer GPU, SSD


def reload_media_plot(runs: list[RunInfo], per_run: list[dict]) -> PlotData:
    """The S2 table's peak GB/s per medium side by side, the papers' figures as stars."""
    series, points, labels, unmeasured = [], [], [], []
    for x, (row_index, label) in enumerate(S2_PLOT, start=1):
        medium, value_name, fig_id = S2_ROWS[row_index]
        paper = figure(fig_id).value(value_name)
        points.append(RefPoint(f"{fig_id} {paper.text()}\nreported by the paper", x,
                               paper.central))
        measured, flat = False, label.replace("\n", " ")
        for index, (run, cells) in enumerate(zip(runs, per_run, strict=True)):
            gbps = cells[(medium, f"{paper.text()} ({fig_id})")][0]
            if not isinstance(gbps, float):
                continue
            measured = True
            shift = (index - (len(runs) - 1) / 2) * 0.15  # runs side by side within a medium
            series.append(Series(f"{flat}: {gbps:.3g} GB/s"
                                 + (f" #{run.label}" if len(runs) > 1 else ""),
                                 (x + shift,), (gbps,), index))
        labels.append(label if measured else f"{label}\nnot measured")
        if not measured:
            unmeasured.append(flat)
    return PlotData("reload-media", "Reload media side by side: each S2 row's best measured "
                    "bandwidth", "medium", "GB/s", series, points, x_is_size=False, connect=False,
                    categories=tuple(labels), unmeasured=tuple(unmeasured))


def section_s3(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("s3", "S3 — layer stream (per-layer round trip)",
                      "layer-stream: fetch one layer's KV from the peer, use it, write it back, "
                      "next layer; the median is one layer's round trip.", _refs("S3", "S5"))
    if not any(df[df["method"] == "layer-stream"]["ok"].any() for df in frames):
        section.absent = "No layer-stream measurement: " + _absent(runs, frames,
                                                                   ["layer-stream"],
                                                                   "layer-stream")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for _, row in df[df["method"] == "layer-stream"].iterrows():
            key = (row["path"], row["pattern"], _params_text(row["params_d"]))
            cells[key] = [stat_of(row), float(row["gbps"]) if row["ok"] else None]
        per_run.append(cells)
    section.table = keyed_table([Column("path"), Column("pattern"), Column("params")],
                                [Column("per-layer round trip (p10–p90)", "time"),
                                 Column("GB/s", "gbps")], runs, per_run)
    return section


NEAR_MATCH = ["method", "access", "attr", "peer", "pattern", "params"]


def near_matches(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured row on a non-local host region that local dram was also measured at (same
    method, access, attribute, peer, pattern and parameters), with `local_ns` and `ratio`."""
    ok = df[df["ok"]]
    base = ok[ok["region"] == "dram"].drop_duplicates(NEAR_MATCH).set_index(NEAR_MATCH)
    others = ok[ok["rank"] < LOCAL_CLASS]
    local = [base["median_ns"].get(tuple(row[m] for m in NEAR_MATCH))
             for _, row in others.iterrows()]
    others = others.assign(local_ns=pd.Series(local, index=others.index, dtype="float64"))
    others = others[others["local_ns"].notna() & (others["local_ns"] > 0)]
    return others.assign(ratio=others["median_ns"] / others["local_ns"])


NEAR_INTRO = ("Every non-local region's median as a ratio of local dram's at the same method, "
              "pattern, access, attribute, peer and parameters (1.00× = as fast as local; "
              "2.00× = twice as slow).")


def _ratio_text(value: float) -> str:
    return f"{value:.2f}×"


def _short_reason(reason: str) -> str:
    """A skip reason's headline (`no GPU: cupy is not importable (...)` -> `no GPU`)."""
    head = str(reason).split(":")[0].split(" (")[0].strip()
    return head or str(reason)


LATENCY_RINGS = (16 * 1024, 1024**3)  # the headline's idle latencies: in L1, and in memory


@dataclass(frozen=True)
class Headline:
    """One non-local region against local DRAM, as the report's first lines state it: idle
    latency (chase, ns per load) at the headline ring sizes and bandwidth at the largest size
    both measured. None where the run lacks the pair."""

    region: str
    what: str
    latency: tuple[tuple[int, float | None, float | None], ...]  # (ring, region ns, local ns)
    bandwidth: tuple[str, float, float] | None  # (method and pattern, region GB/s, local GB/s)


def _chase_median(df: pd.DataFrame, region: str, size: int) -> float | None:
    rows = df[df["ok"] & (df["method"] == "chase") & (df["region"] == region)
              & (df["size_bytes"] == size) & (df["attr"] == "wb")]
    row = _best(rows, ("n_params",))
    return None if row is None else float(row["median_ns"])


def headlines(df: pd.DataFrame) -> list[Headline]:
    """Every measured region that is other memory than this box's DRAM (a pool, a CPU-less or
    another NUMA node), most pool-like first."""
    measured = df[df["ok"] & (df["rank"] < SHARED_CLASS)]
    near = near_matches(df)
    out = []
    for (_, region), group in measured.groupby(["rank", "region"], sort=True):
        latency = tuple((size, _chase_median(df, region, size), _chase_median(df, "dram", size))
                        for size in LATENCY_RINGS)
        moved = near[(near["region"] == region) & near["contiguous"] & near["gbps"].notna()
                     & (near["gbps"] > 0)]
        bandwidth = None
        if len(moved):
            largest = moved[moved["size_bytes"] == moved["size_bytes"].max()]
            local_gbps = largest["gbps"] * largest["ratio"]  # same bytes in local dram's time
            best = largest.loc[local_gbps.idxmax()]
            bandwidth = (f"{best['method']} {best['pattern']}", float(best["gbps"]),
                         float(local_gbps.max()))
        out.append(Headline(region, str(group["region_what"].iloc[0]), latency, bandwidth))
    return out


def headline_text(h: Headline) -> str:
    """`numa:1, a CPU-less NUMA node (...): latency vs local DRAM 16KiB 1.07× (1.6 ns vs 1.5 ns
    per load), 1GiB ...; bandwidth 0.50× (load 64KiB: 21.8 vs 43.7 GB/s).`"""
    latencies = []
    for size, mine, local in h.latency:
        if mine is None or not local:
            latencies.append(f"{format_size(size)} not measured")
        else:
            latencies.append(f"{format_size(size)} {_ratio_text(mine / local)} ({format_ns(mine)} "
                             f"vs {format_ns(local)} per load)")
    if h.bandwidth is None:
        bandwidth = "bandwidth not measured beside local DRAM"
    else:
        case, mine, local = h.bandwidth
        bandwidth = (f"bandwidth {_ratio_text(mine / local)} ({case}: {mine:.3g} vs {local:.3g} "
                     "GB/s)")
    return (f"{h.region}, a {h.what}: latency vs local DRAM {', '.join(latencies)}; "
            f"{bandwidth}.")


def only_local_text(meta: dict) -> str:
    inventory = meta.get("inventory") or {}
    nodes, dax = len(inventory.get("numa") or []), len(inventory.get("dax") or [])
    has = (f"this box has {nodes} NUMA node{'s' if nodes != 1 else ''} and no device-dax pool"
           if nodes <= 1 and not dax else "the run measured no other region")
    return (f"Only local DRAM was measured: {has}, so there is nothing to compare it with "
            "(nearlocal probe lists the regions; --region numa:N or --region devdax:/dev/daxX.Y "
            "names one).")


@dataclass(frozen=True)
class Acceptance:
    """A stored `nearlocal accept` run judged again against its spec."""

    spec: str
    run_id: str
    passed: int
    failed: tuple[str, ...]  # the failed requirements, each with what it measured or why
    problem: str = ""  # the spec could not be read again


def acceptance_of(run: RunData) -> list[Acceptance]:
    """The verdicts that exist for this run's host: the run itself when it is an accept run,
    else the latest accept run per spec in the same store from the same host."""
    from nearlocal.errors import UsageError
    from nearlocal.report import accept
    from nearlocal.results.store import list_runs, load, survey_run

    def is_accept(meta: dict) -> bool:
        return bool(meta.get("spec")) or meta.get("kind") == "accept"

    candidates = [run] if is_accept(run.meta) else []
    if not candidates and run.path is not None:
        latest: dict[str, Path] = {}
        for path in list_runs(Path(run.path).parent):
            meta, state = survey_run(path)
            if is_accept(meta) and not state and meta.get("host_id") == run.meta.get("host_id"):
                latest[str(meta.get("spec"))] = path  # run ids sort by start time
        candidates = []
        for path in latest.values():
            try:
                candidates.append(load(path))
            except UsageError:
                continue
    out = []
    for candidate in candidates:
        name = Path(str(candidate.meta.get("spec", "?"))).name
        try:
            spec = accept.parse_spec(candidate.meta["spec"])
            verdicts = accept.judge(spec, candidate)
        except (UsageError, OSError, KeyError) as exc:
            out.append(Acceptance(name, candidate.run_id, 0, (), f"cannot judge it again: {exc}"))
            continue
        failed = tuple(f"{v.requirement.name} ({_missed(accept, v)})" for v in verdicts
                       if not v.passed)
        out.append(Acceptance(name, candidate.run_id, len(verdicts) - len(failed), failed))
    return out


def _missed(accept, verdict) -> str:
    """Why a requirement failed: its reason (not measured), else measured against the bound."""
    req = verdict.requirement
    return verdict.reason or (f"measured {accept._format(verdict.measured, req)}, bound "
                              f"{accept.bound_text(req)}")


def acceptance_text(a: Acceptance) -> str:
    if a.problem:
        return f"Acceptance {a.spec} (run {a.run_id}): {a.problem}."
    if not a.failed:
        return f"PASS: {a.spec}, all {a.passed} requirements (run {a.run_id})."
    return (f"FAIL: {a.spec}, {len(a.failed)} of {a.passed + len(a.failed)} requirements failed "
            f"(run {a.run_id}): " + "; ".join(a.failed) + ".")


def lead_lines(run: RunInfo, df: pd.DataFrame, data: RunData, multi: bool) -> list[str]:
    """The report's first lines: one per non-local region with its headline ratios to local
    DRAM (or one saying only local DRAM was measured), PASS / FAIL where acceptance verdicts
    exist, the GPU path, and what the run could not measure."""
    lines = [headline_text(h) for h in headlines(df)] or [only_local_text(data.meta)]
    lines += [acceptance_text(a) for a in acceptance_of(data)]
    gpu = _pool_and_local_to_gpu(df)
    pairs = [(m, pool, local) for m, (pool, local) in gpu.items() if pool is not None
             and local is not None and pool["ok"] and local["ok"]]
    if pairs:
        method, pool, local = pairs[0]
        fig = figure("B11")
        paper = fig.value("pool -> GPU").ns() / fig.value("local DRAM -> GPU").ns()
        lines.append(f"Into the GPU, 64 KiB by {method} from {pool['src']} takes "
                     f"{_ratio_text(pool['median_ns'] / local['median_ns'])} the time from "
                     f"{local['src']} (B11; Beluga reports {_ratio_text(paper)}).")
    counts = df["status"].value_counts()
    converged = df["converged"] if "converged" in df else pd.Series(dtype=object)
    unconverged = int((df["ok"] & converged.notna()
                       & (converged.astype("boolean") == False)).sum())  # noqa: E712
    skipped = df.loc[df["status"] == "skipped", "reason"].map(_short_reason).value_counts()
    outcome = (f"{int(counts.get('ok', 0))} cases measured ({unconverged} not converged, "
               f"marked †), {int(counts.get('failed', 0))} failed, "
               f"{int(counts.get('skipped', 0))} skipped")
    if len(skipped):
        outcome += ": " + ", ".join(f"{reason} ({n})" for reason, n in skipped.head(4).items())
        outcome += f" and {len(skipped) - 4} more reasons" if len(skipped) > 4 else ""
    lines.append(outcome + ".")
    return [f"Run #{run.label} ({run.run_id} on {run.host}): {line}" for line in lines] \
        if multi else lines


NO_NEAR_PAIRS = ("No non-local region (numa:N, devdax:, shm:, file:) was measured at a pattern "
                 "that local dram was also measured at.")


def section_near_summary(runs: list[RunInfo], frames: list[pd.DataFrame],
                         data: list[RunData]) -> Section:
    section = Section("near", "How near is local",
                      "Per region and direction: the median, best and worst of its ratios to "
                      "local dram over the cases both measured (every case is listed in "
                      "\"How near is local: every case\" below). " + NEAR_INTRO)
    section.lead = [line for run, df, one in zip(runs, frames, data, strict=True)
                    for line in lead_lines(run, df, one, len(runs) > 1)]
    per_run = []
    order: dict[tuple, tuple] = {}
    for df in frames:
        near = near_matches(df)
        cells: dict[tuple, list[Cell]] = {}
        for (region, what, access, rank), group in near.groupby(
                ["region", "region_what", "access", "rank"], sort=False):
            attrs = sorted(set(group["attr"]))
            key = (region + ("" if attrs == ["wb"] else f" [{', '.join(attrs)}]"), what, access)
            order[key] = (int(rank), key)
            ratios = group["ratio"]
            cells[key] = [len(group), float(ratios.median()), float(ratios.min()),
                          float(ratios.max()),
                          ", ".join(dict.fromkeys(group.sort_values("ratio")["method"]))]
        per_run.append(cells)
    if not any(per_run):  # the lead says so, once
        section.intro = ""
        return section
    section.table = keyed_table(
        [Column("region"), Column("what it is"), Column("access")],
        [Column("cases", "count"), Column("median ÷ local", "ratio"),
         Column("best", "ratio"), Column("worst", "ratio"),
         Column("methods (nearest first)")], runs, per_run, sort_key=lambda k: order[k])
    return section


def section_near_local(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("near-cases", "How near is local: every case", NEAR_INTRO)
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for _, row in near_matches(df).iterrows():
            key = (row["method"], row["access"], row["pattern"], int(row["size_bytes"]),
                   _with_attr(row["region"], row["attr"]), _params_text(row["params_d"]))
            cells[key] = [stat_of(row), float(row["local_ns"]), float(row["ratio"])]
        per_run.append(cells)
    if not any(per_run):
        section.absent = NO_NEAR_PAIRS
        return section
    section.table = keyed_table(
        [Column("method"), Column("access"), Column("pattern"), Column("bytes", "size"),
         Column("region"), Column("params")],
        [Column("median (p10–p90)", "time"), Column("local dram", "time"),
         Column("÷ local", "ratio")], runs, per_run,
        sort_key=lambda k: (k[0], k[1], k[4], k[3]))
    return section


def _inventory_rows(meta: dict) -> dict[tuple, list[Cell]]:
    inv = meta.get("inventory") or {}
    cpu = inv.get("cpu") or {}
    flags = cpu.get("flags") or {}
    settings = meta.get("settings") or {}
    numa = inv.get("numa") or []
    cxl = inv.get("cxl") or {}
    dsa = inv.get("dsa") or {}
    gpu = inv.get("gpu") or {}
    huge = inv.get("hugepages") or {}
    tsc = inv.get("tsc_hz")
    rows = {
        "host": f"{inv.get('hostname', '?')} (host id {inv.get('host_id', '?')})",
        "kernel": inv.get("kernel", "?"),
        "CPU": f"{cpu.get('model', '?')} ({cpu.get('vendor', '?')}), "
               f"{cpu.get('logical_cpus', '?')} logical CPUs",
        "TSC": f"{tsc / 1e9:.3f} GHz ({inv.get('tsc_source', '?')})" if tsc else "?",
        "CPU flags present": " ".join(k for k, v in flags.items() if v) or "-",
        "CPU flags absent": " ".join(k for k, v in flags.items() if not v) or "-",
        "caches": ", ".join(f"L{c.get('level')} {c.get('kind')} "
                            f"{format_size(int(c.get('size_bytes', 0)))}"
                            for c in cpu.get("caches", []) if c.get("size_bytes")) or "-",
        "NUMA nodes": "; ".join(
            f"{n.get('node')}: {len(n.get('cpus') or [])} CPUs, "
            f"{float(n.get('mem_total_bytes') or 0) / 2**30:.1f} GiB"
            + ("" if n.get("cpus") else " (CPU-less: likely CXL)") for n in numa) or "-",
        "CXL": (f"{len(cxl.get('memdevs', []))} memdevs, {len(cxl.get('regions', []))} regions"
                if cxl.get("present") else "none"),
        "device-dax": ", ".join(f"{d.get('name')} {format_size(int(d.get('size') or 0))} "
                                f"({d.get('mode')})" for d in inv.get("dax") or []) or "none",
        "DSA": (", ".join(d.get("name", "?") for d in dsa.get("devices", [])) or
                "idxd loaded, no devices") if dsa.get("module_loaded") else "none",
        "GPU": ", ".join(f"{g.get('index')}: {g.get('name')}" for g in gpu.get("devices", []))
               or gpu.get("reason") or "none",
        "huge pages": ", ".join(f"{format_size(int(p.get('page_bytes')))}: {p.get('free')}/"
                                f"{p.get('total')} free" for p in huge.get("pools", []))
                      + f"; THP {huge.get('thp_mode', '?')}",
        "nearlocal": f"{meta.get('nearlocal_version', '?')} (numba "
                     f"{meta.get('numba_version', '?')}, python {meta.get('python_version', '?')})",
        "suite / budget": f"{meta.get('suite', '?')}, {settings.get('budget_s', '?')} s per case"
                          f", CI target ±{float(settings.get('target_rel_ci', 0)) * 100:g}%",
        "started / ended": f"{meta.get('started', '?')} / {meta.get('ended', '?')}",
    }
    return {(name,): [value] for name, value in rows.items()}


def section_inventory(runs: list[RunInfo], data: list[RunData]) -> Section:
    section = Section("inventory", "Host inventory",
                      "What each run was made on (nearlocal probe at the start of the run).")
    section.table = keyed_table([Column("item")], [Column("value")], runs,
                                [_inventory_rows(run.meta) for run in data])
    return section


def _unconverged_text(group: pd.DataFrame, target: float | None) -> str:
    """What the unconverged cases of one method have in common: their patterns, how wide their
    pooled median's CI is, and (several processes) how many processes missed the target."""
    half = ((group["ci_high_ns"] - group["ci_low_ns"]) / 2 / group["median_ns"] * 100).dropna()
    patterns = ", ".join(dict.fromkeys(group.sort_values("size_bytes")["pattern"]))
    aim = f"±{target * 100:g}%" if target else "its target"
    parts = [patterns]
    if len(half):
        parts.append(f"CI of the pooled median ±{half.min():.1f}–{half.max():.1f}%")
    else:
        parts.append("too few samples for a confidence interval")
    if "processes_converged" in group and "processes" in group:
        missed = (pd.to_numeric(group["processes"], errors="coerce")
                  - pd.to_numeric(group["processes_converged"], errors="coerce")).dropna()
        if len(missed):
            low, high = int(missed.min()), int(missed.max())
            count = f"{low}" if low == high else f"{low}–{high}"
            parts.append(f"in {count} of {int(group['processes'].max())} worker processes the CI "
                         f"did not reach {aim} within the process's budget")
    else:
        parts.append(f"the CI did not reach {aim} within the budget")
    return "; ".join(parts)


def section_failures(runs: list[RunInfo], frames: list[pd.DataFrame],
                     data: list[RunData]) -> Section:
    section = Section("failures", "Failed and unconverged cases",
                      "Cases that failed (crash, timeout, error), one line each, and per method "
                      "the cases whose median's 95% CI did not reach the target within the "
                      "budget (their numbers stand but are noisier; marked † in the tables).")
    per_run = []
    for run_data, df in zip(data, frames, strict=True):
        cells: dict[tuple, list[Cell]] = {}
        for _, row in df[df["status"] == "failed"].iterrows():
            cells[(row["case_id"],)] = [f"failed: {row['reason']}"]
        target = (run_data.meta.get("settings") or {}).get("target_rel_ci")
        converged = df["converged"]
        unconverged = df[df["ok"] & converged.notna() & (converged.astype("boolean") == False)]  # noqa: E712
        for method, group in unconverged.groupby("method", sort=True):  # one line per method
            cells[(f"{method}: {len(group)} not converged",)] = [_unconverged_text(group, target)]
        per_run.append(cells)
    for run, df in zip(runs, frames, strict=True):
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        counts = df["status"].value_counts()
        section.notes.append(f"{name}: " + ", ".join(f"{int(counts.get(s, 0))} {s}"
                                                     for s in ("ok", "skipped", "failed")))
    if not any(per_run):
        section.absent = "No case failed and every measured case converged."
        return section
    section.table = keyed_table([Column("case")], [Column("outcome")], runs, per_run,
                                sort_key=lambda k: k[0])
    return section


def section_skipped(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("skipped", "Skipped cases",
                      "Cases that could not run on the box, grouped by the reason the run "
                      "recorded.")
    per_run = []
    for df in frames:
        counts = df.loc[df["status"] == "skipped", "reason"].value_counts()
        per_run.append({(reason,): [int(n)] for reason, n in counts.items()})
    if not any(per_run):
        section.absent = "No case was skipped."
        return section
    section.table = keyed_table([Column("reason")], [Column("cases", "count")], runs, per_run)
    return section


def section_runs(runs: list[RunInfo]) -> Section:
    section = Section("runs", "Runs", "The runs in this report" + (
        ", side by side: each measured column is labelled with its run's number." if len(runs)
        > 1 else "."))
    rows = [[r.label, r.run_id, r.host, r.suite, r.started,
             ", ".join(f"{n} {s}" for s, n in r.counts.items())] for r in runs]
    section.table = Table([Column("#"), Column("run"), Column("host"), Column("suite"),
                           Column("started"), Column("cases")], rows)
    return section


def section_references() -> Section:
    section = Section("references", "Reference figures",
                      "Every figure the reports compare with, as reported by the papers "
                      "(never measured here). Beluga: arXiv 2511.20172 (SIGMOD 2026); "
                      "SwiftCache: arXiv 2606.16135.")
    rows = [[f.id, f.paper.title.split(":")[0], f.what, f.text, f.provenance]
            for f in figures().values()]
    section.table = Table([Column("ID"), Column("paper"), Column("what"), Column("figure"),
                           Column("provenance")], rows)
    return section


# ---------------------------------------------------------------------------------------------
# Plot data


def _series_label(row_method: str, path: str, run: RunInfo, multi: bool) -> str:
    return f"{row_method} {path}" + (f" #{run.label}" if multi else "")


def _size_series(runs: list[RunInfo], frames: list[pd.DataFrame], value: str,
                 scale: float) -> list[Series]:
    out = []
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        rows = df[df["ok"] & df["contiguous"] & df[value].notna()]
        for (method, path), group in rows.groupby(["method", "path"], sort=False):
            group = group.sort_values("size_bytes").drop_duplicates("size_bytes")
            out.append(Series(_series_label(method, path, run, len(runs) > 1),
                              tuple(float(x) for x in group["size_bytes"]),
                              tuple(float(y) * scale for y in group[value]), index))
    return out


def latency_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    # only the papers' CPU accesses to the pool (B7): B11 (into a GPU) and B15 (an RPC round
    # trip) time other paths than this plot's CPU series, and sit in their own sections
    points = [RefPoint(f"{i} {figure(i).value().text()}", SIZE_16K, figure(i).value().ns() / 1e3)
              for i in ("B7a", "B7b", "B7c", "B7d", "B7e")]
    return PlotData("latency", "Latency against size (median)", "transfer size", "median (us)",
                    _size_series(runs, frames, "median_ns", 1e-3), points)


def bandwidth_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    lines = [RefLine(f"B12 {v.name} {v.text()}", v.central)
             for v in figure("B12").values if v.unit == "GB/s"]
    lines += [RefLine(f"S2 {v.name} {v.text()}", v.central) for v in figure("S2").values
              if v.unit == "GB/s"]
    return PlotData("bandwidth", "Bandwidth against size", "transfer size", "GB/s",
                    _size_series(runs, frames, "gbps", 1.0), lines=lines)


def fragment_plot(name: str, title: str, runs: list[RunInfo],
                  frames: list[pd.DataFrame]) -> PlotData:
    series = []
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        rows = df[df["ok"] & (df["fragment_count"] > 1) & df["transfer"]]
        for (method, path), group in rows.groupby(["method", "path"], sort=False):
            group = group.sort_values("fragment_count")
            series.append(Series(_series_label(method, path, run, len(runs) > 1),
                                 tuple(float(x) for x in group["fragment_count"]),
                                 tuple(float(y) / 1e3 for y in group["median_ns"]), index))
    b14 = figure("B14")
    reads = 16  # "fetching 16 such tokens": 16 reads of 1,024 fragments each
    per_read, cxl = b14.value("fragments per read"), b14.value("CXL")
    points = [RefPoint(f"B14 CXL: {reads} reads x {per_read.text()} x "
                       f"{b14.value('fragment size').text()} in {cxl.text()}",
                       reads * per_read.central, cxl.ns() / 1e3)]
    return PlotData(name, title, "fragments per transfer", "median (us)", series, points,
                    x_is_size=False, connect=False)


# ---------------------------------------------------------------------------------------------


def run_info(index: int, run: RunData) -> RunInfo:
    inventory = run.meta.get("inventory") or {}
    counts = run.cases["status"].value_counts().to_dict() if len(run.cases) else {}
    run_id = run.run_id + (f" (INCOMPLETE: {run.incomplete})" if run.incomplete else "")
    return RunInfo(str(index + 1), run_id,
                   str(inventory.get("hostname", "?")), str(run.meta.get("suite", "?")),
                   str(run.meta.get("started", "?")), str(run.path),
                   {k: int(v) for k, v in counts.items()})


def _latency_sections(runs: list[RunInfo], frames: list[pd.DataFrame]) -> list[Section]:
    from nearlocal.report.latency import (
        section_idle_latency,
        section_loaded_latency,
        section_threads,
    )

    return [section_idle_latency(runs, frames), section_threads(runs, frames),
            section_loaded_latency(runs, frames)]


def _section_rack(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    from nearlocal.report.rack import section_rack

    return section_rack(runs, frames)


def build_report(data: list[RunData]) -> Report:
    """Every section of the report for one or more runs (several runs: side-by-side columns)."""
    if not data:
        raise ValueError("build_report needs at least one run")
    runs = [run_info(i, run) for i, run in enumerate(data)]
    frames = [prepare(run) for run in data]
    idle, threads, loaded = _latency_sections(runs, frames)
    sections = [
        section_near_summary(runs, frames, data),  # the answer first (ratios, idle latency),
        idle,  # then the papers' tables
        section_runs(runs),
        section_b7(runs, frames),
        section_b8(runs, frames),
        section_b9(runs, frames),
        section_b11(runs, frames),
        section_b12(runs, frames),
        section_kv(runs, frames),
        section_b15(runs, frames),
        section_s2(runs, frames),
        section_s3(runs, frames),
        section_near_local(runs, frames),
        threads,
        loaded,
        _section_rack(runs, frames),
        section_inventory(runs, data),
        section_failures(runs, frames, data),
        section_skipped(runs, frames),
        section_references(),
    ]
    # every case beside local dram: nothing to list when nothing else was measured (the
    # first section says so once)
    sections = [s for s in sections if not (s.key == "near-cases" and s.absent)]
    for section in sections:
        if section.table is not None and section.table.collapse:
            collapse_unmeasured(section.table)
    return Report(runs, sections)


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

