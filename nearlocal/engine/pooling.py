"""One row from a case's processes: their rows and samples pooled, each sample's placement
numbered across processes."""

from __future__ import annotations

import numpy as np

from nearlocal.core.sampling import StoppingRule, log_spread, summarize


def global_placements(per_process: list[np.ndarray]) -> np.ndarray:
    """Each sample's placement numbered across the case's processes (process k's placements
    follow process k-1's): one draw of pages each, whose medians give the row's spread."""
    out, offset = [], 0
    for local in per_process:
        local = np.asarray(local, np.int32)
        out.append(local + offset)
        offset += int(local.max()) + 1 if local.size else 0
    return np.concatenate(out) if out else np.array([], np.int32)


def _pooled(rows: list[dict], ns: np.ndarray, placement: np.ndarray, bytes_moved: int,
            rule: StoppingRule) -> dict:
    """One row from each process's row and all their samples (`ns`, each sample's `placement`
    numbered across processes): statistics over all samples; converged when the
    pooled samples meet the stopping rule (the row's median is theirs; each process has only
    budget / K, and how many met the rule alone is `processes_converged`); the coarsest clock
    resolution; the placements of every process (their count, spread and facts, each fact
    naming its process)."""
    if len(rows) == 1:
        return {**rows[0], "processes": 1}
    drawn = np.unique(placement)
    overheads = [r["timer_overhead_ns"] for r in rows if r.get("timer_overhead_ns") is not None]
    resolutions = [r["clock_resolution_ns"] for r in rows if r.get("clock_resolution_ns") is not None]
    facts = [{"process": k, **fact} for k, r in enumerate(rows)
             for fact in (r.get("info") or {}).get("placements", [])]
    info = {**(rows[-1].get("info") or {}), **({"placements": facts} if facts else {})}
    return {**rows[-1], **summarize(ns, bytes_moved), "processes": len(rows),
            "placements": int(drawn.size),
            "placement_spread": log_spread([ns[placement == p] for p in drawn]),
            "info": info,
            "converged": bool(rule.converged(ns)),
            "processes_converged": sum(bool(r.get("converged")) for r in rows),
            "elapsed_s": sum(float(r.get("elapsed_s") or 0.0) for r in rows),
            "wall_s": sum(float(r.get("wall_s") or 0.0) for r in rows),
            "timer_overhead_ns": float(np.median(overheads)) if overheads else None,
            "clock_resolution_ns": max(resolutions) if resolutions else None,
            **({"sample_steps": float(np.median([r["sample_steps"] for r in rows]))}
               if all("sample_steps" in r for r in rows) else {})}
