"""A plugin (NEARLOCAL_PLUGINS=tests.gate_plugin) with a REAL, known slowdown for checking the
regression gate (scripts/gate_check.sh). Test-only; never shipped.

`gate-load` and `gate-chase` time what `load` and `chase` time, inside the same kind of compiled
loop, plus a dependent multiply-add chain inside the timed interval whose length the session
sets at opening: (NEARLOCAL_GATE_SLOWDOWN - 1) times the case's own median body, from a short
calibration of both. The kernel really spends that factor of the time, with the machine's own
noise (a scaled copy of stored samples would not); at 1.0 the chain is empty and the code is the
same. The plugin adds `gate-load` at every quick size and `gate-chase` at the chase sizes to the quick suite.
"""

from __future__ import annotations

import os
import time

import numpy as np
from numba import njit

from nearlocal.harness.cases import Case
from nearlocal.harness.methods import Method, SessionContext, register_method
from nearlocal.harness.pool import CHASE_SIZES
from nearlocal.harness.suites import QUICK_SIZES, extend_suite
from nearlocal.kernels.chase_methods import ChaseSession
from nearlocal.kernels.cpu import load_pass
from nearlocal.kernels.intrinsics import tsc_begin, tsc_end
from nearlocal.units import format_size

SLOWDOWN_ENV = "NEARLOCAL_GATE_SLOWDOWN"


def slowdown() -> float:
    return float(os.environ.get(SLOWDOWN_ENV, "1.0"))


LCG_MUL, LCG_ADD = np.uint64(6364136223846793005), np.uint64(1442695040888963407)


@njit(cache=False, inline="always")
def _delay(iterations, x):
    """A dependent multiply-add chain: CPU time that scales with the core like the work does."""
    for _ in range(iterations):
        x = x * LCG_MUL + LCG_ADD
    return x


@njit(cache=False)
def time_delay(iterations, samples, sink):
    """Ticks of `iterations` steps of the delay chain per sample (its calibration)."""
    x = sink[0]
    for r in range(samples.size):
        t0 = tsc_begin()
        x = _delay(iterations, x)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = x


@njit(cache=False)
def time_load_stretched(src, frags, samples, sink, iterations):
    acc = load_pass(src, src, frags)  # the untimed warm-up pass
    for r in range(samples.size):
        t0 = tsc_begin()
        acc ^= load_pass(src, src, frags)
        acc = _delay(iterations, acc)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=False)
def time_chase_stretched(words, hops, samples, position, sink, iterations):
    p = np.uint64(position[0])
    x = np.uint64(0)
    for r in range(samples.size):
        t0 = tsc_begin()
        for _ in range(hops):
            p = words[p]
        x = _delay(iterations, x ^ p)
        t1 = tsc_end()
        samples[r] = t1 - t0
    position[0] = p
    sink[0] = x


def _median_ticks(take, overhead: float) -> float:
    """Median ticks of a sample less the timer overhead, over ~20 ms (at least 8 samples)."""
    n, start, got = 8, time.perf_counter(), []
    while True:
        ticks = np.empty(n, np.uint64)
        take(ticks)
        got.append(ticks.astype(np.float64) - overhead)
        if time.perf_counter() - start > 0.02 or n >= 1024:
            return float(np.median(np.concatenate(got)))
        n *= 2


def delay_iterations(body_ticks: float, extra: float, overhead: float) -> int:
    """Steps of the delay chain that add `extra` x body_ticks to each sample."""
    if extra <= 0:
        return 0
    sink = np.zeros(1, np.uint64)
    steps = 1 << 14
    per_step = _median_ticks(lambda t: time_delay(steps, t, sink), overhead) / steps
    return max(1, round(extra * body_ticks / per_step))


class GateLoadSession:
    clock = "tsc"

    def __init__(self, ctx: SessionContext):
        self.ctx = ctx
        self.sink = np.zeros(1, np.uint64)
        overhead = float(ctx.timer_overhead_ticks)
        self.iterations = 0
        body = _median_ticks(self._take, overhead)
        self.iterations = delay_iterations(body, slowdown() - 1.0, overhead)
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "slowdown": slowdown(),
                     "delay_steps": self.iterations}

    def _take(self, ticks: np.ndarray) -> None:
        time_load_stretched(self.ctx.src.array, self.ctx.pattern.frags, ticks, self.sink,
                            self.iterations)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        self._take(ticks)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz

    def close(self) -> None:
        pass


class GateChaseSession(ChaseSession):
    def __init__(self, ctx: SessionContext):
        super().__init__(ctx)
        self.sink = np.zeros(1, np.uint64)
        overhead = float(ctx.timer_overhead_ticks)
        self.iterations = 0
        body = _median_ticks(self._take, overhead)
        self.iterations = delay_iterations(body, slowdown() - 1.0, overhead)
        self.info.update(slowdown=slowdown(), delay_steps=self.iterations)

    def _take(self, ticks: np.ndarray) -> None:
        time_chase_stretched(self.ring.words, self.hops, ticks, self.ring.position, self.sink,
                             self.iterations)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        self._take(ticks)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz / self.hops


register_method(Method(
    name="gate-load", family="cpu", summary="test only: load, then a spin of (slowdown-1) x",
    accesses=("read",), state="warm", open_session=GateLoadSession, cpu_flags=("rdtscp",)))
register_method(Method(
    name="gate-chase", family="cpu", summary="test only: chase, then a spin of (slowdown-1) x",
    accesses=("read",), state="warm", open_session=GateChaseSession, cpu_flags=("rdtscp",),
    params={"hops": "4096", "seed": "1"}, stores_in_region=True))


def _gate_cases() -> list[Case]:
    return ([Case("gate-load", "dram", "wb", format_size(size)) for size in QUICK_SIZES]
            + [Case("gate-chase", "dram", "wb", size) for size in CHASE_SIZES])


extend_suite("quick", _gate_cases)
