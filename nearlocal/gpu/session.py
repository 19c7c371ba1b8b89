"""What every GPU session shares: the device and its stream, both clocks, the correctness check,
and the parameter checks a run does before it starts.

Every method takes `timing=device|e2e` (see nearlocal.gpu.timing): `device` = CUDA events around
the work queued behind a blocking kernel (in chunks when it is many calls), after a warm-up;
`e2e` = host monotonic clock from the decision to move the prepared fragments (the API calls or
the launch, plus what the row's `e2e_contains` names) to data usable at the destination
(synchronised). Everything else is prepared before the clock starts. Each case also records the
other figure's median in `info`, and per-copy percentiles for the methods that issue one call per
fragment. Every session checks once, before timing, that the destination holds the source's
bytes.
"""

from __future__ import annotations

import itertools

import numpy as np

from nearlocal.core.methods import SessionContext
from nearlocal.errors import UsageError
from nearlocal.gpu import timing
from nearlocal.gpu.regions import GpuAccess, gpu_access

PEER_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled
PAGEABLE_MEMORY_ACCESS = 88  # cudaDevAttrPageableMemoryAccess
OTHER_TIMING_SAMPLES = 10


def int_param(params: dict, name: str, low: int, high: int) -> int:
    text = str(params.get(name))
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"parameter {name}={text!r} is not an integer ({low}..{high})") from None
    if not low <= value <= high:
        raise UsageError(f"parameter {name}={value} is out of range: valid {low}..{high}")
    return value


def check_params(params: dict) -> None:
    """Parameter values a GPU session would refuse, refused before the run (exit 2)."""
    value = str(params.get("timing", "device"))
    if value not in timing.TIMINGS:
        raise UsageError(f"timing={value!r} is not valid: use device or e2e")
    if "width" in params and int_param(params, "width", 4, 16) not in (4, 8, 16):
        raise UsageError(f"load width {params['width']} is not supported: valid widths are 4, 8, "
                         "16 (bytes)")
    if "threads" in params:
        threads = int_param(params, "threads", 1, 1024)
        group = int_param(params, "group", 0, 1024) if "group" in params else 0
        if group and (group > threads or threads % group):
            raise UsageError(f"group {group} must divide the {threads} threads per block (0: auto)")
    for name, low, high in (("fill", 0, 255), ("layers", 1, 1024), ("compute_us", 0, 10_000_000),
                            ("prime", 0, 1)):
        if name in params:
            int_param(params, name, low, high)
    if str(params.get("api", "driver")) not in ("driver", "bindings"):
        raise UsageError(f"api={params['api']!r} is not valid: use driver or bindings")
    if str(params.get("copy", "memcpy")) not in ("memcpy", "kernel"):
        raise UsageError(f"copy={params['copy']!r} is not valid: use memcpy or kernel")


class GpuSession:
    """One method on one case: the device, a stream, both clocks, a correctness check.

    Subclasses set `work_device` rules through `choose_device` and implement
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
        self.device = self.choose_device()
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

    # -- to override (public: families outside gpu/ subclass it, storage/gpu_methods.py) --
    def choose_device(self) -> int:
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

    def region_bytes(self, region) -> np.ndarray:
        """A region's bytes on the host (a copy of a GPU's): what the checks compare."""
        array = region.array
        return array if isinstance(array, np.ndarray) else self.cp.asnumpy(array)

    def clear_destination(self) -> None:
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
            self.clear_destination()
            self.run_once(path)
            bad = self.kernel_lib.fragments_match(self.region_bytes(self.ctx.dst),
                                                  self.region_bytes(self.ctx.src), self.table)
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

    def one_sample(self, mode: str) -> tuple[float, float]:
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
            samples = [self.one_sample("e2e")[0] for _ in range(self.other_timing_samples)]
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
        pairs = [self.one_sample(self.timing) for _ in range(n)]
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
