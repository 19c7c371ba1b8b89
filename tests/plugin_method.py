"""A third-party CPU method as a plugin adds one (NEARLOCAL_PLUGINS=tests.plugin_method): its
kernel and its one registration, nothing else. Declaring `suites` and `pool_roles` is what puts
it in `quick` and on the pool regions; handing `threaded` a ThreadForm gives it `--threads`."""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.core.methods import Method, register_method
from nearlocal.cpu.methods import CpuSession
from nearlocal.cpu.threads import threaded
from nearlocal.kernels.intrinsics import read_range, tsc_begin, tsc_begin_nodrain, tsc_end
from nearlocal.kernels.thread_forms import ThreadForm


@njit(cache=False, nogil=True, inline="always")
def unwarmed_load_pass(src, dst, frags):
    """One pass of loads over the fragments (all, or a thread's share): the xor read."""
    acc = np.uint64(0)
    for i in range(frags.shape[0]):
        acc ^= read_range(src, frags[i, 0], frags[i, 2])
    return acc


@njit(cache=False)
def time_unwarmed_load(src, dst, frags, samples, sink, drain=True):
    """64-byte vector loads of every fragment, with no untimed warm-up pass before the first."""
    acc = np.uint64(0)
    for r in range(samples.size):
        t0 = tsc_begin() if drain else tsc_begin_nodrain()
        acc ^= unwarmed_load_pass(src, dst, frags)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


register_method(threaded(Method(
    cacheable=True,
    name="unwarmed-load", marker="cpu", accesses=("read",), state="warm",
    summary="64-byte vector loads, no warm-up pass (a plugin's method)",
    open_session=lambda ctx: CpuSession(time_unwarmed_load, "loads, no warm-up pass", ctx),
    cpu_flags=("rdtscp",), markers=("cpu",), params={"drain": "before"},
    suites=("quick",), pool_roles=frozenset({"read"}),
), ThreadForm(reads=True, warm=False, body=lambda: unwarmed_load_pass,
              timed="64-byte vector loads of the thread's share, no warm-up pass")))
