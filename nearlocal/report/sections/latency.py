"""Report sections for the MLC-style figures: idle latency of local memory beside the pool's
(`chase`), bandwidth with N threads beside one, and the loaded-latency curve per region
(`loaded-chase`), built from the prepared rows (report.rows). The method and region names in the
constants below are the section specs."""

from __future__ import annotations

import pandas as pd

from nearlocal.cpu.threads import is_threaded
from nearlocal.report.document import (
    Cell,
    Column,
    NoValue,
    PlotData,
    RunInfo,
    Section,
    Series,
    keyed_table,
)
from nearlocal.report.registry import register_frames_section
from nearlocal.report.rows import stat_of

IDLE_METHOD = "chase"  # MLC's idle latency
LOADED_METHOD = "loaded-chase"  # MLC's loaded latency
LOCAL_REGION = "dram"  # the reference every region is set beside
THREADS_EXCLUDE = (LOADED_METHOD,)  # its threads are the traffic's, not the timed ones


def _info(row) -> dict:
    info = row.get("info")
    return info if isinstance(info, dict) else {}


def _chase(df: pd.DataFrame, method: str) -> pd.DataFrame:
    return df[df["method"] == method]


def section_idle_latency(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("idle", "Idle latency (chase) — each region beside local DRAM",
                      "Dependent loads around a random one-cycle ring of cache lines (Intel "
                      "MLC's idle latency): ns per load by ring size, each region beside local "
                      "dram at the same size; the page size says whether TLB misses are in it.")
    per_run = []
    others = any((_chase(df, IDLE_METHOD)["region"] != LOCAL_REGION).any() for df in frames)
    for df in frames:
        rows = _chase(df, IDLE_METHOD)
        local = rows[rows["ok"] & (rows["region"] == LOCAL_REGION)].drop_duplicates("size_bytes")
        local = local.set_index("size_bytes")["median_ns"]
        cells: dict[tuple, list[Cell]] = {}
        for _, row in rows.iterrows():
            rank, what = int(row["pool_rank"]), row["region_what"]  # prepare() knows CPU-less nodes
            base = local.get(int(row["size_bytes"]))
            ok = bool(row["ok"])
            median = float(row["median_ns"]) if ok else None
            key = (int(row["size_bytes"]), rank, row["region"], what,
                   str(_info(row).get("page_size", "-")))
            if row["region"] == LOCAL_REGION:  # local dram is the reference, not compared with itself
                cells[key] = [stat_of(row), None, None, None]
                continue
            cells[key] = [stat_of(row),
                          float(base) if base is not None else NoValue("no local chase"),
                          median / float(base) if ok and base else None,
                          median - float(base) if ok and base is not None else None]
        order = sorted(cells.items(),  # by ring size: local dram, then the pool first
                       key=lambda kv: (kv[0][0], kv[0][2] != LOCAL_REGION, kv[0][1], kv[0][2]))
        per_run.append({k[:1] + k[2:]: v for k, v in order})
    if not any(per_run):
        section.absent = ("The run has no chase rows (nearlocal run --method chase, or the "
                          "quick / mlc suites).")
        return section
    values = [Column("ns per load (p10–p90)", "time"), Column("local dram", "time"),
              Column("÷ local", "ratio"), Column("+ over local", "time")]
    if not others:  # only local dram: its latency by ring size, nothing to compare it with
        per_run = [{key: cells[:1] for key, cells in run_cells.items()} for run_cells in per_run]
        values = values[:1]  # (the report's first section says once that nothing else was)
    section.table = keyed_table(
        [Column("ring", "size"), Column("region"), Column("what"), Column("pages")],
        values, runs, per_run)
    section.plots.append(idle_plot(runs, frames))
    return section


def idle_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    series = []
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        rows = _chase(df, IDLE_METHOD)
        rows = rows[rows["ok"]]
        for region, group in rows.groupby("region", sort=False):
            group = group.sort_values("size_bytes").drop_duplicates("size_bytes")
            label = region + (f" #{run.label}" if len(runs) > 1 else "")
            series.append(Series(label, tuple(float(x) for x in group["size_bytes"]),
                                 tuple(float(y) for y in group["median_ns"]), index))
    return PlotData("idle", "Idle latency against ring size (chase)", "ring size",
                    "ns per load", series)


def section_loaded_latency(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("loaded", "Loaded latency (chase under traffic)",
                      "Chase latency on one CPU while the other CPUs run bursts of a bandwidth "
                      "method with an injected delay between bursts (Intel MLC's loaded "
                      "latency): bandwidth the traffic reached while the chase was timing, and "
                      "the chase's ns per load. One curve per region.")
    per_run = []
    ranks: dict[str, int] = {}  # region -> its class rank (the pool first)
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for _, row in _chase(df, LOADED_METHOD).iterrows():
            ranks.setdefault(row["region"], int(row["pool_rank"]))
            info = _info(row)
            params = row["effective"]  # the method's defaults with the case's params over them
            delay = int(params.get("delay", info.get("delay_ns", 0)))
            key = (row["region"], str(info.get("traffic", params.get("traffic", "-"))), delay)
            gbps = info.get("traffic_gbps")
            cells[key] = [info.get("traffic_threads"), float(gbps) if gbps is not None
                          and row["ok"] else None, stat_of(row)]
        per_run.append(cells)
    if not any(per_run):
        section.absent = ("The run has no loaded-chase rows (nearlocal run --suite mlc, or "
                          "--method loaded-chase --param delay=NS).")
        return section
    section.table = keyed_table(
        [Column("region"), Column("traffic"), Column("delay ns", "count")],
        [Column("traffic threads", "count"), Column("traffic GB/s", "gbps"),
         Column("ns per load (p10–p90)", "time")], runs, per_run,
        sort_key=lambda k: (ranks.get(k[0], 0), k[0], k[1], k[2]))
    section.plots.append(loaded_plot(runs, frames))
    return section


def loaded_plot(runs: list[RunInfo], frames: list[pd.DataFrame]) -> PlotData:
    series = []
    for index, (run, df) in enumerate(zip(runs, frames, strict=True)):
        rows = _chase(df, LOADED_METHOD)
        rows = rows[rows["ok"]]
        points: dict[str, list[tuple[float, float]]] = {}
        for _, row in rows.iterrows():
            info = _info(row)
            if info.get("traffic_gbps") is None:
                continue
            traffic = info.get("traffic", row["effective"].get("traffic", "-"))
            label = f"{row['region']} ({traffic} traffic)"
            points.setdefault(label, []).append((float(info["traffic_gbps"]),
                                                 float(row["median_ns"])))
        for label, xy in points.items():
            xy.sort()
            series.append(Series(label + (f" #{run.label}" if len(runs) > 1 else ""),
                                 tuple(x for x, _ in xy), tuple(y for _, y in xy),
                                 index))
    return PlotData("loaded", "Loaded latency: ns per load against traffic bandwidth",
                    "traffic bandwidth (GB/s)", "ns per load", series, x_is_size=False,
                    linear=True)


def section_threads(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("threads", "Bandwidth with N threads (--threads)",
                      "N threads pinned to distinct CPUs, each over its share of the pattern, "
                      "every repetition started on one barrier: total bytes / (last end - first "
                      "start), beside one thread on the same region and size, and the spread "
                      "of the threads' own figures.")
    per_run = []
    for df in frames:
        threaded = df["params_d"].map(is_threaded).astype(bool)
        single = df[~threaded & df["ok"] & df["gbps"].notna()]
        single = single.drop_duplicates(["method", "region", "attr", "size_bytes"])
        single = single.set_index(["method", "region", "attr", "size_bytes"])["gbps"]
        cells: dict[tuple, list[Cell]] = {}
        for _, row in df[threaded & ~df["method"].isin(THREADS_EXCLUDE)].iterrows():
            info = _info(row)
            one = single.get((row["method"], row["region"], row["attr"], int(row["size_bytes"])))
            own = [t.get("gbps") for t in info.get("per_thread", []) if t.get("gbps")]
            ok = bool(row["ok"])
            cells[(row["method"], row["region"], int(row["size_bytes"]))] = [
                info.get("threads"), float(row["gbps"]) if ok else stat_of(row),
                float(one) if one is not None else None,
                float(row["gbps"]) / float(one) if ok and one else None,
                f"{min(own):.2f}–{max(own):.2f}" if own else "-"]
        per_run.append(cells)
    if not any(per_run):
        section.absent = "The run has no --threads rows (nearlocal run --threads N|all)."
        return section
    section.table = keyed_table(
        [Column("method"), Column("region"), Column("size", "size")],
        [Column("threads", "count"), Column("GB/s", "gbps"), Column("1 thread GB/s", "gbps"),
         Column("× 1 thread", "ratio"), Column("per thread GB/s")], runs, per_run)
    return section


# ------------------------------------------------------------- registered, in the report's order

register_frames_section('idle', 20, section_idle_latency)
register_frames_section('threads', 140, section_threads)
register_frames_section('loaded', 150, section_loaded_latency)
