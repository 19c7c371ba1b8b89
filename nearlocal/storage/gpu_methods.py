"""Reloading a KV pattern from a `storage:PATH` file into a GPU (SwiftCache S2's SSD row, the path
LMCache's and NIXL's storage backends take):

  file-read-gpu  file -> pinned bounce buffer -> gpu:K: every request of the pattern read into a
                 pinned host buffer by file-read's engine (io_uring or threads, qd, cache), then
                 one cudaMemcpyAsync per contiguous run of that buffer (the CPU-offload path the
                 paper compares NVLink against)
  file-read-gds  GPUDirect Storage: kvikio.CuFile.pread of every fragment straight into device
                 memory through cuFile (skipped where kvikio is missing or runs in its POSIX
                 compatibility mode, which is not GDS)

Both are timed by the GPU package's clocks (nearlocal.gpu.timing): `timing=device` = two CUDA
events the host records around the whole reload (nothing queued before them, host gaps included:
the reads are the host's work), minus an unqueued empty interval; `timing=e2e` = the host's
monotonic clock around the same work and the stream's synchronisation. Each session checks once,
before timing, that the GPU holds the file's bytes (read back with a plain pread).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from nearlocal.core.methods import Delivery, Method, SessionContext, register_method
from nearlocal.errors import UsageError
from nearlocal.gpu.needs import needs_gpu
from nearlocal.gpu.session import GpuSession, check_params
from nearlocal.kernels.cuda import MEMCPY_HOST_TO_DEVICE
from nearlocal.storage.methods import PARAM_DEFAULTS, FileParams

POSIX_FADV_DONTNEED = 4
KVIKIO_HINT = "pip install kvikio-cu12 (or kvikio-cu13)"


def contiguous_runs(table: np.ndarray) -> np.ndarray:
    """(offset, length) rows covering the table's destination pieces, neighbours merged: what a
    packed buffer sends with the fewest copies."""
    pieces = table[np.argsort(table[:, 1], kind="stable")][:, 1:]
    runs: list[list[int]] = []
    for offset, length in pieces:
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1][1] += int(length)
        else:
            runs.append([int(offset), int(length)])
    return np.array(runs, dtype=np.int64).reshape(-1, 2)


def _file_bytes(fd: int, table: np.ndarray) -> list[bytes]:
    """Each fragment's bytes straight from the file (independent of the engine under test)."""
    return [os.pread(fd, int(n), int(s)) for s, _, n in table]


def _drop_pages(fd: int) -> None:
    """This file's clean pages out of the page cache (never the box's caches)."""
    os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)


class _FileToGpuBase(GpuSession):
    """Shared by both methods: the file region, the byte check against the file, the row."""

    synchronous = True  # the host does the reads: events around them, never queued behind a spin
    # every sample reads the whole pattern from the file: the other clock's figure from one
    # reload, not ten (the opening already reads it twice: the check, and its plain preads)
    other_timing_samples = 1

    def _file_region(self, ctx: SessionContext):
        from nearlocal.storage.regions import FileRegion

        if ctx.case.access != "read" or not isinstance(ctx.src, FileRegion):
            raise UsageError(f"{ctx.case.method} reads a storage:PATH file into a GPU: "
                             "--region storage:PATH --peer gpu:K")
        return ctx.src

    def choose_device(self) -> int:
        if self.dst.device is None:
            raise UsageError(f"{self.method} reads into a GPU: use --peer gpu:K")
        return self.dst.device

    def check(self) -> None:
        self.clear_destination()
        bounce = getattr(self, "bounce", None)
        if bounce is not None:  # nor may stale bounce bytes pass it
            bounce.array[:] = 0
        self.run_once("e2e")
        got = self.region_bytes(self.ctx.dst)
        for i, ((_, d, n), want) in enumerate(zip(self.file_table, _file_bytes(
                self.file_region.fd, self.file_table), strict=True)):
            if got[d:d + n].tobytes() != want:
                raise RuntimeError(f"{self.method} moved wrong bytes: fragment {i} ({n} B from "
                                   f"file offset {self.file_table[i, 0]}) differs from the file")
        if self.keep_cached is False:  # the check's plain preads cached pages: drop them again
            _drop_pages(self.file_region.fd)


class FileToGpuSession(_FileToGpuBase):
    """file -> pinned bounce -> GPU: file-read's session fills the pinned buffer (the pattern's
    packed layout), then cudaMemcpyAsync moves each contiguous run to the same offset on gpu:K."""

    def __init__(self, ctx: SessionContext):
        from nearlocal.core.patterns import Pattern
        from nearlocal.regions.base import parse_region, region_kind
        from nearlocal.storage import kernels
        from nearlocal.storage.methods import FileSession

        self.method = "file-read-gpu"
        self.file_region = self._file_region(ctx)
        self.file_table = np.ascontiguousarray(ctx.pattern.frags, dtype=np.int64)
        spec = parse_region("pinned")
        self.bounce = region_kind(spec).open(spec, ctx.pattern.dst_span, "wb", False)
        self.file = None
        try:
            self.file = FileSession(dataclasses.replace(ctx, dst=self.bounce), write=False)
            self.cold = self.file.params.cache == "cold"
            self.keep_cached = self.file.params.cache == "warm"
            self.file.mode = kernels.SETTLE_NONE  # cold: dropped before the interval (one_sample)
            self.read_ns: list[float] = []
            copy_table = self.file_table[:, [1, 1, 2]]  # bounce and GPU share the packed layout
            super().__init__(dataclasses.replace(
                ctx, src=self.bounce, pattern=Pattern(ctx.pattern.text, copy_table)), self.method)
        except BaseException:
            self.close()
            raise
        file_info = {k: v for k, v in self.file.info.items()
                     if k not in ("timed", "timer_overhead_ticks", "page_cache_resident")}
        self.info.update(file_info, bounce="pinned (cudaHostAlloc portable|mapped)",
                         h2d_copies=int(self.runs.shape[0]))
        what = (f"every request of the pattern read from the file into the pinned bounce "
                f"buffer ({self.file.engine}, {self.file.params.qd} in flight, cache="
                f"{self.file.params.cache}), then {self.runs.shape[0]} cudaMemcpyAsync of its "
                f"contiguous runs to GPU {self.device}")
        if self.file.engine == "threads" and self.file.params.qd > 1:
            what += f" (starting the {self.file.params.qd} reader threads included)"
        if self.timing == "e2e":
            self.info["e2e_contains"] = what + ", then stream synchronisation"
        else:
            self.info["device_contains"] = ("events the host records around " + what +
                                            "; host gaps included, minus an unqueued empty "
                                            "interval")
        if self.cold:
            self.info["before_each_sample"] = "untimed: this file's pages dropped (fadvise)"

    def setup(self) -> None:
        self.runs = contiguous_runs(self.table)
        src, dst = int(self.src.host_pointer), int(self.dst.device_pointer)
        self.calls = [(dst + int(o), src + int(o), int(n)) for o, n in self.runs]

    def enqueue(self) -> None:
        self.read_ns.append(float(self.file.sample(1)[1][0]))  # the file part's own TSC figure
        runtime, stream = self.cp.cuda.runtime, self.stream.ptr
        for dst, src, n in self.calls:
            runtime.memcpyAsync(dst, src, n, MEMCPY_HOST_TO_DEVICE, stream)

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self.enqueue()

    def one_sample(self, mode: str) -> tuple[float, float]:
        if self.cold:
            _drop_pages(self.file.fd)  # before the interval opens
        return super().one_sample(mode)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.read_ns.clear()
        out = super().sample(n)
        if self.read_ns:
            self.info["file_part_median_ns"] = float(np.median(self.read_ns))
            self.info["file_part_contains"] = "file-read's own rdtscp interval inside the sample"
        return out

    def close(self) -> None:
        if getattr(self, "stream", None) is not None:
            super().close()
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.bounce is not None:
            self.bounce.close()
            self.bounce = None


def kvikio_or_reason():
    """(kvikio, None), or (None, why GPUDirect Storage through it cannot run here)."""
    try:
        import kvikio
        import kvikio.defaults
    except Exception as exc:  # ImportError, or its CUDA libraries failing to load
        return None, f"kvikio is not importable ({type(exc).__name__}: {exc}; {KVIKIO_HINT})"
    defaults = kvikio.defaults
    try:
        compat = (defaults.is_compat_mode_preferred() if hasattr(defaults,
                  "is_compat_mode_preferred") else bool(defaults.compat_mode()))
    except Exception as exc:
        return None, f"kvikio cannot say whether it uses cuFile ({type(exc).__name__}: {exc})"
    if compat:
        return None, ("kvikio runs in compatibility mode here (no libcufile, WSL, or /run/udev "
                      "unreadable: POSIX reads through a host bounce buffer, not GPUDirect "
                      "Storage)")
    return kvikio, None


def _kvikio_threads(kvikio) -> int | None:
    defaults = kvikio.defaults
    for name in ("get_num_threads", "num_threads"):
        if hasattr(defaults, name):
            return int(getattr(defaults, name)())
    if hasattr(defaults, "get"):
        return int(defaults.get("num_threads"))
    return None


class GdsSession(_FileToGpuBase):
    """kvikio.CuFile.pread of every fragment into device memory (cuFile: the NVMe's DMA lands in
    the GPU); all futures submitted, then all waited for."""

    keep_cached = False  # cuFile in its own compatibility mode would read cached pages

    def __init__(self, ctx: SessionContext):
        from nearlocal.core.patterns import Pattern

        self.method = "file-read-gds"
        self.file_region = self._file_region(ctx)
        self.file_table = np.ascontiguousarray(ctx.pattern.frags, dtype=np.int64)
        self.kvikio, reason = kvikio_or_reason()
        if reason:
            raise RuntimeError(reason)
        self.cufile = self.kvikio.CuFile(self.file_region.path, "r")
        try:  # the table GpuSession checks and clears: the GPU's pieces (the file has no pointer)
            super().__init__(dataclasses.replace(ctx, src=ctx.dst, pattern=Pattern(
                ctx.pattern.text, self.file_table[:, [1, 1, 2]])), self.method)
        except BaseException:
            self.cufile.close()
            raise
        self.info.update(io="kvikio.CuFile.pread (cuFile)", kvikio=self.kvikio.__version__,
                         kvikio_threads=_kvikio_threads(self.kvikio),
                         preads=int(self.file_table.shape[0]))
        what = (f"{self.file_table.shape[0]} kvikio CuFile.pread calls (one per fragment) "
                "submitted, then every future waited for; whether cuFile itself took the GDS "
                "path or its own compatibility mode is cuFile's configuration")
        key = "e2e_contains" if self.timing == "e2e" else "device_contains"
        self.info[key] = (what + ", then stream synchronisation" if self.timing == "e2e" else
                          "events the host records around " + what + "; host gaps included, "
                          "minus an unqueued empty interval")

    def setup(self) -> None:
        target = self.ctx.dst.array  # the cupy array of gpu:K
        self.reads = [(target[int(d):int(d) + int(n)], int(n), int(s))
                      for s, d, n in self.file_table]

    def enqueue(self) -> None:
        futures = [self.cufile.pread(view, size, offset) for view, size, offset in self.reads]
        for (_, size, offset), future in zip(self.reads, futures, strict=True):
            done = future.get()
            if done != size:
                raise RuntimeError(f"CuFile.pread of {size} B at file offset {offset} of "
                                   f"{self.file_region.path}: moved {done} B")

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self.enqueue()

    def close(self) -> None:
        super().close()
        self.cufile.close()


def _needs_gds(inventory) -> str | None:
    return needs_gpu(inventory) or kvikio_or_reason()[1]


def _check_file_gpu(params: dict) -> None:
    check_params(params)
    FileParams.parse({k: v for k, v in params.items() if k in PARAM_DEFAULTS}, write=False)


register_method(Method(
    cacheable=False,
    name="file-read-gpu", marker="gpu", state="-", accesses=("read",),
    summary="file -> pinned bounce buffer -> gpu:K: file-read's engine fills pinned memory, "
            "then cudaMemcpyAsync (the CPU-offload reload path)",
    open_session=FileToGpuSession, region_spaces=frozenset({"storage"}),
    peer_spaces=frozenset({"gpu"}), cpu_flags=("rdtscp",), needs=needs_gpu,
    params={**PARAM_DEFAULTS, "timing": "device"}, markers=("gpu", "storage"),
    check_params=_check_file_gpu, delivery=Delivery("storage", "per-fragment"),
))
register_method(Method(
    cacheable=False,
    name="file-read-gds", marker="gpu", state="-", accesses=("read",),
    summary="GPUDirect Storage: kvikio.CuFile.pread of each fragment from a storage:PATH file "
            "into gpu:K (cuFile)",
    open_session=GdsSession, region_spaces=frozenset({"storage"}),
    peer_spaces=frozenset({"gpu"}), needs=_needs_gds, params={"timing": "device"},
    markers=("gpu", "storage"), check_params=check_params,
    delivery=Delivery("storage", "per-fragment"),
))
