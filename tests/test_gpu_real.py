"""Every GPU session for real, on a GPU box (NEARLOCAL_REAL_GPU=1, scripts/gpu_check.sh): the
kernels' bytes against numpy on the device (NVRTC-compiled, odd and unaligned tables, every
width), and each session opens, passes its byte check and gives samples. Skipped elsewhere."""

import os

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.sampling import StoppingRule
from nearlocal.engine.worker import WorkerSettings, measure
from nearlocal.errors import UsageError

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
    row, _, ns, _ = measure(case, SETTINGS, 0.0)
    assert row["n_samples"] == len(ns) > 0 and (ns >= 0).all() and row["median_ns"] > 0
    return row


# --- the kernels' bytes on the device, against numpy ----------------------------------------------

def _table(rng, count: int, max_len: int, src_size: int) -> np.ndarray:
    lengths = rng.integers(1, max_len, count)
    dst = np.cumsum(rng.integers(0, 5, count)) + np.concatenate([[0], np.cumsum(lengths[:-1])])
    src = rng.integers(0, src_size - max_len, count)
    return np.stack([src, dst, lengths], axis=1)[rng.permutation(count)]


@pytest.mark.parametrize("width", [16, 8, 4])
@pytest.mark.parametrize(("count", "max_len", "misalign"), [
    (1024, 161, (0, 0)), (37, 70_000, (3, 5)), (5, 3_000_000, (8, 0)),
])
def test_kernels_bytes_on_the_device_match_numpy(width, count, max_len, misalign):
    from nearlocal.kernels import cuda as kernels

    rng = np.random.default_rng(count + width)
    k = kernels.compiled(cupy)
    src_host = rng.integers(0, 256, max_len * 4 + 64, dtype=np.uint8)
    table = kernels.validate_fragments(_table(rng, count, max_len, src_host.size - 16))
    dst_size = int((table[:, 1] + table[:, 2]).max()) + 64
    src = cupy.asarray(np.concatenate([np.zeros(misalign[0], np.uint8), src_host]))
    dst_host = rng.integers(0, 256, dst_size + misalign[1], dtype=np.uint8)
    dst = cupy.asarray(dst_host)
    src_ptr, dst_ptr = int(src.data.ptr) + misalign[0], int(dst.data.ptr) + misalign[1]
    plan, pieces = kernels.plan_launch(table, width=width)
    pieces_dev = cupy.asarray(pieces)
    stream = cupy.cuda.Stream(non_blocking=True)
    k.launch("nl_copy", plan, k.copy_args(dst_ptr, src_ptr, int(pieces_dev.data.ptr), plan),
             stream)
    stream.synchronize()
    expected = kernels.reference_copy(dst_host[misalign[1]:], src_host, table)
    np.testing.assert_array_equal(cupy.asnumpy(dst)[misalign[1]:], expected)

    sums = cupy.zeros(len(table), dtype=cupy.uint64)
    k.launch("nl_sum", plan, k.sum_args(src_ptr, int(sums.data.ptr), int(pieces_dev.data.ptr),
                                        plan), stream)
    k.launch("nl_fill", plan, k.fill_args(dst_ptr, 0xA5, int(pieces_dev.data.ptr), plan), stream)
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(sums), kernels.reference_sums(src_host, table))
    filled = expected.copy()
    for _, d, n in table:
        filled[d:d + n] = 0xA5
    np.testing.assert_array_equal(cupy.asnumpy(dst)[misalign[1]:], filled)


def test_spin_waits_on_the_gpu_clock():
    from nearlocal.kernels import cuda as kernels

    out = cupy.zeros(1, dtype=cupy.uint64)
    stream = cupy.cuda.Stream(non_blocking=True)
    kernels.compiled(cupy).spin(200_000, int(out.data.ptr), stream)
    stream.synchronize()
    assert int(out[0]) >= 200_000


@pytest.mark.parametrize("unroll", [4, 12])
@pytest.mark.parametrize(("nbytes", "blocks", "threads"), [
    (1, 1, 1), (16 * 12 * 512 * 3 + 7, 3, 512), (5_000_003, 8, 128),
])
def test_plain_copies_on_the_device_match_numpy(unroll, nbytes, blocks, threads):
    """gpu_check's reference copies, pinned host -> device, and nothing past the range."""
    from nearlocal.kernels import cuda as kernels

    k = kernels.compiled(cupy)
    src_mem = cupy.cuda.alloc_pinned_memory(nbytes + 64)
    src = np.frombuffer(src_mem, np.uint8, nbytes + 64)
    src[:] = np.random.default_rng(nbytes).integers(0, 256, src.size, dtype=np.uint8)
    dst = cupy.asarray(np.full(nbytes + 64, 7, np.uint8))  # host-made: no elementwise kernel
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        k.fn[f"nl_plain_copy{unroll}"]((blocks,), (threads,), k.plain_copy_args(
            int(dst.data.ptr), int(src.ctypes.data), nbytes))
    stream.synchronize()
    out = cupy.asnumpy(dst)
    np.testing.assert_array_equal(out[:nbytes], src[:nbytes])
    assert (out[nbytes:] == 7).all()


def test_the_probe_compiles_the_module():
    from nearlocal.probe.gpu import probe_gpu

    info = probe_gpu()
    assert info.devices and info.nvrtc is None, info.nvrtc
    assert info.kernel_image.startswith(("cubin", "ptx")), info.kernel_image


# --- every session --------------------------------------------------------------------------------

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


@pytest.mark.parametrize("access", ["read", "write"])
@pytest.mark.parametrize("timing", ["device", "e2e"])
def test_1024_async_copies_never_fail_for_the_queue(access, timing):
    row = _measure(Case("cuda-memcpy-async", "pinned", "wb", "1024x160B", peer="gpu:0",
                        access=access, params=(("timing", timing),)))
    if timing == "device":
        assert row["info"]["queued_chunks"] >= 1024 // row["info"]["chunk_ops"]


@pytest.mark.parametrize("width", ["4", "8", "16"])
def test_gather_kernel_widths_for_real(width):
    row = _measure(Case("gather-kernel", "pinned", "wb", "33x77B@301B", peer="gpu:0",
                        params=(("width", width),)))
    assert row["info"]["width"] == int(width)


@pytest.mark.parametrize("api", ["driver", "bindings"])
def test_memcpy_batch_for_real(api):
    from nearlocal.gpu.needs import needs_batch
    from nearlocal.probe import probe

    reason = needs_batch(probe(calibrate=False))
    if reason:
        pytest.skip(reason)
    row = _measure(Case("cuda-memcpy-batch", "pinned", "wb", "1024x160B", peer="gpu:0",
                        params=(("api", api),)))
    assert row["info"]["batch_api"].startswith("driver" if api == "driver" else "cuda-bindings")


def test_kernel_from_pageable_memory_runs_or_explains():
    try:
        _measure(Case("gather-kernel", "dram", "wb", "16x160B", peer="gpu:0"))
    except UsageError as exc:
        assert "pageable" in str(exc)


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
