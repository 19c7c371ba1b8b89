"""The host->gpu replay (issue 57, for the device check, scripts/gpu_check.py --replay): a
serving trace's prefix reloads, cut as `nearlocal replay` cuts them (workloads/replay.py: the
pool's layout, the ring of slots, the fragments), moved from pinned host memory into the GPU at
the requests' arrival times by G concurrent movers, each a CUDA stream with its own buffer.

One host thread issues: it waits on the host's monotonic clock for each request's arrival, then
for a free mover (the end event of the stream's last request done), and queues the request's
fragments on that stream as ONE cuMemcpyBatchAsync (the driver's, through ctypes; where the driver
has none, one cudaMemcpyAsync per fragment: `calls` says which) between a start and an end event.
A FIFO queue with G servers, as the CPU replay's movers (kernels/movers.py). Per request:
arrival (host clock), start and end (its events, placed on the host's time line by a reference
event recorded on an idle stream at a known host time): wait = start - arrival holds the host's
issue latency; transfer = end - start is the stream's."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

LEAD_S = 0.05  # the replay's time zero lies this far after the issue loop is ready


@dataclass(frozen=True)
class GpuReplayTimes:
    """Per request, ns from the replay's time zero (as workloads.replay.ReplayTimes)."""

    arrival_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    mover: np.ndarray
    streams: int
    calls: str
    reference_error_ns: float  # host time between recording the reference event and its end


def _batch_call():
    from nearlocal.gpu.bindings import driver_memcpy_batch

    return driver_memcpy_batch()


def run_gpu_replay(frags: np.ndarray, first: np.ndarray, arrival_s: np.ndarray,
                   region_bytes: int, dst_bytes: int, streams: int,
                   device: int = 0) -> GpuReplayTimes:
    """Move every request's fragments (src offsets in a pinned pool of `region_bytes`, dst
    offsets in a mover's `dst_bytes` buffer on GPU `device`) at its arrival (s from time zero)
    with `streams` movers."""
    import ctypes

    import cupy as cp

    from nearlocal.gpu.bindings import SRC_ACCESS_ORDER_STREAM, DriverAttrs
    from nearlocal.gpu.copy_sessions import MEMCPY_DEFAULT
    from nearlocal.regions import load_providers, parse_region, region_kind

    if len(first) != len(arrival_s) + 1:
        raise ValueError("first must hold one offset per request and one past the last")
    n = len(arrival_s)
    load_providers()
    pinned, gpu = parse_region("pinned"), parse_region(f"gpu:{device}")
    src = region_kind(pinned).open(pinned, region_bytes, "wb", True)
    try:
        dst = region_kind(gpu).open(gpu, streams * dst_bytes, "wb", True)
    except BaseException:
        src.close()
        raise
    try:
        with cp.cuda.Device(device):
            runtime = cp.cuda.runtime
            movers = [cp.cuda.Stream(non_blocking=True) for _ in range(streams)]
            starts = [cp.cuda.Event() for _ in range(n)]
            ends = [cp.cuda.Event() for _ in range(n)]
            reference = cp.cuda.Event()
            src_ptr, dst_ptr = int(src.access.device_pointer), int(dst.access.device_pointer)
            srcs = np.ascontiguousarray(src_ptr + frags[:, 0], np.uint64)
            sizes = np.ascontiguousarray(frags[:, 2], np.uint64)
            dsts = [np.ascontiguousarray(dst_ptr + m * dst_bytes + frags[:, 1], np.uint64)
                    for m in range(streams)]
            call, why = _batch_call()
            attrs = DriverAttrs()
            attrs.srcAccessOrder = SRC_ACCESS_ORDER_STREAM
            idx, fail = np.zeros(1, np.uint64), ctypes.c_size_t(0)
            calls = ("one cuMemcpyBatchAsync a request (driver, ctypes)" if call is not None
                     else f"one cudaMemcpyAsync a fragment ({why})")

            def issue(i: int, m: int) -> None:
                lo, hi = int(first[i]), int(first[i + 1])
                stream = movers[m]
                starts[i].record(stream)
                if call is not None:
                    err = call(dsts[m].ctypes.data + 8 * lo, srcs.ctypes.data + 8 * lo,
                               sizes.ctypes.data + 8 * lo, hi - lo, ctypes.addressof(attrs),
                               idx.ctypes.data, 1, ctypes.addressof(fail), stream.ptr)
                    if int(err) != 0:
                        raise RuntimeError(f"cuMemcpyBatchAsync failed: {err}")
                else:
                    for d, s, size in zip(dsts[m][lo:hi].tolist(), srcs[lo:hi].tolist(),
                                          sizes[lo:hi].tolist(), strict=True):
                        runtime.memcpyAsync(d, s, size, MEMCPY_DEFAULT, stream.ptr)
                ends[i].record(stream)

            # the reference: an event on an idle stream, its host time read around the record
            clock = time.perf_counter_ns
            before = clock()
            reference.record(movers[0])
            reference.synchronize()
            after = clock()
            zero = after + int(LEAD_S * 1e9)
            due = zero + np.round(np.asarray(arrival_s, np.float64) * 1e9).astype(np.int64)
            last: list[int | None] = [None] * streams
            served = np.full(n, -1, np.int64)
            for i in range(n):
                while clock() < due[i]:
                    pass
                if first[i + 1] == first[i]:
                    continue  # no hit: nothing to move
                m = None
                while m is None:
                    m = next((j for j, k in enumerate(last) if k is None or ends[k].done), None)
                issue(i, m)
                last[m] = i
                served[i] = m
            for stream in movers:
                stream.synchronize()
            base = float(before - zero)  # the reference event's host time, from time zero
            start_ns = np.array([base + cp.cuda.get_elapsed_time(reference, starts[i]) * 1e6
                                 if served[i] >= 0 else float(due[i] - zero)
                                 for i in range(n)])
            end_ns = np.array([base + cp.cuda.get_elapsed_time(reference, ends[i]) * 1e6
                               if served[i] >= 0 else float(due[i] - zero) for i in range(n)])
    finally:
        dst.close()
        src.close()
    return GpuReplayTimes(arrival_ns=(due - zero).astype(np.float64), start_ns=start_ns,
                          end_ns=end_ns, mover=served, streams=streams, calls=calls,
                          reference_error_ns=float(after - before))
