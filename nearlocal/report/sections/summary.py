"""The report's answer first: how near local each region is (the lead lines, the per-region
summary, every case beside local dram) and the acceptance verdicts that exist for the host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nearlocal.report.document import Cell, Column, RunInfo, Section, keyed_table
from nearlocal.report.papers import figure
from nearlocal.report.registry import SectionInputs, register_frames_section, register_section
from nearlocal.report.rows import (
    LOCAL_CLASS,
    SHARED_CLASS,
    _best,
    _params_text,
    _with_attr,
    relative_ci,
    stat_of,
)
from nearlocal.report.sections.beluga import _pool_and_local_to_gpu
from nearlocal.store import RunData
from nearlocal.units import format_ns, format_size

LOCAL_REGION = "dram"  # what "local" means in every near-local ratio
IDLE_METHOD = "chase"  # the headline's idle latency

NEAR_MATCH = ["method", "access", "attr", "peer", "pattern", "params"]


def near_matches(df: pd.DataFrame) -> pd.DataFrame:
    """Every measured row on a non-local host region that local dram was also measured at (same
    method, access, attribute, peer, pattern and parameters), with `local_ns` and `ratio`."""
    ok = df[df["ok"]]
    base = ok[ok["region"] == LOCAL_REGION].drop_duplicates(NEAR_MATCH).set_index(NEAR_MATCH)
    others = ok[ok["pool_rank"] < LOCAL_CLASS]
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
    rows = df[df["ok"] & (df["method"] == IDLE_METHOD) & (df["region"] == region)
              & (df["size_bytes"] == size) & (df["attr"] == "wb")]
    row = _best(rows, ("n_params",))
    return None if row is None else float(row["median_ns"])


def headlines(df: pd.DataFrame) -> list[Headline]:
    """Every measured region that is other memory than this box's DRAM (a pool, a CPU-less or
    another NUMA node), most pool-like first."""
    measured = df[df["ok"] & (df["pool_rank"] < SHARED_CLASS)]
    near = near_matches(df)
    out = []
    for (_, region), group in measured.groupby(["pool_rank", "region"], sort=True):
        latency = tuple((size, _chase_median(df, region, size), _chase_median(df, LOCAL_REGION, size))
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
class AcceptanceLine:
    """One spec's verdicts on a run of this host, as the report's lead states them."""

    spec: str  # the spec file's name, with the pool it was aimed at
    run_id: str
    passed: int
    failed: tuple[str, ...]  # the failed requirements, each with what it measured or why
    problem: str = ""  # why no verdict: the run is damaged or incomplete, or kept none


def acceptance_of(run: RunData) -> list[AcceptanceLine]:
    """The verdicts `nearlocal accept` kept for this run's host (acceptance/verdicts.py
    `host_acceptance`: the run's own, else the latest per spec and pool among the host's runs),
    as lead lines: read as stored, never judged again from a spec file that may have changed."""
    from nearlocal.acceptance.render import missed_text
    from nearlocal.acceptance.verdicts import host_acceptance

    lines = []
    for found in host_acceptance(run.meta, run.run_id, None if run.path is None else Path(run.path)):
        name = Path(found.spec).name + (f" (pool {found.pool})" if found.pool else "") \
            if found.spec else ""
        if found.record is None:
            lines.append(AcceptanceLine(name, found.run_id, 0, (), found.problem))
            continue
        failed = tuple(f"{v.requirement} ({missed_text(v)})" for v in found.record.failed)
        lines.append(AcceptanceLine(name, found.run_id, len(found.record.verdicts) - len(failed),
                                    failed))
    return lines


def acceptance_text(a: AcceptanceLine) -> str:
    if a.problem:
        return f"Acceptance {a.spec + ' ' if a.spec else ''}(run {a.run_id}): {a.problem}."
    if not a.failed:
        return f"PASS: {a.spec}, all {a.passed} requirements (run {a.run_id})."
    return (f"FAIL: {a.spec}, {len(a.failed)} of {a.passed + len(a.failed)} requirements "
            f"failed (run {a.run_id}): " + "; ".join(a.failed) + ".")


def lead_lines(run: RunInfo, df: pd.DataFrame, data: RunData, multi: bool) -> list[str]:
    """The report's first lines: one per non-local region with its headline ratios to local
    DRAM (or one saying only local DRAM was measured), PASS / FAIL where acceptance verdicts
    exist, the GPU path, and what the run could not measure."""
    from nearlocal.engine.stability.selfcheck import settings_of

    check = data.meta.get("self_check") or {}
    suspect = check.get("suspect") or []
    lines = [f"These figures are suspect: {'; '.join(suspect)} (the run's self-check)."] \
        if suspect else []
    settings = settings_of(check)
    lines += [f"This box's settings make figures unstable: {'; '.join(settings)} (the run's "
              "self-check; docs/running.md, Prepare a box)."] if settings else []
    lines += [headline_text(h) for h in headlines(df)] or [only_local_text(data.meta)]
    lines += [acceptance_text(a) for a in acceptance_of(data)]
    gpu = _pool_and_local_to_gpu(df)
    pairs = [(m, pool, local) for m, (pool, local) in gpu.items() if pool is not None
             and local is not None and pool["ok"] and local["ok"]]
    if pairs:
        method, pool, local = pairs[0]
        fig = figure("B11")
        paper_pool, paper_local = fig.value("pool -> GPU"), fig.value("local DRAM -> GPU")
        lines.append(f"Into the GPU, 64 KiB by {method} from {pool['src']} takes "
                     f"{_ratio_text(pool['median_ns'] / local['median_ns'])} the time from "
                     f"{local['src']} (B11; Beluga reports {paper_pool.text()} vs "
                     f"{paper_local.text()}, {_ratio_text(paper_pool.ns() / paper_local.ns())}).")
    counts = df["status"].value_counts()
    converged = df["converged"] if "converged" in df else pd.Series(dtype=object)
    unconverged = df[df["ok"] & converged.notna()
                     & (converged.astype("boolean") == False)]  # noqa: E712
    skipped = df.loc[df["status"] == "skipped", "reason"].map(_short_reason).value_counts()
    outcome = (f"{int(counts.get('ok', 0))} cases measured "
               f"({_unconverged_text(unconverged, data.meta)}), "
               f"{int(counts.get('failed', 0))} failed, "
               f"{int(counts.get('skipped', 0))} skipped")
    if len(skipped):
        outcome += ": " + ", ".join(f"{reason} ({n})" for reason, n in skipped.head(4).items())
        outcome += f" and {len(skipped) - 4} more reasons" if len(skipped) > 4 else ""
    lines.append(outcome + ".")
    return [f"Run #{run.label} ({run.run_id} on {run.host}): {line}" for line in lines] \
        if multi else lines


def _unconverged_text(unconverged: pd.DataFrame, meta: dict) -> str:
    """What the † rows mean, in the outcome line: how wide their intervals are against the
    run's target, so a first look's reader knows whether it matters for them."""
    if unconverged.empty:
        return "0 not converged"
    widths = [w for w in (relative_ci(r) for _, r in unconverged.iterrows()) if w is not None]
    target = (meta.get("settings") or {}).get("target_rel_ci")
    aim = f" against the ±{target * 100:.2g}% target" if target else ""
    low, high = (f"{w * 100:.2g}" for w in (min(widths, default=0), max(widths, default=0)))
    span = (f": their medians' 95% CIs are ±{low if low == high else f'{low}–{high}'}%{aim}, "
            "each shown beside its †; the figures stand, known that closely" if widths else "")
    return f"{len(unconverged)} not converged, marked †{span}"


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
                ["region", "region_what", "access", "pool_rank"], sort=False):
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


# ------------------------------------------------------------- registered, in the report's order


@register_section('near', 10)
def _near(i: SectionInputs) -> Section:
    return section_near_summary(i.runs, i.frames, i.data)


# every case beside local dram: left out when nothing else was measured (the lead says so)
register_frames_section('near-cases', 130, section_near_local, drop_when_absent=True)
