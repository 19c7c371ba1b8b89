"""The TSC as a clock: its frequency and the cost of one timed interval."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from nearlocal.kernels import cpu


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
    overhead_ticks: float  # median ticks of an empty fenced interval, subtracted from every sample
    quantum_ticks: float  # the step the TSC moves in (1 on bare metal, ~24 on some VMs)


def tick_quantum(ticks: np.ndarray) -> float:
    """The TSC's step from repeated readings of one short interval. A scaled (virtualised) TSC
    jitters by a tick around coarser steps, so values within 2 ticks are one step."""
    values = np.unique(np.asarray(ticks, dtype=np.float64))
    starts = values[np.concatenate([[True], np.diff(values) > 2])] if values.size else values
    return float(np.diff(starts).min()) if starts.size > 1 else 1.0


def measure_clock(reps: int = 20000) -> ClockCalibration:
    empty = np.zeros(1, np.uint8)
    frags = np.zeros((0, 3), np.int64)
    samples = np.zeros(reps, np.uint64)
    cpu.timer_overhead(empty, empty, frags, samples, np.zeros(1, np.uint64))  # compile, warm up
    cpu.timer_overhead(empty, empty, frags, samples, np.zeros(1, np.uint64))
    return ClockCalibration(float(np.median(samples)), tick_quantum(samples))


def measure_overhead_ticks(reps: int = 20000) -> float:
    """Median ticks of an empty fenced interval; subtracted from every sample."""
    return measure_clock(reps).overhead_ticks
