"""The two GPU clocks.

Device time (`timing=device`): CUDA events recorded around the work, with the work queued
behind a short blocking kernel (`kernels.spin`) so that the host's enqueue cost (Python, the
runtime API, launch) is not inside the interval - the method nvbandwidth and nvbench use. If the
blocking kernel has already finished when the host is done queueing (the start event has
completed), the sample is thrown away and the spin is lengthened; nothing is ever timed with the
GPU waiting on the host.

End-to-end time (`timing=e2e`): from the host's decision to move the fragments (fragment table
upload, launch or API calls included) to the data being usable at the destination (stream
synchronised), read on the host's monotonic clock (time.perf_counter_ns, CLOCK_MONOTONIC). The
interval is >100 us-class (launch + synchronisation alone are tens of microseconds), so a host
clock around the whole operation is accurate enough; it includes the Python-level cost of the
bindings (cupy, numba-cuda, cuda-bindings), which a C caller would not pay.

Each clock's own cost is measured and removed from the samples, as rdtscp's is on the CPU: the
device time of an empty interval (the two events back to back behind the blocking kernel), and
the host time of two back-to-back clock reads. Sessions record it as `timer_overhead_ns`, with
the clock's resolution as `clock_resolution_ns`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

MIN_SPIN_NS = 20_000
MAX_SPIN_NS = 500_000_000
TIMINGS = ("device", "e2e")
EVENT_RESOLUTION_NS = 500.0  # cudaEventElapsedTime: "a resolution of around 0.5 microseconds"
OVERHEAD_SAMPLES = 16


class EventTimer:
    """CUDA events around work queued behind the blocking kernel on `stream`."""

    def __init__(self, cp, stream, nb_stream, spin_out):
        self.cp = cp
        self.stream = stream  # cupy stream the work is queued on
        self.nb_stream = nb_stream  # the same stream as numba sees it
        self.spin_out = spin_out  # numba device array, 1 x uint64
        self.start = cp.cuda.Event()
        self.stop = cp.cuda.Event()
        self.spin_ns = MIN_SPIN_NS
        self.retries = 0
        self.overhead_ns = 0.0  # set by calibrate()
        from nearlocal.gpu import kernels  # numba-cuda: only where a GPU case runs

        self.kernels = kernels

    def queued(self, enqueue: Callable[[], None]) -> float:
        """Device ns of `enqueue()`'s work, run back to back behind the blocking kernel."""
        for _ in range(16):
            self.kernels.spin(self.spin_ns, self.spin_out, self.nb_stream)
            self.start.record(self.stream)
            t0 = time.perf_counter_ns()
            enqueue()
            self.stop.record(self.stream)
            host_ns = time.perf_counter_ns() - t0
            early = self.start.done  # the GPU reached the work before the host finished queueing
            self.stop.synchronize()
            if not early:
                return self.cp.cuda.get_elapsed_time(self.start, self.stop) * 1e6
            self.retries += 1
            self.spin_ns = min(max(2 * self.spin_ns, 2 * host_ns + MIN_SPIN_NS), MAX_SPIN_NS)
        raise RuntimeError("the blocking kernel kept finishing before the host had queued the "
                           f"work (spin {self.spin_ns} ns)")

    def unqueued(self, run: Callable[[], None], stream) -> float:
        """Device ns between events around synchronous calls, which cannot be queued behind a
        blocking kernel (each returns only when its copy is done): host gaps are included."""
        self.start.record(stream)
        run()
        self.stop.record(stream)
        self.stop.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.stop) * 1e6

    def calibrate(self, samples: int = OVERHEAD_SAMPLES) -> float:
        """The timer's own cost: median device ns of an empty interval behind the spin."""
        self.overhead_ns = float(np.median([self.queued(lambda: None) for _ in range(samples)]))
        return self.overhead_ns

    def info(self) -> dict:
        return {"spin_ns": self.spin_ns, "spin_retries": self.retries}


def host_clock_overhead_ns(samples: int = 1000) -> float:
    """Median ns between two back-to-back reads of the host's monotonic clock."""
    clock = time.perf_counter_ns
    gaps = np.empty(samples)
    for i in range(samples):
        t0 = clock()
        gaps[i] = clock() - t0
    return float(np.median(gaps))


def host_clock_resolution_ns() -> float:
    return time.get_clock_info("perf_counter").resolution * 1e9


def end_to_end(run: Callable[[], None], stream) -> float:
    """Host ns from the decision to usable data: run() queues everything, then synchronise."""
    t0 = time.perf_counter_ns()
    run()
    stream.synchronize()
    return float(time.perf_counter_ns() - t0)
