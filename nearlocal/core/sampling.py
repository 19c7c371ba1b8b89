"""What a case's samples are and when there are enough: the sampling loop (warm-up, then batches
until the stopping rule is met), the rule and the statistics of the samples. Core, not engine:
the rack's and RDMA's ranks sample with it inside an MPI job as a worker does."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nearlocal.lazy import lazy_import

np = lazy_import("numpy")

# Page placements (fresh mappings of a case's region and peer, held at once) each worker
# process draws of a case: one process's pages are one draw (a 16 KiB nt-store read 180 ns in
# some processes and 260-280 ns in others on the 2-vCPU VM), so a figure stands on processes x
# placements draws. Every front end's default (run, accept, pytest bench/); engine/worker.py
# draws them.
DEFAULT_PLACEMENTS = 2
MAX_PLACEMENTS = 16
PLACEMENTS_HELP = (f"page placements each worker process draws of a case (fresh mappings of its "
                   f"region and peer, held at once, each with its share of the process's budget) "
                   f"where both are anonymous memory, within the LLC, and fit in a quarter of "
                   f"what is available; else one (default {DEFAULT_PLACEMENTS})")

if TYPE_CHECKING:
    from nearlocal.core.methods import Session


def median_rank_bounds(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """(lo, hi) = scipy's binom.ppf(a, n, 1/2) and binom.isf(a, n, 1/2), a = (1 - confidence)/2:
    the order statistics that bound the median. Computed here because the stopping rule asks for
    them in every worker process, whose first case would otherwise pay scipy.stats' 0.9 s import
    inside its timed budget. By symmetry isf = n - ppf (no dyadic cdf value equals a)."""
    alpha = (1 - confidence) / 2
    k = np.arange(1, n // 2 + 1, dtype=np.float64)
    log_pmf = np.concatenate([[0.0], np.cumsum(np.log((n - k + 1) / k))]) - n * math.log(2)
    lo = int(np.searchsorted(np.cumsum(np.exp(log_pmf)), alpha))
    return lo, n - lo


def median_ci(sorted_ns: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median from order statistics (binomial ranks)."""
    n = sorted_ns.size
    if n < 6:
        return math.nan, math.nan
    lo, hi = median_rank_bounds(n, confidence)
    return float(sorted_ns[max(lo - 1, 0)]), float(sorted_ns[min(hi, n - 1)])


def summarize(ns: np.ndarray, bytes_moved: int) -> dict:
    """The per-case statistics stored with every row."""
    values = np.sort(np.asarray(ns, dtype=np.float64))
    if values.size == 0:
        return {"n_samples": 0}
    median = float(np.median(values))
    ci_low, ci_high = median_ci(values)
    p10, p90, p99 = np.percentile(values, [10, 90, 99])
    return {
        "n_samples": int(values.size),
        "min_ns": float(values[0]),
        "median_ns": median,
        "mean_ns": float(values.mean()),
        "p10_ns": float(p10),
        "p90_ns": float(p90),
        "p99_ns": float(p99),
        "max_ns": float(values[-1]),
        "stddev_ns": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "mad_ns": float(np.median(np.abs(values - median))),
        "ci_low_ns": ci_low,
        "ci_high_ns": ci_high,
        "gbps": bytes_moved / median if median > 0 and bytes_moved > 0 else math.nan,
    }


# Draws (processes, placements) of one case whose log medians spread (log_spread) by more than
# this disagree: the runner settles such a case with more processes (run for a gate), and the
# report marks a row whose placements disagree, its figure a mix of fast and slow draws
SETTLED_SPREAD = 0.10


def draws_disagree(spread: float) -> bool:
    """Whether a case's draws disagree (NaN, too few draws to tell: no)."""
    return bool(spread > SETTLED_SPREAD)


def log_spread(groups: list[np.ndarray]) -> float:
    """Robust SD of the log medians of groups of samples (IQR / 1.349): how much a case's figure
    moves from one draw (a worker process, a page placement) to the next; one draw on a busy
    host does not move it. NaN with fewer than 4 groups or a median at or below 0."""
    medians = np.array([np.median(ns) for ns in groups if len(ns)])
    if medians.size < 4 or not np.all(medians > 0):
        return math.nan
    q25, q75 = np.percentile(np.log(medians), [25, 75])
    return float((q75 - q25) / 1.349)


# Worker processes each run needs of a case (or of a host probe) before its processes are the
# unit a gate compares (gate/samples.py) and a host probe's move is read (engine/stability)
MIN_PROCESSES = 2
PROCESS_TRIM = 0.1  # share of processes trimmed from each end of a run's (Yuen's estimator)


def trimmed_location(log_medians: np.ndarray) -> tuple[float, float, int]:
    """(PROCESS_TRIM-trimmed mean, per-unit variance, h) of log figures: Yuen's estimator. Its
    standard error is sqrt(variance / h), the variance the Winsorized one times
    (n - 1) / (h - 1)."""
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


def relative_half_width(ns: np.ndarray) -> float:
    values = np.sort(np.asarray(ns, dtype=np.float64))
    low, high = median_ci(values)
    median = float(np.median(values)) if values.size else math.nan
    if math.isnan(low) or median <= 0:
        return math.inf
    return (high - low) / 2 / median


@dataclass(frozen=True)
class StoppingRule:
    """Repeat until the median's CI is tight enough, or the budget or sample cap is reached."""

    budget_s: float = 0.5
    target_rel_ci: float = 0.01
    min_samples: int = 30
    max_samples: int = 10_000

    def converged(self, ns: np.ndarray) -> bool:
        return ns.size >= self.min_samples and relative_half_width(ns) <= self.target_rel_ci

    def done(self, ns: np.ndarray, elapsed_s: float) -> bool:
        return self.converged(ns) or elapsed_s >= self.budget_s or ns.size >= self.max_samples

    def batch_size(self, seconds_per_sample: float, have: int) -> int:
        """Batches of about 1/20 of the budget, never beyond the sample cap."""
        target = self.budget_s / 20 / max(seconds_per_sample, 1e-9)
        return int(max(1, min(target, 4096, self.max_samples - have)))


def run_trials(session: Session, rule: StoppingRule) -> tuple[np.ndarray, np.ndarray, float, bool]:
    start = time.perf_counter()
    session.sample(1)  # warm-up: compile, fault in, settle the cache state
    warm0 = time.perf_counter()
    session.sample(2)
    per_sample = (time.perf_counter() - warm0) / 2
    start_trials = time.perf_counter()
    raws, nss, have = [], [], 0
    ns_all = np.empty(0)
    while True:
        raw, ns = session.sample(rule.batch_size(per_sample, have))
        raws.append(np.asarray(raw, dtype=np.float64))
        nss.append(np.asarray(ns, dtype=np.float64))
        have += len(ns)
        ns_all = np.concatenate(nss)
        elapsed = time.perf_counter() - start_trials
        per_sample = elapsed / have
        if rule.done(ns_all, elapsed):
            break
    return np.concatenate(raws), ns_all, time.perf_counter() - start, rule.converged(ns_all)
