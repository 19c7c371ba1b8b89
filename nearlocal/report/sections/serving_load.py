"""Serving under load (whatif.load): B16's request over each serving path as a Poisson stream at
half and four fifths of what the path's one link carries, from the run's rows. The figures come
from nearlocal.whatif.load; this module only lays them out."""

from __future__ import annotations

from nearlocal.report.document import Cell, Column, NoValue, Section, keyed_table
from nearlocal.report.registry import SectionInputs, register_section
from nearlocal.report.rows import _refs
from nearlocal.whatif import inputs_of, reference_box
from nearlocal.whatif.load import at_shares
from nearlocal.whatif.serving import Request

REQUEST = Request()  # B16's, as the Serving section
SHARES = (0.5, 0.8)


def section_load(inputs: SectionInputs) -> Section:
    section = Section(
        "serving-load", "Serving under load — B16's request queueing on each path's link",
        f"Beluga's B16 request ({REQUEST.model}, {REQUEST.context} tokens, all cached) arriving "
        "as a seeded Poisson stream at "
        + " and ".join(f"{round(100 * s)} %" for s in SHARES)
        + " of what the path's one link carries (its reload alone, back to back), one reload at "
          "a time per link, first come first served: the reload's P99 wait and P99 TTFT (the "
          "reload alone: no prefill rate is assumed). A trace, a QPS, a prefill rate and a TTFT "
          "target: `nearlocal whatif --trace FILE` or `--qps N` (docs/whatif.md).",
        _refs("B16"))
    reference = reference_box(inputs.reference) if inputs.reference else None
    per_run = []
    any_complete = False
    for data in inputs.data:
        cells: dict[tuple, list[Cell]] = {}
        for path in at_shares(inputs_of(data), REQUEST, SHARES, reference=reference,
                              samples=data.samples):
            if path.missing:
                cells[(path.path, path.what)] = [NoValue(path.missing)] + [None] * (
                    3 * len(SHARES))
                continue
            any_complete = True
            row: list[Cell] = [path.reload_s * 1e9]
            for share in path.shares:
                row += [f"{share.qps:.3g}", share.load.reload_wait.p99 * 1e9,
                        share.load.ttft.p99 * 1e9]
            row.append(", ".join(path.rows))
            cells[(path.path, path.what)] = row
        per_run.append(cells)
    values = [Column("reload alone", "time")]
    for share in SHARES:
        pct = f"{round(100 * share)} %"
        values += [Column(f"req/s at {pct}"), Column(f"P99 wait at {pct}", "time"),
                   Column(f"P99 TTFT at {pct}", "time")]
    values.append(Column("rows"))
    for cells in per_run:  # an incomplete path's row as long as the others'
        for row in cells.values():
            row.extend([None] * (len(values) - len(row)))
    section.table = keyed_table([Column("path"), Column("what")], values, inputs.runs, per_run)
    section.table.collapse = False
    if not any_complete:
        section.absent = ("No serving path is complete in this run (a hop needs a method that "
                          "lands the bytes: a copy, a GPU transfer, RDMA, a file read).")
        section.table = None
    section.notes.append("Assumed: the rows carry one mover (k = 1), so no contention figure: "
                         "a link moves one reload at a time; each transfer's time is drawn from "
                         "its rows' samples over their median. Decode and batching are not "
                         "modelled.")
    return section


register_section("serving-load", 126)(section_load)
