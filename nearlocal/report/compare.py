"""`nearlocal compare BASE CAND`: is each case slower, faster or the same in the candidate run?

Noise between two runs of the same code on a shared machine is real, and most of it is drawn once
per worker process (page placement, code layout, co-tenants): on a busy 2-vCPU VM a case's median
moves by 2% to 50% from one process to the next, so no statistic over one process's samples can
tell a 1.3x slowdown from a rerun. Two models, chosen per case:

Runs measured in several worker processes (`nearlocal run --processes K`, the default): the
process model (judge_by_processes, ProcessModel). The estimate is the ratio of the (10% trimmed,
Yuen's) geometric means of the process medians; its error is their pooled, empirically-Bayes-
moderated (Winsorized) variance plus any
run noise that neighbouring cases show beyond it; Benjamini-Hochberg over all compared cases
selects with the matching false coverage-rate adjusted intervals. On the busy VM (33, 55 and 88
cases, 5 processes each, 24 comparisons of back-to-back runs) every rerun of the same code exited
0 and every 1.3x copy of another run exited 1, with 6 to 40 cases slower.

Runs with one process per case (schema 1, or `--processes 1`): the whole-run model. The ratio of
medians with a confidence interval from a bootstrap over the raw samples, and a Mann-Whitney U
p-value:

- The runs' samples are put on the same timer-overhead correction (the smaller of the two runs'
  estimates): a different overhead estimate is not a change in the code.
- The interval is widened by the run-to-run noise estimated from all cases together (a robust
  scatter of neighbouring cases' log ratios, which a change shared by a group of cases, such as
  every size of one method, does not inflate), with the heavy tails such changes have (Student t,
  RUN_NOISE_DOF): on a busy shared box single cases move by 30% between runs of the same code.
- alpha is the family-wise error rate over all compared cases (Bonferroni).
- Each median may be off by the clock's resolution: the step the clock moves in
  (`clock_resolution_ns`, the run's one clock), or for older rows that state no step the timer
  overhead. The overhead itself is no term: both runs are put on one overhead correction. A
  median within COARSE_STEPS steps is not judged for the clock's sake. On a VM whose TSC moves
  in ~10 ns steps, a 40 ns case reads 40 or 60 ns from one run to the next.
- `slower` needs the whole interval above 1 + threshold AND p < alpha; `faster` the whole interval
  below 1 / (1 + threshold); `same` the whole interval inside; anything else is `ambiguous`.
- Each case's interval is also at least as wide as that case's own spread over the runs that have
  been this hardware's baseline (--history, the latest 20), when there are 3 or more: one run is
  one draw of page placement, huge pages and co-tenants; only other runs show how much that moves
  a case, and baselines are known-good code.
- A case whose samples did not meet the runner's stopping rule (median CI within --ci) in either
  run is at most `ambiguous`: the run itself says that median is not settled, which on a busy box
  is where back-to-back runs of the same code differ by 2-3x.
Both models: the overhead rebase, the clock's resolution and the past baselines' spread apply.
The clock terms (timer overhead, clock step) belong to one timed interval: a figure that divides a
sample by its operations (a chase's hops, an RPC batch: the row's `ops_per_sample`) carries them
divided by the same count.
`same` is an equivalence verdict (judge_equivalence): two one-sided tests that the ratio lies
within a margin derived from the runs' own noise (the change a lone `slower` needs in a case of
typical noise: what the pair would have caught; at least the threshold, at most 10%), stated in
the summary.
Only `slower` cases make the exit status 1. Runs from different hardware are refused (exit 2)
unless --cross-host.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.results.schema import ops_per_sample
from nearlocal.results.store import RunData, load, read_baseline, require_store
from nearlocal.units import format_ns, non_negative_int

np = lazy_import("numpy")
pd = lazy_import("pandas")
scipy_stats = lazy_import("scipy.stats")
scipy_optimize = lazy_import("scipy.optimize")

DEFAULT_THRESHOLD = 0.05
COARSE_STEPS = 10  # a median within this many clock steps is too short for the clock to judge
DEFAULT_ALPHA = 0.01
N_BOOTSTRAP = 4000
MIN_CASES_FOR_RUN_NOISE = 8  # below this the run-to-run noise is not estimated (taken as 0)
HISTORY_RUNS = 20  # past baselines of the same hardware used for per-case noise
MIN_HISTORY = 3  # runs a case needs in that history before its spread is used
MAD_TO_SIGMA = 1.4826
MIN_PROCESSES = 2  # worker processes each run needs for a case before the process model judges it
MIN_CASES_FOR_PRIOR = 3  # cases with a nonzero process spread needed to fit the variance prior
MAX_PRIOR_DF = 20.0  # the prior never outweighs a case's own spread by more than this
PROCESS_TRIM = 0.1  # share of processes trimmed from each end of a run's (Yuen's estimator)
EXCESS_DEPENDENCE = 1.25  # neighbouring differences share a case: their median varies more
TINY_VARIANCE = 1e-10  # of log medians: rounding, not spread (equal medians after the rebase)
# Degrees of freedom of the Student t that models the cross-case run noise. Fitted on 28 pairs of
# back-to-back quick runs of the same code on a busy 2-core VM: |change| / noise had quantiles
# 2.1 (90%), 4.3 (99%), 6.9 (99.9%) where a normal gives 1.6, 2.6, 3.3 and t(5) 1.9, 3.7, 6.4.
RUN_NOISE_DOF = 5
# `same` (judge_equivalence): two one-sided tests at EQUIV_ALPHA each against a margin of the
# change the pair resolves in a typical case (equivalence_margin), at least the threshold, capped
# at EQUIV_MARGIN_CAP.
EQUIV_ALPHA = 0.05
EQUIV_MARGIN_CAP = 0.10
VERDICT_ORDER = ("slower", "faster", "ambiguous", "missing", "new", "same")
BASELINE_REF = "baseline"


@dataclass
class CaseComparison:
    case_id: str
    verdict: str
    method: str = ""
    base_median_ns: float = math.nan
    cand_median_ns: float = math.nan
    ratio: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    # whole-run model: Mann-Whitney U, two-sided, Bonferroni-adjusted; process model: the
    # Benjamini-Hochberg-adjusted p of "beyond the threshold"
    p_value: float = math.nan
    n_base: int = 0
    n_cand: int = 0
    processes: str = ""  # "base/candidate" worker processes when the process model judged
    note: str = ""
    _log_ratio: float = field(default=math.nan, repr=False)
    _log_se: float = field(default=math.nan, repr=False)
    _p_raw: float = field(default=math.nan, repr=False)
    _resolution_ns: float = field(default=math.nan, repr=False)
    _step_ns: float = field(default=0.0, repr=False)  # the clock's step, per operation
    # the log ratio's standard error and degrees of freedom (the model's), for the equivalence test
    _equiv_sd: float = field(default=math.nan, repr=False)
    _equiv_df: float = field(default=math.inf, repr=False)
    _unsettled: str = field(default="", repr=False)  # which run's stopping rule was not met
    # log medians of each worker process's samples (runs made with --processes >= 2)
    _proc_base: np.ndarray | None = field(default=None, repr=False)
    _proc_cand: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class HostMove:
    """One host probe (harness/hostprobe.py) in both runs: how far the box itself moved."""

    probe: str
    bounds: str  # the cases it is the yardstick of: "all", "llc" or "memory" (_yardsticks)
    base_ns: float
    cand_ns: float
    ratio: float
    low: float  # the ratio's interval, at 1 - alpha
    high: float
    passes: str  # "base/candidate" worker processes it was walked in
    log_se: float  # the standard error of log(ratio)
    # its interval excludes 1: the host moved, by however little (a case must then move beyond
    # the threshold times the move, judge_host_moves; a cliff at the threshold let a 1.06x
    # core-clock move make a 1.11x L1-resident chase `slower`, 2026-12-02)
    moved: bool

    def text(self) -> str:
        return (f"{self.probe} {self.base_ns:.3g} ns -> {self.cand_ns:.3g} ns "
                f"({self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}])")


@dataclass
class Comparison:
    base: str
    candidate: str
    threshold: float
    alpha: float
    run_noise: float  # sigma of log ratios between runs, estimated across cases
    confidence: float  # of each case's interval, after the Bonferroni adjustment
    host_note: str
    cases: list[CaseComparison]
    history_runs: int = 0  # past baselines whose spread widened each case's interval
    process_model: ProcessModel | None = None  # fitted when cases ran in >= 2 processes each
    margin: float = math.nan  # the equivalence margin `same` was tested against
    host_moves: list[HostMove] = field(default_factory=list)  # the runs' host probes

    def host_line(self) -> str:
        """The host probes side by side; what a move of the host did to the verdicts."""
        if not self.host_moves:
            return ""
        moved = [m for m in self.host_moves if m.moved]
        text = "host probes, per hop: " + "; ".join(m.text() for m in self.host_moves)
        if not moved:
            return text + ": the host held still (no probe's interval excludes 1)"
        return (text + f". The host itself moved ({', '.join(m.probe for m in moved)}): a case "
                "is slower or faster only beyond that move (the memory probe for the cases "
                "that reach memory, the llc probe for those living in the LLC, the core probe "
                "for all)")

    @property
    def regressions(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == "slower"]

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.cases) for v in VERDICT_ORDER}

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def summary(self) -> str:
        counts = self.counts()
        text = ", ".join(f"{n} {v}" for v, n in counts.items())
        history = (f", per-case spread of {self.history_runs} past baselines"
                   if self.history_runs else "")
        others = self.n_compared - (self.process_model.cases if self.process_model else 0)
        noise = (f"run-to-run noise {self.run_noise:.1%}" if others >= MIN_CASES_FOR_RUN_NOISE
                 else f"run-to-run noise unknown with under {MIN_CASES_FOR_RUN_NOISE} cases")
        if self.process_model is not None:
            noise = self.process_model.describe() + (
                f"; {noise} for the other {others} cases" if others else "")
        same = (f"; same = within ±{self.margin:.1%} by two one-sided tests at "
                f"{EQUIV_ALPHA:g} (margin: the change a lone `slower` needs in a case of typical "
                f"noise, at least the threshold, at most {EQUIV_MARGIN_CAP:.0%})"
                if math.isfinite(self.margin) else "")
        return (f"{text} (threshold {self.threshold:.1%}, alpha {self.alpha:g} over "
                f"{self.n_compared} cases, {noise}{history}{same})")

    @property
    def n_compared(self) -> int:
        return sum(c.verdict in ("slower", "faster", "ambiguous", "same") for c in self.cases)

    def sorted_cases(self) -> list[CaseComparison]:
        return sorted(self.cases, key=lambda c: VERDICT_ORDER.index(c.verdict))

    def to_dict(self) -> dict:
        return {"base": self.base, "candidate": self.candidate, "threshold": self.threshold,
                "alpha": self.alpha, "run_noise": self.run_noise, "confidence": self.confidence,
                "host_note": self.host_note, "history_runs": self.history_runs,
                "equivalence": {"margin": self.margin, "alpha": EQUIV_ALPHA,
                                "cap": EQUIV_MARGIN_CAP},
                "summary": self.summary(),
                "process_model": asdict(self.process_model) if self.process_model else None,
                "host_probes": [asdict(m) for m in self.host_moves],
                "counts": self.counts(),
                "regression": bool(self.regressions),
                "cases": [c.to_dict() for c in self.sorted_cases()]}


# ---------------------------------------------------------------- hosts


def _identity(meta: dict) -> dict | None:
    """hwprobe.hardware_identity less what a bench import's inventory lacks (CPU count, CXL
    flags), with the TSC: what two runs whose host ids differ are compared by."""
    from nearlocal.hwprobe import hardware_identity

    inventory = meta.get("inventory") or {}
    if not inventory.get("cpu"):
        return None
    exact = hardware_identity(inventory)
    return {
        "cpu": exact["cpu"],
        "tsc_hz": float(inventory.get("tsc_hz") or 0.0),
        "numa": [(node, cpus) for node, cpus, _ in exact["numa"]],
        "gpus": exact["gpus"],
    }


def host_id(meta: dict) -> str | None:
    return meta.get("host_id") or (meta.get("inventory") or {}).get("host_id")


def host_differences(base: dict, cand: dict) -> list[str]:
    """What makes two runs' hardware differ (empty: same hardware). host_id is exact, but on a VM
    the memory size balloons and a calibrated TSC drifts, so inventories are compared instead: CPU
    model, TSC within 0.5%, NUMA nodes and their CPUs, GPUs; memory sizes are left out."""
    if host_id(base) and host_id(base) == host_id(cand):
        return []
    a, b = _identity(base), _identity(cand)
    if a is None or b is None:
        return [f"host id {host_id(base)} vs {host_id(cand)} (no inventory to compare)"]
    found = []
    if a["cpu"] != b["cpu"]:
        found.append(f"CPU {a['cpu']} vs {b['cpu']}")
    if not a["tsc_hz"] or abs(a["tsc_hz"] - b["tsc_hz"]) > 0.005 * a["tsc_hz"]:
        found.append(f"TSC {a['tsc_hz'] / 1e6:.0f} vs {b['tsc_hz'] / 1e6:.0f} MHz")
    if a["numa"] != b["numa"]:
        found.append(f"NUMA nodes (node, CPUs) {a['numa']} vs {b['numa']}")
    if a["gpus"] != b["gpus"]:
        found.append(f"GPUs {a['gpus']} vs {b['gpus']}")
    return found


# ---------------------------------------------------------------- statistics


def bootstrap_medians(values: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Draws from the bootstrap distribution of the sample median, one per uniform.

    A resample's m-th smallest value is <= x_(k) exactly when at least m of its n draws are,
    a Binomial(n, k/n) event, so the bootstrap distribution is known exactly and is sampled by
    inverting it: O(n) per case instead of resampling n values B times. For even n the two middle
    order statistics are drawn with the same uniform and averaged, as np.median does."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    k = np.arange(1, n + 1)

    def draw(m: int) -> np.ndarray:
        cdf = scipy_stats.binom.sf(m - 1, n, k / n)
        return x[np.minimum(np.searchsorted(cdf, uniforms, side="left"), n - 1)]

    if n % 2:
        return draw((n + 1) // 2)
    return (draw(n // 2) + draw(n // 2 + 1)) / 2


def _samples_by_case(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per case: the samples' ns and the worker process that took each (0 in older runs)."""
    samples = run.samples
    if samples.empty:
        return {}
    return {str(cid): (group["ns"].to_numpy(dtype=np.float64),
                       group["process"].to_numpy(dtype=np.int64))
            for cid, group in samples.groupby("case_id", sort=False)}


def _process_log_medians(ns: np.ndarray, process: np.ndarray) -> np.ndarray | None:
    """The log median of each process's samples; None with fewer than 2 processes or a median
    at or below 0 (below the clock's resolution after the overhead correction)."""
    tags = np.unique(process)
    if tags.size < MIN_PROCESSES:
        return None
    medians = np.array([np.median(ns[process == tag]) for tag in tags])
    return np.log(medians) if np.all(medians > 0) else None


def _ok_rows(run: RunData) -> dict[str, dict]:
    return {str(r["case_id"]): r for r in run.cases.to_dict("records") if r.get("status") == "ok"}


def _number(row: dict, column: str) -> float:
    """A numeric column of a case row; NaN when the row lacks it (older or imported runs)."""
    value = row.get(column)
    return float(value) if value is not None and pd.notna(value) else math.nan


def _ops(row: dict) -> int:
    """Operations one sample's ns is divided by (the row's column; older rows: see schema)."""
    info = row.get("info")
    return ops_per_sample(row.get("ops_per_sample"), info if isinstance(info, dict) else {})


def _measure_case(case_id: str, base_row: dict, cand_row: dict,
                  base: tuple[np.ndarray, np.ndarray] | None,
                  cand: tuple[np.ndarray, np.ndarray] | None,
                  rng: np.random.Generator) -> CaseComparison:
    result = CaseComparison(case_id, "ambiguous", method=str(cand_row.get("method", "")),
                            base_median_ns=float(base_row.get("median_ns", math.nan)),
                            cand_median_ns=float(cand_row.get("median_ns", math.nan)))
    base_ns, base_proc = base if base is not None else (None, None)
    cand_ns, cand_proc = cand if cand is not None else (None, None)
    if base_ns is None or cand_ns is None or base_ns.size < 2 or cand_ns.size < 2:
        if result.base_median_ns > 0:
            result.ratio = result.cand_median_ns / result.base_median_ns
        result.note = "no raw samples in one run (pytest-benchmark file saved without " \
                      "--benchmark-save-data?): ratio only"
        return result
    # the clock terms are per timed interval; a figure divided by its operations (a chase's
    # hops, an RPC batch) carries them divided by the same count
    ops_b, ops_c = (_ops(row) for row in (base_row, cand_row))
    overhead_b, overhead_c = (_number(row, "timer_overhead_ns") / ops
                              for row, ops in ((base_row, ops_b), (cand_row, ops_c)))
    if math.isfinite(overhead_b) and math.isfinite(overhead_c):
        common = min(overhead_b, overhead_c)
        base_ns, cand_ns = base_ns + (overhead_b - common), cand_ns + (overhead_c - common)
        result._resolution_ns = common  # no clock step stated (older rows): the overhead
    steps = [_number(row, "clock_resolution_ns") / ops
             for row, ops in ((base_row, ops_b), (cand_row, ops_c))]
    if all(math.isfinite(step) for step in steps):
        # the runs share one overhead correction, so it moves neither figure against the
        # other: what a median cannot resolve is the clock's step
        result._step_ns = result._resolution_ns = max(steps)
    result.n_base, result.n_cand = int(base_ns.size), int(cand_ns.size)
    result._unsettled = " and ".join(
        name for name, row in (("base", base_row), ("candidate", cand_row))
        if row.get("converged") is not None and pd.notna(row.get("converged"))
        and not bool(row.get("converged")))
    result.base_median_ns, result.cand_median_ns = float(np.median(base_ns)), float(np.median(cand_ns))
    if result.base_median_ns <= 0 or result.cand_median_ns <= 0:
        result.note = "a median is 0 after the timer-overhead correction: below the clock's resolution"
        return result
    result.ratio = result.cand_median_ns / result.base_median_ns
    result._proc_base = _process_log_medians(base_ns, base_proc)
    result._proc_cand = _process_log_medians(cand_ns, cand_proc)
    if result._proc_base is not None and result._proc_cand is not None:
        return result  # judged by the process model (judge_by_processes)
    result._proc_base = result._proc_cand = None
    floor = 1e-3  # ns: keeps a resampled zero median from giving an infinite log
    draws = (np.log(np.maximum(bootstrap_medians(cand_ns, rng.random(N_BOOTSTRAP)), floor))
             - np.log(np.maximum(bootstrap_medians(base_ns, rng.random(N_BOOTSTRAP)), floor)))
    result._log_ratio = math.log(result.ratio)
    result._log_se = float(np.std(draws, ddof=1))
    if np.ptp(np.concatenate([base_ns, cand_ns])) == 0:
        result._p_raw = 1.0
    else:
        result._p_raw = float(scipy_stats.mannwhitneyu(base_ns, cand_ns,
                                                       alternative="two-sided").pvalue)
    return result


def _clock_note(c: CaseComparison) -> str:
    """Why a case within a few clock steps is not judged: how many it spans."""
    spans = min(c.base_median_ns, c.cand_median_ns) / c._resolution_ns
    return f"the figure spans {spans:.1f} clock steps of {c._resolution_ns:.3g} ns"


def _resolution_bounds(c: CaseComparison) -> tuple[float, float]:
    """Log ratio bounds when each median may be off by the clock's resolution (see the module's
    docstring): a change of a few resolutions is not told from noise."""
    q = c._resolution_ns if math.isfinite(c._resolution_ns) else 0.0
    mb, mc = c.base_median_ns, c.cand_median_ns
    low = math.log((mc - q) / (mb + q)) if mc > q else -math.inf
    high = math.log((mc + q) / (mb - q)) if mb > q else math.inf
    return low, high


def run_noise(log_ratios: list[float]) -> float:
    """Sigma of the run-to-run change of one case's log ratio, from the scaled MAD of differences
    between consecutive cases (in the run's order: method, then size) divided by sqrt(2). A change
    shared by a group of cases, which is what a real regression looks like, moves neighbours
    together and so is not counted as noise; only the case-to-case scatter is."""
    values = np.asarray([v for v in log_ratios if math.isfinite(v)])
    if values.size < MIN_CASES_FOR_RUN_NOISE:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(np.diff(values))) / math.sqrt(2))


@dataclass
class ProcessModel:
    """The noise model fitted on the runs' own repeats: how much a case's median moves from one
    worker process to the next (page placement and co-tenants are drawn again in each).

    Each case's variance of log process medians is pooled over both runs and shrunk toward a prior
    fitted across cases (empirical Bayes, limma's fitFDist: prior variance `noise`**2 with
    `prior_df` degrees of freedom), so a case with 5 processes is neither trusted alone nor
    drowned by its noisy neighbours. `excess` is run-to-run noise that no process shows (load
    that changed between the runs, not within them), added in quadrature to every case: the
    smallest sigma with which neighbouring cases' differences, which a shared change (a uniform
    slowdown, every size of one method) cancels, scatter no more than the model says. A process
    spread that understates the run-to-run noise so widens every interval instead of crying wolf."""

    cases: int
    noise: float  # prior sigma of one process's log median
    prior_df: float
    excess: float  # sigma of a log ratio's run-to-run noise beyond the processes' spread
    selected: int  # cases beyond the threshold at the Benjamini-Hochberg level
    confidence: float  # of each judged case's interval (false coverage-rate adjusted)
    paired: bool = False  # the runs took turns: process k of each paired with process k

    def describe(self) -> str:
        prior = "inf" if math.isinf(self.prior_df) else f"{self.prior_df:.1f}"
        what = "paired process model (the runs took turns)" if self.paired else "process model"
        noise = "pair" if self.paired else "between-process"
        return (f"{what} on {self.cases} cases: {noise} noise {self.noise:.1%} "
                f"(prior df {prior}), excess run noise {self.excess:.1%}, "
                f"intervals at {self.confidence:.2%}")


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0), by Newton's method on 1/trigamma as limma does."""
    from scipy.special import polygamma

    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = float(polygamma(1, x))
        step = tri * (1 - tri / y) / float(polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


def fit_variance_prior(s2: np.ndarray, df: np.ndarray) -> tuple[float, float]:
    """(prior variance, prior df) of per-case variances s2 on df degrees of freedom, by moments of
    log s2 (Smyth 2004, limma's fitFDist). Zero variances (every process median equal, as on a
    coarse clock) are left out; df is infinite when the cases' variances scatter no more than
    sampling alone would make them, and capped at MAX_PRIOR_DF."""
    from scipy.special import digamma, polygamma

    keep = s2 > TINY_VARIANCE
    s2, df = s2[keep], df[keep]
    if s2.size < MIN_CASES_FOR_PRIOR:
        return (float(np.median(s2)) if s2.size else 0.0), 0.0
    e = np.log(s2) - digamma(df / 2) + np.log(df / 2)
    emean = float(e.mean())
    evar = float(e.var(ddof=1) - np.mean(polygamma(1, df / 2)))
    prior_df = 2 * _trigamma_inverse(evar) if evar > 0 else math.inf
    prior_df = min(prior_df, MAX_PRIOR_DF)
    return float(math.exp(emean + digamma(prior_df / 2) - math.log(prior_df / 2))), prior_df


def benjamini_hochberg(p: np.ndarray, family: int) -> np.ndarray:
    """BH-adjusted p-values of p within a family of `family` >= p.size tests (the rest count as
    tests that were not rejected)."""
    order = np.argsort(p)
    ranked = p[order] * family / np.arange(1, p.size + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def judge_by_processes(cases: list[CaseComparison], family: int, threshold: float, alpha: float,
                       history: dict[str, float], paired: bool = False) -> ProcessModel:
    """Verdicts for cases whose runs both have >= 2 worker processes (see ProcessModel).

    Per case the estimate is the ratio of the trimmed geometric means of the process medians
    (trimmed_location), or with `paired` (the runs took turns) the trimmed mean of the pairs'
    log ratios (_paired_terms); its standard error comes from their moderated pooled variance
    (the pairs' variance), with the
    excess run noise added, and is at least the spread of past baselines. A case's p-value tests
    "beyond the threshold" (the ratio outside [1/(1+t), 1+t], each median allowed to be off by
    the clock's resolution); the Benjamini-Hochberg procedure over the `family` compared cases
    selects, which keeps the chance of any false `slower` at alpha when the code did not change
    (every case null) while a change shared by many cases needs less evidence per case.
    Intervals are the matching false coverage-rate adjusted ones (Benjamini-Yekutieli 2005):
    level 1 - R alpha / family for R
selected, so a case is `slower` exactly when selected with its whole interval above 1+t."""
    hi = math.log1p(threshold)
    base = [trimmed_location(c._proc_base) for c in cases]
    cand = [trimmed_location(c._proc_cand) for c in cases]
    for c, (mean_b, _, _), (mean_c, _, _) in zip(cases, base, cand, strict=True):
        c.base_median_ns, c.cand_median_ns = float(math.exp(mean_b)), float(math.exp(mean_c))
        c.ratio = c.cand_median_ns / c.base_median_ns
        c.processes = f"{c._proc_base.size}/{c._proc_cand.size}"
    if paired:
        logs, s2, df, scale = _paired_terms(cases)
    else:
        logs = np.array([math.log(c.ratio) for c in cases])
        # Yuen's trimmed two-sample model: each run counts h processes (those left after
        # trimming), its per-process variance the Winsorized one scaled so that s2 / h is its
        # trimmed mean's
        kb = np.array([h for _, _, h in base], dtype=float)
        kc = np.array([h for _, _, h in cand], dtype=float)
        df = kb + kc - 2
        s2 = np.array([((hb - 1) * vb + (hc - 1) * vc)
                       for (_, vb, hb), (_, vc, hc) in zip(base, cand, strict=True)]) / df
        scale = 1 / kb + 1 / kc
    coarse = np.array([_coarse_clock(c) for c in cases])
    # the fit learns from cases the clock resolves: a coarse clock's steps are no placement noise
    prior_s2, prior_df = fit_variance_prior(np.where(coarse, 0.0, s2), df)
    if math.isinf(prior_df):
        post_s2, post_df = np.full_like(s2, prior_s2), np.full_like(s2, 1e6)
    else:
        post_s2, post_df = (prior_df * prior_s2 + df * s2) / (prior_df + df), prior_df + df
    se = np.sqrt(post_s2 * scale)
    excess = _excess_noise(logs, se, coarse, float(np.median(post_df)))
    sd = np.maximum(np.hypot(se, excess),
                    [math.sqrt(2) * history.get(c.case_id, 0.0) for c in cases])
    bounds = np.array([_resolution_bounds(c) for c in cases])
    with np.errstate(divide="ignore", invalid="ignore"):
        slow = np.where(sd > 0, scipy_stats.t.sf((bounds[:, 0] - hi) / sd, post_df),
                        (bounds[:, 0] <= hi).astype(float))
        fast = np.where(sd > 0, scipy_stats.t.sf((-hi - bounds[:, 1]) / sd, post_df),
                        (bounds[:, 1] >= -hi).astype(float))
    p = np.minimum(1.0, 2 * np.minimum(slow, fast))
    adjusted = benjamini_hochberg(p, family)
    selected = int(np.sum(adjusted <= alpha))
    level = max(selected, 1) * alpha / family
    quantile = scipy_stats.t.isf(level / 2, post_df)
    for i, c in enumerate(cases):
        c._equiv_sd, c._equiv_df = float(sd[i]), float(post_df[i])
        c.ci_low = math.exp(bounds[i, 0] - quantile[i] * sd[i])
        c.ci_high = math.exp(bounds[i, 1] + quantile[i] * sd[i])
        c.p_value = float(adjusted[i])
        if c.ci_low > 1 + threshold:
            c.verdict = "slower"
        elif c.ci_high < 1 / (1 + threshold):
            c.verdict = "faster"
        elif c.ci_low >= 1 / (1 + threshold) and c.ci_high <= 1 + threshold:
            c.verdict = "same"
        else:
            c.verdict = "ambiguous"
            spread = math.sqrt(post_s2[i])
            what = "the pairs' ratios" if paired else "process medians"
            if coarse[i]:
                c.note = c.note or _clock_note(c)
            elif _past_process_option(c):
                c.note = c.note or (f"the interval straddles the threshold ({what} spread "
                                    f"{spread:.1%} over {c.processes} processes, at least the "
                                    "most --processes gives: between runs this box cannot "
                                    "judge it at the threshold)")
            else:
                c.note = c.note or (f"the interval straddles the threshold ({what} spread "
                                    f"{spread:.1%}: more --processes narrow it)")
    return ProcessModel(len(cases), math.sqrt(prior_s2), prior_df, excess, selected,
                        1 - level, paired)


def _paired_terms(cases: list[CaseComparison]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                         np.ndarray]:
    """Runs that took turns (run --take-turns): process k of a case in one run and process k in
    the other were measured in the same round, seconds apart, so each pair shares the host's
    state then (its L3 and memory, co-tenants), which moved by 1.1-1.5x between runs on the
    shared VM. Per case the log ratio is the trimmed mean of the pairs' differences of log
    medians (Yuen's one-sample trimmed mean, over the processes both runs have); its variance
    the differences' Winsorized one. The candidate's figure is the base's times that ratio (the
    clock-resolution bounds and the equivalence test read the two figures). Returns (log
    ratios, per-pair variances, degrees of freedom, 1 / h) as the two-sample model's terms."""
    logs, s2, df, scale = [], [], [], []
    for c in cases:
        n = min(c._proc_base.size, c._proc_cand.size)
        mean, variance, h = trimmed_location(c._proc_cand[:n] - c._proc_base[:n])
        c.ratio = math.exp(mean)
        c.cand_median_ns = c.base_median_ns * c.ratio
        c.processes = f"{c._proc_base.size}/{c._proc_cand.size} ({n} paired)"
        logs.append(mean)
        s2.append(variance)
        df.append(h - 1)
        scale.append(1 / h)
    return np.array(logs), np.array(s2), np.array(df, dtype=float), np.array(scale)


def _past_process_option(c: CaseComparison) -> bool:
    """Both runs gave the case at least the most processes --processes can ask for (settling
    gives up to 128 to a case whose processes disagree): more are not to be had. The 4 MiB
    chase on the 2-vCPU VM gets there: its processes split between its ring held in the shared
    L3 (16-30 ns a hop) and not (80-150 ns), in a share that moved from ~30 % to ~65 % between
    two unchanged runs."""
    from nearlocal.harness.plan import MAX_PROCESSES

    return c._proc_base is not None and c._proc_cand is not None \
        and min(c._proc_base.size, c._proc_cand.size) >= MAX_PROCESSES


def trimmed_location(log_medians: np.ndarray) -> tuple[float, float, int]:
    """(PROCESS_TRIM-trimmed mean, per-process variance, h) of a run's log process medians:
    Yuen's estimator. A process drawn on a host that was busy for its few seconds reads 1.3-3x
    slower (seen on the 2-vCPU VM: one of 16 store 16 KiB processes at 600 ns, the rest
    183-247); the trimmed mean is not moved by such a process, and its standard error is
    sqrt(variance / h), the variance the Winsorized one times (n - 1) / (h - 1)."""
    x = np.sort(log_medians)
    n = x.size
    g = math.floor(PROCESS_TRIM * n)
    h = n - 2 * g
    if h < 2:
        g, h = 0, n
    mean = float(x[g:n - g].mean())
    winsorized = np.clip(x, x[g], x[n - g - 1])
    variance = float(np.sum((winsorized - winsorized.mean()) ** 2) / (h - 1))
    return mean, variance, h


def _excess_noise(logs: np.ndarray, se: np.ndarray, coarse: np.ndarray, df: float) -> float:
    """The sigma tau of run noise beyond the processes' spread: the smallest with which the
    differences of neighbouring cases' log ratios (in the run's order), each over
    sqrt(se_i^2 + se_j^2 + 2 tau^2), have the median absolute value of a t variate. 0 when they
    scatter no more than a 99% bound on that median's chance excess (the median of a few dozen
    |t| values is itself noisy; inflated by EXCESS_DEPENDENCE for overlapping pairs), or with
    fewer than MIN_CASES_FOR_RUN_NOISE pairs."""
    usable = (~coarse[:-1]) & (~coarse[1:])
    if usable.sum() < MIN_CASES_FOR_RUN_NOISE:
        return 0.0
    diffs = np.abs(np.diff(logs))[usable]
    spread2 = (se[:-1] ** 2 + se[1:] ** 2)[usable]
    typical = float(scipy_stats.t.ppf(0.75, df))
    # the sample median's standard error, 1 / (2 f sqrt(n)), f the density of |t| at its median
    median_se = EXCESS_DEPENDENCE / (4 * float(scipy_stats.t.pdf(typical, df)) * math.sqrt(diffs.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        observed = float(np.median(np.nan_to_num(diffs / np.sqrt(spread2), nan=0.0, posinf=1e9)))
    if observed <= typical + float(scipy_stats.norm.isf(0.01)) * median_se:
        return 0.0

    def excess_scatter(tau: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.median(np.nan_to_num(diffs / np.sqrt(spread2 + 2 * tau**2),
                                                 nan=0.0, posinf=1e9))) - typical

    high = float(diffs.max()) + 1e-12
    while excess_scatter(high) > 0:  # the root can lie past the largest difference when the
        high *= 2  # t quantile is below 1/sqrt(2) and most differences are near the largest
    return float(scipy_optimize.brentq(excess_scatter, 0.0, high, xtol=1e-6))


def _coarse_clock(c: CaseComparison) -> bool:
    """A median within COARSE_STEPS of the clock's resolution: a change of a step or two is
    not told."""
    return math.isfinite(c._resolution_ns) and c._resolution_ns * COARSE_STEPS > min(
        c.base_median_ns, c.cand_median_ns)


def history_noise(root: Path, cand: RunData, limit: int = HISTORY_RUNS) -> tuple[dict[str, float], int]:
    """Per case, the SD of the log median over the runs that have been this hardware's baseline
    (`nearlocal baseline set`, known-good code; the candidate excluded): what one process-wide
    draw of page placement, huge pages and co-tenants does to that case, which no single run can
    show. Cases with fewer than MIN_HISTORY such runs get none. Returns ({case_id: sd}, runs used)."""
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
        except UsageError:
            continue  # a baseline run deleted from the store
        if run.path.resolve() == cand.path.resolve() or host_differences(run.meta, cand.meta):
            continue
        used += 1
        rows = run.cases[(run.cases["status"] == "ok") & (run.cases["median_ns"] > 0)]
        # the run's own overhead estimate is added back: its drift is not the case's noise
        ops = [_ops(row) for row in rows.to_dict("records")]
        totals = rows["median_ns"] + rows["timer_overhead_ns"].astype(float).fillna(0.0) / ops
        for case_id, total in zip(rows["case_id"], totals, strict=True):
            medians.setdefault(str(case_id), []).append(math.log(total))
    return ({cid: float(np.std(v, ddof=1)) for cid, v in medians.items() if len(v) >= MIN_HISTORY},
            used)


def equivalence_margin(cases: list[CaseComparison], threshold: float, alpha: float,
                       family: int) -> float:
    """The margin within which `same` is claimed: the change the gate resolves in a case of
    typical noise, i.e. the ratio a lone `slower` needs: 1 + threshold times the half-width of
    a case's interval at alpha over the family (the typical, median, standard error of a compared
    case's log ratio); at least the threshold, never more than EQUIV_MARGIN_CAP. So `same` says
    "smaller than what this pair of runs would have caught", `slower` "beyond the threshold", and
    between the two the runs cannot tell (`ambiguous`)."""
    errors = [c._equiv_sd for c in cases if math.isfinite(c._equiv_sd)]
    typical = float(np.median(errors)) if errors else 0.0
    reach = float(scipy_stats.norm.isf(alpha / max(family, 1) / 2)) * typical
    return float(min(EQUIV_MARGIN_CAP, max(threshold, (1 + threshold) * math.exp(reach) - 1)))


def judge_equivalence(cases: list[CaseComparison], threshold: float, alpha: float,
                      family: int) -> float:
    """Two one-sided tests (TOST, each at EQUIV_ALPHA) of "the ratio lies within 1 +- margin":
    an undecided case whose whole (1 - 2 EQUIV_ALPHA) interval, widened by half a clock step on
    each median (a median of readings on a stepped clock may sit anywhere within its step), lies
    inside the margin reads `same`. The timer overhead is not a term here: both runs are put on
    the same overhead correction, so it cannot make their figures differ. Returns the margin."""
    margin = equivalence_margin(cases, threshold, alpha, family)
    limit = math.log1p(margin)
    for c in cases:
        if c.verdict not in ("ambiguous", "same") or not math.isfinite(c._equiv_sd) \
                or not (c.base_median_ns > 0 and c.cand_median_ns > 0):
            continue
        half_step = c._step_ns / 2
        mb, mc = c.base_median_ns, c.cand_median_ns
        low = math.log((mc - half_step) / (mb + half_step)) if mc > half_step else -math.inf
        high = math.log((mc + half_step) / (mb - half_step)) if mb > half_step else math.inf
        reach = float(scipy_stats.t.isf(EQUIV_ALPHA, c._equiv_df)) * c._equiv_sd
        if -limit < low - reach and high + reach < limit:
            c.verdict, c.note = "same", ""
        elif c.verdict == "ambiguous" and not c.note.startswith("not converged"):
            c.note = (c.note + "; " if c.note else "") + (
                f"not shown within ±{margin:.1%}: [{math.exp(low - reach):.3f}, "
                f"{math.exp(high + reach):.3f}] at {1 - 2 * EQUIV_ALPHA:.0%}")
    return margin


def compare_runs(base: RunData, cand: RunData, threshold: float = DEFAULT_THRESHOLD,
                 alpha: float = DEFAULT_ALPHA, seed: int = 0, host_note: str = "",
                 history: dict[str, float] | None = None, history_runs: int = 0) -> Comparison:
    """history: per case, the SD of one run's log median between runs (see history_noise)."""
    if not 0 < threshold < 10:
        raise UsageError(f"--threshold must be a positive percentage below 1000%, got {threshold:.1%}")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must lie between 0 and 1, got {alpha}")
    rng = np.random.default_rng(seed)
    base_ok, cand_ok = _ok_rows(base), _ok_rows(cand)
    base_samples, cand_samples = _samples_by_case(base), _samples_by_case(cand)
    cand_all = {str(r["case_id"]): r for r in cand.cases.to_dict("records")}
    base_all = {str(r["case_id"]): r for r in base.cases.to_dict("records")}
    cases: list[CaseComparison] = []
    for case_id, row in base_ok.items():
        if case_id in cand_ok:
            cases.append(_measure_case(case_id, row, cand_ok[case_id], base_samples.get(case_id),
                                       cand_samples.get(case_id), rng))
        else:
            other = cand_all.get(case_id)
            why = f"{other['status']} in the candidate: {other['reason']}" if other else \
                "not in the candidate run"
            cases.append(CaseComparison(case_id, "missing", method=str(row.get("method", "")),
                                        base_median_ns=float(row["median_ns"]), note=why))
    for case_id, row in cand_ok.items():
        if case_id not in base_ok:
            other = base_all.get(case_id)
            why = f"{other['status']} in the base: {other['reason']}" if other else "not in the base run"
            cases.append(CaseComparison(case_id, "new", method=str(row.get("method", "")),
                                        cand_median_ns=float(row["median_ns"]), note=why))

    by_processes = [c for c in cases if c._proc_base is not None]
    tested = [c for c in cases if math.isfinite(c._log_se) or c._proc_base is not None]
    per_case_alpha = alpha / max(len(tested), 1)
    history = history or {}
    from nearlocal.harness.turns import same_group

    model = judge_by_processes(by_processes, len(tested), threshold, alpha, history,
                               paired=same_group(base.meta, cand.meta)) if by_processes else None
    # cases from single-process runs: the whole-run noise model below, Bonferroni over the family
    tested = [c for c in tested if c._proc_base is None]
    tau = run_noise([c._log_ratio for c in tested])
    noise_known = len([c for c in tested if math.isfinite(c._log_ratio)]) >= MIN_CASES_FOR_RUN_NOISE
    z = float(scipy_stats.norm.isf(per_case_alpha / 2))
    # run-to-run changes have heavy tails (a Student t fits them): its quantile, on the MAD scale
    tail = float(scipy_stats.t.isf(per_case_alpha / 2, RUN_NOISE_DOF)
                 * scipy_stats.norm.isf(0.25) / scipy_stats.t.isf(0.25, RUN_NOISE_DOF))
    high_bound, low_bound = 1 + threshold, 1 / (1 + threshold)
    for c in tested:
        # a ratio spans 2 runs, hence sqrt(2) times one run's spread
        between = max(tail * tau, z * math.sqrt(2) * history.get(c.case_id, 0.0))
        half = math.hypot(z * c._log_se, between)
        c._equiv_sd = math.hypot(c._log_se, max(tau, math.sqrt(2) * history.get(c.case_id, 0.0))) \
            if noise_known else math.nan  # nothing is shown the same by an unknown noise
        c._equiv_df = RUN_NOISE_DOF if tau > 0 else math.inf
        low, high = _resolution_bounds(c)
        c.ci_low, c.ci_high = math.exp(low - half), math.exp(high + half)
        c.p_value = min(1.0, c._p_raw * len(tested))
        significant = c.p_value < alpha
        if (c.ci_low > high_bound or c.ci_high < low_bound) and significant and not noise_known:
            c.verdict = "ambiguous"
            c.note = (f"run-to-run noise unknown with under {MIN_CASES_FOR_RUN_NOISE} cases of "
                      "one process each: a change is not told from a rerun")
        elif (c.ci_low > high_bound or c.ci_high < low_bound) and significant and c._unsettled:
            c.verdict = "ambiguous"
            c.note = f"not converged in the {c._unsettled}: re-run with a larger --budget"
        elif c.ci_low > high_bound and significant:
            c.verdict = "slower"
        elif c.ci_high < low_bound and significant:
            c.verdict = "faster"
        elif c.ci_low >= low_bound and c.ci_high <= high_bound:
            c.verdict = "same"
        else:
            c.verdict = "ambiguous"
            if _coarse_clock(c):
                c.note = c.note or _clock_note(c)
            elif c._unsettled:
                c.note = c.note or f"not converged in the {c._unsettled}"
            elif not significant:
                c.note = c.note or f"not significant (p >= {alpha:g})"
            else:
                c.note = c.note or "the interval straddles the threshold"
    margin = judge_equivalence(cases, threshold, alpha,
                               sum(math.isfinite(c._equiv_sd) for c in cases))
    moves = host_moves(base.meta, cand.meta, alpha)
    judge_host_moves(cases, moves, threshold, per_case_alpha, base_ok, cand_ok)
    return Comparison(base.run_id, cand.run_id, threshold, alpha, tau, 1 - per_case_alpha,
                      host_note, cases, history_runs if history else 0, model, margin, moves)


def _probe_log_medians(meta: dict, probe: str) -> np.ndarray:
    """The log median of each reading of `probe` in ns per hop (its facts turn raw ticks into
    that; runs stored before raw ticks were kept hold ns per hop)."""
    from nearlocal.harness.hostprobe import per_hop_ns

    probes = meta.get("host_probe") or {}
    fact = (probes.get("probes") or {}).get(probe) or {}
    medians = [float(np.median(per_hop_ns(fact, entry[probe])))
               for entry in probes.get("passes") or []
               if isinstance(entry, dict) and entry.get(probe)]
    return np.log([m for m in medians if m > 0])


def host_moves(base_meta: dict, cand_meta: dict, alpha: float) -> list[HostMove]:
    """Each host probe both runs walked in >= MIN_PROCESSES processes: the ratio of the trimmed
    geometric means of its per-process medians (as a case's, trimmed_location) and its interval
    at 1 - alpha (Yuen's t). Runs made before the probes, or in one process, have none; a probe
    whose ring or walk differs between the runs (another plan's memory span) is another
    yardstick, not set side by side."""
    facts = (cand_meta.get("host_probe") or {}).get("probes") or {}
    base_facts = (base_meta.get("host_probe") or {}).get("probes") or {}
    moves = []
    for probe, fact in facts.items():
        if any(fact.get(key) != base_facts.get(probe, {}).get(key) for key in ("ring_bytes", "hops")):
            continue
        logs_b, logs_c = _probe_log_medians(base_meta, probe), _probe_log_medians(cand_meta, probe)
        if min(logs_b.size, logs_c.size) < MIN_PROCESSES:
            continue
        (mean_b, var_b, h_b), (mean_c, var_c, h_c) = trimmed_location(logs_b), \
            trimmed_location(logs_c)
        se = math.sqrt(var_b / h_b + var_c / h_c)
        reach = float(scipy_stats.t.isf(alpha / 2, max(h_b + h_c - 2, 1))) * se
        log_ratio = mean_c - mean_b
        low, high = math.exp(log_ratio - reach), math.exp(log_ratio + reach)
        moves.append(HostMove(probe, str(fact.get("bounds", "all")), math.exp(mean_b),
                              math.exp(mean_c), math.exp(log_ratio), low, high,
                              f"{logs_b.size}/{logs_c.size}", se, low > 1 or high < 1))
    return moves


def _reaches_memory(row: dict | None) -> bool:
    """A row's `reaches_memory`; a row stored before the column: taken as reaching memory."""
    value = None if row is None else row.get("reaches_memory")
    return True if value is None or value != value else bool(value)


def _llc_resident(row: dict | None) -> bool:
    """A row's `llc_resident`; a row stored before the column: taken as not."""
    value = None if row is None else row.get("llc_resident")
    return False if value is None or value != value else bool(value)


def _yardsticks(moves: list[HostMove], base_row: dict | None,
                cand_row: dict | None) -> list[HostMove]:
    """The probes a case is judged against: the core probe's for every case, the memory probe's
    too for one that reaches memory in either run, the LLC probe's for one that lives in the
    LLC in either run (and reaches memory in neither)."""
    memory = _reaches_memory(base_row) or _reaches_memory(cand_row)
    llc = not memory and (_llc_resident(base_row) or _llc_resident(cand_row))
    return [m for m in moves
            if m.bounds == "all" or (memory and m.bounds == "memory") or (llc and m.bounds == "llc")]


def _beyond_move(c: CaseComparison, move: HostMove, threshold: float, z: float) -> bool:
    """Whether the case moved beyond the threshold relative to the host's move, at the case's
    own confidence: log(case ratio / probe ratio), less the case's half-interval on that side
    and z probe standard errors in quadrature, beyond log(1 + threshold)."""
    if c.verdict == "slower":
        shift, half = math.log(c.ratio / move.ratio), math.log(c.ratio / c.ci_low)
    else:
        shift, half = math.log(move.ratio / c.ratio), math.log(c.ci_high / c.ratio)
    if not math.isfinite(half):
        return False
    return shift - math.hypot(half, z * move.log_se) > math.log1p(threshold)


def judge_host_moves(cases: list[CaseComparison], moves: list[HostMove], threshold: float,
                     case_alpha: float, base_rows: dict[str, dict],
                     cand_rows: dict[str, dict]) -> None:
    """A case the model called slower (faster) stays so only if it moved beyond the threshold
    relative to the host's own upward (downward) move (_beyond_move; `case_alpha`: the level
    of each case's interval), each probe that is its yardstick (_yardsticks). Else `ambiguous`,
    naming the move: on a shared host the box's memory latency moved 1.26x between two runs of
    unchanged code (2026-12-02), and a 1 GiB chase with it. A move never makes a case slower or
    faster, only less certain."""
    moved = [m for m in moves if m.moved]
    if not moved:
        return
    z = float(scipy_stats.norm.isf(case_alpha / 2))
    for c in cases:
        if c.verdict not in ("slower", "faster"):
            continue
        against = [m for m in _yardsticks(moved, base_rows.get(c.case_id), cand_rows.get(c.case_id))
                   if (m.ratio > 1) == (c.verdict == "slower")]
        if any(not _beyond_move(c, m, threshold, z) for m in against):
            c.verdict = "ambiguous"
            c.note = (f"{c.ratio:.2f}x is within the host's own move between the runs: "
                      + "; ".join(m.text() for m in against))


# ---------------------------------------------------------------- output


def _ratio_text(c: CaseComparison) -> tuple[str, str, str]:
    ratio = f"{c.ratio:.3f}x" if math.isfinite(c.ratio) else "-"
    ci = f"[{c.ci_low:.3f}, {c.ci_high:.3f}]".replace("inf", "∞") if not math.isnan(c.ci_low) else "-"
    p = f"{c.p_value:.2g}" if math.isfinite(c.p_value) else "-"
    return ratio, ci, p


CHANGE_VERDICTS = ("slower", "faster")  # what a job summary lists


def _rest_line(result: Comparison, shown: list[CaseComparison]) -> str:
    """One line counting the cases not listed one by one."""
    listed = {id(c) for c in shown}
    rest = [c for c in result.cases if id(c) not in listed]
    if not rest:
        return ""
    counts = {v: sum(c.verdict == v for c in rest) for v in VERDICT_ORDER}
    text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    margin = f" (within ±{result.margin:.1%})" if counts["same"] and math.isfinite(result.margin) \
        else ""
    return f"{len(rest)} more cases not listed: {text}{margin}"


def _listed(result: Comparison, verdicts: tuple[str, ...] | None = None) -> list[CaseComparison]:
    """The cases printed one per line, changed ones first: every verdict but `same`, or only
    `verdicts`."""
    return [c for c in result.sorted_cases()
            if (c.verdict in verdicts if verdicts else c.verdict != "same")]


def render_table(result: Comparison, file=None) -> None:
    """The changed cases as a table, then one line counting the rest. On a terminal a rich
    table; anywhere else (a CI log, a file) the full-width Markdown table that run and show print
    there: one line per case, every case id whole."""
    from rich.console import Console
    from rich.table import Table

    from nearlocal.console import console as stdout_console
    from nearlocal.console import identifier_column, print_table

    colours = {"slower": "red", "faster": "green", "ambiguous": "yellow", "missing": "magenta",
               "new": "cyan", "same": "default"}
    target = Console(file=file, color_system=None, highlight=False) if file else stdout_console
    listed = _listed(result)
    table = Table(title=f"compare {result.base} -> {result.candidate}", title_justify="left")
    table.add_column("verdict", no_wrap=True)
    identifier_column(table, "case", [c.case_id for c in listed])
    for column in ("base", "candidate", "ratio", "CI", "p", "n", "note"):
        table.add_column(column, justify="right" if column in ("base", "candidate", "ratio", "p")
                         else "left", no_wrap=column not in ("note", "n"))
    for c in listed:
        ratio, ci, p = _ratio_text(c)
        verdict = f"[{colours[c.verdict]}]{c.verdict}[/]" if target.is_terminal else c.verdict
        table.add_row(verdict, c.case_id, format_ns(c.base_median_ns),
                      format_ns(c.cand_median_ns), ratio, ci, p,
                      (f"{c.n_base}/{c.n_cand}" + (f" in {c.processes} proc" if c.processes else ""))
                      if c.n_base else "-", c.note)
    if listed:
        print_table(table, target)
    rest = _rest_line(result, listed)
    for line in (rest, result.host_note, result.host_line(), result.summary()):
        if line:
            target.print(line, markup=False, highlight=False, soft_wrap=True)


def render_markdown(result: Comparison, verdicts: tuple[str, ...] | None = None) -> str:
    """Markdown: a head line, the listed cases (changed first; only `verdicts` when given), then
    one line counting the rest."""
    head = "**regression**" if result.regressions else "no regression"
    lines = [f"### nearlocal compare: `{result.base}` → `{result.candidate}`", "",
             f"{head}: " + result.summary(), ""]
    for line in (result.host_note, result.host_line()):
        if line:
            lines += [f"> {line}", ""]
    listed = _listed(result, verdicts)
    if listed:
        lines += ["| verdict | case | base | candidate | ratio | CI | p | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in listed:
            ratio, ci, p = _ratio_text(c)
            lines.append(f"| {c.verdict} | `{c.case_id}` | {format_ns(c.base_median_ns)} | "
                         f"{format_ns(c.cand_median_ns)} | {ratio} | {ci} | {p} | {c.note} |")
        lines.append("")
    rest = _rest_line(result, listed)
    if rest:
        lines += [rest, ""]
    return "\n".join(lines)


def append_job_summary(result: Comparison, path: str) -> None:
    """GitHub Actions' job summary ($GITHUB_STEP_SUMMARY): the regressions and improvements
    only, the rest counted on one line. A summary that cannot be written is said on stderr and
    does not change the verdict."""
    try:
        with open(path, "a") as handle:
            handle.write(render_markdown(result, CHANGE_VERDICTS) + "\n")
    except OSError as exc:
        from nearlocal.console import err_console

        err_console.print(f"GITHUB_STEP_SUMMARY {path}: cannot append the job summary: "
                          f"{exc.strerror}", markup=False)


def render_junit(result: Comparison) -> str:
    counts = result.counts()
    suite = ET.Element("testsuite", name=f"nearlocal compare {result.base} -> {result.candidate}",
                       tests=str(len(result.cases)), failures=str(counts["slower"]), errors="0",
                       skipped=str(counts["missing"] + counts["new"]),
                       timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    for c in result.sorted_cases():
        ratio, ci, p = _ratio_text(c)
        seconds = c.cand_median_ns / 1e9 if math.isfinite(c.cand_median_ns) else 0.0
        case = ET.SubElement(suite, "testcase", classname=f"nearlocal.compare.{c.method or 'case'}",
                             name=c.case_id, time=f"{seconds:.9f}")
        detail = f"{c.verdict}: ratio {ratio} CI {ci} p {p}" + (f"; {c.note}" if c.note else "")
        if c.verdict == "slower":
            ET.SubElement(case, "failure", message=detail, type="regression").text = detail
        elif c.verdict in ("missing", "new"):
            ET.SubElement(case, "skipped", message=detail)
        else:
            ET.SubElement(case, "system-out").text = detail
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_output(result: Comparison, fmt: str, output: str | None) -> None:
    if not output:
        _write_output(result, fmt, None)
        return
    with safeio.writing("--output", output):  # any OSError: one line with the errno
        _write_output(result, fmt, output)


def _write_output(result: Comparison, fmt: str, output: str | None) -> None:
    if fmt == "table":
        if output:
            with open(output, "w") as handle:
                render_table(result, handle)
        else:
            render_table(result)
        return
    text = {"markdown": render_markdown,
            "json": lambda r: json.dumps(r.to_dict(), indent=1) + "\n",
            "junit": render_junit}[fmt](result)
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)


# ---------------------------------------------------------------- baselines


def _baseline_dir(root: Path) -> Path:
    return Path(root) / "baselines"


def _baseline_records(root: Path, damaged: list[str] | None = None) -> list[tuple[Path, dict]]:
    """The valid records; each damaged one (read_baseline says why) is left out and, when
    `damaged` is given, said there: the other hosts' baselines stay usable."""
    folder = _baseline_dir(root)
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
    records = _baseline_records(root)
    exact = [r for r in records if r[1].get("host_id") == host_id(meta)]
    alike = exact or [r for r in records if not host_differences(
        {**r[1].get("meta", {}), "host_id": r[1].get("host_id")}, meta)]
    return max(alike, key=lambda r: r[1].get("set", "")) if alike else None


def set_baseline(ref: str, root: Path, allow_incomplete: bool = False) -> Path:
    """Make a run this hardware's baseline in `<root>/baselines/<host_id>.json`; the runs that were
    its baseline before are kept as history (they tell how much each case moves between runs).
    An incomplete or empty run is refused: every later comparison would measure against it."""
    run = load(ref, root)
    run.require_complete("a baseline", allow_incomplete)
    key = host_id(run.meta)
    if not key:
        raise UsageError(f"run {run.run_id} records no host id: it cannot be a per-host baseline")
    found = _baseline_record(root, run.meta)
    folder = _baseline_dir(root)
    path = found[0] if found else folder / f"{key}.json"
    if not found and path.exists():  # damaged: refused (its history is not ours to drop)
        read_baseline(path)
    with safeio.writing("baseline", folder):
        folder.mkdir(parents=True, exist_ok=True)
    safeio.check_output("baseline", path)
    inside = run.path.resolve().parent == Path(root).resolve()
    name = run.run_id if inside else str(run.path.resolve())
    previous = [found[1]["run"], *found[1].get("history", [])] if found else []
    record = {"run": name, "host_id": found[1]["host_id"] if found else key,
              "hostname": (run.meta.get("inventory") or {}).get("hostname"),
              "set": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "history": [r for r in dict.fromkeys(previous) if r != name][:HISTORY_RUNS],
              "meta": {"inventory": run.meta.get("inventory", {})}}
    safeio.write_output("baseline", path, json.dumps(record, indent=1, default=str))
    return path


def baselines(root: Path) -> list[dict]:
    return [record for _, record in _baseline_records(root)]


def baseline_for(cand_meta: dict, root: Path) -> str:
    """The run recorded as the baseline of the candidate's hardware."""
    found = _baseline_record(root, cand_meta)
    if found is None:
        damaged: list[str] = []
        _baseline_records(root, damaged)
        raise UsageError(f"no baseline for host {host_id(cand_meta)} in {_baseline_dir(root)}: "
                         "set one with `nearlocal baseline set RUN`"
                         + "".join(f" ({problem})" for problem in damaged[:1]))
    return str(found[1]["run"])


# ---------------------------------------------------------------- CLI


def parse_percent(text: str) -> float:
    """`5%` or `5` -> 0.05."""
    raw = str(text).strip().removesuffix("%")
    try:
        value = float(raw) / 100
    except ValueError:
        raise UsageError(f"malformed threshold {text!r}: give a percentage such as 5%") from None
    return value


def _compare(args) -> int:
    root = Path(args.out)
    safeio.check_output("--output", args.output)  # before anything is read
    cand = load(args.candidate, root)
    base_ref = baseline_for(cand.meta, root) if args.base == BASELINE_REF else args.base
    base = load(base_ref, root)
    base.require_complete("the base of a comparison", args.allow_incomplete)
    cand.require_complete("the candidate of a comparison", args.allow_incomplete)
    note = ""
    differences = host_differences(base.meta, cand.meta)
    if differences:
        if not args.cross_host:
            raise UsageError(f"runs {base.run_id} and {cand.run_id} come from different hardware ("
                             + "; ".join(differences) + "): pass --cross-host to compare anyway")
        note = "cross-host comparison: " + "; ".join(differences)
    elif host_id(base.meta) != host_id(cand.meta):
        note = (f"host ids {host_id(base.meta)} / {host_id(cand.meta)} differ only in memory size "
                "or calibrated TSC: same hardware")
    incomplete = [f"run {r.run_id} is INCOMPLETE ({r.incomplete})" for r in (base, cand)
                  if r.incomplete]  # only with --allow-incomplete: said in every format
    note = "; ".join(filter(None, [note, *incomplete]))
    history, used = history_noise(root, cand, args.history) if args.history else ({}, 0)
    result = compare_runs(base, cand, parse_percent(args.threshold), args.alpha, args.seed, note,
                          history, used)
    write_output(result, args.format, args.output)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        append_job_summary(result, os.environ["GITHUB_STEP_SUMMARY"])
    if args.output and args.format != "table":
        from nearlocal.console import err_console

        err_console.print(f"{'regression' if result.regressions else 'no regression'}: "
                          f"{result.summary()}; wrote {args.output}")
    return result.exit_code


def _baseline(args) -> int:
    from nearlocal.console import console

    root = Path(args.out)
    if args.action == "set":
        path = set_baseline(args.run, root, args.allow_incomplete)
        record = read_baseline(path)
        console.print(f"baseline for host {record['host_id']} is run {record['run']} ({path})")
        return 0
    damaged: list[str] = []
    records = [record for _, record in _baseline_records(require_store(root), damaged)]
    for problem in damaged:
        console.print(problem, markup=False)
    if not records:
        console.print(f"no baselines in {_baseline_dir(root)}")
    for record in records:
        console.print(f"{record['host_id']}  {record.get('hostname') or ''}  run {record['run']}  "
                      f"(set {record.get('set')})")
    return 0


def register(sub) -> None:
    parser = sub.add_parser("compare", help="compare two runs case by case; exit 1 on a regression")
    parser.add_argument("base", help="run id, directory, `latest`, or `baseline` (this host's)")
    parser.add_argument("candidate", nargs="?", default="latest",
                        help="run id or directory (default: latest)")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--threshold", default="5%",
                        help="smallest change that counts (default 5%%)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="family-wise significance level over all cases (default 0.01)")
    parser.add_argument("--format", choices=("table", "markdown", "json", "junit"), default="table",
                        help="table (default): a table on a terminal, full-width Markdown in a "
                             "pipe or CI log; markdown, json or junit for files")
    parser.add_argument("--output", help="write the report to this file instead of stdout")
    parser.add_argument("--cross-host", action="store_true",
                        help="compare runs from different hardware anyway")
    parser.add_argument("--history", type=non_negative_int, default=HISTORY_RUNS,
                        help="past baselines of this hardware whose spread widens each case's "
                             f"interval (default {HISTORY_RUNS}; 0: none)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="bootstrap seed (default 0)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="compare an incomplete (interrupted or killed) run anyway")
    parser.set_defaults(func=_compare)

    baseline = sub.add_parser("baseline", help="a named baseline run per host, kept in the store")
    actions = baseline.add_subparsers(dest="action", required=True)
    set_parser = actions.add_parser("set", help="make RUN this host's baseline")
    set_parser.add_argument("run", help="run id, directory or `latest`")
    set_parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    set_parser.add_argument("--allow-incomplete", action="store_true",
                            help="make an incomplete (interrupted or killed) run the baseline")
    show = actions.add_parser("show", help="list the baselines")
    show.add_argument("--out", default="results", help="the store's root (default ./results)")
    baseline.set_defaults(func=_baseline)
