"""The report's "Pool vs RDMA" section, rdma's own: a face of the family (it imports the report,
so only the report loads it, through the entry-point group nearlocal.report_sections). Beluga's
comparisons (B1, B13, B14, B15) with both columns from this box's own rows — the pool's fastest
path for the figure's transfer beside the rdma-*
row of the same pattern — the measured pool / RDMA ratio next to the ratio the paper reports.
B1's split (data movement vs synchronisation) comes from the rdma-write row, computed when the
row was made (rdma.methods)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from nearlocal.report.document import Cell, Column, NoValue, RunInfo, Section, Stat, keyed_table
from nearlocal.report.papers import figure
from nearlocal.report.registry import register_frames_section
from nearlocal.report.rows import median_ns_of, ratio_or_none, stat_of

RDMA_PREFIX = "rdma-"
POOL_RPC = ("rpc-roundtrip", "rack-rpc-roundtrip")
DENSE_KV = ":dense"
RPC_BYTES = 64  # B15's message


RDMA_WRITE, RDMA_READ, RDMA_RPC = "rdma-write", "rdma-read", "rdma-rpc"
# (figure, transfer, access, pattern, RDMA method): the section spec, one line of the table each
COMPARISONS = (
    ("B1", "16 KiB write", "write", "16KiB", RDMA_WRITE),
    ("B13", "dense KV block write", "write", DENSE_KV, RDMA_WRITE),
    ("B13", "dense KV block read", "read", DENSE_KV, RDMA_READ),
    ("B14", "sparse read, 1,024 x 160 B", "read", "1024x160B", RDMA_READ),
    ("B15", "64 B metadata RPC round trip", "", "64B", RDMA_RPC),
)


@dataclass(frozen=True)
class PaperComparison:
    """One line of the table: which rows stand on each side, and the paper's ratio."""

    figure: str
    what: str
    access: str  # "read" / "write"; "" for the RPC
    pattern: str  # a pattern, or DENSE_KV: any kv:...:dense layout
    rdma_method: str
    paper_ratio: float
    paper_text: str


def _paper_ratio(figure_id: str, access: str) -> tuple[float, str]:
    """The paper's pool / RDMA ratio for a line, and how it is read off the paper's figures."""
    if figure_id == "B1":  # B1 has the RDMA side only: B7a's 16 KB pool write is the other
        b1, b7a = figure("B1").value("total"), figure("B7a").value()
        return b7a.ns() / b1.ns(), f"B7a {b7a.text()} / B1 {b1.text()}"
    if figure_id == "B13":
        change = figure("B13").value(f"{access} latency change")
        return 1 + change.central / 100, f"{access} latency {change.text()}"
    if figure_id == "B14":
        cxl, rdma = figure("B14").value("CXL"), figure("B14").value("RDMA")
        return cxl.ns() / rdma.ns(), f"{cxl.text()} / {rdma.text()}"
    rtt, rdma_rtt = (figure("B15").value("64 B round trip"),
                     figure("B15").value("RDMA RC RPC round trip"))
    return rtt.ns() / rdma_rtt.ns(), f"{rtt.text()} / {rdma_rtt.text()}"


def _comparisons() -> list[PaperComparison]:
    return [PaperComparison(fig, what, access, pattern, method, *_paper_ratio(fig, access))
            for fig, what, access, pattern, method in COMPARISONS]


def _matches(df: pd.DataFrame, pattern: str) -> pd.Series:
    if pattern == DENSE_KV:
        return df["pattern"].str.startswith("kv:") & df["pattern"].str.endswith(DENSE_KV)
    return df["pattern"] == pattern


def _fastest(rows: pd.DataFrame) -> pd.Series | None:
    ok = rows[rows["ok"]]
    return ok.sort_values("median_ns", kind="stable").iloc[0] if len(ok) else None


def _pool_row(df: pd.DataFrame, comparison: PaperComparison) -> pd.Series | None:
    """The pool's side: the fastest completed row of the transfer on the most pool-like region
    of the run (the RPC: a shared-memory RPC round trip)."""
    if comparison.rdma_method == RDMA_RPC:
        return _fastest(df[df["method"].isin(POOL_RPC) & (df["fragment_bytes"] == RPC_BYTES)])
    rows = df[~df["method"].str.startswith(RDMA_PREFIX) & df["transfer"] & df["ok"]
              & (df["access"] == comparison.access) & _matches(df, comparison.pattern)]
    if rows.empty:
        return None
    return _fastest(rows[rows["pool_rank"] == rows["pool_rank"].min()])


def _rdma_row(df: pd.DataFrame, comparison: PaperComparison) -> pd.Series | None:
    """The RDMA side: the row of the same pattern, SGE-batched first (the best case); for the
    RPC the send/recv one first (B15's RDMA RC RPC is send/recv: like for like), else the
    RDMA-write one. A transfer alone, as the paper's: never a movers=k row (k at once)."""
    rows = df[(df["method"] == comparison.rdma_method) & _matches(df, comparison.pattern)
              & df["effective"].map(lambda p: str(p.get("movers", "1")) == "1")]
    if rows.empty:
        return None
    if comparison.rdma_method == RDMA_RPC:
        send = rows[rows["effective"].map(lambda p: p.get("transport") == "send")]
        return _fastest(send) if _fastest(send) is not None else _fastest(rows)
    batched = rows[rows["effective"].map(lambda p: p.get("sge", "batched") == "batched")]
    return _fastest(batched) if _fastest(batched) is not None else _fastest(rows)


def _info(row) -> dict:
    info = row.get("info") if row is not None else None
    return info if isinstance(info, dict) else {}


def _note(pool, rdma) -> str:
    emulated = next((str(r["emulated"]) for r in (pool, rdma)
                     if r is not None and r.get("emulated")), "")
    parts = [emulated] if emulated else []
    if pool is not None:
        parts.append(f"pool: {pool['method']} {pool['path']}")
    info = _info(rdma)
    if info.get("work_requests_per_sample") is not None:
        limit = pd.to_numeric(rdma.get("max_sge"), errors="coerce")
        parts.append(f"RDMA: {info['work_requests_per_sample']} WRs per transfer, max_sge "
                     f"{int(limit) if limit == limit else '?'}, {info.get('device', '?')}"
                     + (f", transport {info['transport']}" if info.get("transport") else "")
                     + (f", path MTU {info['path_mtu']}" if info.get("path_mtu") else ""))
    if info.get("sync_share") is not None:
        parts.append(f"data movement {info['data_movement_ns'] / 1e3:.2f} us, synchronisation "
                     f"{info['sync_share']:.0%} (B1: {figure('B1').value('synchronisation share').text()})")
    if info.get("data_check"):
        parts.append(f"check {info['data_check'].split(':')[0]}")
    return "; ".join(parts)


def section_rdma(runs: list[RunInfo], frames: list[pd.DataFrame]) -> Section:
    section = Section(
        "rdma", "Pool vs RDMA — Beluga's comparisons on this box (B1, B13, B14, B15)",
        "Both columns are this box's rows: the pool's fastest completed path for the transfer "
        "(the most pool-like region of the run) and the rdma-* row of the same pattern "
        "(SGE-batched; the RPC by send/recv where the run has it; docs/rdma.md). measured = "
        "pool / RDMA; paper = the same ratio from the paper's figures (B1's pool side is B7a's "
        "16 KB write).",
        [figure(i) for i in ("B1", "B13", "B14", "B15", "B7a")])
    if not any(df["method"].str.startswith(RDMA_PREFIX).any() for df in frames):
        section.absent = ("No RDMA rows: launch `mpiexec -n 2 nearlocal run --suite rdma` on a "
                          "box with an RDMA device (docs/rdma.md).")
        return section
    per_run = []
    for df in frames:
        cells: dict[tuple, list[Cell]] = {}
        for comparison in _comparisons():
            pool, rdma = _pool_row(df, comparison), _rdma_row(df, comparison)
            pool_stat = stat_of(pool) if pool is not None else NoValue("no pool row")
            rdma_stat = stat_of(rdma) if rdma is not None else NoValue("no RDMA row")
            measured = ratio_or_none(median_ns_of(pool_stat), median_ns_of(rdma_stat)) \
                if isinstance(pool_stat, Stat) and isinstance(rdma_stat, Stat) else None
            key = (comparison.figure, comparison.what, comparison.paper_text)
            cells[key] = [pool_stat, rdma_stat, measured, comparison.paper_ratio,
                          _note(pool, rdma)]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("figure"), Column("transfer"), Column("paper")],
        [Column("pool (p10–p90)", "time"), Column("RDMA (p10–p90)", "time"),
         Column("measured pool / RDMA", "ratio"), Column("paper pool / RDMA", "ratio"),
         Column("note")], runs, per_run)
    section.table.collapse = False
    return section


register_frames_section("rdma", 105, section_rdma)
