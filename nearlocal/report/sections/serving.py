"""What the run's paths mean for serving (whatif): the reload per turn over each serving path for
Beluga's B16 request, and the papers' end-to-end claims recomputed beside what they report. The
figures come from nearlocal.whatif; this module only lays them out."""

from __future__ import annotations

from nearlocal.report.document import Cell, Column, NoValue, Section, keyed_table
from nearlocal.report.registry import SectionInputs, register_section
from nearlocal.report.rows import _refs
from nearlocal.units import format_size
from nearlocal.whatif import Request, inputs_of, reference_box, whatif
from nearlocal.whatif.claims import claims
from nearlocal.whatif.serving import PathFigures, Term

REQUEST = Request()  # B16's: qwen2.5-32b, 16K tokens, all cached, TP 1, flash-attn


def _term(term: Term) -> str:
    head = f"{term.hop} {term.fragments} x {format_size(term.fragment_bytes)}"
    if term.ns is None:
        return f"{head}: {term.source}"
    rows = ", ".join(term.rows)
    return f"{head}: {term.way} (rows {rows})" if term.source == "measured" else \
        f"{head}: {term.source}"


def _reload(path: PathFigures) -> Cell:
    if path.complete:
        return path.reload_ns
    return NoValue("incomplete: " + "; ".join(f"{t.hop} {t.source}" for t in path.terms
                                              if t.ns is None))


def section_serving(inputs: SectionInputs) -> Section:
    section = Section("serving", "Serving — KV reload per turn over each path",
                      "Beluga's B16 request as nearlocal models it (the paper gives LV-Eval, "
                      f">15K-token inputs; {REQUEST.model}, {REQUEST.context} tokens, all "
                      "cached, TP 1, vLLM flash-attn 16-token blocks, scattered are nearlocal's "
                      "choices) reloaded over "
                      "each serving path, from path models fitted to this run's rows (`nearlocal "
                      "whatif` for another model or context; docs/whatif.md). A path whose hop "
                      "the run did not measure is incomplete, and says which.",
                      _refs("B16", "S2"))
    per_run = []
    measured_any = False
    reference = reference_box(inputs.reference) if inputs.reference else None
    if reference is not None:
        section.notes.append(f"Hops a run did not measure come from {reference.label}: a "
                             "reference's figure, never this box's measurement.")
    for run, data in zip(inputs.runs, inputs.data, strict=True):
        result = whatif(inputs_of(data), REQUEST, reference)
        shape = result.shape
        name = f"run {run.label}" if len(inputs.runs) > 1 else "this run"
        section.notes.append(
            f"{name}: one read = {shape.fragments} fragments of {format_size(shape.fragment_bytes)}"
            f" ({format_size(shape.total_bytes)}; pattern {shape.pattern})"
            + (f"; {result.emulated}" if result.emulated else ""))
        section.notes.extend(f"{name}: {path.path}: {path.shares}" for path in result.paths
                             if path.shares)
        cells: dict[tuple, list[Cell]] = {}
        for path in result.paths:
            measured_any |= any(t.source == "measured" for t in path.terms)
            cells[(path.path, path.what)] = [
                _reload(path), path.gbps,
                f"{path.requests_per_s:.3g}" if path.requests_per_s else None,
                "; ".join(_term(t) for t in path.terms)]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("path"), Column("what")],
        [Column("reload per turn", "time"), Column("GB/s", "gbps"), Column("req/s per link"),
         Column("terms (rows)")], inputs.runs, per_run)
    section.table.collapse = False
    if not measured_any and reference is None:
        section.absent = ("No hop of a serving path was measured in this run (a hop needs a method "
                          "that lands the bytes: a copy, a GPU transfer, RDMA, a file read).")
        section.table = None
    section.notes.append("A route's hops are added in series. req/s per link: one link carries "
                         "one request's reload at a time.")
    return section


def section_claims(inputs: SectionInputs) -> Section:
    section = Section("claims", "Serving claims — the papers' end-to-end figures recomputed",
                      "Each claim as the paper reports it, as its own microbenchmarks predict "
                      "through the same path model (the reference boxes beluga-h20 and "
                      "swiftcache-media), and as this run's rows predict. The gap between the "
                      "first two is what paths do not explain. The load claims (B3, B16, S1 under "
                      "load; S4's reclaim) run the serving simulation (docs/whatif.md), over "
                      "the shipped conversation trace where the claim is about real traffic; "
                      "every input a paper does not give is named, or shown over a small grid.",
                      _refs("B3", "B11", "B16", "S1", "S2", "S3", "S4"))
    per_run = []
    explained: dict[str, str] = {}
    for data in inputs.data:
        cells: dict[tuple, list[Cell]] = {}
        for claim in claims(inputs_of(data), data.samples):
            explained[claim.id] = f"{claim.id}: {claim.explains} (assumed: {claim.assumption})"
            cells[(claim.id, claim.what, claim.reported, claim.from_papers)] = [
                claim.this_box + (f" (rows {', '.join(claim.rows)})" if claim.rows else "")]
        per_run.append(cells)
    section.table = keyed_table(
        [Column("ID"), Column("claim"), Column("reported by the paper"),
         Column("from the paper's microbenchmarks")],
        [Column("predicted for this box")], inputs.runs, per_run)
    section.table.collapse = False
    section.notes.extend(explained.values())
    return section


register_section("serving", 125)(section_serving)
register_section("claims", 127)(section_claims)
