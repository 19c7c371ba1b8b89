"""Timed CPU kernels: each repetition is bracketed by fenced rdtscp inside the compiled loop.

Every kernel has the same signature so the registry can treat them alike:
`kernel(src, dst, frags, samples, sink, drain=True, passes=1)` where `frags` is an int64 (n, 3)
table of (src offset, dst offset, length), `samples` receives the TSC ticks of each repetition and
`sink[0]` keeps read results live. What is inside the timed interval is stated per kernel; the
preparation that sets the cache state (warm pass, flush) is outside it.

`passes`: how many passes over the fragment table one timed interval holds. A pass shorter than
a couple of hundred clock steps (a 64-byte load on a VM whose TSC moves in 10 ns steps) is
unresolvable alone: its sample would read 0 or 1 step. The session (cpu/methods.py) sets
passes so a sample spans enough steps and divides the figure by it. nt-load has no `passes`:
its cold state is set per sample, outside the interval, and a flush between passes would be timed.

`drain` says where a repetition starts. True (`drain=before`, the default): an `mfence` before
the first `rdtscp` waits until the previous repetition's stores have left the core, so each
sample is one isolated transfer (what the papers' single-operation figures time); within a
sample of several passes an `mfence` inside the interval drains each pass before the next. False
(`drain=none`): repetitions run back to back as a likwid / MLC / plain C loop runs them, so
nontemporal stores still draining from the previous repetition slow this one: a streaming,
bandwidth-bound figure. Either way the fences a method itself needs (the `sfence` after
nontemporal stores, the `mfence` after flushes) stay inside the interval.

The `*_pass` functions are one untimed repetition over a fragment table, fences included, each
returning a word to keep live (a load's xor; 0 for a store); the timed kernels are one
parameterised kernel (`_timed`) around them, and a multi-threaded harness can give each thread
its own slice of fragments and run the same pass.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import (
    clflush_range,
    clflushopt_range,
    memcpy_range,
    mfence,
    movdir64b_range,
    nt_copy_range,
    nt_read_range,
    nt_write_range,
    read_range,
    sfence,
    tsc_begin,
    tsc_begin_nodrain,
    tsc_end,
    write_clwb_range,
    write_range,
)

STORE_PATTERN = np.uint64(0x5A5A5A5A5A5A5A5A)


@njit(cache=True, inline="always")
def _begin(drain):
    """Start a timed interval: drained (mfence first) or back to back."""
    if drain:
        return tsc_begin()
    return tsc_begin_nodrain()


@njit(cache=True, inline="always")
def _between(drain, k):
    """Before pass k of one timed interval: with drain, pass k > 0 starts after an mfence (inside
    the interval) as the first starts after _begin's, so each pass is an isolated transfer."""
    if drain and k > 0:
        mfence()


@njit(cache=True)
def _flush_src(src, frags):
    for i in range(frags.shape[0]):
        clflush_range(src, frags[i, 0], frags[i, 2])
    mfence()


# ---------------------------------------------------------------------------------------------
# One repetition each (untimed): what a timed interval contains, between the two rdtscp.


@njit(cache=True, inline="always")
def load_pass(src, dst, frags):
    """64-byte vector loads of every fragment of src; returns their xor (keep it live)."""
    acc = np.uint64(0)
    for i in range(frags.shape[0]):
        acc ^= read_range(src, frags[i, 0], frags[i, 2])
    return acc


@njit(cache=True, inline="always")
def nt_load_pass(src, dst, frags):
    """movntdqa loads of every fragment of src; returns their xor."""
    acc = np.uint64(0)
    for i in range(frags.shape[0]):
        acc ^= nt_read_range(src, frags[i, 0], frags[i, 2])
    return acc


@njit(cache=True, inline="always")
def clflush_load_pass(src, dst, frags):
    """clflush every line of src, mfence, then load it all; returns the xor."""
    for i in range(frags.shape[0]):
        clflush_range(src, frags[i, 0], frags[i, 2])
    mfence()
    return load_pass(src, dst, frags)


@njit(cache=True, inline="always")
def clflushopt_load_pass(src, dst, frags):
    """clflushopt every line, mfence, then load. clflushopt is weakly ordered and an sfence does
    not order later loads, so only an mfence keeps the loads from hitting lines not yet flushed."""
    for i in range(frags.shape[0]):
        clflushopt_range(src, frags[i, 0], frags[i, 2])
    mfence()
    return load_pass(src, dst, frags)


@njit(cache=True, inline="always")
def store_pass(src, dst, frags):
    """64-byte vector stores of a constant into every fragment of dst, then mfence."""
    for i in range(frags.shape[0]):
        write_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
    mfence()
    return np.uint64(0)


@njit(cache=True, inline="always")
def nt_store_pass(src, dst, frags):
    """Nontemporal stores (vmovntdq / movnti) of a constant into dst, then sfence."""
    for i in range(frags.shape[0]):
        nt_write_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
    sfence()
    return np.uint64(0)


@njit(cache=True, inline="always")
def nt_copy_pass(src, dst, frags):
    """Loads from src, nontemporal stores of the same bytes into dst, then sfence."""
    for i in range(frags.shape[0]):
        nt_copy_range(dst, frags[i, 1], src, frags[i, 0], frags[i, 2])
    sfence()
    return np.uint64(0)


@njit(cache=True, inline="always")
def store_clwb_pass(src, dst, frags):
    """Stores, clwb of every line written, then sfence."""
    for i in range(frags.shape[0]):
        write_clwb_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
    sfence()
    return np.uint64(0)


@njit(cache=True, inline="always")
def movdir64b_pass(src, dst, frags):
    """64-byte direct stores (movdir64b) from src to dst, then sfence."""
    for i in range(frags.shape[0]):
        movdir64b_range(dst, frags[i, 1], src, frags[i, 0], frags[i, 2])
    sfence()
    return np.uint64(0)


@njit(cache=True, inline="always")
def memcpy_pass(src, dst, frags):
    """LLVM's memcpy of every fragment, then mfence."""
    for i in range(frags.shape[0]):
        memcpy_range(dst, frags[i, 1], src, frags[i, 0], frags[i, 2])
    mfence()
    return np.uint64(0)


# ---------------------------------------------------------------------------------------------
# Timed kernels


@njit(cache=True)
def timer_overhead(src, dst, frags, samples, sink, drain=True):
    """An empty interval: what the timer itself adds to every sample."""
    for r in range(samples.size):
        t0 = _begin(drain)
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_drains(samples, passes):
    """An interval of `passes` passes that move nothing, drained as drain=before drains them: the
    mfences between passes that a batched sample adds to its transfers (subtracted, as the timer
    overhead is; a single pass's drain lies before the interval)."""
    for r in range(samples.size):
        t0 = _begin(True)
        for k in range(passes):
            _between(True, k)
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True, inline="always")
def _timed(run_pass, warm, flush_each, src, dst, frags, samples, sink, drain, passes):
    """The one timed kernel every `time_*` below is: each repetition `passes` passes of
    `run_pass` between _begin and tsc_end, their xor kept live in sink[0]. `warm`: one untimed
    load pass over src first. `flush_each`: src's lines flushed before each repetition
    (untimed), and one pass per interval (a second would find them cached). The named kernels
    pass `run_pass` and the two flags as constants, and this inlines into each, so each
    compiles to the loop written out for its pass alone."""
    acc = load_pass(src, dst, frags) if warm else np.uint64(0)  # the untimed warm-up pass
    for r in range(samples.size):
        if flush_each:
            _flush_src(src, frags)
        t0 = _begin(drain)
        for k in range(1 if flush_each else passes):
            _between(drain, k)
            acc ^= run_pass(src, dst, frags)
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=True)
def time_load(src, dst, frags, samples, sink, drain=True, passes=1):
    """Warm read: one untimed pass, then each repetition reads every fragment of src."""
    _timed(load_pass, True, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_nt_load(src, dst, frags, samples, sink, drain=True):
    """Cold streaming read: lines flushed (untimed), then movntdqa over every fragment."""
    _timed(nt_load_pass, False, True, src, dst, frags, samples, sink, drain, 1)


@njit(cache=True)
def time_clflush_load(src, dst, frags, samples, sink, drain=True, passes=1):
    """Beluga's coherent read of a non-coherent pool: clflush every line, mfence, load — all timed."""
    _timed(clflush_load_pass, True, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_clflushopt_load(src, dst, frags, samples, sink, drain=True, passes=1):
    """As clflush-load with clflushopt, and an mfence (not sfence) between flushes and loads."""
    _timed(clflushopt_load_pass, True, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_store(src, dst, frags, samples, sink, drain=True, passes=1):
    """Plain 64-byte stores into dst, mfence so they have left the store buffer."""
    _timed(store_pass, False, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_nt_store(src, dst, frags, samples, sink, drain=True, passes=1):
    """Nontemporal (vmovntdq / movnti) stores into dst, then sfence: Beluga's write path."""
    _timed(nt_store_pass, False, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_nt_copy(src, dst, frags, samples, sink, drain=True, passes=1):
    """Beluga's CPU write path as a copy: loads from src (warm: one untimed read pass),
    nontemporal stores into dst, sfence."""
    _timed(nt_copy_pass, True, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_store_clwb(src, dst, frags, samples, sink, drain=True, passes=1):
    """Stores followed by clwb of every written line, then sfence: data written back to memory."""
    _timed(store_clwb_pass, False, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_movdir64b(src, dst, frags, samples, sink, drain=True, passes=1):
    """64-byte direct stores (movdir64b) from src to dst, then sfence."""
    _timed(movdir64b_pass, False, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def time_memcpy(src, dst, frags, samples, sink, drain=True, passes=1):
    """libc memcpy (LLVM's memcpy call) of every fragment, warm, mfence at the end."""
    _timed(memcpy_pass, True, False, src, dst, frags, samples, sink, drain, passes)


@njit(cache=True)
def tsc_now():
    return tsc_end()
