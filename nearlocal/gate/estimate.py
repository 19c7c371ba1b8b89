"""Each case's log ratio (candidate / base) and its standard error: the one model, per unit.

- Worker processes (runs made with 2 or more a case, the default): the ratio of the 10 %
  trimmed means of the process log medians (Yuen's two-sample estimator, so one process drawn
  while the host was busy does not move it), its standard error from the Winsorized variances.
- Pairs (the runs took turns, `run --take-turns`): process k of one run and process k of the
  other were measured in the same round, so the ratio is the trimmed mean of the pairs' log
  differences (Yuen's one-sample estimator) and the host's state, shared by a pair, cancels.
- Samples (runs with one process a case: schema 1, `--processes 1`): the ratio of the medians,
  its error a bootstrap of each median widened by the run-to-run noise all such cases show
  together (Qn, the robust scatter of their log ratios: no case order enters).
Either way the error is at least the case's spread over this host's past baselines (--history).
The p-values, the false coverage-rate intervals and the verdicts are gate/verdict.py's."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from nearlocal.core.sampling import trimmed_location
from nearlocal.gate.samples import CaseInput
from nearlocal.lazy import lazy_import

np = lazy_import("numpy")
scipy_stats = lazy_import("scipy.stats")

N_BOOTSTRAP = 4000
MIN_CASES_FOR_RUN_NOISE = 8  # one-process cases needed before their run-to-run noise is known
# Degrees of freedom of the Student t of one-process cases' run noise: fitted on 28 pairs of
# back-to-back quick runs on a busy 2-core VM (|change| / noise quantiles 2.1, 4.3, 6.9 at 90,
# 99, 99.9 %, where t(5) gives 1.9, 3.7, 6.4).
RUN_NOISE_DOF = 5
QN_TO_SIGMA = 2.2219  # Qn's consistency factor at the normal
LOG_FLOOR_NS = 1e-3  # keeps a resampled zero median from giving an infinite log


@dataclass
class Estimate:
    """What the model says of one case: plain numbers for gate/verdict.py."""

    log_ratio: float
    sd: float  # standard error of log_ratio
    df: float  # degrees of freedom of its t
    base_ns: float  # the figures the ratio is of (the trimmed geometric means, or medians)
    cand_ns: float
    unit: str  # "processes", "pairs" or "samples"
    processes: str = ""  # "base/candidate" worker processes ("32/32 (32 paired)" for pairs)
    spread: float = math.nan  # SD of one unit's log figure (a process median, a pair)
    most_processes: bool = False  # both runs had at least the most --processes gives
    noise_unknown: bool = False  # one-process cases too few to know the run-to-run noise


def bootstrap_medians(values: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Draws from the bootstrap distribution of the sample median, one per uniform: a
    resample's m-th smallest value is <= x_(k) exactly when at least m of its n draws are, a
    Binomial(n, k/n) event, so the distribution is sampled by inverting it (O(n) a case). For
    even n the two middle order statistics share a uniform and are averaged, as np.median does."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    k = np.arange(1, n + 1)

    def draw(m: int) -> np.ndarray:
        cdf = scipy_stats.binom.sf(m - 1, n, k / n)
        return x[np.minimum(np.searchsorted(cdf, uniforms, side="left"), n - 1)]

    if n % 2:
        return draw((n + 1) // 2)
    return (draw(n // 2) + draw(n // 2 + 1)) / 2


def _by_processes(case: CaseInput, paired: bool) -> Estimate:
    from nearlocal.engine.plan import MAX_PROCESSES

    nb, nc = case.base_logs.size, case.cand_logs.size
    mean_b, var_b, h_b = trimmed_location(case.base_logs)
    mean_c, var_c, h_c = trimmed_location(case.cand_logs)
    most = min(nb, nc) >= MAX_PROCESSES
    if paired:
        n = min(nb, nc)  # settling gives each run its own count: the pairs are the common ones
        mean, variance, h = trimmed_location(case.cand_logs[:n] - case.base_logs[:n])
        base_ns = math.exp(mean_b)
        return Estimate(mean, math.sqrt(variance / h), h - 1, base_ns, base_ns * math.exp(mean),
                        "pairs", f"{nb}/{nc} ({n} paired)", math.sqrt(variance), most)
    df = h_b + h_c - 2
    pooled = ((h_b - 1) * var_b + (h_c - 1) * var_c) / df
    return Estimate(mean_c - mean_b, math.sqrt(pooled * (1 / h_b + 1 / h_c)), df,
                    math.exp(mean_b), math.exp(mean_c), "processes", f"{nb}/{nc}",
                    math.sqrt(pooled), most)


def _bootstrap_se(case: CaseInput, seed: int) -> float:
    """The bootstrap SD of log(median ratio); the draws seeded by the case's id, so no case's
    estimate depends on which cases came before it."""
    rng = np.random.default_rng([seed, zlib.crc32(case.case_id.encode())])
    draws = (np.log(np.maximum(bootstrap_medians(case.cand_ns, rng.random(N_BOOTSTRAP)),
                               LOG_FLOOR_NS))
             - np.log(np.maximum(bootstrap_medians(case.base_ns, rng.random(N_BOOTSTRAP)),
                                 LOG_FLOOR_NS)))
    return float(np.std(draws, ddof=1))


def run_noise(log_ratios: list[float]) -> float:
    """Sigma of one-process cases' run-to-run change: Rousseeuw and Croux's Qn of their log
    ratios (a quantile of the distances between every two cases, scaled to a normal's sigma).
    A change shared by any group of up to half the cases (every size of one method) leaves the
    distances within each group, which set the quantile; no case order enters. 0 with under
    MIN_CASES_FOR_RUN_NOISE cases."""
    values = np.asarray([v for v in log_ratios if math.isfinite(v)])
    if values.size < MIN_CASES_FOR_RUN_NOISE:
        return 0.0
    h = values.size // 2 + 1
    distances = np.abs(values[:, None] - values[None, :])[np.triu_indices(values.size, 1)]
    return float(QN_TO_SIGMA * np.partition(distances, h * (h - 1) // 2 - 1)[h * (h - 1) // 2 - 1])


def estimate_cases(cases: list[CaseInput], paired: bool, history: dict[str, float],
                   seed: int = 0) -> tuple[list[Estimate], float]:
    """An estimate per judged case (those without a `problem`), and the one-process cases' run
    noise (0 when none). history: per case, the SD of one run's log figure over past baselines
    (a ratio spans two runs: sqrt(2) times it is a floor on its error)."""
    single = [c for c in cases if not c.by_processes]
    tau = run_noise([math.log(c.cand_median_ns / c.base_median_ns) for c in single])
    estimates = []
    for case in cases:
        floor = math.sqrt(2) * history.get(case.case_id, 0.0)
        if case.by_processes:
            est = _by_processes(case, paired)
            est.sd = max(est.sd, floor)
        else:
            est = Estimate(math.log(case.cand_median_ns / case.base_median_ns),
                           math.hypot(_bootstrap_se(case, seed), max(tau, floor)),
                           RUN_NOISE_DOF if tau > 0 else math.inf, case.base_median_ns,
                           case.cand_median_ns, "samples",
                           noise_unknown=len(single) < MIN_CASES_FOR_RUN_NOISE)
        estimates.append(est)
    return estimates, tau
