"""Compiled pieces of the multi-thread methods: a spin barrier, per-method bodies, the threaded
timed kernel and the traffic kernel of loaded latency. All run with the GIL released (nogil), so
Python threads pinned to distinct CPUs run them truly in parallel.

A body (the pass of a method's declared ThreadForm) does one pass over fragments [lo, hi) of its
table, with its closing fence, and returns an xor of what it read (0 for writers). The timed
kernels bracket bodies with the same fenced rdtscp as kernels.cpu; what each interval contains is
stated on the kernel.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
from numba import njit

from nearlocal.kernels import cpu
from nearlocal.kernels.intrinsics import (
    fetch_add,
    load_acquire,
    pause,
    store_release,
    tsc_begin,
    tsc_end,
)
from nearlocal.kernels.thread_forms import ThreadForm

_sched_yield = ctypes.CDLL(None, use_errno=True).sched_yield
_sched_yield.argtypes = []
_sched_yield.restype = ctypes.c_int


@njit(nogil=True)
def barrier_wait(gate, target, yield_cpu=False):
    """Arrive, then wait until `target` arrivals: gate[0] counts every arrival of every round.
    Spins with pause, or with `yield_cpu` gives the CPU away (sched_yield) between looks: there
    may be more threads than cores (storage's request threads)."""
    fetch_add(gate, 0, np.uint64(1))
    while load_acquire(gate, 0) < target:
        if yield_cpu:
            _sched_yield()
        else:
            pause()


@njit(nogil=True)
def spin_ticks(ticks):
    """Busy-wait `ticks` TSC ticks (the injected delay between bursts)."""
    t0 = tsc_end()
    while tsc_end() - t0 < ticks:
        pause()


_threaded: dict[ThreadForm, Callable] = {}
_traffic: dict[ThreadForm, Callable] = {}


def threaded_kernel(form: ThreadForm) -> Callable:
    """kernel(src, dst, frags, gate, n_threads, starts, ends, sink): per repetition r, every
    thread meets the others on the barrier, then times one pass over its own fragments;
    starts[r] / ends[r] are absolute TSC readings, so the caller can take last end - first start.
    A warm method's untimed load_pass runs before the first barrier; its xor goes to sink[0].
    `form`: the method's, as it declared it (the kernel is built once per form)."""
    if form not in _threaded:
        run_pass, warm = form.body(), cpu.load_pass
        warm_first = form.warm  # a closure constant: numba prunes the branch
        if form.reads:
            @njit(nogil=True)
            def kernel(src, dst, frags, gate, n_threads, starts, ends, sink):
                acc = warm(src, dst, frags) if warm_first else np.uint64(0)  # one untimed pass
                for r in range(starts.size):
                    barrier_wait(gate, np.uint64(n_threads * (r + 1)))
                    t0 = tsc_begin()
                    acc ^= run_pass(src, dst, frags)
                    t1 = tsc_end()
                    starts[r] = t0
                    ends[r] = t1
                sink[0] = acc
        else:
            @njit(nogil=True)
            def kernel(src, dst, frags, gate, n_threads, starts, ends, sink):
                if warm_first:
                    sink[0] = warm(src, dst, frags)  # warm the source: one untimed read pass
                for r in range(starts.size):
                    barrier_wait(gate, np.uint64(n_threads * (r + 1)))
                    t0 = tsc_begin()
                    run_pass(src, dst, frags)
                    t1 = tsc_end()
                    starts[r] = t0
                    ends[r] = t1

        _threaded[form] = kernel
    return _threaded[form]


def traffic_kernel(form: ThreadForm) -> Callable:
    """traffic(src, dst, frags, delay_ticks, control, progress, slot): until control[0] != 0,
    one burst (one fragment, cycling through the table) then `delay_ticks` of spinning;
    progress[slot] counts finished bursts (release store, read by the measuring thread).
    `form`: the traffic method's declared form."""
    if form not in _traffic:
        run_pass = form.body()

        if form.reads:
            @njit(nogil=True)
            def burst(src, dst, frags, i):
                return run_pass(src, dst, frags[i:i + 1])
        else:
            @njit(nogil=True)
            def burst(src, dst, frags, i):
                run_pass(src, dst, frags[i:i + 1])
                return np.uint64(0)

        @njit(nogil=True)
        def traffic(src, dst, frags, delay_ticks, control, progress, slot):
            acc = np.uint64(0)
            done = np.uint64(0)
            n = frags.shape[0]
            i = 0
            while load_acquire(control, 0) == 0:
                acc ^= burst(src, dst, frags, i)
                done += np.uint64(1)
                store_release(progress, slot, done)
                i = i + 1 if i + 1 < n else 0
                if delay_ticks > 0:
                    spin_ticks(delay_ticks)
            return acc

        _traffic[form] = traffic
    return _traffic[form]


@njit(nogil=True)
def stop(control):
    store_release(control, 0, np.uint64(1))

