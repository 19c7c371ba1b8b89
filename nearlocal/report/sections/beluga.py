"""Beluga's tables (arXiv 2511.20172): B7 CPU access to the pool, B8 CPU vs DSA, B9-B11 GPU
copies, B12 bandwidth, B13/B14 KV fragments, B15 metadata RPC. The method and region names below
are the section specs: which rows quote which of the paper's figures."""

from __future__ import annotations

import pandas as pd

from nearlocal.report.document import (
    NOT_IN_RUN,
    Cell,
    Column,
    NoValue,
    PlotData,
    RefLine,
    RefPoint,
    RunInfo,
    Section,
    Series,
    Stat,
    keyed_table,
)
from nearlocal.report.papers import figure
from nearlocal.report.registry import register_frames_section
from nearlocal.report.rows import (
    GPU_CLASS,
    LOCAL_CLASS,
    SHARED_CLASS,
    SIZE_16K,
    SIZE_64K,
    _absent,
    _best,
    _host_only,
    _isolated,
    _params_text,
    _refs,
    _with_attr,
    median_ns_of,
    ratio_or_none,
    stat_of,
)
from nearlocal.units import format_ns, format_size

# Rows of one run, with the derived columns every section uses

GPU_COPY_METHODS = ("cuda-memcpy", "cuda-memcpy-async", "cuda-memcpy-batch", "cuda-memcpy-2d",
                    "gather-kernel", "scatter-kernel", "zero-copy-kernel")
KERNEL_METHODS = ("gather-kernel", "scatter-kernel")
RPC_METHODS = ("rpc-roundtrip", "rpc-throughput")
B15_THROUGHPUT = "rpc-throughput"  # B15's Mops row; the other its round trip
B8_DSA = "dsa-memmove"  # B8: the CPU's paths against one DSA memmove
B9_MEMCPY = "cuda-memcpy"  # B9: the one-launch kernels over cudaMemcpy
B11_LOCAL_ORDER = {"pinned": 0, "registered:dram": 1, "dram": 2}  # B11's local host memory
B13_METADATA = "kv-metadata"  # B13: decision -> ready adds this phase to the transfer
B13_OWN_SECTIONS = (*RPC_METHODS, "layer-stream")  # fragmented, but B15's and S3's rows

B7_ROWS = (  # (figure, method, access, attr or None for any, label)
    ("B7a", "nt-store", "write", "wb", "nt-store, wb"),
    ("B7a", "nt-copy", "write", "wb", "nt-copy, wb"),  # Beluga's CPU write path is a copy
    ("B7b", "store", "write", "uc", "store, uc"),
    ("B7c", "clflush-load", "read", "wb", "clflush-load, wb"),
    ("B7d", "load", "read", "uc", "load, uc"),
    ("B7e", "dsa-memmove", "write", None, "dsa-memmove, write"),
    ("B7e", "dsa-memmove", "read", None, "dsa-memmove, read"),
)

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
        used: dict[str, int] = {}  # region -> its class rank
        for fig_id, method, access, attr, label in B7_ROWS:
            paper = figure(fig_id).value()
            key = (fig_id, label, paper.text())
            rows = at16[(at16["method"] == method) & (at16["access"] == access)]
            rows = _isolated(rows)
            if attr:
                rows = rows[rows["attr"] == attr]
            row = _best(rows, ("pool_rank", "n_params", "attr"))
            if row is None:
                what = f"{method} {attr}" if attr else method
                cells[key] = [NoValue(f"no {what} 16KiB row in this run"), None, None]
                continue
            stat = stat_of(row)
            if row["ok"]:
                used[row["region"]] = int(row["pool_rank"])
            # the paper's figure is its pool's: local memory set beside it would read as a pool
            versus = (ratio_or_none(median_ns_of(stat), paper.ns())
                      if row["pool_rank"] < SHARED_CLASS or not row["ok"]
                      else NoValue(f"{row['region_what']}, not a pool"))
            cells[key] = [stat, versus, _with_attr(row["region"], row["attr"])]
        per_run.append(cells)
        pools = sorted(r for r, rank in used.items() if rank < LOCAL_CLASS)
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
    if not any(((df["method"] == B8_DSA) & df["ok"]).any() for df in frames):
        section.absent = "No DSA measurement: " + _absent(runs, frames, [B8_DSA], B8_DSA)
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
        dsa_ok = host[(host["method"] == B8_DSA) & host["ok"]]
        pool = dsa_ok.sort_values("pool_rank").iloc[0]["region"] if len(dsa_ok) else None
        rows = host[host["region"] == pool] if pool else host.iloc[0:0]
        cells: dict[tuple, list[Cell]] = {}
        medians: dict[str, dict[int, float]] = {}
        for label, method, access in B8_SERIES:
            chosen = _isolated(rows[(rows["method"] == method) & (rows["access"] == access)])
            chosen = chosen[(chosen["attr"] == "wb")] if method != B8_DSA else chosen
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
            faster = [("CPU" if median_ns_of(row[i]) < median_ns_of(row[i + 1]) else "DSA")
                      for i in (0, 2)
                      if median_ns_of(row[i]) is not None and median_ns_of(row[i + 1]) is not None]
            row[-1] = " / ".join(faster) if faster else None
            cells[key] = row
        per_run.append(cells)
    section.table = keyed_table([Column("size", "size")],
                                [*(Column(s[0], "time") for s in B8_SERIES),
                                 Column("faster (write / read)")],
                                runs, per_run, sort_key=lambda k: k[0])
    section.plots.append(plot)
    return section


def _ddio_at(row) -> str:
    """Where or why of a row's DDIO at run time (report/rows.py's `ddio_at`: the root port of
    its GPU as the run's inventory read it)."""
    where = row.get("ddio_at")
    return str(where) if isinstance(where, str) and where else "not recorded"


def _ddio(*rows) -> Cell:
    """B11's DDIO cell: the state the pair's rows ran under (both, where they differ)."""
    states = dict.fromkeys(str(row.get("ddio") or "not recorded") for row in rows
                           if row is not None)
    return " / ".join(states) or None


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
            memcpy = values[methods.index(B9_MEMCPY)] if B9_MEMCPY in methods else None
            cells[key] = [*values, ratio_or_none(median_ns_of(kernel), median_ns_of(memcpy))]
        per_run.append(cells)
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        small_uc = rows[(rows["method"] == B9_MEMCPY) & rows["ok"] & (rows["attr"] == "uc")
                        & (rows["size_bytes"] < b10_below.bytes())]
        if len(small_uc):
            worst = small_uc.sort_values("median_ns").iloc[-1]
            section.notes.append(
                f"{name}: cuda-memcpy from uncacheable host memory below {b10_below.text()}: "
                f"slowest median {format_ns(worst['median_ns'])} at {worst['pattern']} "
                f"({ratio_or_none(worst['median_ns'], b10_latency.ns()):.2f}× the "
                f"paper's {b10_latency.text()}); DDIO at run time: {_ddio_at(worst)}")
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
    rows = _gpu_rows(df)
    rows = rows[(rows["size_bytes"] == SIZE_64K) & rows["contiguous"]
                & (rows["dst_pool_rank"] == GPU_CLASS)]
    rows = rows.assign(local_rank=[B11_LOCAL_ORDER.get(s.split("[")[0], 9) for s in rows["src"]])
    return {method: (_best(group[group["src_pool_rank"] < LOCAL_CLASS], ("src_pool_rank",)),
                     _best(group[group["src_pool_rank"] == LOCAL_CLASS], ("local_rank",)))
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
    per_run, notes = [], []
    for run, df in zip(runs, frames, strict=True):
        name = f"run {run.label}" if len(runs) > 1 else "this run"
        cells: dict[tuple, list[Cell]] = {}
        wheres: dict[str, None] = {}  # where or why of the rows' DDIO, in the table's order
        for method, (pool, local) in _pool_and_local_to_gpu(df).items():
            pool_cell = stat_of(pool) if pool is not None else NoValue("no pool -> GPU row")
            local_cell = stat_of(local) if local is not None else NoValue("no local -> GPU row")
            cells[(method, f"{fig.value('pool -> GPU').text()} vs "
                           f"{fig.value('local DRAM -> GPU').text()} (\"near-local\"; "
                           f"{paper_ratio:.2f}× computed)")] = [
                pool_cell, pool["src"] if pool is not None else None, local_cell,
                local["src"] if local is not None else None,
                ratio_or_none(median_ns_of(pool_cell), median_ns_of(local_cell)), _ddio(pool, local)]
            wheres.update(dict.fromkeys(_ddio_at(row) for row in (pool, local) if row is not None))
        per_run.append(cells)
        if wheres:
            notes.append(f"{name}: DDIO at run time: {'; '.join(wheres)}")
    section.table = keyed_table(
        [Column("method"), Column("paper")],
        [Column("pool -> GPU", "time"), Column("pool region"), Column("local -> GPU", "time"),
         Column("local region"), Column("near-local", "ratio"), Column("DDIO")], runs, per_run)
    section.notes.extend(notes)
    return section


def _fact(value: object) -> bool | None:
    """A row's boolean fact as stored (bool, numpy bool, 0/1), or None where it is absent."""
    return None if value is None or pd.isna(value) else bool(value)


def reached_memory(rows: pd.DataFrame) -> pd.Series:
    """Rows whose accesses reached memory (core/rows.py's `reaches_memory`): only these give a
    path's bandwidth. A row stored without the fact (an older nearlocal) counts as reaching
    memory, as compare and whatif take it; `unknown_memory` counts such rows for a note."""
    if "reaches_memory" not in rows:
        return pd.Series(True, index=rows.index, dtype=bool)
    return rows["reaches_memory"].map(lambda v: _fact(v) is not False).astype(bool)


def unknown_memory(rows: pd.DataFrame) -> int:
    """How many rows lack the `reaches_memory` fact (stored before rows carried it)."""
    if "reaches_memory" not in rows:
        return len(rows)
    return int(rows["reaches_memory"].map(lambda v: _fact(v) is None).sum())


def cache_level(row: pd.Series) -> str:
    """Where a row that never reached memory stayed: the LLC (`llc_resident`) or nearer."""
    return "in the LLC" if _fact(row.get("llc_resident")) else "in a CPU cache"


def _peak(rows: pd.DataFrame) -> pd.Series | None:
    """The completed row of highest GB/s among those that reached memory (a cache's peak is no
    path's bandwidth: set beside a paper's, it would compare an L1 with a CXL link)."""
    ok = rows[rows["ok"] & rows["gbps"].notna()]
    ok = ok[reached_memory(ok)]
    if ok.empty:
        return None
    return ok.sort_values("gbps", ascending=False).iloc[0]


def _cache_peak(rows: pd.DataFrame) -> pd.Series | None:
    """The completed row of highest GB/s among those that stayed in a CPU cache."""
    ok = rows[rows["ok"] & rows["gbps"].notna()]
    ok = ok[~reached_memory(ok)]
    if ok.empty:
        return None
    return ok.sort_values("gbps", ascending=False).iloc[0]


def cache_peak_text(row: pd.Series | None) -> str:
    """A cache-resident peak, labelled as a cache's: '133 GB/s at 16KiB, in a CPU cache'."""
    if row is None:
        return ""
    return f"{float(row['gbps']):.3g} GB/s at {format_size(int(row['size_bytes']))}, " \
           f"{cache_level(row)}"


def section_b12(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    cap = figure("B12").value("per CXL adapter")
    section = Section("b12", "B12 — bandwidth per path",
                      "The highest bandwidth each method reached on each path over the "
                      "contiguous sizes measured (bytes moved / median time), from rows whose "
                      "accesses reached memory: a row that stayed in a CPU cache measures the "
                      "cache, not the path, and stands apart, labelled as the cache's. Paths "
                      "between a non-local host region and a GPU are compared with the paper's "
                      f"{cap.text()} per-adapter cap.", _refs("B12", "S2"))
    if not any((df["ok"] & df["contiguous"]).any() for df in frames):
        section.absent = "No contiguous transfer ran in " + (
            "these runs." if len(runs) > 1 else "this run.")
        return section
    per_run = []
    for run, df in zip(runs, frames, strict=True):
        cells: dict[tuple, list[Cell]] = {}
        rows = df[df["contiguous"]]
        for (method, path), group in rows.groupby(["method", "path"], sort=False):
            peak, cached = _peak(group), _cache_peak(group)
            if peak is None and cached is None:  # never ran here: the skipped section says why
                continue
            if peak is None:
                largest = format_size(int(group.loc[group["ok"], "size_bytes"].max()))
                cells[(method, path)] = [
                    NoValue(f"no row reached memory (sizes up to {largest} stayed in a CPU "
                            "cache)"), None, None, cache_peak_text(cached)]
                continue
            pool_gpu = ({peak["pool_rank"], peak["peer_pool_rank"]} & {GPU_CLASS}
                        and min(peak["pool_rank"], peak["peer_pool_rank"]) < LOCAL_CLASS)
            cells[(method, path)] = [float(peak["gbps"]), int(peak["size_bytes"]),
                                     ratio_or_none(float(peak["gbps"]), cap.central) if pool_gpu
                                     else None, cache_peak_text(cached)]
        per_run.append(cells)
        unknown = unknown_memory(rows[rows["ok"]])
        if unknown:
            name = f"run {run.label}" if len(runs) > 1 else "this run"
            section.notes.append(f"{name}: {unknown} rows were stored without `reaches_memory` "
                                 "(an older nearlocal) and are taken as reaching memory, as "
                                 "compare takes them; rerun to have the fact.")
    section.table = keyed_table([Column("method"), Column("path")],
                                [Column("peak GB/s (reached memory)", "gbps"),
                                 Column("at size", "size"),
                                 Column(f"× {cap.text()} cap", "ratio"),
                                 Column("cache-resident peak (the cache's, not the path's)")],
                                runs, per_run)
    section.plots.append(bandwidth_plot(runs, frames))
    return section


def _kv_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Fragmented transfers and the kv-metadata phase: rows with many fragments or a kind:
    pattern (a chase ring is one contiguous pattern that is no transfer: not a fragment list)."""
    fragmented = (df["fragment_count"] > 1) | df["pattern"].str.contains(":", regex=False)
    return df[fragmented & ~df["method"].isin(B13_OWN_SECTIONS)]


# B14's 211 us is for "fetching 16 such tokens", where one such read is 1,024 x 160 B pieces;
# nearlocal reads that as 16 reads, an interpretation it states wherever it is used: this
# section, the fragment plot's label, examples/acceptance/beluga-cxl.toml
def b14_reads() -> int:
    """How many B14 reads the paper's 211 us covers, as nearlocal reads it (b14_reading)."""
    return int(figure("B14").value("such tokens fetched").central)


def b14_reading() -> str:
    """nearlocal's reading of B14's "fetching 16 such tokens", said as a reading."""
    b14 = figure("B14")
    return (f"read here as {b14_reads()} reads of {b14.value('fragments per read').text()} x "
            f"{b14.value('fragment size').text()} each (nearlocal's reading of the paper's "
            "words, not a figure the paper gives)")


def section_kv(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    b14 = figure("B14")
    section = Section("b13", "B13/B14 — KV fragment transfers",
                      "Fragmented transfers: KV-cache layouts (kv: patterns) and COUNTxSIZE "
                      "fragment lists, every method and path. B14's sparse read is "
                      f"{b14.value('fragments per read').text()} fragments of "
                      f"{b14.value('fragment size').text()}; its {b14.value('CXL').text()} "
                      f"(CXL) vs {b14.value('RDMA').text()} (RDMA) are for \"fetching 16 such "
                      f"tokens\", {b14_reading()}. Decision → ready = the kv-metadata phase "
                      "(block table -> fragment list) + the transfer, for the same pattern.",
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
        metadata = dict(zip(done.loc[done["method"] == B13_METADATA, "pattern"],
                            done.loc[done["method"] == B13_METADATA, "median_ns"], strict=True))
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
            params = row["effective"]  # the method's defaults with the case's params over them
            qd = params.get("qd")
            key = (row["method"], str(params.get("protocol", "-")), str(qd or "-"),
                   row["pattern"], _with_attr(row["region"], row["attr"]))
            stat = stat_of(row)
            ops = 1000 / stat.median_ns if isinstance(stat, Stat) and stat.median_ns > 0 \
                else None
            if row["method"] == B15_THROUGHPUT:
                ratio = ratio_or_none(ops, mops.central) if str(qd) == "128" else None
            else:
                ratio = (ratio_or_none(median_ns_of(stat), rtt.ns())
                         if int(row["fragment_bytes"]) == 64 else None)
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



# ---------------------------------------------------------------------------------------------
# Plot data


def _series_label(row_method: str, path: str, run: RunInfo, multi: bool) -> str:
    return f"{row_method} {path}" + (f" #{run.label}" if multi else "")


def _size_series(runs: list[RunInfo], frames: list[pd.DataFrame], value: str,
                 scale: float, split_cache: bool = False) -> list[Series]:
    """One series per method and path, by size; `split_cache`: rows that stayed in a CPU cache
    form their own series, labelled so (a cache's bandwidth beside a paper's is no path's)."""
    out = []
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        rows = df[df["ok"] & df["contiguous"] & df[value].notna()]
        for (method, path), group in rows.groupby(["method", "path"], sort=False):
            group = group.sort_values("size_bytes").drop_duplicates("size_bytes")
            label = _series_label(method, path, run, len(runs) > 1)
            parts = [(label, group)]
            if split_cache:
                memory = reached_memory(group)
                parts = [(label, group[memory]),
                         (f"{label}, in a CPU cache (not the path's)", group[~memory])]
            out += [Series(name, tuple(float(x) for x in part["size_bytes"]),
                           tuple(float(y) * scale for y in part[value]), index)
                    for name, part in parts if len(part)]
    return out


def latency_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    # only the papers' CPU accesses to the pool (B7): B11 (into a GPU) and B15 (an RPC round
    # trip) time other paths than this plot's CPU series, and sit in their own sections
    points = [RefPoint(f"{i} {figure(i).value().text()}", SIZE_16K, figure(i).value().ns() / 1e3)
              for i in ("B7a", "B7b", "B7c", "B7d", "B7e")]
    return PlotData("latency", "Latency against size (median)", "transfer size", "median (us)",
                    _size_series(runs, frames, "median_ns", 1e-3), points)


def bandwidth_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    """Bandwidth by size beside the papers' per-path figures (B12's per adapter and per pool
    device, S2's media); rows that stayed in a CPU cache are their own, labelled series."""
    lines = [RefLine(f"B12 {v.name} {v.text()}", v.central)
             for v in figure("B12").values if v.unit == "GB/s"]
    lines += [RefLine(f"S2 {v.name} {v.text()}", v.central) for v in figure("S2").values
              if v.unit == "GB/s"]
    return PlotData("bandwidth", "Bandwidth against size", "transfer size", "GB/s",
                    _size_series(runs, frames, "gbps", 1.0, split_cache=True), lines=lines)


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
    reads = b14_reads()  # "fetching 16 such tokens", read as 16 reads (b14_reading)
    per_read, cxl = b14.value("fragments per read"), b14.value("CXL")
    points = [RefPoint(f"B14 CXL {cxl.text()} for \"fetching {reads} such tokens\"; drawn as "
                       f"{reads} reads x {per_read.text()} x {b14.value('fragment size').text()}"
                       " (nearlocal's reading)", reads * per_read.central, cxl.ns() / 1e3)]
    return PlotData(name, title, "fragments per transfer", "median (us)", series, points,
                    x_is_size=False, connect=False)


# ------------------------------------------------------------- registered, in the report's order

register_frames_section('b7', 40, section_b7)
register_frames_section('b8', 50, section_b8)
register_frames_section('b9', 60, section_b9)
register_frames_section('b11', 70, section_b11)
register_frames_section('b12', 80, section_b12)
register_frames_section('b13', 90, section_kv)
register_frames_section('b15', 100, section_b15)
