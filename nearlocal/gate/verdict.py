"""The one place a case's verdict is assigned (judge_case), and the comparison it belongs to.

Per case the model (gate/estimate.py) gives a log ratio, its standard error and degrees of freedom.
Each median may be off by the clock's step, so the ratio's bounds allow for that. A case's
p-value tests "beyond the threshold" (outside [1/(1+t), 1+t]); Benjamini-Hochberg over the
compared cases selects, which keeps the chance of any false `slower` on unchanged code at
alpha, and each interval is the matching false coverage-rate adjusted one (level
1 - R alpha / family for R selected). Then, in this order:
  - a figure within COARSE_STEPS clock steps, or too few one-process cases: `ambiguous`;
  - the interval beyond the threshold: `slower` (`faster`), except in code mode, between runs
    that did not take turns, when the case moved no further than a host probe that is its
    yardstick and walked the same probe code in both runs (`ambiguous`: the host's move is
    noise there), or a one-process case whose stopping rule was not met. Runs that took turns
    shared the host: a probe that differs between them moved with one side's run (its probe
    code, its cases, its own rings), and excuses nothing;
  - the 90 % interval within the equivalence margin (two one-sided tests; the margin is the
    change a lone `slower` needs in a case of typical error, at least the threshold, at most
    10 %): `same`;
  - else `ambiguous`.
No case's verdict reads another's figures except through the family's size, R and the
typical error, none of which depends on the cases' order."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from nearlocal.engine.stability.hostmoves import HostMove, excusing, host_moves, layer, yardsticks
from nearlocal.errors import UsageError
from nearlocal.gate.estimate import Estimate, estimate_cases
from nearlocal.gate.modes import DEFAULT_MODE, Mode, get_mode
from nearlocal.gate.samples import Absent, CaseInput, case_inputs
from nearlocal.lazy import lazy_import
from nearlocal.store.reader import RunData

np = lazy_import("numpy")
scipy_stats = lazy_import("scipy.stats")

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
COARSE_STEPS = 10  # a figure within this many clock steps is too short for the clock to judge
EQUIV_ALPHA = 0.05
EQUIV_MARGIN_CAP = 0.10
VERDICT_ORDER = ("slower", "faster", "ambiguous", "missing", "new", "same")


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
    p_value: float = math.nan  # Benjamini-Hochberg-adjusted p of "beyond the threshold"
    n_base: int = 0
    n_cand: int = 0
    processes: str = ""  # "base/candidate" worker processes when they were the unit
    placements: str = ""  # "base/candidate" page placements behind them, where a process drew more
    note: str = ""  # one short clause; the details are in `detail` (--format json)
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _finite(asdict(self))


@dataclass
class Comparison:
    base: str
    candidate: str
    mode: str
    paired: bool  # the runs took turns (one group, two arms): pairs are the unit
    threshold: float
    alpha: float
    confidence: float  # of each case's interval (false coverage-rate adjusted)
    margin: float  # the equivalence margin `same` was tested against
    host_note: str
    cases: list[CaseComparison]
    host_moves: list[HostMove] = field(default_factory=list)
    run_noise: float = 0.0  # one-process cases' run-to-run noise (0: none or unknown)
    history_runs: int = 0  # past baselines whose spread floored each case's error

    def moved_layers(self) -> list[HostMove]:
        return [m for m in self.host_moves if m.beyond(self.threshold)]

    def head_line(self) -> str:
        """The first line of every report: the mode, and for box CI the layers that moved."""
        if self.mode == "code":
            return ("code CI, paired: the runs took turns" if self.paired else
                    "code CI, unpaired: the runs did not take turns, the host's moves are noise")
        if not self.host_moves:
            return "box CI: these runs have no host probes to say which layer moved"
        moved = self.moved_layers()
        if not moved:
            return f"box CI: no layer moved beyond {self.threshold:.0%}"
        return "box CI: " + "; ".join(f"{layer(m)} moved {m.ratio:.2f}x [{m.low:.2f}, "
                                      f"{m.high:.2f}]" for m in moved)

    def code_moves(self) -> list[HostMove]:
        """Code CI, runs that took turns: the probes that read differently on the two sides'
        turns (one host: one side's run moved them, not the host)."""
        return [m for m in self.host_moves if m.moved] if self.mode == "code" and self.paired \
            else []

    def host_line(self) -> str:
        if not self.host_moves:
            return ""
        line = "host probes, per hop: " + "; ".join(m.text() for m in self.host_moves)
        if self.code_moves():
            line += ("; one host, taking turns: " + "; ".join(m.by_code() for m in
                                                              self.code_moves())
                     + ", which excuses no case")
        elif self.mode == "code" and not self.paired:
            other = [m.probe for m in self.host_moves if not m.same_code]
            if other:
                line += (f"; {', '.join(other)}: the runs' probe code differs, another "
                         "yardstick, which excuses no case")
        return line

    @property
    def regressions(self) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == "slower"]

    def counts(self) -> dict[str, int]:
        return {v: sum(c.verdict == v for c in self.cases) for v in VERDICT_ORDER}

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    @property
    def n_compared(self) -> int:
        return sum(c.verdict in ("slower", "faster", "ambiguous", "same") for c in self.cases)

    def summary(self) -> str:
        text = ", ".join(f"{n} {v}" for v, n in self.counts().items())
        same = f"; same = within ±{self.margin:.1%}" if math.isfinite(self.margin) else ""
        return (f"{text} (threshold {self.threshold:.1%}, alpha {self.alpha:g} over "
                f"{self.n_compared} cases{same})")

    def sorted_cases(self) -> list[CaseComparison]:
        return sorted(self.cases, key=lambda c: VERDICT_ORDER.index(c.verdict))

    def to_dict(self) -> dict:
        return _finite({"mode": self.mode, "head": self.head_line(), "paired": self.paired,
                "base": self.base, "candidate": self.candidate, "threshold": self.threshold,
                "alpha": self.alpha, "confidence": self.confidence,
                "run_noise": self.run_noise, "host_note": self.host_note,
                "history_runs": self.history_runs,
                "equivalence": {"margin": self.margin, "alpha": EQUIV_ALPHA,
                                "cap": EQUIV_MARGIN_CAP},
                "summary": self.summary(),
                "host_probes": [{**asdict(m), "layer": layer(m),
                                 "beyond_threshold": m.beyond(self.threshold),
                                 "moved_by": m.moved_by() if m in self.code_moves() else ""}
                                for m in self.host_moves],
                "moved_layers": [layer(m) for m in self.moved_layers()],
                "counts": self.counts(), "regression": bool(self.regressions),
                "cases": [c.to_dict() for c in self.sorted_cases()]})


def _finite(value):
    """JSON has no NaN or infinity: None instead, in nested dicts and lists too."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _log_bounds(est: Estimate, slack_ns: float) -> tuple[float, float]:
    """The log ratio's bounds when each figure may be off by `slack_ns` (the clock)."""
    q = slack_ns if math.isfinite(slack_ns) else 0.0
    mb, mc = est.base_ns, est.cand_ns
    low = math.log((mc - q) / (mb + q)) if mc > q else -math.inf
    high = math.log((mc + q) / (mb - q)) if mb > q else math.inf
    return low, high


def _p_beyond(est: Estimate, bounds: tuple[float, float], threshold: float) -> float:
    """Two-sided p of "the ratio lies beyond the threshold"."""
    hi, sd = math.log1p(threshold), max(est.sd, 1e-12)
    slow = float(scipy_stats.t.sf((bounds[0] - hi) / sd, est.df))
    fast = float(scipy_stats.t.sf((-hi - bounds[1]) / sd, est.df))
    return min(1.0, 2 * min(slow, fast))


def benjamini_hochberg(p: np.ndarray, family: int) -> np.ndarray:
    """BH-adjusted p-values of p within a family of `family` >= p.size tests."""
    order = np.argsort(p, kind="stable")
    ranked = p[order] * family / np.arange(1, p.size + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def equivalence_margin(estimates: list[Estimate], threshold: float, alpha: float) -> float:
    """The change a lone `slower` needs in a case of typical (median) error: what this pair of
    runs would have caught; at least the threshold, at most EQUIV_MARGIN_CAP."""
    errors = [e.sd for e in estimates if math.isfinite(e.sd) and not e.noise_unknown]
    if not errors:
        return math.nan
    reach = float(scipy_stats.norm.isf(alpha / len(estimates) / 2)) * float(np.median(errors))
    return float(min(EQUIV_MARGIN_CAP, max(threshold, (1 + threshold) * math.exp(reach) - 1)))


@dataclass
class Family:
    """What every case of one comparison is judged with."""

    mode: Mode
    threshold: float
    margin: float
    quantile_level: float  # two-sided level of each interval (false coverage-rate adjusted)
    z_case: float  # the normal quantile of a case's level, for a host probe's error
    moves: list[HostMove]
    paired: bool = False  # the runs took turns: one host, so no probe move excuses a case


def judge_case(case: CaseInput, est: Estimate, p: float, fam: Family) -> CaseComparison:
    """The verdict of one case (the rules in this module's docstring), assigned once."""
    result = CaseComparison(case.case_id, "ambiguous", case.method, est.base_ns, est.cand_ns,
                            math.exp(est.log_ratio), n_base=case.n_base, n_cand=case.n_cand,
                            p_value=p, processes=est.processes if est.unit != "samples" else "",
                            placements=_drawn(case) if est.unit != "samples" else "",
                            detail={"unit": est.unit, "log_sd": est.sd, "df": est.df,
                                    "unit_spread": est.spread, "clock_step_ns": case.step_ns})
    low, high = _log_bounds(est, case.resolution_ns)
    reach = float(scipy_stats.t.isf(fam.quantile_level / 2, est.df)) * est.sd
    result.ci_low, result.ci_high = math.exp(low - reach), math.exp(high + reach)
    steps = min(est.base_ns, est.cand_ns) / case.resolution_ns \
        if math.isfinite(case.resolution_ns) and case.resolution_ns > 0 else math.inf
    up, down = 1 + fam.threshold, 1 / (1 + fam.threshold)
    mine = yardsticks(fam.moves, case)
    result.detail["yardsticks"] = [m.probe for m in mine]
    if steps < COARSE_STEPS:
        result.note = f"spans {steps:.1f} clock steps of {case.resolution_ns:.3g} ns"
    elif est.noise_unknown:
        result.note = "one process a case, too few cases to know the run noise"
    elif result.ci_low > up or result.ci_high < down:
        slower = result.ci_low > up
        half = math.log(result.ratio / result.ci_low if slower else result.ci_high / result.ratio)
        excused = [] if fam.paired else excusing([m for m in mine if m.same_code], slower,
                                                  result.ratio, half, fam.threshold, fam.z_case)
        if case.unsettled:
            result.note = f"not converged in the {case.unsettled}"
        elif fam.mode.host_moves == "noise" and excused:
            result.note = "with the host's " + ", ".join(f"{layer(m)} move ({m.ratio:.2f}x)"
                                                         for m in excused)
            result.detail["within_host_moves"] = [m.probe for m in excused]
        else:
            result.verdict = "slower" if slower else "faster"
            moved = [] if fam.paired and fam.mode.host_moves == "noise" else \
                [m for m in mine if m.moved and (m.ratio > 1) == slower]
            if moved:  # box CI's finding (unpaired code CI's case moved beyond it)
                result.note = ", ".join(f"{layer(m)} moved {m.ratio:.2f}x" for m in moved)
    elif _within_margin(case, est, fam.margin):
        result.verdict = "same"
    elif case.unsettled:
        result.note = f"not converged in the {case.unsettled}"
    elif est.unit == "samples":
        result.note = "straddles the threshold"
    else:
        result.note = f"spread {est.spread:.0%}" + _next_step(est, fam.mode)
    return result


def _drawn(case: CaseInput) -> str:
    """The placements behind the processes' figures, where some process drew more than one."""
    processes = (case.base_logs.size, case.cand_logs.size) if case.by_processes else (0, 0)
    more = any(drawn > count for drawn, count in zip(case.placements, processes, strict=True))
    return f"{case.placements[0]}/{case.placements[1]}" if more else ""


def _next_step(est: Estimate, mode: Mode) -> str:
    """What narrows an undecided case: taking turns (code CI, runs that did not), more
    processes (unless both runs had the most a run gives)."""
    turns = est.unit == "processes" and mode.host_moves == "noise"
    if est.most_processes:
        return " at the most processes" + (": take turns" if turns else "")
    return ": take turns or more --processes" if turns else ": more --processes"


def _within_margin(case: CaseInput, est: Estimate, margin: float) -> bool:
    """Two one-sided tests at EQUIV_ALPHA: the ratio, each figure allowed half a clock step
    either way, lies within 1 +- margin."""
    if not math.isfinite(margin):
        return False
    low, high = _log_bounds(est, case.step_ns / 2 if math.isfinite(case.step_ns) else 0.0)
    reach = float(scipy_stats.t.isf(EQUIV_ALPHA, est.df)) * est.sd
    limit = math.log1p(margin)
    return -limit < low - reach and high + reach < limit


def _unjudged(case: CaseInput) -> CaseComparison:
    ratio = case.cand_median_ns / case.base_median_ns if case.base_median_ns > 0 else math.nan
    return CaseComparison(case.case_id, "ambiguous", case.method, case.base_median_ns,
                          case.cand_median_ns, ratio, n_base=case.n_base, n_cand=case.n_cand,
                          note=case.problem)


def _absent(entry: Absent) -> CaseComparison:
    figures = {"base_median_ns" if entry.verdict == "missing" else "cand_median_ns":
               entry.median_ns}
    return CaseComparison(entry.case_id, entry.verdict, entry.method, note=entry.why, **figures)


def compare_runs(base: RunData, cand: RunData, threshold: float = DEFAULT_THRESHOLD,
                 alpha: float = DEFAULT_ALPHA, seed: int = 0, host_note: str = "",
                 history: dict[str, float] | None = None, history_runs: int = 0,
                 mode: str = DEFAULT_MODE) -> Comparison:
    """Judge every case of `cand` against `base` in `mode` ("code" or "box"). history: per
    case, the SD of one run's log figure over past baselines (gate/baselines.history_noise)."""
    from nearlocal.engine.stability.turns import same_group

    if not 0 < threshold < 10:
        raise UsageError(f"--threshold must be a positive percentage below 1000%, "
                         f"got {threshold:.1%}")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must lie between 0 and 1, got {alpha}")
    chosen = get_mode(mode)
    inputs, absent = case_inputs(base, cand)
    judged = [c for c in inputs if not c.problem]
    paired = same_group(base.meta, cand.meta)
    estimates, tau = estimate_cases(judged, paired, history or {}, seed)
    family = max(len(judged), 1)
    p = np.array([_p_beyond(e, _log_bounds(e, c.resolution_ns), threshold)
                  for c, e in zip(judged, estimates, strict=True)])
    adjusted = benjamini_hochberg(p, family) if p.size else p
    selected = int(np.sum(adjusted <= alpha))
    level = max(selected, 1) * alpha / family
    moves = host_moves(base.meta, cand.meta, alpha, paired)
    fam = Family(chosen, threshold, equivalence_margin(estimates, threshold, alpha), level,
                 float(scipy_stats.norm.isf(alpha / family / 2)), moves, paired)
    cases = [judge_case(c, e, float(q), fam) for c, e, q in zip(judged, estimates, adjusted,
                                                            strict=True)]
    cases += [_unjudged(c) for c in inputs if c.problem] + [_absent(a) for a in absent]
    return Comparison(base.run_id, cand.run_id, chosen.name, paired, threshold, alpha,
                      1 - level, fam.margin, host_note, cases, moves, tau,
                      history_runs if history else 0)
