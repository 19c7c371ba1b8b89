"""The compiled loop of a replay's movers (`nearlocal replay`): each mover, a Python thread pinned
to its own CPU running this with the GIL released, takes the next request in arrival order from a
shared counter (lock xadd), waits in compiled code for the request's arrival time on the TSC, then
gathers the request's fragments with the memcpy pass and brackets that with fenced rdtscp. A FIFO
queue with G servers, all of it in compiled code: no Python between a request's arrival and its
first byte, so the wait it records is the queue's, not the interpreter's."""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.cpu import memcpy_pass
from nearlocal.kernels.intrinsics import fetch_add, pause, tsc_begin, tsc_end


@njit(nogil=True)
def replay_mover(src, dst, frags, first, arrivals, next_request, starts, ends, served_by, mover,
                 sink):
    """Serve requests until none is left: request i's fragments are frags[first[i]:first[i + 1]]
    (src offsets in the pool, dst offsets in this mover's own `dst`), due at TSC arrivals[i].
    starts[i] / ends[i]: the fenced rdtscp readings around its gather; served_by[i] = mover.
    The xor of the sink keeps the copies from being optimised away."""
    n = arrivals.size
    acc = np.uint64(0)
    while True:
        i = np.int64(fetch_add(next_request, 0, np.uint64(1)))
        if i >= n:
            break
        due = arrivals[i]
        while tsc_end() < due:
            pause()
        t0 = tsc_begin()
        memcpy_pass(src, dst, frags[first[i]:first[i + 1]])
        t1 = tsc_end()
        starts[i] = t0
        ends[i] = t1
        served_by[i] = mover
        acc ^= t1
    sink[0] = acc


@njit(nogil=True)
def read_tsc():
    """The TSC now (the replay's time zero is taken with the clock its movers read)."""
    return tsc_end()
