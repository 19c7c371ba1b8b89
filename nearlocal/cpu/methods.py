"""CPU access methods: each a numba kernel from kernels.cpu timed inside its own loop. Each
method declares its kernels once, where it registers (`_cpu`): its timed kernel and its one pass
(`CpuKernels`, the registry CPU_KERNELS), and its multi-thread form where it has one; nothing
looks a kernel up by a method's name.

Every CPU method takes `drain=before|none` (default `before`): whether each repetition starts
after an mfence has drained the previous one's stores (an isolated transfer) or right behind it
(back to back, bandwidth-bound, as likwid / MLC loops time). The row's `info` says which, and
what its timed interval contains.

A pass shorter than MIN_SAMPLE_STEPS steps of the clock and MIN_SAMPLE_OVERHEADS timer overheads
(a 64-byte load, 1-10 ns, on a VM whose TSC moves in ~10 ns steps) reads 0 or 1 step alone.
Where several passes in one interval measure the same thing as one pass, the sample holds
several (`passes_for`) and the figure is divided by them: back-to-back passes (drain=none, a
stream either way) and a method declared `batch_with_drain` (warm loads, and stores that end in
their own mfence: scripts/batch_check.py reads them alike batched and alone, 1.00-1.02x).
Elsewhere an isolated transfer is measured isolated, one pass per sample, however short: on a
2-vCPU Intel guest an nt-store of 16 KiB read 535 ns alone and 808 ns per pass in samples of 8
passes (the mfence between passes waits for the previous pass's nontemporal stores to reach
memory, which a lone sample's sfence does not), so a batch there is a different measurement, not
a finer one. Its row then says how many clock steps a sample spans (`sample_steps`). The passes
are chosen once per case, by its first process, and every later process takes them
(SessionContext.chosen): every sample of a case measures the same thing. The row states them
(`ops_per_sample`, info `passes_per_sample`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nearlocal.core.methods import Delivery, Method, SessionContext, register_method
from nearlocal.cpu.movers import with_movers
from nearlocal.cpu.threads import threaded
from nearlocal.errors import UsageError
from nearlocal.kernels.thread_forms import ThreadForm
from nearlocal.lazy import lazy_import
from nearlocal.plugins import declare

kernels = lazy_import("nearlocal.kernels.cpu")  # numba loads when a session first runs a kernel

MIN_SAMPLE_STEPS = 200  # clock steps one sample spans at least: its quantisation under 0.5%
MIN_SAMPLE_OVERHEADS = 20  # timer overheads one sample spans at least (1-tick clocks)
MAX_PASSES = 4096
CALIBRATION_SAMPLES = 5
DRAIN_SAMPLES = 51

DRAINS = {
    "before": "mfence before each repetition: one isolated transfer per sample",
    "none": "no drain between repetitions: back to back, earlier stores may still be draining",
}


def check_params(params: dict) -> None:
    """drain must be one of DRAINS: a one-line usage error otherwise."""
    drain = str(params.get("drain", "before"))
    if drain not in DRAINS:
        raise UsageError(f"drain={drain!r} is not valid: use drain={' or drain='.join(DRAINS)}")


def passes_for(take: Callable[[np.ndarray, int], None], overhead_ticks: float,
               quantum_ticks: float) -> int:
    """Passes per timed interval (a power of two, so that processes rarely differ) for a sample
    to span MIN_SAMPLE_STEPS clock steps and MIN_SAMPLE_OVERHEADS timer overheads. `take(ticks,
    passes)` fills ticks with samples of that many passes. A pass well over the target costs one
    sample to rule out; a short one is refined over a few rounds (its first reading is mostly
    steps of the clock)."""
    target = max(MIN_SAMPLE_STEPS * quantum_ticks, MIN_SAMPLE_OVERHEADS * overhead_ticks, 1.0)
    one = np.empty(1, np.uint64)
    take(one, 1)
    if float(one[0]) - overhead_ticks >= 4 * target:
        return 1
    passes = 1
    for _ in range(3):
        ticks = np.empty(CALIBRATION_SAMPLES, np.uint64)
        take(ticks, passes)
        body = max(float(np.median(ticks)) - overhead_ticks, quantum_ticks, 1.0)
        if body >= target or passes >= MAX_PASSES:
            break
        passes = min(MAX_PASSES, 1 << math.ceil(math.log2(passes * target / body)))
    return passes


class CpuSession:
    """Runs one kernel over the case's fragment table; ticks -> ns by the TSC frequency.
    `batched`: the kernel takes `passes` (kernels.cpu); a plugin's own kernel need not."""

    clock = "tsc"

    def __init__(self, kernel: Callable, timed: str, ctx: SessionContext, batched: bool = False,
                 batch_with_drain: bool = False):
        check_params(ctx.params)
        self.kernel = kernel  # the method's own, as it declared it (kernels.cpu's, a plugin's)
        self.ctx = ctx
        self.sink = np.zeros(1, np.uint64)
        drain = str(ctx.params.get("drain", "before"))
        self.drain = drain == "before"
        # The empty interval subtracted (timer_overhead_ticks) is the same for both drains: the
        # mfence of drain=before lies before the first rdtscp, outside the interval.
        self.passes = self.ops_per_sample = 1
        self.batched = batched
        # several passes per interval only where they measure what one pass does (module doc)
        given = ctx.chosen or {}  # what the case's first process chose: taken as it is
        if batched and (batch_with_drain or not self.drain):
            self.passes = self.ops_per_sample = int(given.get("passes") or passes_for(
                self._take, ctx.timer_overhead_ticks, ctx.clock_quantum_ticks))
        # with drain=before the passes after the first start after an mfence inside the interval:
        # its cost when nothing is pending is measured (by the case's first process) and
        # subtracted with the timer overhead
        self.drain_ticks = float(given["drain_ticks"] if "drain_ticks" in given
                                 else self.drain_ticks_for(self.passes))
        self.chosen = {"passes": self.passes, "drain_ticks": self.drain_ticks}
        timed = f"{timed}; {DRAINS[drain]}"
        if self.passes > 1:
            timed += (f"; {self.passes} passes per timed interval, ns per pass (one spans under "
                      f"{MIN_SAMPLE_STEPS} clock steps)"
                      + ("; an mfence before each pass, its idle cost subtracted" if self.drain
                         else ""))
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "kernel": kernel.__name__,
                     "drain": drain, "passes_per_sample": self.passes,
                     "drain_overhead_ticks": self.drain_ticks, "timed": timed}

    def drain_ticks_for(self, passes: int) -> float:
        """The idle cost of the mfences between `passes` passes of one interval (drain=before)."""
        if passes < 2 or not self.drain:
            return 0.0
        ticks = np.empty(DRAIN_SAMPLES, np.uint64)
        kernels.time_drains(ticks, passes)
        return max(float(np.median(ticks)) - self.ctx.timer_overhead_ticks, 0.0)

    def _take(self, ticks: np.ndarray, passes: int) -> None:
        self.kernel(self.ctx.src.array, self.ctx.dst.array, self.ctx.pattern.frags, ticks,
                    self.sink, self.drain, passes)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        if self.batched:
            self._take(ticks, self.passes)
        else:  # a plugin's kernel may take no `passes`
            self.kernel(self.ctx.src.array, self.ctx.dst.array, self.ctx.pattern.frags, ticks,
                        self.sink, self.drain)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks
                        - self.drain_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz / self.passes

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CpuKernels:
    """A CPU method's compiled code, declared where it registers, each a function of no arguments
    returning the kernel (so registering imports no numba): `timed`, the timed kernel
    (`kernel(src, dst, frags, samples, sink, drain[, passes])`); `one_pass`, one untimed
    repetition (`pass(src, dst, frags)`), what the timed interval contains."""

    timed: Callable[[], Callable]
    one_pass: Callable[[], Callable]


CPU_KERNELS: dict[str, CpuKernels] = {}  # the built-in CPU methods' kernels, by method


def _cpu(name: str, code: CpuKernels, accesses: tuple[str, ...], state: str, summary: str,
         flags: tuple[str, ...] = (), roles: tuple[str, ...] = (), batched: bool = True,
         peer: bool = False, cacheable: bool = False, batch_with_drain: bool = False,
         cacheable_loads: bool | None = None,
         threads: tuple[bool, bool, str] | None = None) -> Method:
    """One CPU method, declared once with its kernels (`code`) and, if it has a multi-thread
    form (--threads, movers=k), that form's `reads`, `warm` and `timed` (`threads`; its body is
    the method's own pass: kernels.thread_forms.ThreadForm). peer: the kernel moves bytes
    between the region and the peer (a copy); the others only load the region or store a
    constant into it.
    batched: the kernel takes `passes`; batch_with_drain: passes drained by an mfence between
    them give the figure one isolated pass gives (docs/timing.md has the check), so a short
    isolated pass may be batched."""
    declare(CPU_KERNELS, name, code, "CPU method")
    form = ThreadForm(*threads, body=code.one_pass) if threads else None
    # threaded: --threads N / --cpus (cpu.threads); with_movers: movers=k (cpu.movers)
    return register_method(with_movers(threaded(Method(
        name=name, marker="cpu", summary=summary, accesses=accesses, state=state,
        open_session=lambda ctx, timed=summary: CpuSession(
            code.timed(), timed, ctx, batched, batch_with_drain),
        cpu_flags=("rdtscp", *flags), markers=("cpu",), params={"drain": "before"},
        check_params=check_params, suites=("quick",), pool_roles=frozenset(roles),
        touches_peer=peer, cacheable=cacheable, cacheable_loads=cacheable_loads,
        delivery=Delivery("cpu", "one") if peer else None,  # a copy lands the bytes in the peer
    ), form), form))


_cpu("load", CpuKernels(lambda: kernels.time_load, lambda: kernels.load_pass), ("read",),
     "warm", "64-byte vector loads, warm (one untimed pass first)", roles=("read", "bandwidth"),
     cacheable=True, batch_with_drain=True,
     threads=(True, True, "64-byte vector loads of the thread's share, warm"))
_cpu("store", CpuKernels(lambda: kernels.time_store, lambda: kernels.store_pass), ("write",),
     "warm", "64-byte vector stores, then mfence", roles=("bandwidth",), cacheable=True,
     batch_with_drain=True,  # its own mfence already drains each pass: batched reads alike
     threads=(False, False, "64-byte vector stores to the thread's share, then mfence"))
_cpu("nt-store", CpuKernels(lambda: kernels.time_nt_store, lambda: kernels.nt_store_pass),
     ("write",), "warm", "nontemporal stores (vmovntdq) of a constant, then sfence",
     roles=("bandwidth",),
     threads=(False, False, "nontemporal stores to the thread's share, then sfence"))
_cpu("nt-copy", CpuKernels(lambda: kernels.time_nt_copy, lambda: kernels.nt_copy_pass),
     ("write",), "warm",
     "loads from the peer (warm), nontemporal stores (vmovntdq) into the region, then sfence",
     peer=True, cacheable_loads=True,  # its stores reach memory, its loads of the peer need not
     threads=(False, True, "loads (warm) and nontemporal stores of the thread's share, then "
                           "sfence"))
_cpu("nt-load", CpuKernels(lambda: kernels.time_nt_load, lambda: kernels.nt_load_pass),
     ("read",), "cold",
     "nontemporal loads (vmovntdqa) of lines flushed beforehand (untimed)", ("sse4_1", "clflush"),
     roles=("read",), batched=False)  # its flush, per sample, is outside the interval
_cpu("clflush-load",
     CpuKernels(lambda: kernels.time_clflush_load, lambda: kernels.clflush_load_pass),
     ("read",), "warm",
     "clflush every line, mfence, then load: all timed (Beluga's read of a non-coherent pool)",
     ("clflush",), roles=("read",))
_cpu("clflushopt-load",
     CpuKernels(lambda: kernels.time_clflushopt_load, lambda: kernels.clflushopt_load_pass),
     ("read",), "warm", "clflushopt every line, mfence, then load: all timed", ("clflushopt",),
     roles=("read",))
_cpu("store-clwb", CpuKernels(lambda: kernels.time_store_clwb, lambda: kernels.store_clwb_pass),
     ("write",), "warm", "stores, clwb of every line, sfence: written back to memory", ("clwb",))
_cpu("movdir64b", CpuKernels(lambda: kernels.time_movdir64b, lambda: kernels.movdir64b_pass),
     ("write",), "warm",
     "64-byte direct stores (movdir64b) from the peer into the region, sfence", ("movdir64b",),
     peer=True, cacheable_loads=True)
_cpu("memcpy", CpuKernels(lambda: kernels.time_memcpy, lambda: kernels.memcpy_pass),
     ("write", "read"), "warm", "libc memcpy of every fragment, then mfence, the baseline",
     roles=("bandwidth", "read"), peer=True, cacheable=True,
     threads=(False, True, "libc memcpy of the thread's share (source warm), then mfence"))
