"""Contention: per way of moving bytes, k movers at once (issue 57, item 1) — each mover's GB/s,
the aggregate and the service time's quantiles at each k, as whatif/contention.py fits them from
the run's `movers=k` rows (CPU threads, CUDA streams, queue pairs) and its rows whose info says
they are one measurement's movers (an MPI job's ranks reading the pool at once). The figures are
contention_of's; this module only lays them out."""

from __future__ import annotations

from nearlocal.report.document import Cell, Column, Section, keyed_table
from nearlocal.report.registry import SectionInputs, register_section
from nearlocal.whatif.contention import contention_of


def _cells(entry: dict) -> list[Cell]:
    service = entry.get("service_ns") or {}
    return [entry.get("per_mover_gbps"), entry.get("aggregate_gbps"), service.get("p50_ns"),
            service.get("p99_ns"), service.get("n"), str(entry.get("service_from") or ""),
            ", ".join(entry.get("rows") or ())]


def section_contention(inputs: SectionInputs) -> Section:
    section = Section(
        "contention", "Contention — k movers at once, per way",
        "Each way of moving bytes timed with k movers at once (k CPU threads, CUDA streams, "
        "queue pairs or MPI ranks, as the way says; k = 1 the same transfer alone): one "
        "mover's GB/s (its bytes over the median service time), the aggregate (measured: k x "
        "bytes over the span of the k passes, or the ranks' own GB/s summed where each rank "
        "keeps its own clock; never k x one mover's), and the service time's P50 and P99 over "
        "the raw samples. What `nearlocal whatif --trace/--qps` draws each transfer from.")
    per_run = []
    for data in inputs.data:
        cells: dict[tuple, list[Cell]] = {}
        for way, ks in contention_of(data.cases, data.samples).items():
            for k, entry in ks.items():
                cells[(way, str(k))] = _cells(entry)
        per_run.append(cells)
    if not any(per_run):
        section.absent = ("No rows with k movers at once: `nearlocal run --suite contention`, "
                          "or `mpiexec -n N nearlocal run --method rack-aggregate` for the pool.")
        return section
    section.table = keyed_table(
        [Column("way"), Column("k")],
        [Column("per mover GB/s", "gbps"), Column("aggregate GB/s", "gbps"),
         Column("P50", "time"), Column("P99", "time"), Column("samples", "count"),
         Column("service time from"), Column("rows")], inputs.runs, per_run)
    section.table.collapse = False
    return section


register_section("contention", 128, drop_when_absent=True)(section_contention)
