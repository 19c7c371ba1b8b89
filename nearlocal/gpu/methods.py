"""GPU methods: the CUDA runtime's copy APIs (one call per fragment, batched, 2-D), one CUDA C
kernel (NVRTC called directly, no headers) for the whole fragment table (Beluga B9, B13-B14),
zero-copy access to mapped host memory, NVLink peer copies and SwiftCache's layer stream
(S2-S3).

Every method takes `timing=device|e2e` (see nearlocal.gpu.timing): `device` = CUDA events around
the work queued behind a blocking kernel (in chunks when it is many calls), after a warm-up;
`e2e` = host monotonic clock from the decision to move the prepared fragments (the API calls or
the launch, plus what the row's `e2e_contains` names) to data usable at the destination
(synchronised). Everything else is prepared before the clock starts. Each case also records the
other figure's median in `info`, and per-copy percentiles for the methods that issue one call per
fragment. Every session checks once, before timing, that the destination holds the source's
bytes.

Host<->GPU methods: the region under test is the host side (pinned, registered:..., dram), the
peer is gpu:K (the GPU doing the work); read = region -> GPU (gather), write = GPU -> region
(scatter). Peer methods: region gpu:J (the donor), peer gpu:K (the local GPU doing the work).
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np

from nearlocal.core.methods import Delivery, Method, SessionContext, register_method
from nearlocal.errors import UsageError
from nearlocal.gpu import timing
from nearlocal.gpu.regions import GpuAccess, _no_gpu, alloc_mapped, gpu_access
from nearlocal.probe import HostInventory

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (UVA)
PEER_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled
PAGEABLE_MEMORY_ACCESS = 88  # cudaDevAttrPageableMemoryAccess
BATCH_MIN_VERSION = 12080
OTHER_TIMING_SAMPLES = 10


# --- needs: why a method cannot run on this box -------------------------------------------------

def _needs_gpu(inventory: HostInventory) -> str | None:
    """A GPU and cupy (the regions' reason), and NVRTC: every session's device clock queues the
    work behind a blocking kernel, and the kernel methods are CUDA C compiled at run time."""
    reason = _no_gpu(inventory)
    if reason is None and inventory.gpu.nvrtc:
        reason = inventory.gpu.nvrtc
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
    except Exception as exc:  # absent, or installed and broken: its own words say which
        return (f"cuda-bindings is not importable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; pip install nearlocal[cuda12] "
                "or [cuda13])")
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
    for name, low, high in (("fill", 0, 255), ("layers", 1, 1024), ("compute_us", 0, 10_000_000),
                            ("prime", 0, 1)):
        if name in params:
            _int_param(params, name, low, high)
    if str(params.get("api", "driver")) not in ("driver", "bindings"):
        raise UsageError(f"api={params['api']!r} is not valid: use driver or bindings")
    if str(params.get("copy", "memcpy")) not in ("memcpy", "kernel"):
        raise UsageError(f"copy={params['copy']!r} is not valid: use memcpy or kernel")


class GpuSession:
    """One method on one case: the device, a stream, both clocks, a correctness check.

    Subclasses set `work_device` rules through `_choose_device` and implement
    `enqueue_range(lo, hi)` (queue operations lo..hi of `ops` on self.stream), optionally
    `decide()` (host work e2e adds before the calls) and `prime()` (a 1-byte copy of the same
    direction queued before the start event; see nearlocal.gpu.timing)."""

    synchronous = False  # the host's calls may block until the copy is done: cannot be queued
    legacy_stream = False  # the work runs on the legacy default stream (cudaMemcpy)
    per_call = False  # one API call per fragment: per-copy percentiles are recorded
    ops = 1  # operations enqueue_range() indexes (API calls per sample)
    e2e_contains = ""  # what an e2e interval holds besides the final stream synchronisation

    def __init__(self, ctx: SessionContext, method: str):
        import cupy as cp

        self.cp = cp
        self.ctx = ctx
        self.method = method
        self.timing = str(ctx.params.get("timing", "device"))
        if self.timing not in timing.TIMINGS:
            raise UsageError(f"timing={self.timing!r} is not valid: use device or e2e")
        self.src, self.dst = gpu_access(ctx.src), gpu_access(ctx.dst)
        from nearlocal.kernels import cuda as kernels

        self.kernel_lib = kernels
        self.table = kernels.validate_fragments(ctx.pattern.frags, self.src.nbytes,
                                                self.dst.nbytes)
        self.device = self._choose_device()
        self.clock = "cuda-event" if self.timing == "device" else "monotonic-ns"
        self.info: dict = {"timing": self.timing, "gpu": self.device,
                           "src_memory": self.src.memory, "dst_memory": self.dst.memory}
        self._device_ctx = cp.cuda.Device(self.device)
        self._device_ctx.use()
        self.kernels = kernels.compiled(cp)  # NVRTC, once per process and device
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._spin_out = cp.zeros(1, dtype=cp.uint64)
        self.timer = timing.EventTimer(cp, self.stream, self.kernels,
                                       int(self._spin_out.data.ptr))
        self.setup()
        if (type(self).prime is not GpuSession.prime and not self.synchronous
                and str(ctx.params.get("prime", "1")) == "1"):
            self.timer.prime = self.prime
        cp.cuda.runtime.deviceSynchronize()  # uploads on the legacy stream are done
        self.check()
        # each clock's own cost, from an empty interval of the same kind as the samples it is
        # removed from: host clock reads (e2e), unqueued events (synchronous rows, host-gap
        # fallbacks, an e2e row's events figure), queued events (the rest)
        self.overheads = {"e2e": timing.host_clock_overhead_ns()}
        self.timer.calibrate_unqueued(self._work_stream())
        if self.timing == "device" and not self.synchronous:  # e2e rows never spin
            self.timer.calibrate()
        self.overhead_ns, kind = (
            (self.overheads["e2e"], "two back-to-back host clock reads")
            if self.timing == "e2e" else
            (self.timer.unqueued_overhead_ns, "unqueued empty interval (two events the host "
             "records back to back)") if self.synchronous else
            (self.timer.overhead_ns, "queued empty interval (two events back to back behind "
             "the blocking kernel), once per chunk"))
        resolution = timing.EVENT_RESOLUTION_NS if self.timing == "device" else \
            timing.host_clock_resolution_ns()
        self.info.update(timer_overhead_ns=self.overhead_ns, timer_overhead_kind=kind,
                         clock_resolution_ns=resolution)
        if self.timing == "device" and not self.synchronous:
            self.info["unqueued_overhead_ns"] = self.timer.unqueued_overhead_ns  # host gaps
        if self.timing == "e2e":
            self.info["e2e_contains"] = (self.e2e_contains or "the calls") + \
                ", then stream synchronisation; everything else prepared before the clock"
        else:
            self.info["device_contains"] = (
                "events around the calls, host gaps included (the calls may block the host)"
                if self.synchronous else
                "events around the work queued behind a blocking kernel, in chunks of at most "
                "chunk_ops calls (queued_chunks intervals summed), each minus the empty interval"
                + ("; a 1-byte copy of the same direction runs before the start event, so the "
                   "copy engine's wait for the blocking kernel (likely a few us) is not in the interval"
                   if self.timer.prime is not None else ""))
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

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        raise NotImplementedError

    def enqueue(self) -> None:
        self.enqueue_range(0, self.ops)

    def decide(self) -> None:
        """Work the host does between deciding and the calls (e2e only): nothing by default."""

    def prime(self) -> None:
        """A 1-byte copy of the work's direction, before the start event (copy sessions)."""

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

    def e2e_run(self) -> None:
        """What an e2e interval runs before the synchronisation."""
        self.decide()
        self.enqueue()

    check_paths: tuple[str, ...] = ("e2e",)  # the paths whose bytes check() verifies

    def run_once(self, path: str = "e2e") -> None:
        if path == "e2e":
            self.e2e_run()
        else:
            self.enqueue()
        self.stream.synchronize()
        self.cp.cuda.Stream.null.synchronize()

    def check(self) -> None:
        for path in self.check_paths:
            self._clear_destination()
            self.run_once(path)
            bad = self.kernel_lib.fragments_match(self._bytes(self.ctx.dst),
                                                  self._bytes(self.ctx.src), self.table)
            if bad is not None:
                s, d, n = (int(x) for x in self.table[bad])
                raise RuntimeError(f"{self.method} moved wrong bytes: fragment {bad} ({n} B "
                                   f"from {s} to {d}) differs from its source")

    def _blocking_if_pageable(self) -> None:
        """CUDA may run a copy to or from pageable memory synchronously with the host (device ->
        pageable returns only once done), so the host would wait for the blocking kernel: time
        such copies between events around the calls instead (host gaps included)."""
        if self.src.device_pointer is None or self.dst.device_pointer is None:
            self.synchronous = True
            self.info["host_may_block"] = "pageable memory"

    def _work_stream(self):
        return self.cp.cuda.Stream.null if self.legacy_stream else self.stream

    def _one(self, mode: str) -> tuple[float, float]:
        """One sample on `mode`'s clock: (raw ns, the clock's cost inside it, to remove)."""
        if mode == "e2e":
            return timing.end_to_end(self.e2e_run, self._work_stream()), self.overheads["e2e"]
        if self.synchronous:
            return (self.timer.unqueued(self.enqueue, self._work_stream()),
                    self.timer.unqueued_overhead_ns)
        ns = self.timer.queued_ops(self.enqueue_range, self.ops)
        return ns, self.timer.sample_overhead_ns

    other_timing_samples = OTHER_TIMING_SAMPLES  # the other clock's figure: from this many runs

    def _record_other_timing(self) -> None:
        self.info["other_timing_samples"] = self.other_timing_samples
        if self.timing == "device":
            samples = [self._one("e2e")[0] for _ in range(self.other_timing_samples)]
            values = np.maximum(np.array(samples) - self.overheads["e2e"], 0.0)
            self.info["e2e_median_ns"] = float(np.median(values))
            self.info["e2e_p99_ns"] = float(np.percentile(values, 99))
        else:  # no blocking kernel in e2e rows: events around the same calls, host gaps in
            values = np.array([self.timer.unqueued(self.e2e_run, self._work_stream())
                               for _ in range(self.other_timing_samples)])
            net = np.maximum(values - self.timer.unqueued_overhead_ns, 0.0)
            self.info["events_median_ns"] = float(np.median(net))
            self.info["events_overhead_ns"] = self.timer.unqueued_overhead_ns
            self.info["events_contains"] = ("events around the e2e calls, host gaps included, "
                                            "minus an unqueued empty interval")
        if self.per_call and self.ops > 1 and not self.synchronous and self.timing == "device":
            self._per_copy()

    def _per_copy(self) -> None:
        """Percentiles of single calls: events between the calls of one queued chunk."""
        count = max(1, min(self.ops, self.timer.chunk // 2))  # an event per call: half a chunk
        marks = [self.cp.cuda.Event() for _ in range(count + 1)]

        def marked() -> None:
            marks[0].record(self.stream)
            self.enqueue_range(0, count, marks[1:])

        self.timer.queued(marked)
        per_copy = np.array([self.cp.cuda.get_elapsed_time(a, b) * 1e6
                             for a, b in itertools.pairwise(marks)])
        for q in (50, 90, 99):
            self.info[f"per_copy_p{q}_ns"] = float(np.percentile(per_copy, q))
        self.info["per_copy_calls"] = count

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        pairs = [self._one(self.timing) for _ in range(n)]
        values = np.array([v for v, _ in pairs], dtype=np.float64)
        overheads = np.array([k for _, k in pairs], dtype=np.float64)
        if self.timing == "device" and not self.synchronous:
            self.info.update(self.timer.info())
        ns = np.maximum(values - overheads, 0.0)
        if self.timing == "device":
            return values / 1e6, ns  # raw: milliseconds, as cudaEventElapsedTime gives
        return values, ns

    def close(self) -> None:
        self.stream.synchronize()


# --- runtime API copies ------------------------------------------------------------------------

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


class _DriverAttrs(ctypes.Structure):
    """CUmemcpyAttributes (cuda.h, CUDA >= 12.8): access order, two CUmemLocation hints, flags."""

    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHintType", ctypes.c_int),
                ("srcLocHintId", ctypes.c_int), ("dstLocHintType", ctypes.c_int),
                ("dstLocHintId", ctypes.c_int), ("flags", ctypes.c_uint)]


SRC_ACCESS_ORDER_STREAM, SRC_ACCESS_ORDER_ANY = 1, 3


def driver_memcpy_batch():
    """cuMemcpyBatchAsync of the driver (libcuda.so.1, the CUDA 12.8 ABI, asked for by version
    through cuGetProcAddress), or (None, why not). Called straight through ctypes with arrays
    built once, its cost per call is the driver's; cuda-bindings converts its Python lists on
    every call (~0.3-1 ms for 1,024 copies), which would sit inside every e2e sample."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
    except (OSError, AttributeError) as exc:
        return None, f"libcuda.so.1 has no cuGetProcAddress_v2 ({exc})"
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    get.restype = ctypes.c_int
    pfn, status = ctypes.c_void_p(), ctypes.c_int()
    rc = get(b"cuMemcpyBatchAsync", ctypes.byref(pfn), BATCH_MIN_VERSION, 0, ctypes.byref(status))
    if rc != 0 or not pfn.value:
        return None, f"cuGetProcAddress(cuMemcpyBatchAsync, 12080) failed ({rc}, {status.value})"
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p, ctypes.c_void_p)
    return proto(pfn.value), None


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
            attrs = _DriverAttrs()
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
    """gather-kernel / scatter-kernel / peer-kernel: one launch moves every fragment, its work
    split by bytes (nearlocal.kernels.cuda). The piece table lives in device memory for device
    timing; for e2e the host writes it into pinned memory inside the interval and the kernel
    reads it from there (no separate upload call)."""

    peer = False  # peer-kernel: both sides must be GPUs
    kernel_name = "nl_copy"
    check_paths = ("e2e", "device")  # pieces read from pinned staging, and from device memory

    def setup(self) -> None:
        params = self.ctx.params
        if self.peer and (self.src.device is None or self.dst.device is None):
            raise UsageError(f"{self.method} copies between two GPUs: use --region gpu:J "
                             "--peer gpu:K")
        for access in (self.src, self.dst):  # the kernel touches the other GPU's memory
            if access.device is not None and access.device != self.device:
                enable_peer_access(self.cp, self.device, access.device, required=True,
                                   info=self.info)
        self.src_ptr = self._pointer(self.src, True)
        self.dst_ptr = self._pointer(self.dst, True)
        self.plan, self.pieces = self.kernel_lib.plan_launch(
            self.table, width=_int_param(params, "width", 4, 16),
            threads=_int_param(params, "threads", 1, 1024),
            group=_int_param(params, "group", 0, 1024))  # each piece's width: its own addresses
        self.info.update(self.plan.info())
        cp = self.cp
        self.pieces_dev = cp.asarray(self.pieces)
        # the host's copy of the pieces, in mapped pinned memory, read in place by e2e launches
        self._staging, staging_dev, staging = alloc_mapped(cp.cuda.runtime, self.pieces.nbytes)
        self.staging_view = staging.view(np.int64).reshape(self.pieces.shape)
        self.args = {"device": self._args(int(self.pieces_dev.data.ptr)),
                     "e2e": self._args(staging_dev)}
        self.e2e_contains = ("the host writing the piece table (" +
                             f"{self.pieces.nbytes} B) into pinned memory, one kernel launch, "
                             "the kernel reading the table from there over the bus (part of "
                             "the figure: no separate upload call and its round trip)")

    def _args(self, pieces_pointer: int) -> tuple:
        return self.kernels.copy_args(self.dst_ptr, self.src_ptr, pieces_pointer, self.plan)

    def decide(self) -> None:
        np.copyto(self.staging_view, self.pieces)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self.kernels.launch(self.kernel_name, self.plan, self.args["device"], self.stream)

    def e2e_run(self) -> None:
        self.decide()
        self.kernels.launch(self.kernel_name, self.plan, self.args["e2e"], self.stream)

    def close(self) -> None:
        super().close()
        self.cp.cuda.runtime.freeHost(self._staging)


class PeerKernelSession(KernelSession):
    peer = True


class ZeroCopySession(KernelSession):
    """The kernel reads the region's fragments where they lie (a byte sum per fragment, nothing
    copied to device memory) or writes them in place (a fill byte)."""

    def setup(self) -> None:
        self.sums = self.cp.zeros(self.table.shape[0], dtype=self.cp.uint64)
        self.fill = _int_param(self.ctx.params, "fill", 0, 255)
        self.kernel_name = "nl_sum" if self.ctx.case.access == "read" else "nl_fill"
        super().setup()

    def _args(self, pieces_pointer: int) -> tuple:
        if self.ctx.case.access == "read":  # the sums are only read by the check
            return self.kernels.sum_args(self.src_ptr, int(self.sums.data.ptr), pieces_pointer,
                                         self.plan)
        return self.kernels.fill_args(self.dst_ptr, self.fill, pieces_pointer, self.plan)

    def check(self) -> None:
        for path in self.check_paths:
            if self.ctx.case.access == "read":
                self.sums.data.memset_async(0, self.sums.nbytes, self.stream)
                self.run_once(path)
                expected = self.kernel_lib.reference_sums(self._bytes(self.ctx.src), self.table)
                if not np.array_equal(self.cp.asnumpy(self.sums), expected):
                    raise RuntimeError("zero-copy-kernel read wrong bytes: fragment sums differ")
                continue
            self._clear_destination()
            self.run_once(path)
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
        if self.timing == "e2e":  # the whole pass on the host clock, / layers
            self.ops_per_sample = self.layers
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
            # period 251: no two layers hold the same bytes, so a wrong layer fails the check
            self.kernel_lib.fill_device(cp, int(self.store.data.ptr), self.store.size,
                                        np.arange(251 * 4096) % 251 + 1)
            cp.cuda.Device(donor.device).synchronize()
        self.buffers = [cp.zeros(local_span + 256, dtype=cp.uint8) for _ in range(2)]
        self.fetch_tables = [table + np.array([k * span, 0, 0]) for k in range(self.layers)]
        self.streams = {name: cp.cuda.Stream(non_blocking=True) for name in ("compute", "back")}
        self._compute_out = cp.zeros(1, dtype=cp.uint64)
        if self.copy == "kernel":
            self.plan, _ = self.kernel_lib.plan_launch(
                table, width=_int_param(params, "width", 4, 16),
                threads=_int_param(params, "threads", 1, 1024))
            split = self.kernel_lib.split_pieces
            self.fetch_dev = [cp.asarray(split(t, self.plan.chunk)) for t in self.fetch_tables]
            self.back_dev = [cp.asarray(split(t[:, [1, 0, 2]], self.plan.chunk))
                             for t in self.fetch_tables]
            store, bufs = int(self.store.data.ptr), [int(b.data.ptr) for b in self.buffers]
            self.fetch_args = [self.kernels.copy_args(bufs[k % 2], store, int(t.data.ptr),
                                                      self.plan)
                               for k, t in enumerate(self.fetch_dev)]
            self.back_args = [self.kernels.copy_args(store, bufs[k % 2], int(t.data.ptr),
                                                     self.plan)
                              for k, t in enumerate(self.back_dev)]
            self.info.update(self.plan.info())
        count = self.layers
        self.ev = {name: [cp.cuda.Event() for _ in range(count)]
                   for name in ("fetch0", "fetch1", "compute1", "back0", "back1")}
        self.donor_device, self.donor_ptr = donor.device, int(self.store.data.ptr)
        self.info.update(layers=self.layers, compute_us=self.compute_ns / 1000, copy=self.copy,
                         layer_bytes=int(table[:, 2].sum()),
                         round_trip_bytes=2 * int(table[:, 2].sum()))  # fetch + write back
        self.compute_pass_ns: float | None = None  # measured once the timer is calibrated
        self._last_pass_ns = 0.0

    def _copy(self, layer: int, fetch: bool, stream) -> None:
        buf = self.buffers[layer % 2]
        if self.copy == "kernel":
            args = (self.fetch_args if fetch else self.back_args)[layer]
            self.kernels.launch("nl_copy", self.plan, args, stream)
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
                self._copy(layer, True, fetch)
                ev["fetch1"][layer].record(fetch)
                compute.wait_event(ev["fetch1"][layer])
            elif layer == 0:
                compute.wait_event(self.timer.start)
            self.kernels.spin(self.compute_ns, int(self._compute_out.data.ptr), compute)
            ev["compute1"][layer].record(compute)
            if not compute_only:
                back.wait_event(ev["compute1"][layer])
                ev["back0"][layer].record(back)
                self._copy(layer, False, back)
                ev["back1"][layer].record(back)
        last = ev["compute1" if compute_only else "back1"][self.layers - 1]
        fetch.wait_event(last)  # the timer's stop event on self.stream covers the whole pass

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self._pass()

    def check(self) -> None:
        self.run_once()
        self.cp.cuda.Device(self.device).synchronize()
        last = self.layers - 1
        local = self.cp.asnumpy(self.buffers[last % 2])
        store = self.cp.asnumpy(self.store)
        bad = self.kernel_lib.fragments_match(local, store, self.fetch_tables[last])
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
        if self.compute_pass_ns is None:  # after __init__ calibrated the blocking kernel
            self.compute_pass_ns = self.timer.queued(lambda: self._pass(compute_only=True))
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
_COPY = {**_TIMING, "prime": "1"}  # prime=0: no 1-byte copy before the start event
_KERNEL = {**_TIMING, "width": "16", "threads": "128", "group": "0"}


def _gpu(name: str, summary: str, accesses: tuple[str, ...], open_session, needs,
         params: dict, regions=("host", "gpu"), markers=("gpu",), sample_bytes=None,
         calls: str | None = "one") -> Method:
    """calls: how many calls a read of n fragments costs (core.methods.CALL_RULES); None: the
    method lands no read's bytes in the other side's memory (a zero-copy sum, the layer stream)."""
    return register_method(Method(
        cacheable=False,
        name=name, family="gpu", summary=summary, accesses=accesses, state="-",
        open_session=open_session, region_families=frozenset(regions),
        peer_families=frozenset({"gpu"}), needs=needs, params=params, markers=markers,
        check_params=check_params, sample_bytes=sample_bytes,
        delivery=Delivery("gpu", calls) if calls else None,
    ))


_gpu("cuda-memcpy", "cudaMemcpy per fragment (synchronous; device time includes host gaps)",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy", False), _needs_gpu,
     _TIMING, calls="per-fragment")
_gpu("cuda-memcpy-async", "cudaMemcpyAsync per fragment on one stream",
     ("read", "write"), lambda ctx: MemcpySession(ctx, "cuda-memcpy-async", True), _needs_gpu,
     _COPY, calls="per-fragment")
_gpu("cuda-memcpy-batch", "cudaMemcpyBatchAsync: every fragment in one call (CUDA >= 12.8)",
     ("read", "write"), lambda ctx: BatchSession(ctx, "cuda-memcpy-batch"), _needs_batch,
     {**_COPY, "api": "driver"})
_gpu("cuda-memcpy-2d", "cudaMemcpy2DAsync of regularly strided fragments",
     ("read", "write"), lambda ctx: Memcpy2DSession(ctx, "cuda-memcpy-2d"), _needs_gpu, _COPY)
_gpu("gather-kernel", "one CUDA C kernel gathers every fragment into the GPU (reads mapped host "
     "memory; work split by bytes)",
     ("read",), lambda ctx: KernelSession(ctx, "gather-kernel"), _needs_gpu, _KERNEL)
_gpu("scatter-kernel", "one kernel scatters every fragment from the GPU into the region",
     ("write",), lambda ctx: KernelSession(ctx, "scatter-kernel"), _needs_gpu, _KERNEL)
_gpu("zero-copy-kernel", "a kernel reads (byte sums) or writes (fill) mapped host memory in place",
     ("read", "write"), lambda ctx: ZeroCopySession(ctx, "zero-copy-kernel"), _needs_gpu,
     {**_KERNEL, "fill": "90"}, regions=("host",), calls=None)
_gpu("peer-memcpy", "cudaMemcpyPeerAsync per fragment between two GPUs (NVLink when peered)",
     ("read", "write"), lambda ctx: PeerMemcpySession(ctx, "peer-memcpy"), _needs_two,
     _COPY, regions=("gpu",), markers=("gpu", "nvlink"), calls="per-fragment")
_gpu("peer-kernel", "one kernel on the local GPU copies every fragment from / to a peer GPU",
     ("read", "write"), lambda ctx: PeerKernelSession(ctx, "peer-kernel"), _needs_peer,
     _KERNEL, regions=("gpu",), markers=("gpu", "nvlink"))
_gpu("layer-stream", "SwiftCache layer stream: per layer fetch from the peer GPU, compute, "
     "write back", ("read",), lambda ctx: LayerStreamSession(ctx, "layer-stream"), _needs_peer,
     {**_TIMING, "layers": "32", "compute_us": "100", "copy": "memcpy", "width": "16",
      "threads": "128"},
     regions=("gpu",), markers=("gpu", "nvlink"),
     sample_bytes=lambda pattern: 2 * pattern.total_bytes,  # a layer's fetch and write-back
     calls=None)  # its figure is a layer's round trip, not a read's delivery

from nearlocal.gpu import suites  # noqa: E402, F401 - the gpu / swiftcache suites
