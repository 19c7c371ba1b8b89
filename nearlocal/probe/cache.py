"""The last-level cache a process can really use, read from a pointer chase where cpuid cannot
be trusted.

In a VM cpuid reports the host socket's L3 (260 MiB on a 2-vCPU Intel guest) while the guest's
share of it is far smaller: there a 32 MiB chase read 150 ns a hop, memory, and cases of 4-64 MiB
were called `llc_resident`. So on a box whose CPU says `hypervisor`, the probe walks a chase ring
surely in memory (twice cpuid's LLC) and rings of doubling span from twice the L2 upwards, and
takes the largest span whose hops are still CACHED times faster than memory's as the usable LLC
(the L2 when none is: a co-tenant may hold the whole L3).
Bare metal keeps cpuid's figure. Each CpuInfo says which it holds and why (`llc_source`).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import re

import numpy as np

from nearlocal.sysroot import SysRoot

MIB = 1 << 20
MIN_SPAN = MIB
MAX_SPAN = 1 << 30
MEMORY_SHARE = 0.125  # a ring takes at most this share of MemAvailable
CACHED = 2.0  # a span is in the LLC while its hops are at least this many times faster than memory
HOPS, SAMPLES, READINGS = 4096, 9, 3
_measured: dict[tuple[int, int], tuple[int | None, str]] = {}  # per process: probes repeat


def available_bytes(root: SysRoot) -> int | None:
    """MemAvailable, bytes (None: not told): the chase rings take a small share of it."""
    found = re.search(r"MemAvailable:\s+(\d+)\s*kB", root.read("/proc/meminfo", "") or "")
    return int(found.group(1)) * 1024 if found else None


def _ns_per_hop(span: int, tsc_hz: float) -> float:
    """Median ns per hop of a chase over `span` bytes of fresh anonymous memory, walked once
    through before timing (a ring that fits stays in the cache)."""
    from nearlocal.kernels.chase import LINE, build_ring, time_chase, walk

    buf = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    words = np.frombuffer(buf, np.uint64)
    try:
        lines = span // LINE
        build_ring(words, lines, 11)
        position = np.array([walk(words, 0, min(lines, 1 << 21))], np.uint64)
        ticks = np.empty(SAMPLES, np.uint64)
        best = math.inf
        for _ in range(READINGS):  # the quieter reading: a co-tenant's burst is not the cache
            time_chase(words, HOPS, ticks, position)
            best = min(best, float(np.median(ticks)))
        return best * 1e9 / tsc_hz / HOPS
    finally:
        del words  # the mapping cannot close while a view of it lives (a Ctrl-C mid-walk)
        with contextlib.suppress(BufferError):  # a frame of the interrupt's traceback (numba's
            buf.close()  # dispatcher) still holds one: the GC unmaps it with that frame


def memory_span(cpuid_llc_bytes: int, available: int | None) -> int:
    """The reference ring, surely in memory: twice cpuid's LLC, at least 64 MiB, at most 1 GiB
    and MEMORY_SHARE of `available`."""
    span = min(MAX_SPAN, max(64 * MIB, 2 * cpuid_llc_bytes))
    while available and span > MIN_SPAN and span > available * MEMORY_SHARE:
        span //= 2
    return span


def chase_curve(l2_bytes: int, cpuid_llc_bytes: int, tsc_hz: float,
                available: int | None = None) -> tuple[list[int], list[float]]:
    """(spans, ns per hop), the last span the memory reference (memory_span); the others
    doubling from twice the L2, stopping at the first that is no longer cached (usable_llc)."""
    reference = memory_span(cpuid_llc_bytes, available)
    memory_ns = _ns_per_hop(reference, tsc_hz)
    spans, ns = [], []
    span = max(MIN_SPAN, 2 * l2_bytes)
    while span < reference:
        spans.append(span)
        ns.append(_ns_per_hop(span, tsc_hz))
        if ns[-1] * CACHED < memory_ns:
            span *= 2
        else:
            break
    return [*spans, reference], [*ns, memory_ns]


def usable_llc(spans: list[int], ns: list[float], l2_bytes: int) -> int | None:
    """The largest span before the first whose hops are not CACHED times faster than the
    memory reference (the curve's last point); the L2 when even twice the L2 is not; None
    when every span below the reference is cached (cpuid's figure stands)."""
    if len(ns) < 2 or not ns[-1] > 0:
        return None
    memory_ns = ns[-1]
    for index, t in enumerate(ns[:-1]):
        if t * CACHED >= memory_ns:
            return spans[index - 1] if index > 0 else l2_bytes or None
    return None


def measured_llc(l2_bytes: int, cpuid_llc_bytes: int, tsc_hz: float,
                 available: int | None) -> tuple[int | None, str]:
    """(the usable LLC in bytes or None, how it was found): walked once per process."""
    key = (l2_bytes, cpuid_llc_bytes)
    if key not in _measured:
        try:
            spans, ns = chase_curve(l2_bytes, cpuid_llc_bytes, tsc_hz, available)
        except (OSError, ValueError) as exc:
            _measured[key] = (None, f"cpuid (a VM; the chase curve failed: {exc})")
            return _measured[key]
        found = usable_llc(spans, ns, l2_bytes)
        curve = ", ".join(f"{s / MIB:g} MiB {t:.0f} ns" for s, t in zip(spans, ns, strict=True))
        how = (f"measured: a chase curve in a VM (cpuid's {cpuid_llc_bytes / MIB:g} MiB may be "
               f"the host's): the largest span still {CACHED:g}x faster than memory; ns per "
               f"hop: {curve}" if found else
               f"cpuid (a VM; every span below memory's was cached: {curve})")
        _measured[key] = (found, how)
    return _measured[key]
