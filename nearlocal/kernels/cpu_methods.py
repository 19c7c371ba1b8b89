"""CPU access methods: each a numba kernel from kernels.cpu timed inside its own loop.

Every CPU method takes `drain=before|none` (default `before`): whether each repetition starts
after an mfence has drained the previous one's stores (an isolated transfer) or right behind it
(back to back, bandwidth-bound, as likwid / MLC loops time). The row's `info` says which, and
what its timed interval contains.
"""

from __future__ import annotations

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.harness.methods import Method, SessionContext, register_method
from nearlocal.harness.threads import threaded

DRAINS = {
    "before": "mfence before each repetition: one isolated transfer per sample",
    "none": "no drain between repetitions: back to back, earlier stores may still be draining",
}


def check_params(params: dict) -> None:
    """drain must be one of DRAINS: a one-line usage error otherwise."""
    drain = str(params.get("drain", "before"))
    if drain not in DRAINS:
        raise UsageError(f"drain={drain!r} is not valid: use drain={' or drain='.join(DRAINS)}")


class CpuSession:
    """Runs one kernel over the case's fragment table; ticks -> ns by the TSC frequency."""

    clock = "tsc"

    def __init__(self, kernel_name: str, timed: str, ctx: SessionContext):
        from nearlocal.kernels import cpu

        check_params(ctx.params)
        # a kernel of kernels.cpu by name, or a kernel function (a plugin's own)
        self.kernel = getattr(cpu, kernel_name) if isinstance(kernel_name, str) else kernel_name
        self.ctx = ctx
        self.sink = np.zeros(1, np.uint64)
        drain = str(ctx.params.get("drain", "before"))
        self.drain = drain == "before"
        # The empty interval subtracted (timer_overhead_ticks) is the same for both drains: the
        # mfence of drain=before lies before the first rdtscp, outside the interval.
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "kernel": kernel_name,
                     "drain": drain, "timed": f"{timed}; {DRAINS[drain]}"}

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.empty(n, np.uint64)
        self.kernel(self.ctx.src.array, self.ctx.dst.array, self.ctx.pattern.frags, ticks,
                    self.sink, self.drain)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz

    def close(self) -> None:
        pass


def _cpu(name: str, kernel: str, accesses: tuple[str, ...], state: str, summary: str,
         flags: tuple[str, ...] = (), roles: tuple[str, ...] = ()) -> Method:
    return register_method(threaded(Method(  # threaded: --threads N / --cpus (harness.threads)
        name=name, family="cpu", summary=summary, accesses=accesses, state=state,
        open_session=lambda ctx, kernel=kernel, timed=summary: CpuSession(kernel, timed, ctx),
        cpu_flags=("rdtscp", *flags), markers=("cpu",), params={"drain": "before"},
        check_params=check_params, suites=("quick",), pool_roles=frozenset(roles),
    )))


_cpu("load", "time_load", ("read",), "warm",
     "64-byte vector loads, warm (one untimed pass first)", roles=("read", "bandwidth"))
_cpu("store", "time_store", ("write",), "warm",
     "64-byte vector stores, then mfence", roles=("bandwidth",))
_cpu("nt-store", "time_nt_store", ("write",), "warm",
     "nontemporal stores (vmovntdq) of a constant, then sfence", roles=("bandwidth",))
_cpu("nt-copy", "time_nt_copy", ("write",), "warm",
     "loads from the peer (warm), nontemporal stores (vmovntdq) into the region, then sfence")
_cpu("nt-load", "time_nt_load", ("read",), "cold",
     "nontemporal loads (vmovntdqa) of lines flushed beforehand (untimed)", ("sse4_1", "clflush"),
     roles=("read",))
_cpu("clflush-load", "time_clflush_load", ("read",), "warm",
     "clflush every line, mfence, then load: all timed (Beluga's read of a non-coherent pool)",
     ("clflush",), roles=("read",))
_cpu("clflushopt-load", "time_clflushopt_load", ("read",), "warm",
     "clflushopt every line, mfence, then load: all timed", ("clflushopt",), roles=("read",))
_cpu("store-clwb", "time_store_clwb", ("write",), "warm",
     "stores, clwb of every line, sfence: written back to memory", ("clwb",))
_cpu("movdir64b", "time_movdir64b", ("write",), "warm",
     "64-byte direct stores (movdir64b) from the peer into the region, sfence", ("movdir64b",))
_cpu("memcpy", "time_memcpy", ("write", "read"), "warm",
     "libc memcpy of every fragment, then mfence, the baseline", roles=("bandwidth",))
