"""A plugin (NEARLOCAL_PLUGINS=tests.gate_plugin) with a REAL, known slowdown for checking the
regression gate (scripts/gate_check.sh). Test-only; never shipped.

`gate-load` and `gate-chase` are `load` and `chase` whose timed interval does
NEARLOCAL_GATE_SLOWDOWN times the work while the figure is divided by the work of one:
`gate-load` runs 1.3 x its passes per sample (whole passes, then a pass over the leading share of
the pattern's bytes, in whole cache lines), `gate-chase` walks 1.3 x its hops. The kernel really
spends that factor of the time, on the same lines in the same cache state, with the machine's own
noise acting on all of it (a scaled copy of stored samples would not, nor would a delay chain,
whose cost moves differently from the loads' when the host's load changes); at 1.0 it is `load`
and `chase` exactly. The plugin adds `gate-load` at every quick size and `gate-chase` at the
chase sizes to the quick suite, and declares the `gate` suite: those cases, their unchanged
twins and a few others (what scripts/gate_check.sh runs).
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

from nearlocal.core.cases import Case
from nearlocal.core.methods import Method, SessionContext, register_method
from nearlocal.core.suites import QUICK_SIZES, Suite, extend_suite, register_suite
from nearlocal.cpu.chase import ChaseSession
from nearlocal.cpu.methods import CpuSession
from nearlocal.cpu.pool import CHASE_SIZES
from nearlocal.kernels.chase import time_chase
from nearlocal.kernels.cpu import _begin, _between, load_pass
from nearlocal.kernels.intrinsics import tsc_end
from nearlocal.units import format_size

SLOWDOWN_ENV = "NEARLOCAL_GATE_SLOWDOWN"
NO_FRAGMENTS = np.zeros((0, 3), np.int64)


def slowdown() -> float:
    return float(os.environ.get(SLOWDOWN_ENV, "1.0"))


@njit(cache=True)  # compiled once, not in every worker process of a gate run
def time_load_more(src, dst, frags, share, samples, sink, drain, passes):
    """kernels.cpu.time_load whose interval also reads `share`, a leading part of the pattern,
    as one more pass (drained like the others)."""
    acc = load_pass(src, dst, frags)  # the untimed warm-up pass
    for r in range(samples.size):
        t0 = _begin(drain)
        for k in range(passes):
            _between(drain, k)
            acc ^= load_pass(src, dst, frags)
        if share.shape[0]:
            _between(drain, passes)
            acc ^= load_pass(src, dst, share)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


def leading_share(frags: np.ndarray, fraction: float) -> np.ndarray:
    """The fragments covering the first `fraction` of the table's bytes, cut at a cache line."""
    want = round(fraction * int(frags[:, 2].sum()) / 64) * 64
    rows = []
    for src_off, dst_off, length in frags.tolist():
        if want <= 0:
            break
        take = min(length, want)
        rows.append((src_off, dst_off, take))
        want -= take
    return np.array(rows, np.int64).reshape(-1, 3)


class GateLoadSession(CpuSession):
    """`load`'s session (its passes per sample, its drain) doing slowdown x its passes' work in
    each sample, its figure still per nominal pass."""

    def __init__(self, ctx: SessionContext):
        # while CpuSession finds the passes (calling _take), the interval holds plain passes
        self.whole: int | None = None
        self.share = NO_FRAGMENTS
        super().__init__("time_load", "64-byte vector loads, warm, x slowdown the work", ctx,
                         batched=True, batch_with_drain=True)  # as load: passes batched
        extra = (slowdown() - 1.0) * self.passes
        self.whole = self.passes + int(extra)
        self.share = leading_share(ctx.pattern.frags, extra - int(extra))
        # the mfences before every pass of the interval, their idle cost subtracted as load's
        self.drain_ticks = self.drain_ticks_for(self.whole + (1 if self.share.shape[0] else 0))
        work = (self.whole + self.share[:, 2].sum() / ctx.pattern.frags[:, 2].sum()) / self.passes
        self.info.update(slowdown=slowdown(), work_per_pass=float(work),
                         drain_overhead_ticks=self.drain_ticks)

    def _take(self, ticks: np.ndarray, passes: int) -> None:
        time_load_more(self.ctx.src.array, self.ctx.dst.array, self.ctx.pattern.frags, self.share,
                       ticks, self.sink, self.drain, passes if self.whole is None else self.whole)


class GateChaseSession(ChaseSession):
    """`chase` walking slowdown x its hops per sample, its figure still per nominal hop."""

    def __init__(self, ctx: SessionContext):
        super().__init__(ctx)
        self.walked = max(self.hops, round(self.hops * slowdown()))
        self.info.update(slowdown=slowdown(), hops_walked=self.walked)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        time_chase(self.ring.words, self.walked, ticks, self.ring.position)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz / self.hops


register_method(Method(
    name="gate-load", marker="cpu", summary="test only: load doing slowdown x the work",
    accesses=("read",), state="warm", open_session=GateLoadSession, cpu_flags=("rdtscp",),
    params={"drain": "before"}, touches_peer=False, cacheable=True))  # as load and chase
register_method(Method(
    name="gate-chase", marker="cpu", summary="test only: chase walking slowdown x the hops",
    accesses=("read",), state="warm", open_session=GateChaseSession, cpu_flags=("rdtscp",),
    params={"hops": "4096", "seed": "1"}, stores_in_region=True, touches_peer=False,
    cacheable=True, moves_bytes=False, measures="operation"))  # as chase: ns a hop, no bytes


def _gate_cases() -> list[Case]:
    return ([Case("gate-load", "dram", "wb", format_size(size)) for size in QUICK_SIZES]
            + [Case("gate-chase", "dram", "wb", size) for size in CHASE_SIZES])


def _twins() -> list[Case]:
    """The unchanged methods at the gate cases' sizes, and a few cases of other kinds
    (non-temporal stores, a copy, a store that reaches memory): what the gate must call the
    same when only the gate cases slowed, and what a slower box path moves."""
    return ([Case("load", "dram", "wb", format_size(size)) for size in QUICK_SIZES]
            + [Case("chase", "dram", "wb", size) for size in CHASE_SIZES]
            + [Case("nt-store", "dram", "wb", size) for size in ("1KiB", "16MiB")]
            + [Case("memcpy", "dram", "wb", "16MiB"), Case("store", "dram", "wb", "64MiB")])


extend_suite("quick", _gate_cases)
# scripts/gate_check.sh's suite: the gate cases and their twins, about a third of quick
register_suite(Suite("gate", "test only: gate-load / gate-chase, their unchanged twins and a "
                     "few others", [_gate_cases, _twins]))
