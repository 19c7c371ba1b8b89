"""SwiftCache's tables (arXiv 2606.16135): S2 reload media, S3 the layer stream. The method
names below are the section specs."""

from __future__ import annotations

import pandas as pd

from nearlocal.report.document import (
    Cell,
    Column,
    NoValue,
    PlotData,
    RefPoint,
    RunInfo,
    Section,
    Series,
    keyed_table,
)
from nearlocal.report.papers import figure
from nearlocal.report.registry import register_frames_section
from nearlocal.report.rows import (
    GPU_CLASS,
    LOCAL_CLASS,
    _absent,
    _params_text,
    _refs,
    ratio_or_none,
    stat_of,
)
from nearlocal.report.sections.beluga import _cache_peak, _peak, cache_peak_text

S2_ROWS = (  # (medium, paper value name or None, paper figure)
    ("NVLink peer GPU (peer-memcpy)", "NVLink", "S2"),
    ("Host DRAM over PCIe (cuda-memcpy pinned -> GPU)", "PCIe host", "S2"),
    ("CXL pool -> GPU (cuda-memcpy)", "per CXL adapter", "B12"),
    ("NVMe SSD", "NVMe SSD", "S2"),
)
STORAGE_READS = ("file-read", "file-read-gpu", "file-read-gds")  # the SSD row's candidates
S2_PEER, S2_HOST, S2_PINNED = "peer-memcpy", "cuda-memcpy", "pinned"  # NVLink; PCIe from pinned
S2_GPU_METHODS = (S2_PEER, S2_HOST)
S3_METHOD = "layer-stream"


def section_s2(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section("s2", "S2 — reload media",
                      "Where a KV cache can be reloaded from, at the best bandwidth measured "
                      "(any size) by a row that reached memory. The CXL pool row compares with "
                      "Beluga's per-adapter cap.",
                      _refs("S2", "B12"))
    if not any(df[df["method"].isin(S2_GPU_METHODS)]["ok"].any() for df in frames):
        section.absent = "No GPU reload path measured: " + _absent(
            runs, frames, S2_GPU_METHODS, " / ".join(S2_GPU_METHODS))
    per_run = []
    for df in frames:
        gpu_dst = df["dst_pool_rank"] == GPU_CLASS
        choices = {
            S2_ROWS[0][0]: df[(df["method"] == S2_PEER)],
            S2_ROWS[1][0]: df[(df["method"] == S2_HOST) & gpu_dst
                              & (df["src_kind"] == S2_PINNED)],
            S2_ROWS[2][0]: df[(df["method"] == S2_HOST) & gpu_dst
                              & (df["src_pool_rank"] < LOCAL_CLASS)],
            S2_ROWS[3][0]: df[df["method"].isin(STORAGE_READS)  # the disk, not a warm cache
                              & df["params_d"].map(lambda p: p.get("cache") != "warm")],
        }
        cells: dict[tuple, list[Cell]] = {}
        for medium, value_name, fig_id in S2_ROWS:
            paper = figure(fig_id).value(value_name)
            key = (medium, f"{paper.text()} ({fig_id})")
            peak = _peak(choices[medium])  # rows that reached memory: a cache is no medium
            if peak is None:
                rows, cached = choices[medium], _cache_peak(choices[medium])
                why = (f"no row reached memory (the cache's peak: {cache_peak_text(cached)})"
                       if cached is not None
                       else f"{rows.iloc[0]['status']}: {rows.iloc[0]['reason']}" if len(rows)
                       else "no such rows in this run")
                cells[key] = [NoValue(why), None, None, None]
                continue
            path = peak["path"]
            if medium == S2_ROWS[3][0]:  # which reads: pattern, qd, cache, engine
                info = peak.get("info") if isinstance(peak.get("info"), dict) else {}
                params = {**peak["effective"],
                          **({"engine": info["engine"]} if "engine" in info else {})}  # ran
                path = f"{peak['method']}: {path} {peak['pattern']} {_params_text(params)}"
            cells[key] = [float(peak["gbps"]), int(peak["size_bytes"]), path,
                          ratio_or_none(float(peak["gbps"]), paper.central)]
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
    if not any(df[df["method"] == S3_METHOD]["ok"].any() for df in frames):
        section.absent = "No layer-stream measurement: " + _absent(runs, frames,
                                                                   [S3_METHOD], S3_METHOD)
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for _, row in df[df["method"] == S3_METHOD].iterrows():
            key = (row["path"], row["pattern"], _params_text(row["params_d"]))
            cells[key] = [stat_of(row), float(row["gbps"]) if row["ok"] else None]
        per_run.append(cells)
    section.table = keyed_table([Column("path"), Column("pattern"), Column("params")],
                                [Column("per-layer round trip (p10–p90)", "time"),
                                 Column("GB/s", "gbps")], runs, per_run)
    return section


# ------------------------------------------------------------- registered, in the report's order

register_frames_section('s2', 110, section_s2)
register_frames_section('s3', 120, section_s3)
