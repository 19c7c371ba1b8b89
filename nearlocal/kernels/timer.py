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


def _comb_step(values: np.ndarray, counts: np.ndarray) -> float | None:
    """The step of the teeth when the bulk's values form a comb (teeth narrower than half the
    gaps between them, as a scaled TSC that jitters by a tick gives); None otherwise."""
    gaps = np.diff(values)
    kinds = np.unique(gaps)
    if kinds.size < 2:
        return None
    split = int(np.argmax(kinds[1:] / kinds[:-1]))  # the largest jump in gap size
    within = kinds[split]
    teeth = np.split(np.arange(values.size), np.flatnonzero(gaps > within) + 1)
    if len(teeth) < 2:
        return None
    widths = [values[t[-1]] - values[t[0]] for t in teeth]
    centres = np.array([np.average(values[t], weights=counts[t]) for t in teeth])
    spacing = np.diff(centres)
    if spacing.min() <= 2 * max(widths):  # no clear comb: a dense bulk with a hole in it
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
    if not used.any():
        return rough
    return float((mass[used] * k[used] * centres[used]).sum() / (mass[used] * k[used] ** 2).sum())


def clock_step(ticks: np.ndarray) -> tuple[float, str]:
    """(the TSC's step in ticks, how it was found) from repeated readings of one short interval.
    Read from the bulk: a comb's tooth spacing, else the typical spacing of its distinct values
    (1 or 2 ticks on a fine clock); with one value only in the bulk, the greatest common divisor
    of every distinct reading's distance from it (a coarse clock that never jittered); 1 tick
    when nothing tells."""
    return _step_of(*_values(ticks))


def _step_of(ticks: np.ndarray, values: np.ndarray, counts: np.ndarray) -> tuple[float, str]:
    """clock_step on readings already split into the bulk's values and counts."""
    if values.size >= 2:
        comb = _comb_step(values, counts)
        if comb is not None:
            return comb, "comb: spacing of the bulk's teeth"
        return float(np.median(np.diff(values))), "spacing of the bulk's distinct values"
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
