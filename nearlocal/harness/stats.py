"""Statistics of one case's samples, and the stopping rule that decides when there are enough."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nearlocal.lazy import lazy_import

np = lazy_import("numpy")


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
