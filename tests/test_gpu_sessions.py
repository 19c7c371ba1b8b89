"""The GPU sessions' plumbing on a CPU box, against a cupy test double (tests/gpu_fakecupy.py):
pointers and fragment tables reach the right calls, every session's byte check passes, both
clocks give samples, wrong setups fail with a clear error. Kernels run under the simulator."""

import sys

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.harness.cases import Case
from nearlocal.harness.stats import StoppingRule
from nearlocal.harness.worker import WorkerSettings, measure
from tests.gpu_fakecupy import host_numba_array, make_fake_cupy

kernels = pytest.importorskip("nearlocal.gpu.kernels", reason="numba-cuda is not installed")
if not kernels.SIMULATED:
    pytest.skip("a real GPU run tests the sessions for real (scripts/gpu_check.sh)",
                allow_module_level=True)

SETTINGS = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9, False)
SMALL = (("threads", "8"),)


@pytest.fixture
def fake_cupy(monkeypatch):
    from numba import cuda

    import nearlocal.gpu.methods as gpu_methods

    cp = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(cuda, "external_stream", lambda ptr: 0, raising=False)
    monkeypatch.setattr(gpu_methods, "_numba_array", host_numba_array)
    return cp


def _run(case: Case) -> dict:
    row, _raw, ns = measure(case, SETTINGS, 0.0)
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
    other = "device" if info["timing"] == "e2e" else "e2e"
    assert info[f"{other}_median_ns"] >= 0
    assert info["timer_overhead_ns"] >= 0 and info["clock_resolution_ns"] > 0
    if region == "dram":  # the host may wait for the copy: never queued behind the spin
        assert info["host_may_block"] == "pageable memory" and "per_copy_p50_ns" not in info
    elif method == "cuda-memcpy-async" and info["timing"] == "device":
        assert info["per_copy_p99_ns"] >= info["per_copy_p50_ns"] >= 0
    if method.endswith("kernel"):
        assert info["threads"] == 8 and info["width"] == 16


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
    from tests.gpu_fakecupy import _Event

    answers = iter([True, True, False])  # the spin ended before the host had queued twice
    monkeypatch.setattr(_Event, "done", property(lambda self: next(answers)))
    timer = EventTimer(fake_cupy, fake_cupy.cuda.Stream(), 0, np.zeros(1, np.uint64))
    assert timer.queued(lambda: None) >= 0
    assert timer.retries == 2 and timer.spin_ns >= 4 * MIN_SPIN_NS
