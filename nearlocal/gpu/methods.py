"""GPU methods: the CUDA runtime's copy APIs (one call per fragment, batched, 2-D), one numba-cuda
kernel for the whole fragment table (Beluga B9, B13-B14), zero-copy access to mapped host
memory, NVLink peer copies and SwiftCache's layer stream (S2-S3).

Every method takes `timing=device|e2e` (see nearlocal.gpu.timing): `device` = CUDA events around
the work queued behind a blocking kernel, after a warm-up; `e2e` = host monotonic clock from the
decision to move (fragment table upload, launch / API calls included) to data usable at the
destination (synchronised) - a >100 us-class interval, so a host clock around it is sound. Each
case also records the other figure's median in `info`, and per-copy percentiles for the methods
that issue one call per fragment. Every session checks once, before timing, that the destination
holds the source's bytes.

Host<->GPU methods: the region under test is the host side (pinned, registered:..., dram), the
peer is gpu:K (the GPU doing the work); read = region -> GPU (gather), write = GPU -> region
(scatter). Peer methods: region gpu:J (the donor), peer gpu:K (the local GPU doing the work).
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.gpu import timing
from nearlocal.gpu.regions import GpuAccess, _no_gpu, gpu_access
from nearlocal.harness.methods import Method, SessionContext, register_method
from nearlocal.hwprobe import HostInventory

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (UVA)
MEMCPY_HOST_TO_DEVICE = 1
PEER_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled
PAGEABLE_MEMORY_ACCESS = 88  # cudaDevAttrPageableMemoryAccess
BATCH_MIN_VERSION = 12080
OTHER_TIMING_SAMPLES = 10


# --- needs: why a method cannot run on this box -------------------------------------------------

def _needs_gpu(inventory: HostInventory) -> str | None:
    """A GPU and cupy (the regions' reason), and numba-cuda: every session's device clock queues
    the work behind its blocking kernel, and the kernel methods are numba-cuda kernels."""
    reason = _no_gpu(inventory)
    if reason is None and importlib.util.find_spec("numba_cuda") is None:
        reason = "numba-cuda is not installed (pip install nearlocal[cuda12] or [cuda13])"
    return reason


def _needs_two(inventory: HostInventory) -> str | None:
    reason = _needs_gpu(inventory)
    count = len(inventory.gpu.devices)
    if reason is None and count < 2:
        reason = f"fewer than 2 GPUs (this box has {count})"
    return reason


def _needs_peer(inventory: HostInventory) -> str | None:
    reason = _needs_two(inventory)
    count = len(inventory.gpu.devices)
    if reason is None and not any(inventory.gpu.can_access_peer(i, j)
                                  for i in range(count) for j in range(count) if i != j):
        reason = f"no peer access between any pair of the {count} GPUs"
    return reason


def _needs_batch(inventory: HostInventory) -> str | None:
    reason = _needs_gpu(inventory)
    if reason:
        return reason
    versions = [v for v in (inventory.gpu.runtime_version, inventory.gpu.driver_version) if v]
    if not versions or min(versions) < BATCH_MIN_VERSION:
        return (f"cudaMemcpyBatchAsync needs CUDA >= 12.8 (runtime "
                f"{inventory.gpu.runtime_version}, driver {inventory.gpu.driver_version})")
    try:
        from cuda.bindings import runtime
    except Exception:
        return "cuda-bindings is not importable (pip install nearlocal[cuda12] or [cuda13])"
    if not hasattr(runtime, "cudaMemcpyBatchAsync"):
        return "this cuda-bindings has no cudaMemcpyBatchAsync (needs >= 12.8)"
    return None


# --- shared session machinery --------------------------------------------------------------------

def _int_param(params: dict, name: str, low: int, high: int) -> int:
    text = str(params.get(name))
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"parameter {name}={text!r} is not an integer ({low}..{high})") from None
    if not low <= value <= high:
        raise UsageError(f"parameter {name}={value} is out of range: valid {low}..{high}")
    return value


def _numba_array(pointer: int, shape: int | tuple, dtype=np.uint8):
    """A numba device array over a device-usable address (no copy, no stream sync)."""
    from numba import cuda

    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    desc = {"shape": shape, "typestr": np.dtype(dtype).str, "version": 3,
            "data": (int(pointer), False), "strides": None, "stream": None}
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


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


def check_params(params: dict) -> None:
    """Parameter values a GPU session would refuse, refused before the run (exit 2)."""
    value = str(params.get("timing", "device"))
    if value not in timing.TIMINGS:
        raise UsageError(f"timing={value!r} is not valid: use device or e2e")
    if "width" in params and _int_param(params, "width", 4, 16) not in (4, 8, 16):
        raise UsageError(f"load width {params['width']} is not supported: valid widths are 4, 8, "
                         "16 (bytes)")
    if "threads" in params:
        threads = _int_param(params, "threads", 1, 1024)
        group = _int_param(params, "group", 0, 1024) if "group" in params else 0
        if group and (group > threads or threads % group):
            raise UsageError(f"group {group} must divide the {threads} threads per block (0: auto)")
    for name, low, high in (("fill", 0, 255), ("layers", 1, 1024), ("compute_us", 0, 10_000_000)):
        if name in params:
            _int_param(params, name, low, high)
    if str(params.get("copy", "memcpy")) not in ("memcpy", "kernel"):
        raise UsageError(f"copy={params['copy']!r} is not valid: use memcpy or kernel")


class GpuSession:
    """One method on one case: the device, a stream, both clocks, a correctness check.

    Subclasses set `work_device` rules through `_choose_device` and implement `enqueue()` (queue
    the work on self.stream) and optionally `decide()` (what e2e adds before it: table upload)."""

    synchronous = False  # the host's calls may block until the copy is done: cannot be queued
    legacy_stream = False  # the work runs on the legacy default stream (cudaMemcpy)
    per_call = False  # one API call per fragment: per-copy percentiles are recorded

    def __init__(self, ctx: SessionContext, method: str):
        import cupy as cp

        self.cp = cp
        self.ctx = ctx
        self.method = method
        self.timing = str(ctx.params.get("timing", "device"))
        if self.timing not in timing.TIMINGS:
            raise UsageError(f"timing={self.timing!r} is not valid: use device or e2e")
        self.src, self.dst = gpu_access(ctx.src), gpu_access(ctx.dst)
        from nearlocal.gpu import kernels

        self.kernels = kernels
        self.table = kernels.validate_fragments(ctx.pattern.frags, self.src.nbytes,
                                                self.dst.nbytes)
        self.device = self._choose_device()
        self.clock = "cuda-event" if self.timing == "device" else "monotonic-ns"
        self.info: dict = {"timing": self.timing, "gpu": self.device,
                           "src_memory": self.src.memory, "dst_memory": self.dst.memory}
        self._device_ctx = cp.cuda.Device(self.device)
        self._device_ctx.use()
        from numba import cuda

        self.stream = cp.cuda.Stream(non_blocking=True)
        self.nb_stream = cuda.external_stream(self.stream.ptr)
        self._spin_out = cp.zeros(1, dtype=cp.uint64)
        self.timer = timing.EventTimer(cp, self.stream, self.nb_stream,
                                       _numba_array(self._spin_out.data.ptr, 1, np.uint64))
        self.setup()
        cp.cuda.runtime.deviceSynchronize()  # uploads on the legacy stream are done
        self.check()
        # each clock's own cost, removed from its samples (the row's and the other figure)
        self.overheads = {"device": self.timer.calibrate(),
                          "e2e": timing.host_clock_overhead_ns()}
        self.overhead_ns = self.overheads[self.timing]
        resolution = timing.EVENT_RESOLUTION_NS if self.timing == "device" else \
            timing.host_clock_resolution_ns()
        self.info.update(timer_overhead_ns=self.overhead_ns, clock_resolution_ns=resolution)
        self._record_other_timing()

    # -- to override --
    def _choose_device(self) -> int:
        """The GPU doing the work: the peer's (the local GPU), else the region's."""
        reading = self.ctx.case.access == "read"
        peer, region = (self.dst, self.src) if reading else (self.src, self.dst)
        for access in (peer, region):
            if access.device is not None:
                return access.device
        raise UsageError(f"{self.method} needs a GPU on one side: use --peer gpu:K")

    def setup(self) -> None:
        pass

    def enqueue(self, marks: list | None = None) -> None:
        raise NotImplementedError

    def decide(self) -> None:
        """Work the host does between deciding and queueing (e2e only): nothing by default."""

    # -- shared --
    def _pointer(self, access: GpuAccess, kernel: bool) -> int:
        """The address the GPU uses. API copies take pageable host pointers; kernels need memory
        mapped into the GPU, or a GPU that reads pageable memory (HMM / ATS)."""
        if access.device_pointer is not None:
            return access.device_pointer
        if kernel and not self.cp.cuda.runtime.deviceGetAttribute(PAGEABLE_MEMORY_ACCESS,
                                                                   self.device):
            raise UsageError(
                f"{self.method} accesses host memory in place, and {self.ctx.case.region} is "
                f"pageable while GPU {self.device} cannot touch pageable memory (no HMM / ATS): "
                f"use pinned or registered:{self.ctx.case.region}")
        return int(access.host_pointer)

    def _bytes(self, region) -> np.ndarray:
        array = region.array
        return array if isinstance(array, np.ndarray) else self.cp.asnumpy(array)

    def _clear_destination(self) -> None:
        """Zero the destination fragments so the check cannot pass on stale bytes."""
        array = self.ctx.dst.array
        if isinstance(array, np.ndarray):
            for _, d, n in self.table:
                array[d:d + n] = 0
        else:
            host = self.cp.asnumpy(array)
            for _, d, n in self.table:
                host[d:d + n] = 0
            array.set(host)
            self.cp.cuda.runtime.deviceSynchronize()  # .set() ran on the legacy stream

    def run_once(self) -> None:
        self.decide()
        self.enqueue()
        self.stream.synchronize()
        self.cp.cuda.Stream.null.synchronize()

    def check(self) -> None:
        self._clear_destination()
        self.run_once()
        bad = self.kernels.fragments_match(self._bytes(self.ctx.dst), self._bytes(self.ctx.src),
                                           self.table)
        if bad is not None:
            s, d, n = (int(x) for x in self.table[bad])
            raise RuntimeError(f"{self.method} moved wrong bytes: fragment {bad} ({n} B from "
                               f"{s} to {d}) differs from its source")

    def _blocking_if_pageable(self) -> None:
        """CUDA may run a copy to or from pageable memory synchronously with the host (device ->
        pageable returns only once done), so the host would wait for the blocking kernel: time
        such copies between events around the calls instead (host gaps included)."""
        if self.src.device_pointer is None or self.dst.device_pointer is None:
            self.synchronous = True
            self.info["host_may_block"] = "pageable memory"

    def _one(self, mode: str) -> float:
        stream = self.cp.cuda.Stream.null if self.legacy_stream else self.stream
        if mode == "e2e":
            def run() -> None:
                self.decide()
                self.enqueue()
            return timing.end_to_end(run, stream)
        if self.synchronous:
            return self.timer.unqueued(self.enqueue, stream)
        return self.timer.queued(self.enqueue)

    def _record_other_timing(self) -> None:
        other = "e2e" if self.timing == "device" else "device"
        values = np.array([self._one(other) for _ in range(OTHER_TIMING_SAMPLES)])
        values = np.maximum(values - self.overheads[other], 0.0)
        self.info[f"{other}_median_ns"] = float(np.median(values))
        self.info[f"{other}_p99_ns"] = float(np.percentile(values, 99))
        if self.per_call and self.table.shape[0] > 1 and not self.synchronous:
            marks = [self.cp.cuda.Event() for _ in range(self.table.shape[0] + 1)]

            def marked() -> None:
                marks[0].record(self.stream)
                self.enqueue(marks[1:])

            self.timer.queued(marked)
            per_copy = np.array([self.cp.cuda.get_elapsed_time(a, b) * 1e6
                                 for a, b in itertools.pairwise(marks)])
            for q in (50, 90, 99):
                self.info[f"per_copy_p{q}_ns"] = float(np.percentile(per_copy, q))

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        values = np.array([self._one(self.timing) for _ in range(n)], dtype=np.float64)
        self.info.update(self.timer.info())
        ns = np.maximum(values - self.overhead_ns, 0.0)
        if self.timing == "device":
            return values / 1e6, ns  # raw: milliseconds, as cudaEventElapsedTime gives
        return values, ns

    def close(self) -> None:
        self.stream.synchronize()


# --- runtime API copies ------------------------------------------------------------------------

class MemcpySession(GpuSession):
    """cudaMemcpy (synchronous) or cudaMemcpyAsync, one call per fragment."""

    per_call = True

    def __init__(self, ctx: SessionContext, method: str, asynchronous: bool):
        self.synchronous = self.legacy_stream = not asynchronous
        super().__init__(ctx, method)

    def setup(self) -> None:
        self._blocking_if_pageable()
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        self.calls = [(dst + int(d), src + int(s), int(n)) for s, d, n in self.table]
        self.info["calls"] = len(self.calls)

    def enqueue(self, marks: list | None = None) -> None:
        runtime = self.cp.cuda.runtime
        if self.legacy_stream:
            for dst, src, n in self.calls:
                runtime.memcpy(dst, src, n, MEMCPY_DEFAULT)
            return
        stream = self.stream.ptr
        for i, (dst, src, n) in enumerate(self.calls):
            runtime.memcpyAsync(dst, src, n, MEMCPY_DEFAULT, stream)
            if marks is not None:
                marks[i].record(self.stream)


class BatchSession(GpuSession):
    """cudaMemcpyBatchAsync (CUDA >= 12.8): every fragment in one API call."""

    def setup(self) -> None:
        from cuda.bindings import runtime

        self.runtime = runtime
        self._blocking_if_pageable()
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        self.srcs = [src + int(s) for s in self.table[:, 0]]
        self.dsts = [dst + int(d) for d in self.table[:, 1]]
        self.sizes = [int(n) for n in self.table[:, 2]]
        attrs = runtime.cudaMemcpyAttributes()
        order = runtime.cudaMemcpySrcAccessOrder
        pageable = self.src.device_pointer is None
        # stream order for memory CUDA knows; "any" is what the API asks for malloc'd sources
        attrs.srcAccessOrder = (order.cudaMemcpySrcAccessOrderAny if pageable
                                else order.cudaMemcpySrcAccessOrderStream)
        self.attrs = [attrs]
        self.info["src_access_order"] = "any" if pageable else "stream"
        runtime.cudaSetDevice(self.device)

    def enqueue(self, marks: list | None = None) -> None:
        result = self.runtime.cudaMemcpyBatchAsync(self.dsts, self.srcs, self.sizes,
                                                   len(self.sizes), self.attrs, [0], 1,
                                                   self.stream.ptr)
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise RuntimeError(f"cudaMemcpyBatchAsync failed: {err}")


class Memcpy2DSession(GpuSession):
    """cudaMemcpy2DAsync: regularly strided fragments as one pitched copy."""

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

    def enqueue(self, marks: list | None = None) -> None:
        dst, dpitch, src, spitch, width, height = self.args
        self.cp.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                           MEMCPY_DEFAULT, self.stream.ptr)


class PeerMemcpySession(GpuSession):
    """cudaMemcpyPeerAsync, one call per fragment, with peer access enabled when possible."""

    per_call = True

    def setup(self) -> None:
        other = self._other_device()  # both directions, so the copy engines go direct
        both = [enable_peer_access(self.cp, a, b, required=False, info={})
                for a, b in ((other, self.device), (self.device, other))]
        self.info["peer_access"] = all(both)
        src, dst = self._pointer(self.src, False), self._pointer(self.dst, False)
        self.calls = [(dst + int(d), self.dst.device, src + int(s), self.src.device, int(n))
                      for s, d, n in self.table]

    def _other_device(self) -> int:
        if self.src.device is None or self.dst.device is None:
            raise UsageError(f"{self.method} copies between two GPUs: use --region gpu:J "
                             "--peer gpu:K")
        return self.src.device if self.src.device != self.device else self.dst.device

    def enqueue(self, marks: list | None = None) -> None:
        runtime, stream = self.cp.cuda.runtime, self.stream.ptr
        for i, (dst, dst_dev, src, src_dev, n) in enumerate(self.calls):
            runtime.memcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream)
            if marks is not None:
                marks[i].record(self.stream)


def enable_peer_access(cp, device: int, peer: int, required: bool, info: dict) -> bool:
    """Let `device` access `peer`'s memory; False (or an error when required) if it cannot."""
    if device == peer:
        return True
    runtime = cp.cuda.runtime
    if not runtime.deviceCanAccessPeer(device, peer):
        if required:
            raise RuntimeError(f"GPU {device} cannot access GPU {peer}'s memory (no peer access)")
        info["peer_access"] = False
        return False
    with cp.cuda.Device(device):
        try:
            runtime.deviceEnablePeerAccess(peer)
        except cp.cuda.runtime.CUDARuntimeError as exc:
            if exc.status != PEER_ALREADY_ENABLED:
                raise
    info["peer_access"] = True
    return True


# --- one kernel for the whole table --------------------------------------------------------------

class KernelSession(GpuSession):
    """gather-kernel / scatter-kernel / peer-kernel: one launch moves every fragment."""

    peer = False  # peer-kernel: both sides must be GPUs

    def setup(self) -> None:
        params = self.ctx.params
        if self.peer and (self.src.device is None or self.dst.device is None):
            raise UsageError(f"{self.method} copies between two GPUs: use --region gpu:J "
                             "--peer gpu:K")
        for access in (self.src, self.dst):  # the kernel touches the other GPU's memory
            if access.device is not None and access.device != self.device:
                enable_peer_access(self.cp, self.device, access.device, required=True,
                                   info=self.info)
        src = self._pointer(self.src, True)
        dst = self._pointer(self.dst, True)
        self.src_nb = _numba_array(src, self.src.nbytes)
        self.dst_nb = _numba_array(dst, self.dst.nbytes)
        self.plan = self.kernels.plan_launch(
            self.table, width=_int_param(params, "width", 4, 16),
            threads=_int_param(params, "threads", 1, 1024),
            group=_int_param(params, "group", 0, 1024),
            alignment=self.kernels.pointer_alignment(src, dst))
        self.info.update(self.plan.info())
        cp = self.cp
        self.table_dev = cp.asarray(self.table)
        self.table_nb = _numba_array(self.table_dev.data.ptr, self.table.shape, np.int64)
        # the host's copy of the table, in pinned memory, for the e2e upload
        self._table_host_mem = cp.cuda.alloc_pinned_memory(self.table.nbytes)
        self.table_host = np.frombuffer(self._table_host_mem, np.int64,
                                        self.table.size).reshape(self.table.shape)

    def decide(self) -> None:
        np.copyto(self.table_host, self.table)
        self.cp.cuda.runtime.memcpyAsync(self.table_dev.data.ptr, self.table_host.ctypes.data,
                                         self.table.nbytes, MEMCPY_HOST_TO_DEVICE,
                                         self.stream.ptr)

    def enqueue(self, marks: list | None = None) -> None:
        self.kernels.copy_fragments(self.dst_nb, self.src_nb, self.table_nb, self.plan,
                                    self.nb_stream)


class PeerKernelSession(KernelSession):
    peer = True


class ZeroCopySession(KernelSession):
    """The kernel reads the region's fragments where they lie (a byte sum per fragment, nothing
    copied to device memory) or writes them in place (a fill byte)."""

    def setup(self) -> None:
        super().setup()
        self.sums = self.cp.zeros(self.table.shape[0], dtype=self.cp.uint64)
        self.sums_nb = _numba_array(self.sums.data.ptr, self.sums.size, np.uint64)
        self.fill = _int_param(self.ctx.params, "fill", 0, 255)

    def enqueue(self, marks: list | None = None) -> None:
        if self.ctx.case.access == "read":  # the sums are only read by the check
            self.kernels.sum_fragments(self.src_nb, self.table_nb, self.plan, self.sums_nb,
                                       self.nb_stream)
        else:
            self.kernels.fill_fragments(self.dst_nb, self.table_nb, self.plan, self.fill,
                                        self.nb_stream)

    def check(self) -> None:
        if self.ctx.case.access == "read":
            self.sums.data.memset_async(0, self.sums.nbytes, self.stream)
            self.run_once()
            expected = self.kernels.reference_sums(self._bytes(self.ctx.src), self.table)
            if not np.array_equal(self.cp.asnumpy(self.sums), expected):
                raise RuntimeError("zero-copy-kernel read wrong bytes: fragment sums differ")
            return
        self._clear_destination()
        self.run_once()
        data = self._bytes(self.ctx.dst)
        for i, (_, d, n) in enumerate(self.table):
            if np.any(data[d:d + n] != self.fill):
                raise RuntimeError(f"zero-copy-kernel did not write fragment {i}")


# --- SwiftCache S3: layer stream ------------------------------------------------------------------

def layer_stream_summary(round_trip_ns: np.ndarray, pass_ns: float, compute_pass_ns: float,
                         edge_ns: float, compute_ns: float, tolerance: float = 0.05) -> dict:
    """Does the per-layer fetch + write-back hide behind compute? It does when a whole pass takes
    no longer than compute alone (plus the first fetch and last write-back that nothing can hide,
    plus `tolerance`)."""
    median = float(np.median(round_trip_ns)) if len(round_trip_ns) else float("nan")
    return {
        "round_trip_median_ns": median,
        "compute_ns": compute_ns,
        "pass_ns": pass_ns,
        "compute_only_pass_ns": compute_pass_ns,
        "exposed_ns": max(0.0, pass_ns - compute_pass_ns - edge_ns),
        "round_trip_fits_compute": bool(median <= compute_ns),
        "hides_behind_compute": bool(pass_ns <= compute_pass_ns * (1 + tolerance) + edge_ns),
    }


class LayerStreamSession(GpuSession):
    """For layers 1..L: fetch layer l's KV (the pattern) from the donor GPU (the region) into a
    double buffer on the local GPU (the peer), compute for `compute_us` (a blocking kernel standing
    in for attention, one thread, leaving the SMs and copy engines free), write it back; fetch of
    l+1 overlaps compute of l. Samples: per-layer round trip (fetch + write-back, CUDA events) in
    device timing; the whole pass / L on the host clock in e2e timing."""

    def setup(self) -> None:
        cp, params = self.cp, self.ctx.params
        if self.src.device is None or self.dst.device is None:
            raise UsageError("layer-stream moves KV between two GPUs: --region gpu:J --peer gpu:K")
        self.layers = _int_param(params, "layers", 1, 1024)
        self.compute_ns = 1000 * _int_param(params, "compute_us", 0, 10_000_000)
        self.copy = str(params.get("copy", "memcpy"))
        if self.copy not in ("memcpy", "kernel"):
            raise UsageError(f"copy={self.copy!r} is not valid: use memcpy or kernel")
        # the direction of the case does not matter: a layer goes out and back
        donor = self.src if self.ctx.case.access == "read" else self.dst
        table = self.table if self.ctx.case.access == "read" else self.table[:, [1, 0, 2]]
        span = int((table[:, 0] + table[:, 2]).max())
        local_span = int((table[:, 1] + table[:, 2]).max())
        enable_peer_access(cp, self.device, donor.device, required=self.copy == "kernel",
                           info=self.info)
        with cp.cuda.Device(donor.device):
            self.store = cp.empty(self.layers * span + 256, dtype=cp.uint8)
            self.store[:] = (cp.arange(self.store.size, dtype=cp.uint32) % 251 + 1).astype(cp.uint8)
            cp.cuda.Device(donor.device).synchronize()
        self.buffers = [cp.zeros(local_span + 256, dtype=cp.uint8) for _ in range(2)]
        self.fetch_tables = [table + np.array([k * span, 0, 0]) for k in range(self.layers)]
        self.streams = {name: cp.cuda.Stream(non_blocking=True) for name in ("compute", "back")}
        from numba import cuda

        self.nb_compute = cuda.external_stream(self.streams["compute"].ptr)
        if self.copy == "kernel":
            from nearlocal.gpu import kernels

            self.store_nb = _numba_array(self.store.data.ptr, self.store.nbytes)
            self.buf_nb = [_numba_array(b.data.ptr, b.nbytes) for b in self.buffers]
            self.nb_back = cuda.external_stream(self.streams["back"].ptr)
            self.fetch_dev = [cp.asarray(t) for t in self.fetch_tables]
            self.back_dev = [cp.asarray(t[:, [1, 0, 2]]) for t in self.fetch_tables]
            self.fetch_nb = [_numba_array(t.data.ptr, t.shape, np.int64) for t in self.fetch_dev]
            self.back_nb = [_numba_array(t.data.ptr, t.shape, np.int64) for t in self.back_dev]
            self.plan = kernels.plan_launch(table, width=_int_param(params, "width", 4, 16),
                                            threads=_int_param(params, "threads", 1, 1024))
            self.info.update(self.plan.info())
        count = self.layers
        self.ev = {name: [cp.cuda.Event() for _ in range(count)]
                   for name in ("fetch0", "fetch1", "compute1", "back0", "back1")}
        self.donor_device, self.donor_ptr = donor.device, int(self.store.data.ptr)
        self.info.update(layers=self.layers, compute_us=self.compute_ns / 1000, copy=self.copy,
                         layer_bytes=int(table[:, 2].sum()),
                         round_trip_bytes=2 * int(table[:, 2].sum()))  # fetch + write back
        self.compute_pass_ns = self.timer.queued(lambda: self._pass(compute_only=True))
        self._last_pass_ns = 0.0

    def _copy(self, layer: int, fetch: bool, stream, nb_stream) -> None:
        buf = self.buffers[layer % 2]
        if self.copy == "kernel":
            if fetch:
                self.kernels.copy_fragments(self.buf_nb[layer % 2], self.store_nb,
                                            self.fetch_nb[layer], self.plan, nb_stream)
            else:
                self.kernels.copy_fragments(self.store_nb, self.buf_nb[layer % 2],
                                            self.back_nb[layer], self.plan, nb_stream)
            return
        runtime = self.cp.cuda.runtime
        local = int(buf.data.ptr)
        for s, d, n in self.fetch_tables[layer]:
            if fetch:
                runtime.memcpyPeerAsync(local + int(d), self.device, self.donor_ptr + int(s),
                                        self.donor_device, int(n), stream.ptr)
            else:
                runtime.memcpyPeerAsync(self.donor_ptr + int(s), self.donor_device,
                                        local + int(d), self.device, int(n), stream.ptr)

    def _pass(self, compute_only: bool = False) -> None:
        """Queue one pass over every layer (fetch on self.stream, compute, write-back)."""
        fetch, compute, back = self.stream, self.streams["compute"], self.streams["back"]
        ev = self.ev
        for layer in range(self.layers):
            if not compute_only:
                if layer >= 2:
                    fetch.wait_event(ev["back1"][layer - 2])  # its buffer is free again
                ev["fetch0"][layer].record(fetch)
                self._copy(layer, True, fetch, self.nb_stream)
                ev["fetch1"][layer].record(fetch)
                compute.wait_event(ev["fetch1"][layer])
            elif layer == 0:
                compute.wait_event(self.timer.start)
            self.kernels.spin(self.compute_ns, self._spin_out_nb(), self.nb_compute)
            ev["compute1"][layer].record(compute)
            if not compute_only:
                back.wait_event(ev["compute1"][layer])
                ev["back0"][layer].record(back)
                self._copy(layer, False, back, getattr(self, "nb_back", None))
                ev["back1"][layer].record(back)
        last = ev["compute1" if compute_only else "back1"][self.layers - 1]
        fetch.wait_event(last)  # the timer's stop event on self.stream covers the whole pass

    def _spin_out_nb(self):
        if not hasattr(self, "_compute_out"):
            self._compute_out = self.cp.zeros(1, dtype=self.cp.uint64)
            self._compute_out_nb = _numba_array(self._compute_out.data.ptr, 1, np.uint64)
        return self._compute_out_nb

    def enqueue(self, marks: list | None = None) -> None:
        self._pass()

    def check(self) -> None:
        self.run_once()
        self.cp.cuda.Device(self.device).synchronize()
        last = self.layers - 1
        local = self.cp.asnumpy(self.buffers[last % 2])
        store = self.cp.asnumpy(self.store)
        bad = self.kernels.fragments_match(local, store, self.fetch_tables[last])
        if bad is not None:
            raise RuntimeError(f"layer-stream fetched wrong bytes (layer {last}, fragment {bad})")

    def _per_layer(self) -> np.ndarray:
        get, ev = self.cp.cuda.get_elapsed_time, self.ev
        return np.array([(get(ev["fetch0"][i], ev["fetch1"][i]) +
                          get(ev["back0"][i], ev["back1"][i])) * 1e6
                         for i in range(self.layers)])

    def _record_other_timing(self) -> None:
        pass  # both figures are in the summary below

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        out, passes = [], []
        while sum(len(v) for v in out) < n:
            if self.timing == "device":
                passes.append(self.timer.queued(self._pass))
                out.append(self._per_layer())
            else:
                total = timing.end_to_end(self._pass, self.stream)
                passes.append(total)
                out.append(np.array([total / self.layers]))
        values = np.concatenate(out)
        device_pass = self.timer.queued(self._pass)
        first_fetch = self.cp.cuda.get_elapsed_time(self.ev["fetch0"][0], self.ev["fetch1"][0])
        last_back = self.cp.cuda.get_elapsed_time(self.ev["back0"][-1], self.ev["back1"][-1])
        self.info.update(layer_stream_summary(self._per_layer(), device_pass,
                                              self.compute_pass_ns,
                                              (first_fetch + last_back) * 1e6, self.compute_ns))
        self.info["pass_e2e_median_ns" if self.timing == "e2e" else "pass_median_ns"] = \
            float(np.median(passes))
        self.info.update(self.timer.info())
        if self.timing == "device":  # a layer's round trip is two event intervals
            return values / 1e6, np.maximum(values - 2 * self.overhead_ns, 0.0)
        return values, np.maximum(values - self.overhead_ns / self.layers, 0.0)

    def close(self) -> None:
        self.cp.cuda.Device(self.device).synchronize()


# --- registration ---------------------------------------------------------------------------

_TIMING = {"timing": "device"}
_KERNEL = {**_TIMING, "width": "16", "threads": "128", "group": "0"}


def _gpu(name: str, summary: str, accesses: tuple[str, ...], open_session, needs,
         params: dict, regions=("host", "gpu"), markers=("gpu",), sample_bytes=None) -> Method:
    return register_method(Method(
        name=name, family="gpu", summary=summary, accesses=accesses, state="-",
        open_session=open_session, region_families=frozenset(regions),
        peer_families=frozenset({"gpu"}), needs=needs, params=params, markers=markers,
        check_params=check_params, sample_bytes=sample_bytes,
    ))


_gpu("cuda-memcpy", "cudaMemcpy per fragment (synchronous; device time includes host gaps)",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy", False), _needs_gpu,
     _TIMING)
_gpu("cuda-memcpy-async", "cudaMemcpyAsync per fragment on one stream",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy-async", True), _needs_gpu,
     _TIMING)
_gpu("cuda-memcpy-batch", "cudaMemcpyBatchAsync: every fragment in one call (CUDA >= 12.8)",
     ("read", "write"), lambda ctx: BatchSession(ctx, "cuda-memcpy-batch"), _needs_batch,
     _TIMING)
_gpu("cuda-memcpy-2d", "cudaMemcpy2DAsync of regularly strided fragments",
     ("read", "write"), lambda ctx: Memcpy2DSession(ctx, "cuda-memcpy-2d"), _needs_gpu, _TIMING)
_gpu("gather-kernel", "one kernel gathers every fragment into the GPU (reads mapped host memory)",
     ("read",), lambda ctx: KernelSession(ctx, "gather-kernel"), _needs_gpu, _KERNEL)
_gpu("scatter-kernel", "one kernel scatters every fragment from the GPU into the region",
     ("write",), lambda ctx: KernelSession(ctx, "scatter-kernel"), _needs_gpu, _KERNEL)
_gpu("zero-copy-kernel", "a kernel reads (byte sums) or writes (fill) mapped host memory in place",
     ("read", "write"), lambda ctx: ZeroCopySession(ctx, "zero-copy-kernel"), _needs_gpu,
     {**_KERNEL, "fill": "90"}, regions=("host",))
_gpu("peer-memcpy", "cudaMemcpyPeerAsync per fragment between two GPUs (NVLink when peered)",
     ("read", "write"), lambda ctx: PeerMemcpySession(ctx, "peer-memcpy"), _needs_two,
     _TIMING, regions=("gpu",), markers=("gpu", "nvlink"))
_gpu("peer-kernel", "one kernel on the local GPU copies every fragment from / to a peer GPU",
     ("read", "write"), lambda ctx: PeerKernelSession(ctx, "peer-kernel"), _needs_peer,
     _KERNEL, regions=("gpu",), markers=("gpu", "nvlink"))
_gpu("layer-stream", "SwiftCache layer stream: per layer fetch from the peer GPU, compute, "
     "write back", ("read",), lambda ctx: LayerStreamSession(ctx, "layer-stream"), _needs_peer,
     {**_TIMING, "layers": "32", "compute_us": "100", "copy": "memcpy", "width": "16",
      "threads": "128"},
     regions=("gpu",), markers=("gpu", "nvlink"),
     sample_bytes=lambda pattern: 2 * pattern.total_bytes)  # a layer's fetch and write-back

from nearlocal.gpu import suites  # noqa: E402, F401 - the gpu / swiftcache suites
