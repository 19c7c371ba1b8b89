"""The GPU sessions' plumbing on a CPU box, against a cupy test double (tests/gpu_fakecupy.py):
pointers and fragment tables reach the right calls, every session's byte check passes, both
clocks give samples, wrong setups fail with a clear error. The CUDA C kernels run on the CPU
through the g++ shim (tests/gpu_cpushim.py)."""

import shutil

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.sampling import StoppingRule
from nearlocal.engine.worker import WorkerSettings, measure
from nearlocal.errors import UsageError
from nearlocal.gpu.timing import ATTEMPTS
from tests.gpu_fakecupy import _Event

if shutil.which("g++") is None:
    pytest.skip("g++ runs the kernels' CUDA C on the CPU", allow_module_level=True)

SETTINGS = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9, False)
SMALL = (("threads", "8"),)


@pytest.fixture
def spins(monkeypatch):
    """Counts launches of the blocking kernel."""
    from nearlocal.kernels.cuda import Kernels

    count = {"n": 0}
    real = Kernels.spin

    def spin(self, duration_ns, out_pointer, stream):
        count["n"] += 1
        real(self, duration_ns, out_pointer, stream)

    monkeypatch.setattr(Kernels, "spin", spin)
    return count


def _run(case: Case) -> dict:
    row, _raw, ns, _placement = measure(case, SETTINGS, 0.0)
    assert row["n_samples"] == len(ns) >= 1 and np.all(ns >= 0)
    return row


@pytest.mark.parametrize(("method", "region", "access", "params"), [
    ("cuda-memcpy", "pinned", "read", ()),
    ("cuda-memcpy-async", "registered:dram", "write", ()),
    ("cuda-memcpy-async", "dram", "read", (("timing", "e2e"),)),
    ("cuda-memcpy-async", "dram", "write", ()),
    ("cuda-memcpy-2d", "pinned", "write", ()),
    ("gather-kernel", "pinned", "read", SMALL),
    ("scatter-kernel", "registered:dram", "write", (*SMALL, ("timing", "e2e"))),
    ("zero-copy-kernel", "pinned", "read", SMALL),
    ("zero-copy-kernel", "registered:dram", "write", SMALL),
])
def test_host_gpu_sessions_move_the_right_bytes(fake_cupy, method, region, access, params):
    row = _run(Case(method, region, "wb", "6x40B", peer="gpu:0", access=access, params=params))
    info = row["info"]
    assert info["gpu"] == 0 and info["timing"] == dict(params).get("timing", "device")
    assert row["clock"] == ("monotonic-ns" if info["timing"] == "e2e" else "cuda-event")
    if info["timing"] == "e2e":
        assert info["events_median_ns"] >= 0 and "stream synchronisation" in info["e2e_contains"]
    else:
        assert info["e2e_median_ns"] >= 0
    assert info["timer_overhead_ns"] >= 0 and info["clock_resolution_ns"] > 0
    if region == "dram":  # the host may wait for the copy: never queued behind the spin
        assert info["host_may_block"] == "pageable memory" and "per_copy_p50_ns" not in info
    elif method == "cuda-memcpy-async" and info["timing"] == "device":
        assert info["per_copy_p99_ns"] >= info["per_copy_p50_ns"] >= 0
    if method.endswith("kernel"):
        assert info["threads"] == 8 and info["width"] == 16 and info["pieces"] >= 6


def test_peer_sessions_and_layer_stream(fake_cupy):
    for method in ("peer-memcpy", "peer-kernel"):
        for access in ("read", "write"):
            row = _run(Case(method, "gpu:1", "wb", "4x100B", peer="gpu:0", access=access,
                            params=SMALL))
            assert row["info"]["peer_access"] is True
    for copy in ("memcpy", "kernel"):
        row = _run(Case("layer-stream", "gpu:1", "wb", "2x24B", peer="gpu:0",
                        params=(("layers", "3"), ("compute_us", "5"), ("copy", copy), *SMALL)))
        info = row["info"]
        assert info["layers"] == 3 and "hides_behind_compute" in info
        assert info["round_trip_bytes"] == 2 * 48  # fetch + write back: what GB/s counts
        assert row["gbps"] == pytest.approx(2 * 48 / row["median_ns"])
        assert info["compute_only_pass_ns"] > 0


def test_kernels_refuse_pageable_memory_without_hmm(fake_cupy):
    with pytest.raises(UsageError, match=r"pageable.*use pinned or registered:dram"):
        measure(Case("gather-kernel", "dram", "wb", "4x40B", peer="gpu:0", params=SMALL),
                SETTINGS, 0.0)


def test_failed_registration_is_reported_not_hidden(fake_cupy):
    fake_cupy.cuda.runtime.fail_register = True
    with pytest.raises(RuntimeError, match=r"cudaHostRegister of dram .* not falling back"):
        measure(Case("cuda-memcpy", "registered:dram", "wb", "64KiB", peer="gpu:0"),
                SETTINGS, 0.0)


def test_bad_parameters_are_usage_errors(fake_cupy):
    with pytest.raises(UsageError, match="timing='wall' is not valid"):
        measure(Case("cuda-memcpy", "pinned", "wb", "64KiB", peer="gpu:0",
                     params=(("timing", "wall"),)), SETTINGS, 0.0)
    with pytest.raises(UsageError, match="valid widths are 4, 8, 16"):
        measure(Case("gather-kernel", "pinned", "wb", "64B", peer="gpu:0",
                     params=(("width", "12"),)), SETTINGS, 0.0)


def test_registered_region_is_unregistered_on_close(fake_cupy):
    _run(Case("cuda-memcpy", "registered:dram", "wb", "2x64B", peer="gpu:0"))
    runtime = fake_cupy.cuda.runtime
    assert runtime.registered == {} and runtime.host_allocs == {}
    assert runtime.calls["memcpy"] >= 2




def test_a_copy_that_drops_a_byte_fails_the_check(fake_cupy, monkeypatch):
    import ctypes

    runtime = fake_cupy.cuda.runtime
    monkeypatch.setattr(runtime, "memcpyAsync",
                        lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n - 1))
    with pytest.raises(RuntimeError, match="moved wrong bytes: fragment 0"):
        measure(Case("cuda-memcpy-async", "pinned", "wb", "3x40B", peer="gpu:0"), SETTINGS, 0.0)


def test_event_timer_throws_away_samples_the_host_was_late_for(fake_cupy, monkeypatch):
    from nearlocal.gpu.timing import MIN_SPIN_NS, EventTimer
    from nearlocal.kernels.cuda import compiled

    answers = iter([True, True, False])  # the spin ended before the host had queued twice
    monkeypatch.setattr(_Event, "done", property(lambda self: next(answers)))
    out = np.zeros(1, np.uint64)
    timer = EventTimer(fake_cupy, fake_cupy.cuda.Stream(), compiled(fake_cupy), out.ctypes.data)
    assert timer.queued(lambda: None) >= 0
    assert timer.retries == 2 and timer.spin_ns >= 4 * MIN_SPIN_NS and out[0] > 0


def _queue_of(fake_cupy, monkeypatch, depth: int):
    """A timer whose stream queue holds `depth` operations: a longer chunk always outruns."""
    from nearlocal.gpu.timing import EventTimer
    from nearlocal.kernels.cuda import compiled

    last = {"size": 0}
    monkeypatch.setattr(_Event, "done", property(lambda self: last["size"] > depth))
    timer = EventTimer(fake_cupy, fake_cupy.cuda.Stream(), compiled(fake_cupy),
                       np.zeros(1, np.uint64).ctypes.data)
    done = []

    def enqueue_range(lo, hi):
        last["size"] = hi - lo
        done.append((lo, hi))

    return timer, enqueue_range, done


def test_a_full_stream_queue_shrinks_the_chunks_instead_of_failing(fake_cupy, monkeypatch):
    timer, enqueue_range, done = _queue_of(fake_cupy, monkeypatch, 40)
    assert timer.queued_ops(enqueue_range, 1024) >= 0
    assert timer.chunk == 32 and timer.intervals == 1024 // 32 and timer.host_gaps == 0
    kept = [(lo, hi) for lo, hi in done if hi - lo <= 40]  # the intervals that were timed
    assert sorted(kept) == [(lo, lo + 32) for lo in range(0, 1024, 32)]  # each call once
    assert timer.info()["queued_chunks"] == 32


def test_a_call_that_blocks_the_host_is_timed_with_its_host_gap(fake_cupy, monkeypatch):
    timer, enqueue_range, done = _queue_of(fake_cupy, monkeypatch, 0)  # nothing can be queued
    assert timer.queued_ops(enqueue_range, 3) >= 0
    assert timer.chunk == 1 and timer.host_gaps == 3 and timer.intervals == 3
    done.clear()
    timer.retries = 0
    assert timer.queued(lambda: enqueue_range(0, 1)) >= 0  # one operation: no halving to try
    assert timer.retries == ATTEMPTS and len(done) == ATTEMPTS + 1 and timer.host_gaps == 4


def test_1024_async_copies_are_chunked_and_overheads_removed_per_chunk(fake_cupy):
    row = _run(Case("cuda-memcpy-async", "pinned", "wb", "1024x16B", peer="gpu:0"))
    info = row["info"]
    assert info["queued_chunks"] == 1024 // 128 and info["chunk_ops"] == 128
    assert info["primed"] is True and info["per_copy_calls"] == 64
    assert "chunks" in info["device_contains"]


@pytest.mark.parametrize("method", ["cuda-memcpy-async", "gather-kernel", "zero-copy-kernel"])
def test_e2e_rows_never_launch_the_blocking_kernel(fake_cupy, spins, method):
    row = _run(Case(method, "pinned", "wb", "64x40B", peer="gpu:0",
                    params=(("timing", "e2e"), *SMALL) if "kernel" in method
                    else (("timing", "e2e"),)))
    assert spins["n"] == 0 and "spin_ns" not in row["info"]


def test_kernel_e2e_reads_the_pieces_the_host_wrote_in_pinned_memory(fake_cupy, monkeypatch):
    from nearlocal.gpu.kernel_sessions import KernelSession

    writes = []
    real = KernelSession.decide
    monkeypatch.setattr(KernelSession, "decide", lambda self: (writes.append(1), real(self)))
    row = _run(Case("gather-kernel", "pinned", "wb", "3x5000B", peer="gpu:0",
                    params=(("timing", "e2e"), *SMALL)))
    assert writes and "piece table" in row["info"]["e2e_contains"]
    assert row["info"]["pieces"] > 3  # 5000-byte fragments span several pieces each


def test_batch_calls_the_driver_with_arrays_built_once(fake_cupy, monkeypatch):
    """cuMemcpyBatchAsync through ctypes: the pointer and size arrays and the attributes reach
    the call (a stand-in that reads them as the driver would and copies)."""
    import ctypes

    from nearlocal.gpu import bindings, copy_sessions

    seen = []

    def driver(dsts, srcs, sizes, count, attrs, idx, num_attrs, fail, stream):
        read = lambda p: np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(p))  # noqa: E731
        for d, s, n in zip(read(dsts), read(srcs), read(sizes), strict=True):
            ctypes.memmove(int(d), int(s), int(n))
        seen.append((count, bindings.DriverAttrs.from_address(attrs).srcAccessOrder,
                     num_attrs))
        return 0

    monkeypatch.setattr(copy_sessions, "driver_memcpy_batch", lambda: (driver, None))
    row = _run(Case("cuda-memcpy-batch", "pinned", "wb", "5x40B@64B", peer="gpu:0"))
    assert seen and set(seen) == {(5, bindings.SRC_ACCESS_ORDER_STREAM, 1)}
    assert row["info"]["batch_api"].startswith("driver")


def test_kernel_check_covers_the_device_path_too(fake_cupy, monkeypatch):
    from nearlocal.gpu.kernel_sessions import KernelSession

    monkeypatch.setattr(KernelSession, "enqueue_range", lambda self, lo, hi, marks=None: None)
    with pytest.raises(RuntimeError, match="gather-kernel moved wrong bytes: fragment 0"):
        measure(Case("gather-kernel", "pinned", "wb", "3x40B", peer="gpu:0", params=SMALL),
                SETTINGS, 0.0)


def test_batch_driver_call_with_wrong_bytes_fails_the_case(fake_cupy, monkeypatch):
    """A driver cuMemcpyBatchAsync that returns success but moves nothing fails the check with
    its error; nothing switches to cuda-bindings behind it."""
    from nearlocal.gpu import copy_sessions

    calls = []
    monkeypatch.setattr(copy_sessions, "driver_memcpy_batch",
                        lambda: (lambda *args: calls.append(args) or 0, None))
    monkeypatch.setattr(copy_sessions.BatchSession, "_bindings_setup",
                        lambda self, pageable: pytest.fail("fell back to cuda-bindings"))
    with pytest.raises(RuntimeError, match="cuda-memcpy-batch moved wrong bytes: fragment 0"):
        measure(Case("cuda-memcpy-batch", "pinned", "wb", "5x40B@64B", peer="gpu:0"),
                SETTINGS, 0.0)
    assert calls


def test_a_whole_call_list_is_not_copied_inside_the_interval(fake_cupy):
    from nearlocal.gpu.copy_sessions import _calls

    calls = [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    assert _calls(calls, 0, 3) is calls
    assert list(_calls(calls, 1, 3)) == calls[1:3] and list(_calls(calls, 0, 1)) == calls[:1]


def test_pinned_staging_is_freed_when_it_has_no_device_pointer(fake_cupy, monkeypatch):
    from nearlocal.gpu import regions

    runtime = fake_cupy.cuda.runtime
    monkeypatch.setattr(type(runtime), "pointerGetAttributes",
                        lambda self, pointer: type("A", (), {"type": 1, "devicePointer": 0})())
    with pytest.raises(RuntimeError, match="not mapped into the GPU's address space"):
        regions.alloc_mapped(runtime, 4096)
    assert runtime.host_allocs == {}


class _HostClock:
    """The host clock EventTimer reads (time.perf_counter_ns), moved only by the enqueues: each
    takes exactly `enqueue_ns`, so what the timer learns of the host is the test's choice."""

    def __init__(self, enqueue_ns: int):
        self.now, self.enqueue_ns = 0, enqueue_ns

    def perf_counter_ns(self) -> int:
        return self.now

    def enqueue(self) -> None:
        self.now += self.enqueue_ns


def test_the_spin_shrinks_again_after_intervals_in_time(fake_cupy, monkeypatch):
    """One slow host moment doubles the spin; SHRINK_AFTER intervals in time halve it again,
    down to what the enqueues needed (twice the slowest, plus MIN_SPIN_NS), so it does not stay
    at MAX_SPIN_NS (issue 24)."""
    from nearlocal.gpu import timing
    from nearlocal.gpu.timing import MAX_SPIN_NS, MIN_SPIN_NS, SHRINK_AFTER, EventTimer
    from nearlocal.kernels.cuda import compiled

    clock = _HostClock(enqueue_ns=5_000)
    monkeypatch.setattr(timing, "time", clock)
    late = {"n": 12}  # the host is late 12 times in a row, then always in time

    def done(self):
        late["n"] -= 1
        return late["n"] >= 0

    monkeypatch.setattr(_Event, "done", property(done))
    timer = EventTimer(fake_cupy, fake_cupy.cuda.Stream(), compiled(fake_cupy),
                       np.zeros(1, np.uint64).ctypes.data)
    for _ in range(2):  # ATTEMPTS late tries each: the spin doubles to the ceiling
        timer.queued(clock.enqueue)
    assert timer.spin_ns == timer.max_spin_ns == MAX_SPIN_NS
    for _ in range(SHRINK_AFTER - 1):
        timer.queued(clock.enqueue)
    assert timer.spin_ns == MAX_SPIN_NS and timer.spin_shrinks == 0
    timer.queued(clock.enqueue)
    assert timer.spin_ns == MAX_SPIN_NS // 2 and timer.spin_shrinks == 1
    needed = 2 * clock.enqueue_ns + MIN_SPIN_NS
    halvings = 0
    while MAX_SPIN_NS >> (halvings + 1) > needed:
        halvings += 1
    for _ in range(SHRINK_AFTER * 20):
        timer.queued(clock.enqueue)
    assert timer.spin_ns == needed  # halved each SHRINK_AFTER, then held at what was needed
    info = timer.info()
    assert info["spin_max_ns"] == MAX_SPIN_NS and info["spin_shrinks"] == halvings + 1


def test_each_interval_loses_the_cost_of_an_empty_interval_of_its_kind(fake_cupy, monkeypatch):
    """Queued chunks lose the queued empty interval, host-gap fallbacks the unqueued one."""
    timer, enqueue_range, _ = _queue_of(fake_cupy, monkeypatch, 40)
    timer.overhead_ns, timer.unqueued_overhead_ns = 500.0, 3.0
    timer.queued_ops(enqueue_range, 1024)
    assert timer.intervals == 32 and timer.sample_overhead_ns == 32 * 500.0
    timer, enqueue_range, _ = _queue_of(fake_cupy, monkeypatch, 0)  # every chunk a host gap
    timer.overhead_ns, timer.unqueued_overhead_ns = 500.0, 3.0
    timer.queued_ops(enqueue_range, 3)
    assert timer.host_gaps == 3 and timer.sample_overhead_ns == 3 * 3.0


@pytest.fixture
def known_overheads(monkeypatch):
    """Calibrations that answer known costs: queued 500 ns, unqueued 3 ns."""
    from nearlocal.gpu.timing import EventTimer

    def queued(self, samples=0):
        self.overhead_ns = 500.0
        return 500.0

    def unqueued(self, stream, samples=0):
        self.unqueued_overhead_ns = 3.0
        return 3.0

    monkeypatch.setattr(EventTimer, "calibrate", queued)
    monkeypatch.setattr(EventTimer, "calibrate_unqueued", unqueued)


@pytest.mark.parametrize(("method", "region", "pattern", "kind", "per_sample"), [
    ("cuda-memcpy", "pinned", "4x64B", "unqueued", 3.0),  # synchronous cudaMemcpy
    ("cuda-memcpy-async", "dram", "4x64B", "unqueued", 3.0),  # pageable: the host may block
    ("cuda-memcpy-async", "pinned", "1024x16B", "queued", 8 * 500.0),  # 8 chunks of 128
])
def test_rows_subtract_the_empty_interval_of_their_kind(fake_cupy, known_overheads, method,
                                                        region, pattern, kind, per_sample):
    row, raw_ms, ns, _placement = measure(Case(method, region, "wb", pattern, peer="gpu:0"), SETTINGS, 0.0)
    info = row["info"]
    assert info["timer_overhead_kind"].startswith(kind)
    assert info["timer_overhead_ns"] == (3.0 if kind == "unqueued" else 500.0)
    raw_ns = np.asarray(raw_ms) * 1e6
    kept = raw_ns > per_sample  # samples not clipped at 0
    assert kept.any()
    np.testing.assert_allclose(raw_ns[kept] - ns[kept], per_sample)


def test_e2e_events_figure_loses_the_unqueued_empty_interval(fake_cupy, known_overheads):
    row = _run(Case("cuda-memcpy-async", "pinned", "wb", "4x64B", peer="gpu:0",
                    params=(("timing", "e2e"),)))
    info = row["info"]
    assert info["events_overhead_ns"] == 3.0 and "unqueued empty interval" in info["events_contains"]
    assert info["timer_overhead_kind"] == "two back-to-back host clock reads"


def test_layer_stream_times_its_compute_pass_after_the_timer_is_calibrated(fake_cupy,
                                                                          monkeypatch):
    """The compute-only pass is a queued interval: it needs the blocking kernel's calibration
    (its wait and the empty interval removed), so it is measured after it, not in setup."""
    from nearlocal.gpu.layerstream import LayerStreamSession
    from nearlocal.gpu.timing import EventTimer

    order = []
    calibrate, compute_pass = EventTimer.calibrate, LayerStreamSession._pass

    def calibrated(self, *args, **kwargs):
        order.append("calibrate")
        return calibrate(self, *args, **kwargs)

    def passed(self, compute_only=False):
        if compute_only:
            order.append("compute pass")
        return compute_pass(self, compute_only)

    monkeypatch.setattr(EventTimer, "calibrate", calibrated)
    monkeypatch.setattr(LayerStreamSession, "_pass", passed)
    _run(Case("layer-stream", "gpu:1", "wb", "2x24B", peer="gpu:0",
              params=(("layers", "2"), ("compute_us", "5"), ("copy", "kernel"), *SMALL)))
    assert "compute pass" in order
    assert order.index("calibrate") < order.index("compute pass")
