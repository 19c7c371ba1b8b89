"""Host probes: how fast this box's cores and memory were while each worker process measured.

On a shared host the box itself moves between two runs: on the 2-vCPU development VM
(2026-12-02) the unchanged 16 KiB chase, one L1 hit per hop, read 1.17 ns in one run and 1.30 ns
twenty minutes later (the core clock), and the 1 GiB chase 186 ns and 349 ns (co-tenants'
memory traffic). No spread between processes of one run shows such a move. So every worker
process, at its start, walks two fixed chase rings, one per probe below, and the run keeps
every sample (run.json `host_probe`). `nearlocal compare` sets the two runs' probes side by side:
a case cannot be told slower when the host's own probe moved as much (report/compare.py).

The probes are a yardstick of the host, not cases of the run: their rings are private
anonymous memory of the worker, the same size and walk in every process and every run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nearlocal.kernels.chase import LINE, WORDS_PER_LINE

MIB = 1 << 20


@dataclass(frozen=True)
class HostProbe:
    name: str
    summary: str
    ring_bytes: Callable[[int], int]  # from the last-level cache's bytes (0: unknown)
    hops: int  # dependent loads per sample
    samples: int
    # which cases it is the yardstick of: "all", or "memory" (those whose row says
    # reaches_memory: the host's memory latency moves them, and not only its core clock)
    bounds: str


HOST_PROBES: dict[str, HostProbe] = {}


def register_probe(probe: HostProbe) -> HostProbe:
    HOST_PROBES[probe.name] = probe
    return probe


register_probe(HostProbe(
    "core", "chase over 16 KiB (an L1 hit per hop): the core's clock", lambda llc: 16 << 10,
    hops=4096, samples=15, bounds="all"))
register_probe(HostProbe(
    "memory", "chase over max(64 MiB, 2 x LLC), 4 KiB pages: the host's memory latency",
    lambda llc: max(64 * MIB, 2 * llc), hops=512, samples=15, bounds="memory"))


def probe_ring(nbytes: int, seed: int = 7) -> np.ndarray:
    """A one-cycle random ring over nbytes of fresh anonymous memory (a uint64 view)."""
    from nearlocal.kernels.chase import build_ring

    words = np.zeros(nbytes // 8, np.uint64)
    build_ring(words, nbytes // LINE, seed)
    return words


def measure_host(llc_bytes: int, tsc_hz: float, overhead_ticks: float) -> dict[str, list[float]]:
    """Per probe, its samples in ns per hop (timer overhead subtracted, as a chase case's are).
    The ring is laid and walked once untimed first, so a sample's loads hit where the probe
    says (L1 for core; memory, through 4 KiB pages' TLB misses, for memory)."""
    from nearlocal.kernels.chase import time_chase, walk

    readings: dict[str, list[float]] = {}
    for probe in HOST_PROBES.values():
        words = probe_ring(probe.ring_bytes(llc_bytes))
        lines = words.size // WORDS_PER_LINE
        position = np.array([walk(words, 0, min(lines, 1 << 16))], np.uint64)
        ticks = np.empty(probe.samples, np.uint64)
        time_chase(words, probe.hops, ticks, position)
        ns = np.maximum(ticks.astype(np.float64) - overhead_ticks, 0.0) * 1e9 / tsc_hz / probe.hops
        readings[probe.name] = [round(float(x), 4) for x in ns]
        del words
    return readings


def load_kernels() -> None:
    """Lay and walk a 4 KiB ring once: numba loads the probes' kernels from its cache (the
    worker fork server does this, so each worker is not charged for it)."""
    from nearlocal.kernels.chase import time_chase, walk

    words = probe_ring(4096)
    position = np.array([walk(words, 0, 1)], np.uint64)
    time_chase(words, 1, np.empty(1, np.uint64), position)


def probe_facts(llc_bytes: int) -> dict[str, dict]:
    """What run.json says of each probe beside its samples."""
    return {p.name: {"summary": p.summary, "ring_bytes": p.ring_bytes(llc_bytes), "hops": p.hops,
                     "bounds": p.bounds} for p in HOST_PROBES.values()}
