"""Baselines: a run per hardware (`nearlocal baseline set`), kept in the store with the runs
that were its baseline before. Box CI compares against it; both modes floor each case's error
at its spread over those past baselines (known-good runs: only other runs show how much one
run's draw of page placement and co-tenants moves a case)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError, error_line
from nearlocal.gate.identity import host_differences, host_id
from nearlocal.gate.samples import row_ops
from nearlocal.lazy import lazy_import
from nearlocal.store.baseline import read_baseline
from nearlocal.store.reader import RunData, load

np = lazy_import("numpy")

HISTORY_RUNS = 20  # past baselines of the same hardware used for per-case noise
MIN_HISTORY = 3  # runs a case needs in that history before its spread is used
BASELINE_REF = "baseline"


def baseline_dir(root: Path) -> Path:
    return Path(root) / "baselines"


def baseline_records(root: Path, damaged: list[str] | None = None) -> list[tuple[Path, dict]]:
    """The valid records; each damaged one is left out and, when `damaged` is given, said
    there: the other hosts' baselines stay usable."""
    folder = baseline_dir(root)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append((path, read_baseline(path)))
        except UsageError as exc:
            if damaged is not None:
                damaged.append(str(exc))
    return found


def _baseline_record(root: Path, meta: dict) -> tuple[Path, dict] | None:
    """The baseline record of this run's hardware: its exact host id, else the same hardware
    within tolerance (host ids drift on VMs), the most recently set first."""
    records = baseline_records(root)
    exact = [r for r in records if r[1].get("host_id") == host_id(meta)]
    alike = exact or [r for r in records if not host_differences(
        {**r[1].get("meta", {}), "host_id": r[1].get("host_id")}, meta)]
    return max(alike, key=lambda r: r[1].get("set", "")) if alike else None


def set_baseline(ref: str, root: Path, allow_incomplete: bool = False) -> Path:
    """Make a run this hardware's baseline in `<root>/baselines/<host_id>.json`; the runs that
    were its baseline before are kept as history. An incomplete or empty run is refused."""
    run = load(ref, root)
    run.require_complete("a baseline", allow_incomplete)
    key = host_id(run.meta)
    if not key:
        raise UsageError(f"run {run.run_id} records no host id: it cannot be a per-host baseline")
    found = _baseline_record(root, run.meta)
    folder = baseline_dir(root)
    path = found[0] if found else folder / f"{key}.json"
    if not found and path.exists():  # damaged: refused (its history is not ours to drop)
        read_baseline(path)
    inside = run.path.resolve().parent == Path(root).resolve()
    name = run.run_id if inside else str(run.path.resolve())
    previous = [found[1]["run"], *found[1].get("history", [])] if found else []
    record = {"run": name, "host_id": found[1]["host_id"] if found else key,
              "hostname": (run.meta.get("inventory") or {}).get("hostname"),
              "set": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "history": [r for r in dict.fromkeys(previous) if r != name][:HISTORY_RUNS],
              "meta": {"inventory": run.meta.get("inventory", {})}}
    made = _absent_folders(folder)
    try:
        with safeio.writing("baseline", folder):
            folder.mkdir(parents=True, exist_ok=True)
        safeio.check_output("baseline", path)
        safeio.write_output("baseline", path, json.dumps(record, indent=1, default=str))
    except BaseException:  # a full disk, say: no empty baselines folder is left behind
        for folder_made in made:
            with contextlib.suppress(OSError):  # rmdir: only while still empty
                folder_made.rmdir()
        raise
    return path


def _absent_folders(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist yet, deepest first: what mkdir -p makes."""
    absent = []
    for candidate in (folder, *folder.parents):
        if candidate.exists() or candidate.is_symlink():
            break
        absent.append(candidate)
    return absent


def history_note(unread: list[str]) -> str:
    """One line naming the past baselines left out of the noise estimate, each with its error."""
    if not unread:
        return ""
    return (f"history: {len(unread)} past baseline run{'s' if len(unread) > 1 else ''} could "
            "not be read and left out of the noise estimate (a narrower floor): "
            + "; ".join(unread))


def baseline_for(cand_meta: dict, root: Path) -> str:
    """The run recorded as the baseline of the candidate's hardware."""
    found = _baseline_record(root, cand_meta)
    if found is None:
        damaged: list[str] = []
        baseline_records(root, damaged)
        raise UsageError(f"no baseline for host {host_id(cand_meta)} in {baseline_dir(root)}: "
                         "set one with `nearlocal baseline set RUN`"
                         + "".join(f" ({problem})" for problem in damaged[:1]))
    return str(found[1]["run"])


def history_noise(root: Path, cand: RunData, limit: int = HISTORY_RUNS,
                  unread: list[str] | None = None) -> tuple[dict[str, float], int]:
    """Per case, the SD of the log median over the runs that have been this hardware's
    baseline (the candidate excluded); cases with under MIN_HISTORY such runs get none.
    Returns ({case_id: sd}, runs used). A past baseline that cannot be loaded (removed,
    damaged) is left out and, when `unread` is given, said there with its error: fewer runs
    make a narrower noise floor, which the comparison must not hide."""
    found = _baseline_record(root, cand.meta)
    if found is None:
        return {}, 0
    medians: dict[str, list[float]] = {}
    used = 0
    for ref in [found[1]["run"], *found[1].get("history", [])]:
        if used >= limit:
            break
        try:
            run = load(ref, root)
        except UsageError as exc:  # removed from the store, or damaged
            if unread is not None:
                unread.append(f"{ref} ({error_line(exc, 300)})")
            continue
        if run.path.resolve() == cand.path.resolve() or host_differences(run.meta, cand.meta):
            continue
        used += 1
        rows = run.cases[(run.cases["status"] == "ok") & (run.cases["median_ns"] > 0)]
        # the run's own overhead estimate is added back: its drift is not the case's noise
        ops = [row_ops(row) for row in rows.to_dict("records")]
        totals = rows["median_ns"] + rows["timer_overhead_ns"].astype(float).fillna(0.0) / ops
        for case_id, total in zip(rows["case_id"], totals, strict=True):
            medians.setdefault(str(case_id), []).append(math.log(total))
    return ({cid: float(np.std(v, ddof=1)) for cid, v in medians.items()
             if len(v) >= MIN_HISTORY}, used)
