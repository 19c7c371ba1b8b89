"""`chase` (idle latency) and `loaded-chase` (latency while other CPUs inject traffic): the two
figures Intel MLC prints first, measured with the ring of kernels.chase.

Both lay their pointer ring INTO the region, so on memory nearlocal did not create (a devdax pool,
an existing file) they need --allow-write like any writing method. A sample's raw value is the TSC
ticks of `hops` dependent loads; its ns is per load (timer overhead removed, then / hops).
"""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np

from nearlocal.core.methods import Method, SessionContext, register_method
from nearlocal.cpu.threads import THREAD_FORMS, check_thread_params, choose_cpus, run_pinned
from nearlocal.errors import UsageError
from nearlocal.units import parse_size

LINE = 64
TRAFFIC_METHODS = ("load", "store", "nt-store")
WARM_HOPS_MAX = 1 << 20  # enough for any cache; a bigger ring is memory-bound anyway
TRAFFIC_START_TIMEOUT_S = 30.0


# Work per sample is bounded: a sample is one pass of `hops` loads (at up to ~1 us each on a
# far pool) and must fit well inside the longest budget; the delay between bursts likewise.
MAX_PARAM = {"hops": 2**24, "delay": 10**9, "seed": 2**63 - 1}


def _int_param(params: dict, key: str, low: int = 0) -> int:
    text = str(params.get(key, "")).strip()
    high = MAX_PARAM.get(key, 2**63 - 1)
    if not re.fullmatch(r"\d+", text) or not low <= int(text) <= high:
        raise UsageError(f"malformed --param {key}={text[:30]!r}: use an integer from {low} to "
                         f"{high}")
    return int(text)


def _size_param(params: dict, key: str, default: str) -> int:
    """A size parameter, its error naming the parameter (`--param burst=0`)."""
    text = str(params.get(key, default)).strip()
    try:
        return parse_size(text)
    except UsageError as exc:
        why = str(exc).removeprefix(f"malformed size {text!r}: ")
        raise UsageError(f"malformed --param {key}={text[:30]!r}: {why}") from None


def _thp_share(array: np.ndarray) -> str:
    """How much of a THP mapping the kernel really backs with 2 MiB pages (/proc/self/smaps)."""
    address = array.ctypes.data
    try:
        with open("/proc/self/smaps") as smaps:
            text = smaps.read()
    except OSError:
        return "thp (coverage unknown)"
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, _, hi = block.split(" ", 1)[0].partition("-")
        if lo and hi and int(lo, 16) <= address < int(hi, 16):
            size = re.search(r"^Size:\s+(\d+) kB", block, re.M)
            huge = re.search(r"^AnonHugePages:\s+(\d+) kB", block, re.M)
            if size and huge and int(size.group(1)):
                return f"thp ({100 * int(huge.group(1)) // int(size.group(1))}% in 2M pages)"
    return "thp (coverage unknown)"


def _page_size(info: dict, array: np.ndarray | None = None) -> str:
    """What the row says about page size: the region's pages (for THP, how much the kernel
    really gave in 2 MiB pages), a devdax device's alignment."""
    if info.get("pages") == "thp" and array is not None:
        return _thp_share(array)
    if info.get("pages"):
        return str(info["pages"])
    align = info.get("align")
    if align:
        return f"{int(align) >> 20}M" if int(align) >= 1 << 20 else f"{int(align) >> 10}K"
    return "4K"


class _Ring:
    """The ring laid over `nbytes` of a region at byte `offset`, warmed by one untimed walk."""

    def __init__(self, array: np.ndarray, offset: int, nbytes: int, seed: int):
        from nearlocal.kernels.chase import build_ring, walk

        if not array.flags.writeable:
            raise UsageError("chase lays its pointer ring into the region: it needs a writable "
                             "mapping (--allow-write for memory nearlocal did not create)")
        self.lines = nbytes // LINE
        if self.lines < 1:
            raise UsageError(f"chase needs at least one {LINE}-byte line, got {nbytes} bytes")
        if offset % LINE:
            raise UsageError("chase needs a line-aligned region offset")
        self.words = array[offset:offset + self.lines * LINE].view(np.uint64)
        build_ring(self.words, self.lines, seed)
        self.position = np.zeros(1, np.uint64)
        self.position[0] = walk(self.words, 0, min(2 * self.lines, WARM_HOPS_MAX))


def _contiguous(ctx: SessionContext) -> tuple[int, int]:
    frags = ctx.pattern.frags
    if frags.shape[0] != 1:
        raise UsageError(f"{ctx.case.method} takes a size (the ring), not a fragment pattern "
                         f"({ctx.case.pattern!r})")
    return int(frags[0, 0]), int(frags[0, 2])


class ChaseSession:
    clock = "tsc"

    def __init__(self, ctx: SessionContext):
        offset, nbytes = _contiguous(ctx)
        self.ctx = ctx
        self.hops = self.ops_per_sample = _int_param(ctx.params, "hops", 1)
        self.ring = _Ring(ctx.src.array, offset, nbytes, _int_param(ctx.params, "seed"))
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "kernel": "time_chase",
                     "ring_lines": self.ring.lines, "hops_per_sample": self.hops,
                     "page_size": _page_size(ctx.src.info, ctx.src.array),
                     "timed": f"{self.hops} dependent loads around a one-cycle random ring of "
                              f"{self.ring.lines} lines; ns is per load"}

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        from nearlocal.kernels.chase import time_chase

        ticks = np.empty(n, np.uint64)
        time_chase(self.ring.words, self.hops, ticks, self.ring.position)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz / self.hops

    def close(self) -> None:
        pass


class LoadedChaseSession(ChaseSession):
    """The chase on the first CPU while every other CPU runs bursts of a bandwidth method with
    `delay` ns of spinning between bursts, all in the same region (MLC's --loaded_latency).

    The region is cut into one share per CPU: the ring in the first, traffic in the others.
    The traffic's bandwidth is counted only while the chase is timing (bursts finished between
    the TSC readings around each batch of samples) and stored as info.traffic_gbps."""

    def __init__(self, ctx: SessionContext):
        from nearlocal.kernels.parallel import traffic_kernel

        offset, nbytes = _contiguous(ctx)
        params = ctx.params
        _check_loaded(params)  # traffic, burst, delay, hops, seed, threads / cpus
        self.ctx = ctx
        self.hops = self.ops_per_sample = _int_param(params, "hops", 1)
        traffic = params.get("traffic", "load")
        self.cpus = choose_cpus(ctx.case.region, params.get("threads", "all"),
                                params.get("cpus", ""), numa=ctx.numa)
        if len(self.cpus) < 2:
            raise UsageError("loaded-chase needs at least 2 CPUs (one chases, the others load)")
        burst = _size_param(params, "burst", "4KiB")
        share = nbytes // len(self.cpus) // burst * burst
        if share < burst:
            raise UsageError(f"{nbytes} bytes cannot hold a ring and {len(self.cpus) - 1} traffic "
                             f"shares of at least one {burst}-byte burst")
        array = ctx.src.array
        self.ring = _Ring(array, offset, share, _int_param(params, "seed"))
        delay_ns = _int_param(params, "delay")
        self.delay_ticks = np.uint64(round(delay_ns * ctx.tsc_hz / 1e9))
        self.burst = burst
        self.control = np.zeros(1, np.uint64)
        self.progress = np.zeros(len(self.cpus) - 1, np.uint64)
        self.bursts = 0
        self.ticks = 0.0
        kernel = traffic_kernel(THREAD_FORMS[traffic])  # traffic= names a method
        self._errors: list[BaseException] = []
        self._threads = []
        for k, cpu in enumerate(self.cpus[1:]):
            start = offset + (k + 1) * share
            frags = np.array([[start + b, start + b, burst] for b in range(0, share, burst)],
                             np.int64)
            self._threads.append(threading.Thread(
                target=self._traffic, args=(cpu, kernel, frags, k), daemon=True))
        kernel(array, array, frags[:1], np.uint64(0), np.ones(1, np.uint64), self.progress, 0)
        self.progress[:] = 0  # the call above only compiled the kernel (stop flag already set)
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + TRAFFIC_START_TIMEOUT_S
        while (self.progress == 0).any() and not self._errors:  # chase only under traffic
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the traffic threads did not start")
            time.sleep(0.001)
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "kernel": "time_chase",
                     "ring_lines": self.ring.lines, "hops_per_sample": self.hops,
                     "page_size": _page_size(ctx.src.info, ctx.src.array), "cpus": self.cpus,
                     "chase_cpu": self.cpus[0], "traffic": traffic, "traffic_threads":
                     len(self.cpus) - 1, "delay_ns": delay_ns, "burst_bytes": burst,
                     "share_bytes": share, "traffic_gbps": None,
                     "timed": f"{self.hops} dependent loads on CPU {self.cpus[0]} while "
                              f"{len(self.cpus) - 1} CPU(s) run {traffic} bursts of {burst} B "
                              f"with {delay_ns} ns between them; ns is per load"}

    def _traffic(self, cpu: int, kernel, frags: np.ndarray, slot: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # this thread only
            kernel(self.ctx.src.array, self.ctx.src.array, frags, self.delay_ticks, self.control,
                   self.progress, slot)
        except BaseException as exc:  # reported by sample()
            self._errors.append(exc)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        from nearlocal.kernels.chase import time_chase
        from nearlocal.kernels.cpu import tsc_now

        if self._errors:
            raise self._errors[0]
        ticks = np.empty(n, np.uint64)
        before, t0 = int(self.progress.sum()), tsc_now()
        run_pinned([(self.cpus[0],
                     lambda: time_chase(self.ring.words, self.hops, ticks, self.ring.position))])
        after, t1 = int(self.progress.sum()), tsc_now()
        self.bursts += after - before
        self.ticks += float(t1 - t0)
        if self.ticks > 0:
            self.info["traffic_gbps"] = self.bursts * self.burst / (self.ticks * 1e9
                                                                    / self.ctx.tsc_hz)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz / self.hops

    def close(self) -> None:
        from nearlocal.kernels.parallel import stop

        stop(self.control)
        for thread in self._threads:
            thread.join()


def _check_chase(params: dict) -> None:
    _int_param(params, "hops", 1)
    _int_param(params, "seed")


def _check_loaded(params: dict) -> None:
    _check_chase(params)
    check_thread_params(params)
    _int_param(params, "delay")
    if params.get("traffic", "load") not in TRAFFIC_METHODS:
        raise UsageError(f"unknown traffic={params.get('traffic')!r}: valid are "
                         f"{', '.join(TRAFFIC_METHODS)}")
    burst = _size_param(params, "burst", "4KiB")
    if burst < LINE or burst % LINE:
        raise UsageError(f"--param burst={params.get('burst')!r} must be a multiple of {LINE} "
                         "bytes")


register_method(Method(
    name="chase", marker="cpu", accesses=("read",), state="warm",
    summary="dependent loads around a random one-cycle ring of cache lines: ns per load (idle "
            "latency; the size picks L1 / L2 / LLC / memory)",
    open_session=ChaseSession, cpu_flags=("rdtscp",), markers=("cpu",), moves_bytes=False,
    params={"hops": "4096", "seed": "1"}, check_params=_check_chase, stores_in_region=True,
    pool_roles=frozenset({"latency"}), measures="operation", touches_peer=False, cacheable=True,
))
register_method(Method(
    cacheable=False,
    name="loaded-chase", marker="cpu", accesses=("read",), state="warm",
    summary="chase on one CPU while the others run bursts of load / store / nt-store with "
            "`delay` ns between them: latency under load (MLC's loaded latency)",
    open_session=LoadedChaseSession, cpu_flags=("rdtscp",), markers=("cpu",), moves_bytes=False,
    params={"hops": "4096", "seed": "1", "threads": "all", "cpus": "", "delay": "0",
            "traffic": "load", "burst": "4KiB"},
    check_params=_check_loaded, stores_in_region=True, pool_roles=frozenset({"loaded-latency"}),
    measures="operation", touches_peer=False,
))
