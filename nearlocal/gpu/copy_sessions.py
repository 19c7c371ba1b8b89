"""The CUDA runtime's copy APIs as sessions: cudaMemcpy / cudaMemcpyAsync per fragment,
cudaMemcpyBatchAsync (every fragment in one call), cudaMemcpy2DAsync (strided fragments as one
pitched copy) and cudaMemcpyPeerAsync between two GPUs."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np

from nearlocal.core.methods import SessionContext
from nearlocal.errors import UsageError
from nearlocal.gpu.bindings import (
    SRC_ACCESS_ORDER_ANY,
    SRC_ACCESS_ORDER_STREAM,
    DriverAttrs,
    driver_memcpy_batch,
)
from nearlocal.gpu.session import GpuSession, enable_peer_access

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (UVA)


def regular_strides(table: np.ndarray) -> tuple[int, int, int, int] | None:
    """(src pitch, dst pitch, width, height) when the fragments form a 2-D copy, else None."""
    width = int(table[0, 2])
    if np.any(table[:, 2] != width):
        return None
    if table.shape[0] == 1:
        return width, width, width, 1
    src_step, dst_step = np.diff(table[:, 0]), np.diff(table[:, 1])
    if np.any(src_step != src_step[0]) or np.any(dst_step != dst_step[0]):
        return None
    spitch, dpitch = int(src_step[0]), int(dst_step[0])
    if spitch < width or dpitch < width:
        return None
    return spitch, dpitch, width, int(table.shape[0])


def _calls(calls: list, lo: int, hi: int):
    """Calls lo..hi without copying the list inside a timed interval (a slice would)."""
    return calls if lo == 0 and hi >= len(calls) else itertools.islice(calls, lo, hi)


class MemcpySession(GpuSession):
    """cudaMemcpy (synchronous) or cudaMemcpyAsync, one call per fragment."""

    per_call = True

    def __init__(self, ctx: SessionContext, method: str, asynchronous: bool):
        self.synchronous = self.legacy_stream = not asynchronous
        self.e2e_contains = ("one cudaMemcpyAsync call per fragment" if asynchronous else
                             "one cudaMemcpy call per fragment")
        super().__init__(ctx, method)

    def setup(self) -> None:
        self._blocking_if_pageable()
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        self.calls = [(dst + int(d), src + int(s), int(n)) for s, d, n in self.table]
        self.ops = len(self.calls)
        self.info["calls"] = len(self.calls)

    def prime(self) -> None:
        dst, src, _ = self.calls[0]
        self.cp.cuda.runtime.memcpyAsync(dst, src, 1, MEMCPY_DEFAULT, self.stream.ptr)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        runtime, calls = self.cp.cuda.runtime, _calls(self.calls, lo, hi)
        if self.legacy_stream:
            for dst, src, n in calls:
                runtime.memcpy(dst, src, n, MEMCPY_DEFAULT)
            return
        stream = self.stream.ptr
        if marks is None:  # the timed path: no per-call branch or counter
            for dst, src, n in calls:
                runtime.memcpyAsync(dst, src, n, MEMCPY_DEFAULT, stream)
            return
        for i, (dst, src, n) in enumerate(calls):
            runtime.memcpyAsync(dst, src, n, MEMCPY_DEFAULT, stream)
            marks[i].record(self.stream)


class BatchSession(GpuSession):
    """cudaMemcpyBatchAsync (CUDA >= 12.8): every fragment in one API call. By default the
    driver's cuMemcpyBatchAsync is called through ctypes with the pointer arrays built in setup
    (`batch_api=driver`); `--param api=bindings` (or a driver without it) uses cuda-bindings.
    Only an unavailable driver call falls back: wrong bytes from it fail the case (check())."""

    e2e_contains = "one cuMemcpyBatchAsync call (pointer arrays built beforehand)"

    def setup(self) -> None:
        self._blocking_if_pageable()
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        pageable = self.src.device_pointer is None
        self.info["src_access_order"] = "any" if pageable else "stream"
        self.dsts = np.ascontiguousarray(dst + self.table[:, 1], dtype=np.uint64)
        self.srcs = np.ascontiguousarray(src + self.table[:, 0], dtype=np.uint64)
        self.sizes = np.ascontiguousarray(self.table[:, 2], dtype=np.uint64)
        self.first = (int(self.dsts[0]), int(self.srcs[0]))
        self._driver_call, why = (None, "api=bindings") \
            if str(self.ctx.params.get("api", "driver")) == "bindings" else driver_memcpy_batch()
        if self._driver_call is not None:
            attrs = DriverAttrs()
            # stream order for memory CUDA knows; "any" is what the API asks for malloc'd sources
            attrs.srcAccessOrder = SRC_ACCESS_ORDER_ANY if pageable else SRC_ACCESS_ORDER_STREAM
            self._attrs = attrs
            self._idx = np.zeros(1, np.uint64)
            self._fail = ctypes.c_size_t(0)
            self._args = (self.dsts.ctypes.data, self.srcs.ctypes.data, self.sizes.ctypes.data,
                          len(self.sizes), ctypes.addressof(attrs), self._idx.ctypes.data, 1,
                          ctypes.addressof(self._fail), self.stream.ptr)
            self.info["batch_api"] = "driver cuMemcpyBatchAsync via ctypes"
        else:
            self._bindings_setup(pageable)
            self.info["batch_api"] = f"cuda-bindings ({why}; its list conversion is inside e2e)"

    def _bindings_setup(self, pageable: bool) -> None:
        from cuda.bindings import runtime

        self.runtime = runtime
        self._lists = ([int(x) for x in self.dsts], [int(x) for x in self.srcs],
                       [int(x) for x in self.sizes])
        attrs = runtime.cudaMemcpyAttributes()
        order = runtime.cudaMemcpySrcAccessOrder
        attrs.srcAccessOrder = (order.cudaMemcpySrcAccessOrderAny if pageable
                                else order.cudaMemcpySrcAccessOrderStream)
        self.attrs = [attrs]
        runtime.cudaSetDevice(self.device)

    def prime(self) -> None:
        dst, src = self.first
        self.cp.cuda.runtime.memcpyAsync(dst, src, 1, MEMCPY_DEFAULT, self.stream.ptr)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        if self._driver_call is not None:
            err = self._driver_call(*self._args)
        else:
            dsts, srcs, sizes = self._lists
            result = self.runtime.cudaMemcpyBatchAsync(dsts, srcs, sizes, len(sizes),
                                                       self.attrs, [0], 1, self.stream.ptr)
            err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise RuntimeError(f"cudaMemcpyBatchAsync failed: {err}")


class Memcpy2DSession(GpuSession):
    """cudaMemcpy2DAsync: regularly strided fragments as one pitched copy."""

    e2e_contains = "one cudaMemcpy2DAsync call"

    def setup(self) -> None:
        shape = regular_strides(self.table)
        if shape is None:
            raise UsageError(f"cuda-memcpy-2d needs equal fragments at a constant stride "
                             f"(COUNTxSIZE[@STRIDE]); {self.ctx.case.pattern!r} is not")
        spitch, dpitch, width, height = shape
        self._blocking_if_pageable()
        self.args = (self._pointer(self.dst, False) + int(self.table[0, 1]), dpitch,
                     self._pointer(self.src, False) + int(self.table[0, 0]), spitch, width,
                     height)
        self.info.update(spitch=spitch, dpitch=dpitch, width=width, height=height)

    def prime(self) -> None:
        dst, _, src, _, _, _ = self.args
        self.cp.cuda.runtime.memcpyAsync(dst, src, 1, MEMCPY_DEFAULT, self.stream.ptr)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        dst, dpitch, src, spitch, width, height = self.args
        self.cp.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                           MEMCPY_DEFAULT, self.stream.ptr)


class PeerMemcpySession(GpuSession):
    """cudaMemcpyPeerAsync, one call per fragment, with peer access enabled when possible."""

    per_call = True
    e2e_contains = "one cudaMemcpyPeerAsync call per fragment"

    def setup(self) -> None:
        other = self._other_device()  # both directions, so the copy engines go direct
        both = [enable_peer_access(self.cp, a, b, required=False, info={})
                for a, b in ((other, self.device), (self.device, other))]
        self.info["peer_access"] = all(both)
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        self.calls = [(dst + int(d), self.dst.device, src + int(s), self.src.device, int(n))
                      for s, d, n in self.table]
        self.ops = len(self.calls)

    def _other_device(self) -> int:
        if self.src.device is None or self.dst.device is None:
            raise UsageError(f"{self.method} copies between two GPUs: use --region gpu:J "
                             "--peer gpu:K")
        return self.src.device if self.src.device != self.device else self.dst.device

    def prime(self) -> None:
        dst, dst_dev, src, src_dev, _ = self.calls[0]
        self.cp.cuda.runtime.memcpyPeerAsync(dst, dst_dev, src, src_dev, 1, self.stream.ptr)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        runtime, stream = self.cp.cuda.runtime, self.stream.ptr
        for i, (dst, dst_dev, src, src_dev, n) in enumerate(_calls(self.calls, lo, hi)):
            runtime.memcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream)
            if marks is not None:
                marks[i].record(self.stream)
