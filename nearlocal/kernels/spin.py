"""The one spin-wait with a deadline: every flag wait and completion poll of the rpc, rack and
rdma kernels (a response flag, a reader's acknowledgement, a work completion, a replay's next
event) and the record store's reader waiting out a write in progress spins through `spin_until`.

A wait is a `ready(args) -> (done, value)` function, compiled (njit, inline="always"), with its
arguments in one tuple; it is called once per spin until `done`. Every SPINS_PER_CHECK spins the
wait calls `stop(stop_args)` (a word another agent sets: the client's stop; `never` where there
is none) and reads the clock (`intrinsics.deadline_passed`). Everything here inlines into the
caller, so a timed wait holds the same instructions as with the loop written out.

SPINS_PER_CHECK is 1024, one value for every wait: a pause is 10 to 140 cycles and a CQ poll a
call of some tens of ns, so 1024 spins are about 5 to 100 us. An answer that comes sooner (an RPC
round trip, a handoff's acknowledgement, an RDMA completion: the figures these waits time) reads
the clock never, so no TSC read lands inside a timed interval; and the deadlines are safety nets
of milliseconds to seconds (a peer gone, a server's idle check), so seeing them up to 100 us late
changes nothing. The stop word is read as rarely, for the same reason: a non-coherent protocol's
read is a flush and a load, not free. (The rpc slots spun 1024 times per check, the rack and rdma
loops 256: no wait needed the finer check.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import deadline_passed, pause

SPINS_PER_CHECK = 1024
WAIT_READY, WAIT_STOPPED, WAIT_EXPIRED = 0, 1, 2  # why spin_until returned


@njit(cache=True, nogil=True, inline="always")
def never(args):
    """The stop check of a wait nothing else stops."""
    return False


@njit(cache=True, nogil=True, inline="always")
def spin_until(ready, args, limit_ticks, relax, stop, stop_args):
    """Spin until `ready(args)` says done: returns (WAIT_READY, its value, spins before it);
    (WAIT_STOPPED, ...) when `stop(stop_args)` holds at a check; (WAIT_EXPIRED, ...) once
    `limit_ticks` TSC ticks have passed since the first check (so a fast wait reads no clock).
    `relax`: a pause between spins (flag waits: the sibling hyperthread and the memory bus get
    the cycles); False where each spin is already a call (a CQ poll through the provider)."""
    spins = 0
    start = np.uint64(0)
    while True:
        done, value = ready(args)
        if done:
            return WAIT_READY, value, spins
        if relax:
            pause()
        spins += 1
        if spins % SPINS_PER_CHECK == 0:
            if stop(stop_args):
                return WAIT_STOPPED, value, spins
            start, passed = deadline_passed(start, limit_ticks)
            if passed:
                return WAIT_EXPIRED, value, spins
