"""The run's self-check: physical sanity of the box's own figures, computed from the run itself.

A run whose clock, cache sizes or process set-up went wrong on a box nobody here has seen still
produces tidy numbers (on an Intel guest every row once said its clock moved in 110 us steps).
These checks catch what physics rules out; a failed one is a line in the run's output, a note
at the top of its report ("these figures are suspect: ...") and `self_check` in run.json. It
never passes silently, and it never changes a figure.

Each check reads the stored rows (`cases`), samples and run.json (`meta`): plain data. Besides
physics: how busy the box was while the run measured (`busy`: other work on a CPU, the memory
probe's move; busy.py beside this), a suspect finding too, and the box's settings that make
figures unstable (governor, boost, THP, NUMA balancing, deep C-states: settings.py), kept apart as
`settings`: the figures are the box's as it is set, not wrong, and the fix is the operator's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nearlocal.units import format_size

MIN_STEPS = 1.0  # a sample spanning less than one clock step is no figure
# an L1 hit, per hop, in TSC ticks: 3-5 core cycles on a core clocked 0.3-3x the TSC
L1_HOP_TICKS = (1.0, 30.0)
L1_CHASE_BYTES = 32 << 10  # a chase ring within every L1d
MAX_BYTES_PER_TICK = 128.0  # one thread moves at most two 64-byte lines per TSC tick
PROCESS_AGREEMENT = 0.01  # a case's processes convert raw ticks to ns by one factor, within 1 %


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


def _info(value: object) -> dict:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value) if isinstance(value, str) else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _ok_tsc(cases: pd.DataFrame) -> pd.DataFrame:
    if cases.empty or "status" not in cases:
        return cases.iloc[0:0]
    return cases[(cases["status"] == "ok") & (cases["clock"] == "tsc")]


def clock_step(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> Finding:
    """Every figure spans at least one step of the run's clock."""
    rows = _ok_tsc(cases)
    steps = pd.to_numeric(rows.get("sample_steps", pd.Series(dtype=float)), errors="coerce")
    below = rows[steps < MIN_STEPS]
    clock = meta.get("clock") or {}
    step_ns = clock.get("step_ns")
    if step_ns is None:
        return Finding("clock", True, "no clock recorded (a run stored before it was)")
    if below.empty:
        shortest = float(steps.min()) if steps.notna().any() else math.nan
        return Finding("clock", True, f"step {step_ns:.3g} ns; the shortest sample spans "
                                      f"{shortest:.0f} steps")
    names = ", ".join(below["case_id"].head(3))
    return Finding("clock", False, f"{len(below)} cases' samples span under one step of the "
                                   f"clock ({step_ns:.3g} ns): {names}")


def l1_chase(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> Finding:
    """An L1-resident chase reads a plausible number of TSC ticks per hop."""
    tsc_hz = float((meta.get("clock") or {}).get("tsc_hz") or
                   (meta.get("inventory") or {}).get("tsc_hz") or 0.0)
    rows = _ok_tsc(cases)
    chases = rows[(rows["method"] == "chase") & (rows["size_bytes"] <= L1_CHASE_BYTES)
                  & (rows["attr"] == "wb")] if "method" in rows else rows.iloc[0:0]
    if chases.empty or not tsc_hz:
        return Finding("l1-chase", True, "no L1-resident chase in the run")
    ticks = float(chases["median_ns"].median()) * tsc_hz / 1e9
    low, high = L1_HOP_TICKS
    detail = (f"{ticks:.1f} TSC ticks a hop (chase of "
              f"{', '.join(format_size(int(b)) for b in sorted(set(chases['size_bytes'])))})")
    if low <= ticks <= high:
        return Finding("l1-chase", True, detail)
    return Finding("l1-chase", False, f"an L1 chase read {detail}, outside {low:g}-{high:g}: "
                                      "the TSC rate or the timer overhead is wrong")


def bandwidth(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> Finding:
    """No row moves more bytes per TSC tick per thread than a core can."""
    tsc_hz = float((meta.get("clock") or {}).get("tsc_hz") or 0.0)
    rows = cases[cases["status"] == "ok"] if "status" in cases else cases
    if rows.empty or not tsc_hz or "gbps" not in rows:
        return Finding("bandwidth", True, "no bandwidth to check")
    threads = [max(1, int(_info(info).get("threads", 1) or 1)) for info in rows["info"]]
    per_thread = pd.to_numeric(rows["gbps"], errors="coerce") / np.asarray(threads)
    limit = MAX_BYTES_PER_TICK * tsc_hz / 1e9
    over = rows[per_thread > limit]
    if over.empty:
        return Finding("bandwidth", True, f"at most {per_thread.max():.3g} GB/s a thread "
                                          f"(limit {limit:.0f})")
    return Finding("bandwidth", False, f"{len(over)} cases move over {limit:.0f} GB/s a thread "
                                       f"({', '.join(over['case_id'].head(3))}): more than a "
                                       "core can; the timer overhead subtracted is too large")


def processes_agree(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> Finding:
    """Every process of a case turned its raw ticks into ns by the same factor: they measured
    the same thing (the same passes per sample, the same overheads subtracted)."""
    clock = meta.get("clock") or {}
    if "overhead_ticks" not in clock or samples.empty:
        return Finding("processes", True, "no clock or samples to check")
    rows = _ok_tsc(cases)
    rows = rows[pd.to_numeric(rows.get("processes", 1), errors="coerce").fillna(1) > 1]
    disagree = []
    for _, row in rows.iterrows():
        mine = samples[(samples["case_id"] == row["case_id"]) & (samples["ns"] > 0)]
        removed = clock["overhead_ticks"] + float(_info(row["info"]).get("drain_overhead_ticks", 0))
        scale = ((mine["raw"] - removed) / mine["ns"]).groupby(mine["process"]).median()
        if len(scale) > 1 and scale.min() > 0 and scale.max() / scale.min() - 1 > PROCESS_AGREEMENT:
            disagree.append(f"{row['case_id']} ({scale.max() / scale.min():.3f}x)")
    if not disagree:
        return Finding("processes", True, f"{len(rows)} cases, every process alike")
    return Finding("processes", False, f"{len(disagree)} cases' processes measured different "
                                       f"things: {', '.join(disagree[:3])}")


def _siblings(box: dict) -> dict[int, list[int]]:
    return {int(e["cpu"]): [int(c) for c in e.get("siblings") or []]
            for e in box.get("cpus") or [] if isinstance(e, dict) and isinstance(e.get("cpu"), int)}


def _box(meta: dict) -> dict:
    box = (meta.get("inventory") or {}).get("box_settings")
    return box if isinstance(box, dict) else {}


def busy_box(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> Finding:
    """No other work took a CPU over the run (/proc/stat against the run's own CPU time), and the
    memory probe read the same at the run's end as at its start (busy.py)."""
    from nearlocal.engine.stability.busy import OTHERS_SHARE, busy_lines, busy_shares, memory_line

    record = meta.get("busy")
    lines = busy_lines(record, _siblings(_box(meta)))
    moved = memory_line(meta.get("host_probe"))
    lines += [moved] if moved else []
    if lines:
        return Finding("busy", False, "; ".join(lines))
    shares = busy_shares(record) if isinstance(record, dict) else {}
    if not shares:
        return Finding("busy", True, "not recorded (a run stored before it was)")
    cpu, share = max(shares.items(), key=lambda item: item[1]["others"])
    return Finding("busy", True, f"other work at most {100 * share['others']:.0f} % of CPU {cpu} "
                                 f"(named over {100 * OTHERS_SHARE:.0f} %)")


CHECKS = (clock_step, l1_chase, bandwidth, processes_agree, busy_box)


def self_check(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> dict:
    """run.json's `self_check`: every check's finding, the failed ones' details (`suspect`), and
    the box's settings that make figures unstable (`settings`, each with its fix)."""
    from nearlocal.engine.stability.settings import unstable_settings
    from nearlocal.probe.links import below_maximum

    findings = [check(meta, cases, samples) for check in CHECKS]
    allowed = (meta.get("busy") or {}).get("allowed_cpus") if isinstance(meta.get("busy"), dict) else None
    topology = (meta.get("inventory") or {}).get("topology")
    return {"checks": {f.check: {"ok": f.ok, "detail": f.detail} for f in findings},
            "suspect": [f.detail for f in findings if not f.ok],
            "settings": unstable_settings(_box(meta), allowed),
            "links": below_maximum(topology if isinstance(topology, dict) else None)}


def checked(meta: dict, cases: pd.DataFrame, samples: pd.DataFrame) -> dict:
    """Store.finish's `derive`: run.json's `self_check`."""
    return {"self_check": self_check(meta, cases, samples)}


def settings_of(result: dict) -> list[str]:
    """A stored self-check's box settings lines (none in a run stored before they were)."""
    lines = result.get("settings") if isinstance(result, dict) else None
    return [str(line) for line in lines] if isinstance(lines, list) else []


def links_of(result: dict) -> list[str]:
    """A stored self-check's links trained below their maximum (none in a run stored before
    they were read)."""
    lines = result.get("links") if isinstance(result, dict) else None
    return [str(line) for line in lines] if isinstance(lines, list) else []


def summary_line(result: dict) -> str:
    """The run's self-check, said: passed or what is suspect, then (further lines) the box's
    settings that make figures unstable and the links trained below their maximum, when there
    are any."""
    suspect = result.get("suspect") or []
    suspect = [str(s) for s in suspect] if isinstance(suspect, list) else [str(suspect)]
    checks = result.get("checks")  # a stored run's, as `show` reads it back: plain data
    first = (f"self-check: ok ({', '.join(map(str, checks if isinstance(checks, dict) else {}))})"
             if not suspect else "self-check: these figures are suspect: " + "; ".join(suspect))
    settings = settings_of(result)
    if settings:
        first += "\nself-check: this box's settings make figures unstable: " + "; ".join(settings)
    links = links_of(result)
    if links:
        first += "\nself-check: links trained below their maximum: " + "; ".join(links)
    return first
