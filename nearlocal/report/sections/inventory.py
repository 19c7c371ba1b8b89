"""The report's bookkeeping sections: the runs, each host's inventory, failed / unconverged and
skipped cases, and the papers' reference figures."""

from __future__ import annotations

import pandas as pd

from nearlocal.core.sampling import draws_disagree
from nearlocal.report.document import Cell, Column, RunInfo, Section, Table, keyed_table
from nearlocal.report.papers import figures, stated
from nearlocal.report.registry import SectionInputs, register_frames_section, register_section
from nearlocal.store import RunData
from nearlocal.units import format_size


def _inventory_rows(meta: dict) -> dict[tuple, list[Cell]]:
    from nearlocal.units import format_number

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
        **_settings_rows(inv.get("box_settings")),
        "nearlocal": f"{meta.get('nearlocal_version', '?')} (numba "
                     f"{meta.get('numba_version', '?')}, python {meta.get('python_version', '?')})",
        "suite / budget": f"{meta.get('suite', '?')}, "
                          f"{format_number(settings.get('budget_s', '?'))} s per case"
                          f", CI target ±{float(settings.get('target_rel_ci', 0)) * 100:g}%",
        "started / ended": f"{meta.get('started', '?')} / {meta.get('ended', '?')}",
    }
    return {(name,): [value] for name, value in rows.items()}


def _topology_rows(meta: dict) -> dict[tuple, list[Cell]]:
    """Links (speed, width, node, root port) of each CXL memdev, GPU and RDMA NIC, DDIO per root
    port, the GPU x adapter / NIC affinity, and the nearlocal_pool module's range, as the run's
    inventory read them (probe/links.py, probe/poolmod.py); none for a run stored before."""
    from nearlocal.probe.links import below_maximum, ddio_text, link_text

    inv = meta.get("inventory") or {}
    topology = inv.get("topology")
    rows: dict[str, str] = {}
    if isinstance(topology, dict):
        rows["links"] = "; ".join(link_text(link) for link in topology.get("links") or []
                                  if isinstance(link, dict)) or "no CXL memdev, GPU or RDMA NIC"
        below = below_maximum(topology)
        if below:
            rows["links below their maximum"] = "; ".join(below)
        rows["DDIO"] = ddio_text(topology)
        pairs = [p for p in topology.get("affinity") or [] if isinstance(p, dict)]
        if pairs:
            rows["GPU affinity"] = "; ".join(
                f"{p.get('gpu')} - {p.get('peer_kind')} {p.get('peer')}: {p.get('relation')}"
                for p in pairs)
    module = inv.get("pool_module")
    if isinstance(module, dict):
        rows["nearlocal_pool module"] = (
            f"{module.get('device')} maps [{module['start']:#x}, "
            f"{module['start'] + module['size']:#x})" if module.get("loaded")
            and module.get("device") and module.get("start") is not None and module.get("size")
            else "loaded, no device" if module.get("loaded") else "not loaded")
    return {(name,): [value] for name, value in rows.items()}


def _settings_rows(box: object) -> dict[str, str]:
    """The box's settings as `nearlocal probe` lists them (engine/stability/settings.py), one
    row each; the self-check's lead line says which of them make figures unstable."""
    from nearlocal.engine.stability.settings import describe_settings

    if not isinstance(box, dict) or not box:
        return {"settings": "not recorded (a run stored before nearlocal read the box's settings)"}
    try:
        return {f"settings: {label}": text for label, text in describe_settings(box)}
    except (AttributeError, TypeError, ValueError):  # a run.json edited by hand
        return {"settings": "unreadable in this run's run.json (inventory.box_settings)"}


def section_inventory(runs: list[RunInfo], data: list[RunData]) -> Section:
    section = Section("inventory", "Host inventory",
                      "What each run was made on (nearlocal probe at the start of the run).")
    section.table = keyed_table([Column("item")], [Column("value")], runs,
                                [{**_inventory_rows(run.meta), **_topology_rows(run.meta)}
                                 for run in data])
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


def _mixed_text(group: pd.DataFrame) -> str:
    """Cases whose page placements disagree: their patterns, how far apart, over how many."""
    patterns = ", ".join(dict.fromkeys(group.sort_values("size_bytes")["pattern"]))
    low, high = group["spread"].min() * 100, group["spread"].max() * 100
    drawn = pd.to_numeric(group["placements"], errors="coerce").dropna()
    over = f" over {int(drawn.min())}–{int(drawn.max())}" if len(drawn) and drawn.min() != drawn.max() \
        else (f" over {int(drawn.max())}" if len(drawn) else "")
    return (f"{patterns}; placement medians spread {low:.0f}–{high:.0f}% (robust SD){over} "
            "placements: the figure mixes fast and slow page placements (`nearlocal show --json` "
            "lists each placement's median, CPU and offsets)")


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
        spread = pd.to_numeric(df["placement_spread"], errors="coerce")  # load() fills it: NaN
        mixed = df[df["ok"] & spread.map(draws_disagree)].assign(spread=spread)
        for method, group in mixed.groupby("method", sort=True):
            cells[(f"{method}: {len(group)} placements disagree",)] = [_mixed_text(group)]
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
    section.notes += [f"Stated, not measured ({f.paper.title.split(':')[0]}), so compared with "
                      f"nothing: {f.what}: \"{f.text}\" ({f.provenance})."
                      for f in stated().values()]
    return section


# ------------------------------------------------------------- registered, in the report's order


@register_section('runs', 30)
def _runs(i: SectionInputs) -> Section:
    return section_runs(i.runs)


@register_section('inventory', 170)
def _inventory(i: SectionInputs) -> Section:
    return section_inventory(i.runs, i.data)


@register_section('failures', 180)
def _failures(i: SectionInputs) -> Section:
    return section_failures(i.runs, i.frames, i.data)


register_frames_section('skipped', 190, section_skipped)


@register_section('references', 200)
def _references(i: SectionInputs) -> Section:
    return section_references()
