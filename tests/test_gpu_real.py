"""Every GPU session for real, on a GPU box (NEARLOCAL_REAL_GPU=1, scripts/gpu_check.sh): each
opens, passes its byte check and gives samples. Skipped everywhere else."""

import os

import pytest

from nearlocal.errors import UsageError
from nearlocal.harness.cases import Case
from nearlocal.harness.stats import StoppingRule
from nearlocal.harness.worker import WorkerSettings, measure

if os.environ.get("NEARLOCAL_REAL_GPU") != "1":
    pytest.skip("real GPU tests run with NEARLOCAL_REAL_GPU=1 (scripts/gpu_check.sh)",
                allow_module_level=True)
cupy = pytest.importorskip("cupy")
GPUS = cupy.cuda.runtime.getDeviceCount()
if GPUS == 0:
    pytest.skip("no GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu
SETTINGS = WorkerSettings(StoppingRule(budget_s=0.02, min_samples=5, max_samples=50), 1e9, False)


def _measure(case: Case) -> dict:
    row, _, ns = measure(case, SETTINGS, 0.0)
    assert row["n_samples"] == len(ns) > 0 and (ns >= 0).all() and row["median_ns"] > 0
    return row


@pytest.mark.parametrize("pattern", ["1024x160B", "7x1000B@1037B"])
@pytest.mark.parametrize("region", ["pinned", "registered:dram"])
@pytest.mark.parametrize(("method", "access"), [
    ("cuda-memcpy", "read"), ("cuda-memcpy-async", "write"), ("cuda-memcpy-2d", "read"),
    ("gather-kernel", "read"), ("scatter-kernel", "write"), ("zero-copy-kernel", "read"),
    ("zero-copy-kernel", "write"),
])
def test_host_gpu_methods_for_real(method, access, region, pattern):
    for timing in ("device", "e2e"):
        row = _measure(Case(method, region, "wb", pattern, peer="gpu:0", access=access,
                            params=(("timing", timing),)))
        assert row["info"]["timing"] == timing


@pytest.mark.parametrize("width", ["4", "8", "16"])
def test_gather_kernel_widths_for_real(width):
    row = _measure(Case("gather-kernel", "pinned", "wb", "33x77B@301B", peer="gpu:0",
                        params=(("width", width),)))
    assert row["info"]["width"] == int(width)


def test_memcpy_batch_for_real():
    from nearlocal.gpu.methods import _needs_batch
    from nearlocal.hwprobe import probe

    reason = _needs_batch(probe(calibrate=False))
    if reason:
        pytest.skip(reason)
    _measure(Case("cuda-memcpy-batch", "pinned", "wb", "1024x160B", peer="gpu:0"))


def test_kernel_from_pageable_memory_runs_or_explains():
    try:
        _measure(Case("gather-kernel", "dram", "wb", "16x160B", peer="gpu:0"))
    except UsageError as exc:
        assert "pageable" in str(exc)


def test_vector_accesses_are_in_the_ptx():
    from nearlocal.gpu import kernels

    _measure(Case("gather-kernel", "pinned", "wb", "8x64B", peer="gpu:0"))
    ptx = "\n".join(kernels._copy_kernel.inspect_asm().values())
    assert "ld.global.v2.u64" in ptx or "ld.global.v4.u32" in ptx


@pytest.mark.skipif(GPUS < 2, reason="fewer than 2 GPUs")
@pytest.mark.parametrize("method", ["peer-memcpy", "peer-kernel"])
@pytest.mark.parametrize("access", ["read", "write"])
def test_peer_methods_for_real(method, access):
    _measure(Case(method, "gpu:1", "wb", "128x20KiB", peer="gpu:0", access=access))


@pytest.mark.skipif(GPUS < 2, reason="fewer than 2 GPUs")
@pytest.mark.parametrize("copy", ["memcpy", "kernel"])
def test_layer_stream_for_real(copy):
    row = _measure(Case("layer-stream", "gpu:1", "wb", "1MiB", peer="gpu:0",
                        params=(("layers", "8"), ("compute_us", "50"), ("copy", copy))))
    assert "hides_behind_compute" in row["info"]
