"""What each case measured in both runs, as plain data for the model (gate/estimate.py).

The unit is one worker process: the mean of the log medians of the page placements it drew
(engine/worker.py; one a process in runs stored before placements), since most of the noise
between runs of the same code is drawn once per process or per placement (page placement, code
layout, co-tenants). Placements are not units of their own: measured on the 2-vCPU VM (quick
run, 8 processes x 2 placements, 105 cases), the process means of the placement log medians
varied 3x more than independent placements would make them (variance 5.8e-4 against 1.9e-4 =
the within-process 3.7e-4 over 2): half the variance is drawn once per process, so two
placements of one process are not two draws, and counting them as such would understate every
ratio's error by ~1.2x. A process's placements average away the placement part of its noise.
Both runs are put on one timer-overhead correction (the smaller estimate: a different estimate
is no change in the code), and each median may be off by the clock's step (run.json's `clock`,
per row `clock_resolution_ns`; older rows: the overhead), divided by the operations a sample's
figure is divided by (a chase's hops: `ops_per_sample`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nearlocal.core.sampling import MIN_PROCESSES
from nearlocal.lazy import lazy_import
from nearlocal.store.reader import RunData
from nearlocal.store.schema import ops_per_sample

np = lazy_import("numpy")
pd = lazy_import("pandas")


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
    base_logs: np.ndarray | None = None  # log median of each worker process (>= 2 processes)
    cand_logs: np.ndarray | None = None
    step_ns: float = math.nan  # the clock's step per operation (nan: the row states none)
    resolution_ns: float = math.nan  # what a median cannot resolve: the step, else the overhead
    unsettled: str = ""  # the run(s) whose stopping rule was not met (one-process runs only)
    placements: tuple[int, int] = (0, 0)  # (base, candidate) page placements behind the figures
    reaches_memory: bool = True
    llc_resident: bool = False

    @property
    def by_processes(self) -> bool:
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
    """Per case: the samples' ns and a tag per sample naming its process and placement
    (process x 2^20 + placement; store.load gives older runs one placement a process, and a
    RunData built by hand without placements has one too)."""
    samples = run.samples
    if samples.empty:
        return {}
    placement = samples["placement"] if "placement" in samples else samples["process"]
    tags = (samples["process"].to_numpy(np.int64) << 20) + placement.to_numpy(np.int64)
    return {str(cid): (samples["ns"].to_numpy(np.float64)[rows], tags[rows])
            for cid, rows in samples.groupby("case_id", sort=False).indices.items()}


def process_log_medians(ns: np.ndarray, tags: np.ndarray) -> np.ndarray | None:
    """Per process, in process order: the mean of the log medians of its placements' samples
    (`tags`: process x 2^20 + placement). None with fewer than 2 processes or a median at or
    below 0 (below the clock's resolution)."""
    placements = np.unique(tags)
    processes = placements >> 20
    if np.unique(processes).size < MIN_PROCESSES:
        return None
    medians = np.array([np.median(ns[tags == tag]) for tag in placements])
    if not np.all(medians > 0):
        return None
    logs = np.log(medians)
    return np.array([logs[processes == p].mean() for p in np.unique(processes)])


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
    case.base_logs = process_log_medians(base_ns, base_proc)
    case.cand_logs = process_log_medians(cand_ns, cand_proc)
    case.placements = (int(np.unique(base_proc).size), int(np.unique(cand_proc).size))
    if not case.by_processes:
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
