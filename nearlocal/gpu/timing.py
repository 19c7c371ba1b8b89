"""The two GPU clocks.

Device time (`timing=device`): CUDA events around the work, with the work queued behind a short
blocking kernel (`nl_spin`) so that the host's enqueue cost (Python, the runtime API, launch) is
not inside the interval - the method nvbandwidth and nvbench use. If the blocking kernel has
already finished when the host is done queueing (the start event has completed), the interval is
thrown away and the spin lengthened; nothing is ever timed with the GPU waiting on the host.

A stream's queue of pending work is finite: once it is full the host blocks until the GPU drains
it, so no spin can hide the enqueue of, say, 1,024 cudaMemcpyAsync calls. Work of many operations
is therefore queued in CHUNKS of at most `chunk` operations (128 to start with; halved whenever a
chunk keeps outrunning the spin), each behind its own blocking kernel between its own two events;
the sample is the sum of the chunks' intervals, each minus the empty interval's cost. The row says
how many chunks a sample took (`queued_chunks`). Only if a single operation still outruns the
spin (the host blocked in the call itself) is that interval taken between events around the
calls, host gaps included, and counted in `host_gap_intervals`. The spin doubles (up to
MAX_SPIN_NS) when the host was late and shrinks again after SHRINK_AFTER intervals in a row were
in time (halved, never below twice the slowest enqueue it covered plus MIN_SPIN_NS), so one slow
host moment does not leave every later sample waiting 50 ms.

A copy engine that starts right behind a kernel first waits for the kernel's completion to be
signalled to it: a few microseconds that a lone cudaMemcpyAsync between two events does not pay,
and the likely cause of issue 11's 64 KiB figure (8.1 us against 5.7 us; scripts/gpu_check.sh
prints both variants beside the lone copy to confirm it). Copy sessions therefore queue a
1-byte copy of the same direction (`prime`) between the blocking kernel and the start event, so
that hand-off happens before the interval opens (`primed` in the row); the empty interval used
for the overhead is measured the same way.

End-to-end time (`timing=e2e`): from the host's decision to move the prepared fragments to the
data being usable at the destination (stream synchronised), read on the host's monotonic clock
(time.perf_counter_ns, CLOCK_MONOTONIC). Everything that is not the move itself (pointer lists,
argument packing, tables, pinned staging) is prepared before the clock starts; each session says
in `e2e_contains` what its interval holds. No blocking kernel is involved: an e2e row's other
figure (`events_median_ns`) is two events around the same calls, host gaps included.

Each clock's own cost is measured and removed from the samples, as rdtscp's is on the CPU, with
an empty interval of the same kind as the sample's: queued intervals lose the device time of two
events back to back behind the blocking kernel (`calibrate`), unqueued ones (synchronous calls,
host-gap fallbacks, e2e rows' events figure) the device time of two events recorded back to back
by the host with nothing queued before them (`calibrate_unqueued`: the host's gap between the two
records is in it, as it is in theirs), and host-clock samples two back-to-back clock reads.
Sessions record the one their row's samples lost as `timer_overhead_ns` (`timer_overhead_kind`
names it), with the clock's resolution as `clock_resolution_ns`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

MIN_SPIN_NS = 20_000
MAX_SPIN_NS = 50_000_000
FIRST_CHUNK = 128  # operations queued behind one blocking kernel
ATTEMPTS = 6  # tries per chunk (the spin doubling) before the chunk is halved
SHRINK_AFTER = 16  # intervals in time in a row before the spin is halved
TIMINGS = ("device", "e2e")
EVENT_RESOLUTION_NS = 500.0  # cudaEventElapsedTime: "a resolution of around 0.5 microseconds"
OVERHEAD_SAMPLES = 16


class EventTimer:
    """CUDA events around work queued behind the blocking kernel on `stream`."""

    def __init__(self, cp, stream, kernels, spin_out: int,
                 prime: Callable[[], None] | None = None):
        self.cp = cp
        self.stream = stream  # cupy stream the work is queued on
        self.kernels = kernels  # nearlocal.kernels.cuda.Kernels (nl_spin)
        self.spin_out = spin_out  # device pointer of 1 x uint64
        self.prime = prime  # queued between the spin and the start event (copy sessions)
        self.start = cp.cuda.Event()
        self.stop = cp.cuda.Event()
        self.spin_ns = MIN_SPIN_NS
        self.chunk = FIRST_CHUNK
        self.retries = 0
        self.host_gaps = 0
        self.intervals = 1  # event intervals in the last sample (their overhead is removed)
        self.max_intervals = 1
        self.overhead_ns = 0.0  # queued empty interval, set by calibrate()
        self.unqueued_overhead_ns = 0.0  # unqueued empty interval, set by calibrate_unqueued()
        self.sample_overhead_ns = 0.0  # what the last queued_ops() sample's intervals cost
        self.max_spin_ns = MIN_SPIN_NS
        self.spin_shrinks = 0
        self._in_time = 0  # intervals in time since the spin last changed
        self._slowest_host_ns = 0  # the slowest enqueue among them

    def _try(self, enqueue: Callable[[], None]) -> float | None:
        """Device ns of enqueue()'s work behind the spin; None when the spin ended too early."""
        self.kernels.spin(self.spin_ns, self.spin_out, self.stream)
        if self.prime is not None:
            self.prime()
        self.start.record(self.stream)
        t0 = time.perf_counter_ns()
        enqueue()
        self.stop.record(self.stream)
        host_ns = time.perf_counter_ns() - t0
        early = self.start.done  # the GPU reached the work before the host finished queueing
        self.stop.synchronize()
        if not early:
            self._in_time_once(host_ns)
            return self.cp.cuda.get_elapsed_time(self.start, self.stop) * 1e6
        self.retries += 1
        self.spin_ns = min(max(2 * self.spin_ns, 2 * host_ns + MIN_SPIN_NS), MAX_SPIN_NS)
        self.max_spin_ns = max(self.max_spin_ns, self.spin_ns)
        self._in_time, self._slowest_host_ns = 0, 0
        return None

    def _in_time_once(self, host_ns: int) -> None:
        """After SHRINK_AFTER intervals in time, halve the spin towards what they needed."""
        self._in_time += 1
        self._slowest_host_ns = max(self._slowest_host_ns, host_ns)
        if self._in_time < SHRINK_AFTER:
            return
        needed = max(MIN_SPIN_NS, 2 * self._slowest_host_ns + MIN_SPIN_NS)
        if needed < self.spin_ns:
            self.spin_ns = max(needed, self.spin_ns // 2)
            self.spin_shrinks += 1
        self._in_time, self._slowest_host_ns = 0, 0

    def queued(self, enqueue: Callable[[], None]) -> float:
        """Device ns of enqueue()'s work (one operation, or few), back to back behind the spin."""
        return self.queued_ops(lambda lo, hi: enqueue(), 1)

    def queued_ops(self, enqueue_range: Callable[[int, int], None], ops: int) -> float:
        """Device ns of operations 0..ops, queued in chunks behind the spin (see the module)."""
        total, lo, intervals, gaps = 0.0, 0, 0, 0
        while lo < ops:
            hi = min(ops, lo + self.chunk)
            ns = None
            for _ in range(ATTEMPTS):
                ns = self._try(lambda lo=lo, hi=hi: enqueue_range(lo, hi))
                if ns is not None:
                    break
            if ns is None and hi - lo > 1:
                self.chunk = max(1, (hi - lo) // 2)
                continue  # the same operations again, in smaller chunks
            if ns is None:  # one call (or one pass) outruns any spin: the host blocked in it
                self.host_gaps += 1
                gaps += 1
                ns = self.unqueued(lambda lo=lo, hi=hi: enqueue_range(lo, hi), self.stream)
            total += ns
            intervals += 1
            lo = hi
        self.intervals = intervals
        self.max_intervals = max(self.max_intervals, intervals)
        self.sample_overhead_ns = ((intervals - gaps) * self.overhead_ns
                                   + gaps * self.unqueued_overhead_ns)
        return total

    def unqueued(self, run: Callable[[], None], stream) -> float:
        """Device ns between events around calls that are not queued behind the spin (synchronous
        calls return only when their copy is done; e2e rows' event figure): host gaps included."""
        self.start.record(stream)
        run()
        self.stop.record(stream)
        self.stop.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.stop) * 1e6

    def calibrate(self, samples: int = OVERHEAD_SAMPLES) -> float:
        """The timer's own cost: median device ns of an empty interval behind the spin."""
        self.overhead_ns = float(np.median([self.queued(lambda: None) for _ in range(samples)]))
        return self.overhead_ns

    def calibrate_unqueued(self, stream, samples: int = OVERHEAD_SAMPLES) -> float:
        """The cost of an unqueued interval: median device ns of two events the host records
        back to back on `stream` with nothing queued before them."""
        self.unqueued_overhead_ns = float(np.median(
            [self.unqueued(lambda: None, stream) for _ in range(samples)]))
        return self.unqueued_overhead_ns

    def info(self) -> dict:
        return {"spin_ns": self.spin_ns, "spin_max_ns": self.max_spin_ns,
                "spin_shrinks": self.spin_shrinks, "spin_retries": self.retries,
                "queued_chunks": self.max_intervals, "chunk_ops": self.chunk,
                "host_gap_intervals": self.host_gaps, "primed": self.prime is not None}


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
    """Host ns from the decision to usable data: run() issues the move, then synchronise."""
    t0 = time.perf_counter_ns()
    run()
    stream.synchronize()
    return float(time.perf_counter_ns() - t0)
