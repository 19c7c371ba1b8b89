"""The TSC as a clock: its frequency, the step it moves in and the cost of one timed interval.

A run calibrates its clock once (`measure_clock`, in the process that plans the run) and hands
the one calibration to every worker: each process subtracts the same overhead, and every row
states the same step. The step is read from the bulk of the readings of an empty interval,
never from its outliers: a TSC that moves in steps of 1 or 2 ticks (bare metal, most KVM
guests) has a dense bulk whose spacing is the step; a scaled one (some AMD guests: ~24-26
ticks) has a comb of values, each a tooth maybe a tick wide, whose teeth are a step apart. An
interrupt or a VM exit lands far out in the tail and says nothing about the step.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from nearlocal.kernels import cpu

CALIBRATION_REPS = 20000
BULK_QUANTILES = (0.02, 0.98)  # the central mass the step is read from
MIN_VALUE_SHARE = 0.002  # a value seen in fewer than 0.2 % of the bulk's readings is a straggler
# A scaled TSC's tooth: what one count of steps reads, within a tick or two of k x step (TCG
# guest: k x 26 - 1 and k x 26; AMD KVM guest: k x 26 exactly). A run of values wider than this
# is a fine clock's.
COMB_TOOTH_SPAN = 2
COMB_GAP_WIDTHS = 4  # teeth lie at least this many tooth widths (+1 tick) apart
MAX_LOWEST_TOOTH = 3  # the lowest tooth above zero lies at most this many steps out
MAX_FINE_STEP = 8  # a fine clock's step is read up to this many ticks
FINE_RESIDUE_SHARE = 0.99  # of the bulk's readings in one residue class mod the step
EVIDENCE_QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
EVIDENCE_VALUES = 32  # the bulk's most frequent values kept as evidence


def calibrate_tsc_hz(duration_s: float = 0.1) -> float:
    """TSC ticks per second against CLOCK_MONOTONIC_RAW, after a warm-up call (JIT, page-ins)."""
    cpu.tsc_now()
    best = None
    for _ in range(3):
        wall0, tsc0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW), cpu.tsc_now()
        time.sleep(duration_s / 3)
        wall1, tsc1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW), cpu.tsc_now()
        rate = (tsc1 - tsc0) * 1e9 / (wall1 - wall0)
        best = rate if best is None else (best + rate) / 2
    return float(best)


@dataclass(frozen=True)
class ClockCalibration:
    """One run's clock: what every worker subtracts and every row states."""

    overhead_ticks: float  # median ticks of an empty fenced interval, subtracted from every sample
    quantum_ticks: float  # the step the TSC moves in (1 on bare metal, 2 on some guests, ~24 on others)
    evidence: dict = field(default_factory=dict, compare=False)  # what the step was read from

    def step_ns(self, tsc_hz: float) -> float:
        return self.quantum_ticks * 1e9 / tsc_hz

    def to_dict(self, tsc_hz: float | None = None) -> dict:
        """What run.json keeps: the figures, in ticks and ns, and their evidence."""
        facts = asdict(self)
        if tsc_hz:
            facts.update(tsc_hz=tsc_hz, step_ns=self.step_ns(tsc_hz),
                         overhead_ns=self.overhead_ticks * 1e9 / tsc_hz)
        return facts


def _values(ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all readings, the bulk's distinct values, their counts): the bulk is the central mass
    (BULK_QUANTILES) less values too rare to be more than stragglers."""
    ticks = np.asarray(ticks, dtype=np.float64).ravel()
    ticks = np.rint(ticks[np.isfinite(ticks)])
    if ticks.size == 0:
        return ticks, ticks, ticks
    lo, hi = np.quantile(ticks, BULK_QUANTILES)
    bulk = ticks[(ticks >= lo) & (ticks <= hi)]
    values, counts = np.unique(bulk, return_counts=True)
    keep = counts >= max(1.0, MIN_VALUE_SHARE * bulk.size)
    return ticks, values[keep], counts[keep]


def _groups(values: np.ndarray) -> list[np.ndarray]:
    """The bulk's values in runs: neighbours at most COMB_TOOTH_SPAN ticks apart share a run
    (a fine clock's dense bulk, or one tooth of a scaled TSC's comb)."""
    return np.split(np.arange(values.size), np.flatnonzero(np.diff(values) > COMB_TOOTH_SPAN) + 1)


def _comb_step(values: np.ndarray, counts: np.ndarray, teeth: list[np.ndarray]) -> float | None:
    """The step of a scaled TSC's comb, or None where the runs are no comb. Teeth: runs each at
    most COMB_TOOTH_SPAN wide (the caller's test), far apart against their width, and sitting at
    whole multiples of one step from zero within that width, the lowest above zero at most
    MAX_LOWEST_TOOTH steps out (an empty interval costs a few of a scaled TSC's ~24-tick steps;
    clusters of a fine clock that happen to sit apart fit no such comb)."""
    if len(teeth) < 2:
        return None
    widths = np.array([values[t[-1]] - values[t[0]] for t in teeth], np.float64)
    centres = np.array([np.average(values[t], weights=counts[t]) for t in teeth])
    spacing = np.diff(centres)
    if spacing.min() < COMB_GAP_WIDTHS * (widths.max() + 1):
        return None
    multiples = np.maximum(np.rint(spacing / spacing.min()), 1.0)
    rough = float(spacing.sum() / multiples.sum())
    # A difference of two readings of a stepped counter is a whole number of steps: the teeth
    # sit at k x step, from 0, give or take the jitter. Fit the step through the origin, each
    # tooth by its mass (a TCG guest's bottom tooth reads 1 tick for 0 steps: its spacing to
    # the next, 25 of 26, would bias the step).
    mass = np.array([counts[t].sum() for t in teeth], np.float64)
    k = np.rint(centres / rough)
    used = k >= 1
    if not used.any() or k[used].min() > MAX_LOWEST_TOOTH:
        return None
    step = float((mass[used] * k[used] * centres[used]).sum() / (mass[used] * k[used] ** 2).sum())
    if np.any(np.abs(centres - np.rint(centres / step) * step) > widths / 2 + 1.0):
        return None  # a tooth off the comb: these runs are a fine clock's clusters
    return step


def _fine_step(values: np.ndarray, counts: np.ndarray) -> float:
    """A fine clock's step: the largest d (up to MAX_FINE_STEP) for which the bulk's readings
    all fall in one residue class mod d (an Intel guest's readings are all even: 2), read from
    every value, so a value missing from the bulk or clusters far apart do not move it."""
    total = counts.sum()
    for step in range(MAX_FINE_STEP, 1, -1):
        mass = np.bincount(values.astype(np.int64) % step, weights=counts, minlength=step)
        if mass.max() >= FINE_RESIDUE_SHARE * total:
            return float(step)
    return 1.0


def clock_step(ticks: np.ndarray) -> tuple[float, str]:
    """(the TSC's step in ticks, how it was found) from repeated readings of one short interval.
    Read from the bulk: a comb's step where its teeth sit at whole multiples of one, else the
    largest step whose residue class holds the bulk's values (1 or 2 ticks on a fine clock);
    with one value only in the bulk, the greatest common divisor
    of every distinct reading's distance from it (a coarse clock that never jittered); 1 tick
    when nothing tells."""
    return _step_of(*_values(ticks))


def _step_of(ticks: np.ndarray, values: np.ndarray, counts: np.ndarray) -> tuple[float, str]:
    """clock_step on readings already split into the bulk's values and counts. A run wider than
    a tooth (several values at a fine spacing) is a fine clock whatever the gaps between runs:
    two paths through the fences give a bare-metal bulk two clusters, never a comb."""
    if values.size >= 2:
        runs = _groups(values)
        if all(values[r[-1]] - values[r[0]] <= COMB_TOOTH_SPAN for r in runs):
            comb = _comb_step(values, counts, runs)
            if comb is not None:
                return comb, "comb: teeth at whole multiples of the step"
        return _fine_step(values, counts), "one residue class of the bulk's values"
    distinct = np.unique(ticks)
    if values.size == 1 and distinct.size >= 2:
        step = int(np.gcd.reduce(np.abs(distinct - values[0]).astype(np.int64)))
        if step > 1:
            return float(step), "one value in the bulk: gcd of the distances of every reading from it"
    return 1.0, "unresolved: the bulk holds one value and nothing else tells the step"


def calibrate(ticks: np.ndarray) -> ClockCalibration:
    """The clock read from readings of an empty interval, with the evidence run.json keeps."""
    all_ticks, values, counts = _values(ticks)
    step, how = _step_of(all_ticks, values, counts)
    top = np.argsort(counts)[::-1][:EVIDENCE_VALUES]
    evidence = {
        "readings": int(all_ticks.size), "how": how,
        "quantiles": {f"p{round(q * 100)}": float(v)
                      for q, v in zip(EVIDENCE_QUANTILES,
                                      np.quantile(all_ticks, EVIDENCE_QUANTILES), strict=True)},
        "max": float(all_ticks.max()) if all_ticks.size else 0.0,
        "bulk_values": {str(int(values[i])): int(counts[i]) for i in sorted(top)},
    }
    return ClockCalibration(float(np.median(all_ticks)), step, evidence)


def empty_intervals(reps: int = CALIBRATION_REPS) -> np.ndarray:
    """Ticks of `reps` empty fenced intervals (the timer kernel warmed up first)."""
    empty = np.zeros(1, np.uint8)
    frags = np.zeros((0, 3), np.int64)
    samples = np.zeros(reps, np.uint64)
    cpu.timer_overhead(empty, empty, frags, samples, np.zeros(1, np.uint64))  # compile, warm up
    cpu.timer_overhead(empty, empty, frags, samples, np.zeros(1, np.uint64))
    return samples


def measure_clock(reps: int = CALIBRATION_REPS) -> ClockCalibration:
    return calibrate(empty_intervals(reps))
