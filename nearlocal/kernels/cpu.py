"""Timed CPU kernels: each repetition is bracketed by fenced rdtscp inside the compiled loop.

Every kernel has the same signature so the registry can treat them alike:
`kernel(src, dst, frags, samples, sink)` where `frags` is an int64 (n, 3) table of
(src offset, dst offset, length), `samples` receives the TSC ticks of each repetition and
`sink[0]` keeps read results live. What is inside the timed interval is stated per kernel; the
preparation that sets the cache state (warm pass, flush) is outside it.
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
    nt_read_range,
    nt_write_range,
    read_range,
    sfence,
    tsc_begin,
    tsc_end,
    write_clwb_range,
    write_range,
)

STORE_PATTERN = np.uint64(0x5A5A5A5A5A5A5A5A)


@njit(cache=True)
def _warm_reads(src, frags):
    acc = np.uint64(0)
    for i in range(frags.shape[0]):
        acc ^= read_range(src, frags[i, 0], frags[i, 2])
    return acc


@njit(cache=True)
def _flush_src(src, frags):
    for i in range(frags.shape[0]):
        clflush_range(src, frags[i, 0], frags[i, 2])
    mfence()


@njit(cache=True)
def timer_overhead(src, dst, frags, samples, sink):
    """An empty interval: what the timer itself adds to every sample."""
    for r in range(samples.size):
        t0 = tsc_begin()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_load(src, dst, frags, samples, sink):
    """Warm read: one untimed pass, then each repetition reads every fragment of src."""
    acc = _warm_reads(src, frags)
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            acc ^= read_range(src, frags[i, 0], frags[i, 2])
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=True)
def time_nt_load(src, dst, frags, samples, sink):
    """Cold streaming read: lines flushed (untimed), then movntdqa over every fragment."""
    acc = np.uint64(0)
    for r in range(samples.size):
        _flush_src(src, frags)
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            acc ^= nt_read_range(src, frags[i, 0], frags[i, 2])
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=True)
def time_clflush_load(src, dst, frags, samples, sink):
    """Beluga's coherent read of a non-coherent pool: clflush every line, mfence, load — all timed."""
    acc = _warm_reads(src, frags)
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            clflush_range(src, frags[i, 0], frags[i, 2])
        mfence()
        for i in range(frags.shape[0]):
            acc ^= read_range(src, frags[i, 0], frags[i, 2])
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=True)
def time_clflushopt_load(src, dst, frags, samples, sink):
    """As clflush-load with clflushopt (weakly ordered, so an sfence before the loads)."""
    acc = _warm_reads(src, frags)
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            clflushopt_range(src, frags[i, 0], frags[i, 2])
        sfence()
        for i in range(frags.shape[0]):
            acc ^= read_range(src, frags[i, 0], frags[i, 2])
        t1 = tsc_end()
        samples[r] = t1 - t0
    sink[0] = acc


@njit(cache=True)
def time_store(src, dst, frags, samples, sink):
    """Plain 64-byte stores into dst, mfence so they have left the store buffer."""
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            write_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
        mfence()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_nt_store(src, dst, frags, samples, sink):
    """Nontemporal (vmovntdq / movnti) stores into dst, then sfence: Beluga's write path."""
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            nt_write_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
        sfence()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_store_clwb(src, dst, frags, samples, sink):
    """Stores followed by clwb of every written line, then sfence: data written back to memory."""
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            write_clwb_range(dst, frags[i, 1], frags[i, 2], STORE_PATTERN)
        sfence()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_movdir64b(src, dst, frags, samples, sink):
    """64-byte direct stores (movdir64b) from src to dst, then sfence."""
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            movdir64b_range(dst, frags[i, 1], src, frags[i, 0], frags[i, 2])
        sfence()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def time_memcpy(src, dst, frags, samples, sink):
    """libc memcpy (LLVM's memcpy call) of every fragment, warm, mfence at the end."""
    sink[0] = _warm_reads(src, frags)
    for r in range(samples.size):
        t0 = tsc_begin()
        for i in range(frags.shape[0]):
            memcpy_range(dst, frags[i, 1], src, frags[i, 0], frags[i, 2])
        mfence()
        t1 = tsc_end()
        samples[r] = t1 - t0


@njit(cache=True)
def tsc_now():
    return tsc_end()
