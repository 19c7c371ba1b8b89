"""`file-read` / `file-write`: KV-sized patterns between a `storage:PATH` file and a memory region
(dram, numa:N, the pool), the reload-from-SSD medium of SwiftCache's S2 table (LMCache's and
NIXL's POSIX backends).

Parameters:
  qd      requests in flight, 1..64 (default 1)
  cache   file-read: direct (O_DIRECT: the page cache never answers), warm (buffered, pages read
          in by an untimed pass first) or cold (buffered, the file's pages dropped with
          posix_fadvise DONTNEED before every sample: this file only, never the box's caches);
          file-write: direct or buffered (an untimed fdatasync + drop before every sample)
  engine  auto (io_uring where this process may use it, else threads), io_uring or threads
          (qd threads, each with one pread/pwrite outstanding, taking requests from one queue)
  block   0 (each fragment is one request) or a size: fragments cut into requests of at most
          that many bytes (fio's bs; `64MiB` with block=1MiB is one large span in 1 MiB reads)

A sample is every request of the pattern: its interval holds their submission and completion
waits (io_uring) or the threads' calls, start to last end; the timer's overhead is removed as for
the CPU methods. O_DIRECT needs every file offset, length and buffer address to be a multiple of
the device's logical block size: an unaligned fragment (an odd size, an unaligned tail) is refused
with the offending request named, never rounded; buffered reads take any size.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import numpy as np

from nearlocal.core.methods import Delivery, Method, SessionContext, register_method
from nearlocal.errors import UsageError
from nearlocal.units import format_size, parse_size

QD_MAX = 64
READ_CACHES = ("direct", "warm", "cold")
WRITE_CACHES = ("direct", "buffered")
ENGINES = ("auto", "io_uring", "threads")
PARAM_DEFAULTS = {"qd": "1", "cache": "direct", "engine": "auto", "block": "0"}
DEFAULT_ALIGN = 4096  # when the device's logical block size cannot be read


@dataclass(frozen=True)
class FileParams:
    qd: int
    cache: str
    engine: str
    block: int

    @classmethod
    def parse(cls, params: dict, write: bool) -> FileParams:
        params = {**PARAM_DEFAULTS, **params}
        text = str(params["qd"])
        try:
            qd = int(text)
        except ValueError:
            raise UsageError(f"qd={text!r} is not a whole number (valid: 1..{QD_MAX})") from None
        if not 1 <= qd <= QD_MAX:
            raise UsageError(f"qd={qd} is out of range (valid: 1..{QD_MAX} requests in flight)")
        caches = WRITE_CACHES if write else READ_CACHES
        if params["cache"] not in caches:
            raise UsageError(f"cache={params['cache']!r} for file-{'write' if write else 'read'}:"
                             f" valid are {', '.join(caches)}")
        if params["engine"] not in ENGINES:
            raise UsageError(f"engine={params['engine']!r}: valid are {', '.join(ENGINES)}")
        block = 0 if str(params["block"]) == "0" else parse_size(str(params["block"]))
        return cls(qd, str(params["cache"]), str(params["engine"]), block)


def requests(frags: np.ndarray, file_col: int, base: int, block: int) -> np.ndarray:
    """(file offset, memory address, length) rows, fragments cut at `block` bytes."""
    rows = []
    for row in frags:
        file_off, mem_off, length = int(row[file_col]), int(row[1 - file_col]), int(row[2])
        step = block or length
        for done in range(0, length, max(step, 1)):
            part = min(step, length - done)
            rows.append((file_off + done, base + mem_off + done, part))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def direct_alignment(device: str) -> int:
    """O_DIRECT's unit: the block device's logical block size (4096 where it cannot be read)."""
    from nearlocal.sysroot import SysRoot

    found = SysRoot.default().read_int(f"/sys/block/{device}/queue/logical_block_size") \
        if device and device != "-" else None
    return found or DEFAULT_ALIGN


def check_aligned(reqs: np.ndarray, align: int, base: int) -> None:
    bad = np.nonzero((reqs % align).any(axis=1))[0]
    if bad.size:
        off, addr, length = (int(x) for x in reqs[bad[0]])
        raise UsageError(f"cache=direct (O_DIRECT) needs file offsets, lengths and buffer "
                         f"offsets that are multiples of {align} B (the device's logical block): "
                         f"request {int(bad[0])} is {length} B at file offset {off}, buffer "
                         f"offset {addr - base}; use cache=warm or cold (buffered) for such "
                         "sizes")


def resident_fraction(fd: int, length: int) -> float:
    """Share of [0, length) of the file in the page cache."""
    pages = resident_pages(fd, length)
    return float(pages.mean()) if pages.size else 0.0


def resident_pages(fd: int, length: int) -> np.ndarray:
    """Per page of [0, length) of the file, whether it is in the page cache (mincore on a
    read-only mapping: the file is never written)."""
    import ctypes
    import mmap

    if length <= 0:
        return np.zeros(0, bool)
    page = mmap.PAGESIZE
    buf = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
    try:
        pages = (length + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        view = np.frombuffer(buf, np.uint8)
        address = view.ctypes.data
        rc = libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vec)
        del view
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return (np.frombuffer(vec, np.uint8) & 1).astype(bool)
    finally:
        buf.close()


class FileSession:
    """Requests built once; each sample runs the compiled submit / wait loop."""

    clock = "tsc"

    def __init__(self, ctx: SessionContext, write: bool):
        from nearlocal.storage import kernels, uring
        from nearlocal.storage.regions import FileRegion

        self.ctx, self.write = ctx, write
        self.params = p = FileParams.parse(dict(ctx.params), write)
        region, memory = (ctx.dst, ctx.src) if write else (ctx.src, ctx.dst)
        if not isinstance(region, FileRegion):
            raise UsageError(f"{ctx.case.method} works on storage:PATH regions")
        if write and not region.writable:
            raise UsageError(f"{region.path} is opened read-only: file-write needs --allow-write")
        self.region, self.memory = region, memory
        base = int(memory.array.ctypes.data)
        self.reqs = requests(ctx.pattern.frags, 1 if write else 0, base, p.block)
        self.align = direct_alignment(region.info.get("block_device", "-"))
        if p.cache == "direct":
            check_aligned(self.reqs - np.array([0, base, 0]), self.align, 0)
        flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC
        flags |= os.O_DIRECT if p.cache == "direct" else 0
        try:  # a new open file description of the same inode (never a path looked up again)
            self.fd = os.open(f"/proc/self/fd/{region.fd}", flags)
        except OSError as exc:
            raise UsageError(f"{region.path} cannot be opened with "
                             f"{'O_DIRECT' if p.cache == 'direct' else 'buffered I/O'}: "
                             f"{exc.strerror} ({region.info.get('fstype')})") from None
        self.mode = {("direct", False): kernels.SETTLE_NONE, ("warm", False): kernels.SETTLE_NONE,
                     ("cold", False): kernels.SETTLE_DROP, ("direct", True): kernels.SETTLE_NONE,
                     ("buffered", True): kernels.SETTLE_SYNC_DROP}[(p.cache, write)]
        self.ring = None
        engine = p.engine
        if engine != "threads":
            reason = uring.unavailable()
            if reason and engine == "io_uring":
                os.close(self.fd)
                raise RuntimeError(reason)
            engine = "threads" if reason else "io_uring"
            self.uring_reason = reason
        self.engine = engine
        try:
            if engine == "io_uring":
                # the setup fio's io_uring engine asks for, where the kernel takes it
                self.ring = uring.setup(1 << max(p.qd - 1, 0).bit_length(),
                                        uring.SETUP_FLAG_CHOICES)
            self._run(0)  # compile here (no I/O: zero samples)
            if p.cache == "warm":
                self._run(1)  # untimed: the page cache holds the pattern's pages
        except BaseException:
            self.close()
            raise
        self.samples = 0

    def _run(self, n: int) -> np.ndarray:
        from nearlocal.storage import kernels, uring

        ticks = np.zeros(n, np.uint64)
        status = np.zeros(2, np.int64)
        if self.engine == "io_uring":
            r = self.ring
            op = uring.IORING_OP_WRITE if self.write else uring.IORING_OP_READ
            failed = kernels.time_uring(r.sq, r.cq, r.sqes, r.layout, r.fd, self.fd, op,
                                        self.reqs, self.params.qd, self.mode, ticks, status)
        elif self.params.qd == 1:
            failed = kernels.time_sync(self.fd, self.write, self.reqs, self.mode, ticks, status)
        else:
            failed = self._threads(ticks, status)
        if failed or status[1] != 0:
            raise RuntimeError(self._describe(int(status[0]), int(status[1]) - 1))
        return ticks

    def _threads(self, ticks: np.ndarray, status: np.ndarray) -> int:
        from nearlocal.storage import kernels

        k, n = self.params.qd, ticks.shape[0]
        gate, taken = np.zeros(1, np.uint64), np.zeros(max(n, 1), np.uint64)
        starts, ends = np.zeros((n, k), np.uint64), np.zeros((n, k), np.uint64)
        per_thread = np.zeros((k, 2), np.int64)
        threads = [threading.Thread(target=kernels.thread_share, daemon=True,
                                    args=(self.fd, self.write, self.reqs, self.mode, gate, taken,
                                          starts, ends, t, k, per_thread)) for t in range(k)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if n:
            ticks[:] = ends.max(axis=1) - starts.min(axis=1)
        failed = per_thread[per_thread[:, 1] != 0]
        if len(failed):
            status[:] = failed[np.argmin(failed[:, 1])]
        return int(status[1] != 0)

    def _describe(self, result: int, index: int) -> str:
        if index < 0:
            return f"io_uring_enter kept failing on {self.region.path}"
        off, _, length = (int(x) for x in self.reqs[index])
        if self.engine == "io_uring" and result < 0:  # a CQE's result is -errno
            what = os.strerror(-result)
        elif result < 0:  # libc returned -1; errno stays in the compiled call: ask again
            what = self._errno_of(off, length)
        else:
            what = f"moved {result} of {length} B" + (" (end of file)" if result == 0 else "")
        return (f"{'pwrite' if self.write else 'pread'} of {length} B at file offset {off} of "
                f"{self.region.path}: {what}")

    def _errno_of(self, offset: int, length: int) -> str:
        if self.write:
            return "failed"
        try:
            os.pread(self.fd, min(length, 1 << 20), offset)
        except OSError as exc:
            return exc.strerror or "failed"
        return "failed"

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = self._run(n)
        self.samples += n
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz

    @property
    def info(self) -> dict:
        p = self.params
        info = {"engine": self.engine, "qd": p.qd, "cache": p.cache,
                "o_direct": p.cache == "direct", "requests": int(self.reqs.shape[0]),
                "request_bytes_median": int(np.median(self.reqs[:, 2])) if self.reqs.size else 0,
                "direct_align": self.align, "timer_overhead_ticks": self.ctx.timer_overhead_ticks,
                "timed": ("per sample, every request's submission and completion wait "
                          f"({'io_uring_enter' if self.engine == 'io_uring' else 'pread/pwrite'}"
                          f", {p.qd} in flight)"
                          + ("; before it, untimed: this file's pages dropped (fadvise)"
                             if self.mode else ""))}
        if self.ring is not None:
            from nearlocal.storage import uring

            info["io_uring_setup"] = uring.flag_names(self.ring.flags)
        if self.engine == "threads" and getattr(self, "uring_reason", None):
            info["io_uring"] = self.uring_reason
        if p.block:
            info["block"] = format_size(p.block)
        with contextlib.suppress(OSError):
            info["page_cache_resident"] = round(resident_fraction(self.fd, self.region.length), 4)
        return info

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _needs(inventory) -> str | None:
    return None if inventory.cpu.has("rdtscp") else "CPU lacks rdtscp"


def _file_method(name: str, write: bool, summary: str) -> Method:
    return register_method(Method(
        cacheable=False,
        name=name, marker="cpu", state="-", accesses=("write",) if write else ("read",),
        summary=summary, open_session=lambda ctx: FileSession(ctx, write=write),
        region_spaces=frozenset({"storage"}), cpu_flags=("rdtscp",),
        params=dict(PARAM_DEFAULTS), markers=("storage",),
        check_params=lambda params: FileParams.parse(params, write=write),
        delivery=Delivery("storage", "per-fragment"),  # one I/O per fragment
    ))


FILE_READ = _file_method(
    "file-read", write=False,
    summary="pread / io_uring reads of the pattern from a storage:PATH file into memory "
            "(O_DIRECT or buffered, qd requests in flight)")
FILE_WRITE = _file_method(
    "file-write", write=True,
    summary="pwrite / io_uring writes of the pattern from memory into a storage:PATH file "
            "(offload; an existing file needs --allow-write)")


def default_file() -> str:
    """Where the suite's cases put the file they create and remove (env NEARLOCAL_STORAGE)."""
    return "storage:" + os.environ.get("NEARLOCAL_STORAGE", ".nearlocal-storage")


MIB_READS = "64x1MiB@1MiB"  # 64 back-to-back 1 MiB requests: fio's bs=1M over a 64 MiB file
KV_PIECES = "128x20KiB"  # SwiftCache's fragment shape
KV_DENSE = "kv:qwen2.5-32b:flash-attn:dense"  # one dense block: 128 pieces of 32 KiB


def _storage_suite() -> list:
    from nearlocal.core.cases import Case

    file = default_file()
    cases = []
    for pattern, qds in ((MIB_READS, ("1", "4", "32")), (KV_PIECES, ("1", "16")),
                         (KV_DENSE, ("16",))):
        for qd in qds:
            cases.append(Case("file-read", file, "wb", pattern, params=(("qd", qd),)))
        deep = qds[-1]
        for cache in ("warm", "cold"):
            cases.append(Case("file-read", file, "wb", pattern,
                              params=(("qd", deep), ("cache", cache))))
        cases.append(Case("file-read", file, "wb", pattern,
                          params=(("qd", deep), ("engine", "threads"))))
        cases.append(Case("file-write", file, "wb", pattern, params=(("qd", deep),)))
    cases.append(Case("file-read", file, "wb", "64MiB", params=(("qd", "32"), ("block", "1MiB"))))
    cases.append(Case("file-read", file, "wb", "64MiB"))
    return cases


def _swiftcache_part() -> list:
    from nearlocal.core.cases import Case

    file = default_file()
    return [Case("file-read", file, "wb", MIB_READS, params=(("qd", "32"),)),
            # the reload into a GPU: through a pinned bounce buffer, and GPUDirect Storage
            Case("file-read-gpu", file, "wb", MIB_READS, peer="gpu:0", params=(("qd", "32"),)),
            Case("file-read-gds", file, "wb", MIB_READS, peer="gpu:0")]


def _register_suites() -> None:
    from nearlocal.core.suites import Suite, extend_suite, register_suite

    register_suite(Suite("storage", "file-read / file-write on a storage:PATH file (default "
                         "./.nearlocal-storage, env NEARLOCAL_STORAGE): O_DIRECT vs page cache, "
                         "qd 1..32, 1 MiB reads, 128x20KiB, a dense KV block", [_storage_suite]))
    extend_suite("swiftcache", _swiftcache_part)  # S2's reload from an SSD (gpu/suites.py)


_register_suites()
