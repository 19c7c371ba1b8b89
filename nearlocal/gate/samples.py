"""What each case measured in both runs, as plain data for the model (gate/model.py).

The unit is one page placement: its samples' median (in log), since most of the noise between
runs of the same code is drawn once per placement or per process (page placement, code layout,
co-tenants). A worker process draws several placements of a case (engine/worker.py); in runs
stored before that, each process drew one, and the unit is the process.
Both runs are put on one timer-overhead correction (the smaller estimate: a different estimate
is no change in the code), and each median may be off by the clock's step (run.json's `clock`,
per row `clock_resolution_ns`; older rows: the overhead), divided by the operations a sample's
figure is divided by (a chase's hops: `ops_per_sample`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nearlocal.lazy import lazy_import
from nearlocal.store.runs import RunData
from nearlocal.store.schema import ops_per_sample

np = lazy_import("numpy")
pd = lazy_import("pandas")

MIN_PROCESSES = 2  # worker processes a host probe needs before its processes are the unit
MIN_PLACEMENTS = 2  # placements each run needs for a case before its placements are the unit


@dataclass
class CaseInput:
    """One case present in both runs."""

    case_id: str
    method: str
    base_median_ns: float
    cand_median_ns: float
    n_base: int = 0
    n_cand: int = 0
    problem: str = ""  # why no ratio is judged ("" when one is)
    base_ns: np.ndarray | None = None  # samples on the common overhead correction
    cand_ns: np.ndarray | None = None
    base_logs: np.ndarray | None = None  # log median of each placement (>= 2 placements)
    cand_logs: np.ndarray | None = None
    step_ns: float = math.nan  # the clock's step per operation (nan: the row states none)
    resolution_ns: float = math.nan  # what a median cannot resolve: the step, else the overhead
    unsettled: str = ""  # the run(s) whose stopping rule was not met (one-placement runs only)
    most_processes: bool = False  # both runs had at least the most --processes gives
    reaches_memory: bool = True
    llc_resident: bool = False

    @property
    def by_placements(self) -> bool:
        return self.base_logs is not None and self.cand_logs is not None


@dataclass
class Absent:
    """A case one run measured and the other did not (`missing` from the candidate, or `new`)."""

    case_id: str
    verdict: str
    method: str
    median_ns: float
    why: str


def ok_rows(run: RunData) -> dict[str, dict]:
    return {str(r["case_id"]): r for r in run.cases.to_dict("records") if r.get("status") == "ok"}


def number(row: dict, column: str) -> float:
    """A numeric column of a case row; NaN when the row lacks it (older or imported runs)."""
    value = row.get(column)
    return float(value) if value is not None and pd.notna(value) else math.nan


def row_ops(row: dict) -> int:
    """Operations one sample's ns is divided by (the row's column; older rows: see schema)."""
    info = row.get("info")
    return ops_per_sample(row.get("ops_per_sample"), info if isinstance(info, dict) else {})


def _flag(row: dict, column: str, before_column: bool) -> bool:
    """A boolean column; `before_column` for a row stored before it (reaches_memory: True,
    llc_resident: False)."""
    value = row.get(column)
    return before_column if value is None or value != value else bool(value)


def layer_flags(base_row: dict, cand_row: dict) -> tuple[bool, bool]:
    """(reaches memory, lives in the LLC) in either run: which host probes are its yardsticks."""
    return (_flag(base_row, "reaches_memory", True) or _flag(cand_row, "reaches_memory", True),
            _flag(base_row, "llc_resident", False) or _flag(cand_row, "llc_resident", False))


def _samples_by_case(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per case: the samples' ns and the placement each was taken on (store.load gives older
    runs one placement a process)."""
    samples = run.samples
    if samples.empty:
        return {}
    unit = "placement" if "placement" in samples else "process"  # a RunData built by hand
    return {str(cid): (group["ns"].to_numpy(dtype=np.float64),
                       group[unit].to_numpy(dtype=np.int64))
            for cid, group in samples.groupby("case_id", sort=False)}


def placement_log_medians(ns: np.ndarray, placement: np.ndarray) -> np.ndarray | None:
    """The log median of each placement's samples, in placement order (process by process, so
    placement k of two runs that took turns was measured in the same round); None with fewer
    than MIN_PLACEMENTS or a median at or below 0 (below the clock's resolution)."""
    tags = np.unique(placement)
    if tags.size < MIN_PLACEMENTS:
        return None
    medians = np.array([np.median(ns[placement == tag]) for tag in tags])
    return np.log(medians) if np.all(medians > 0) else None


def _case_input(case_id: str, base_row: dict, cand_row: dict,
                base: tuple[np.ndarray, np.ndarray] | None,
                cand: tuple[np.ndarray, np.ndarray] | None) -> CaseInput:
    case = CaseInput(case_id, str(cand_row.get("method", "")),
                     float(base_row.get("median_ns", math.nan)),
                     float(cand_row.get("median_ns", math.nan)))
    case.reaches_memory, case.llc_resident = layer_flags(base_row, cand_row)
    if base is None or cand is None or base[0].size < 2 or cand[0].size < 2:
        case.problem = "no raw samples: ratio only"
        return case
    (base_ns, base_proc), (cand_ns, cand_proc) = base, cand
    ops_b, ops_c = row_ops(base_row), row_ops(cand_row)
    overhead_b = number(base_row, "timer_overhead_ns") / ops_b
    overhead_c = number(cand_row, "timer_overhead_ns") / ops_c
    if math.isfinite(overhead_b) and math.isfinite(overhead_c):
        common = min(overhead_b, overhead_c)
        base_ns, cand_ns = base_ns + (overhead_b - common), cand_ns + (overhead_c - common)
        case.resolution_ns = common  # no clock step stated (older rows): the overhead
    steps = (number(base_row, "clock_resolution_ns") / ops_b,
             number(cand_row, "clock_resolution_ns") / ops_c)
    if all(math.isfinite(step) for step in steps):
        case.step_ns = case.resolution_ns = max(steps)
    case.n_base, case.n_cand = int(base_ns.size), int(cand_ns.size)
    case.base_ns, case.cand_ns = base_ns, cand_ns
    case.base_median_ns, case.cand_median_ns = float(np.median(base_ns)), float(np.median(cand_ns))
    if case.base_median_ns <= 0 or case.cand_median_ns <= 0:
        case.problem = "a median is 0: below the clock's resolution"
        return case
    case.base_logs = placement_log_medians(base_ns, base_proc)
    case.cand_logs = placement_log_medians(cand_ns, cand_proc)
    from nearlocal.engine.plan import MAX_PROCESSES

    case.most_processes = min(number(base_row, "processes"), number(cand_row, "processes")) \
        >= MAX_PROCESSES
    if not case.by_placements:
        case.base_logs = case.cand_logs = None
        case.unsettled = " and ".join(
            name for name, row in (("base", base_row), ("candidate", cand_row))
            if row.get("converged") is not None and pd.notna(row.get("converged"))
            and not bool(row.get("converged")))
    return case


def case_inputs(base: RunData, cand: RunData) -> tuple[list[CaseInput], list[Absent]]:
    """The cases both runs measured, and those only one did (with why not the other)."""
    base_ok, cand_ok = ok_rows(base), ok_rows(cand)
    base_samples, cand_samples = _samples_by_case(base), _samples_by_case(cand)
    base_all = {str(r["case_id"]): r for r in base.cases.to_dict("records")}
    cand_all = {str(r["case_id"]): r for r in cand.cases.to_dict("records")}
    both, absent = [], []
    for case_id, row in base_ok.items():
        if case_id in cand_ok:
            both.append(_case_input(case_id, row, cand_ok[case_id], base_samples.get(case_id),
                                    cand_samples.get(case_id)))
        else:
            other = cand_all.get(case_id)
            why = (f"{other['status']} in the candidate: {other['reason']}" if other
                   else "not in the candidate run")
            absent.append(Absent(case_id, "missing", str(row.get("method", "")),
                                 float(row["median_ns"]), why))
    for case_id, row in cand_ok.items():
        if case_id not in base_ok:
            other = base_all.get(case_id)
            why = f"{other['status']} in the base: {other['reason']}" if other else \
                "not in the base run"
            absent.append(Absent(case_id, "new", str(row.get("method", "")),
                                 float(row["median_ns"]), why))
    return both, absent
