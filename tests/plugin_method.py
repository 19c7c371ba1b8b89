"""A third-party CPU method as a plugin adds one (NEARLOCAL_PLUGINS=tests.plugin_method): its
kernel and its one registration, nothing else. Declaring `suites` and `pool_roles` is what puts
it in `quick` and on the pool regions."""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.core.methods import Method, register_method
from nearlocal.cpu.methods import CpuSession
from nearlocal.kernels.intrinsics import read_range, tsc_begin, tsc_begin_nodrain, tsc_end


@njit(cache=False)
def time_unwarmed_load(src, dst, frags, samples, sink, drain=True):
    """64-byte vector loads of every fragment, with no untimed warm-up pass before the first."""
    acc = np.uint64(0)
    for r in range(samples.size):
        t0 = tsc_begin() if drain else tsc_begin_nodrain()
        for i in range(frags.shape[0]):
            acc ^= read_range(src, frags[i, 0], frags[i, 2])
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


register_method(Method(
    cacheable=True,
    name="unwarmed-load", family="cpu", accesses=("read",), state="warm",
    summary="64-byte vector loads, no warm-up pass (a plugin's method)",
    open_session=lambda ctx: CpuSession(time_unwarmed_load, "loads, no warm-up pass", ctx),
    cpu_flags=("rdtscp",), markers=("cpu",), params={"drain": "before"},
    suites=("quick",), pool_roles=frozenset({"read"}),
))
