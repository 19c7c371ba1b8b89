"""Host probes: how fast this box's cores and memory were while each worker process measured.

On a shared host the box itself moves between two runs: on the 2-vCPU development VM
(2026-12-02) the unchanged 16 KiB chase, one L1 hit per hop, read 1.17 ns in one run and 1.30 ns
twenty minutes later (the core clock), and the 1 GiB chase 186 ns and 349 ns while a 64 MiB
chase moved only 1.04x (the 1 GiB walk's page-table misses moved with it); on 2026-12-03 the
cases living in the 32 MiB L3 (chase 4 MiB, loads and stores of 16 MiB) read 1.3-2.5x slower in
one run than in the one before while the core and memory held still (the L3 is shared with other
tenants). No spread between processes of one run shows such a move. So one process of the
run, the prober, holds a fixed chase ring per probe below and walks them as each worker process
starts; the run keeps every sample (run.json `host_probe`). `nearlocal compare` sets the two
runs' probes side by side (hostmoves.py beside this): code CI reads a probe's move as noise,
box CI names the layer that moved.

The probes walk their own kernel (kernels/yardstick.py), not the chase method's: the code
under test (a tree's kernels) must not move its own yardstick, and each run records the
probe code's fingerprint (`code`), so compare knows whether two runs walked the same one.

The probes are a yardstick of the host, not cases of the run: their rings are laid once per run
(the memory ring spans what the run's largest memory-bound case spans, ~2.5 s at 1 GiB), in the
pages a default dram region gets, and walked the same way in every run."""

from __future__ import annotations

import contextlib
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MIB = 1 << 20
GIB = 1 << 30
MIN_MEMORY_RING = 64 * MIB
MAX_MEMORY_RING = GIB  # the quick suite's largest chase; more costs each run ~2 s per GiB
MEMORY_SHARE = 0.25  # the memory ring takes at most this share of MemAvailable
PROBER_START_S = 120.0  # laying a 1 GiB ring takes ~2.5 s on the 2-vCPU VM; TCG guests far more
PROBER_WALK_S = 30.0


@dataclass(frozen=True)
class HostProbe:
    name: str
    summary: str
    # its ring's bytes from the last-level cache's bytes (0: unknown) and the footprint of the
    # run's largest case that reaches memory (0: none)
    ring_bytes: Callable[[int, int], int]
    hops: int  # dependent loads per sample
    samples: int
    # untimed hops before each reading, from its ring's bytes (as laid): the other cases ran
    # since the last one, and a ring walked cold reads its page-table misses too (1 GiB: ~320 ns
    # a hop cold, ~215 ns walked)
    warm_hops: Callable[[int], int]
    # which cases it is the yardstick of: "all", "llc" (rows saying llc_resident: the host's
    # last-level cache, shared with other tenants, moves them) or "memory" (rows saying
    # reaches_memory: the host's memory latency moves them, and not only its core clock)
    bounds: str


HOST_PROBES: dict[str, HostProbe] = {}


def register_probe(probe: HostProbe) -> HostProbe:
    HOST_PROBES[probe.name] = probe
    return probe


def llc_ring_bytes(llc_bytes: int, span_bytes: int) -> int:
    """An eighth of the LLC (4 MiB of a 32 MiB L3: far beyond L2, as the cases living in the LLC
    are); 1 MiB when the LLC is unknown."""
    return max(llc_bytes // 8, MIB)


def llc_warm_hops(ring_bytes: int) -> int:
    """128 Ki hops, or one pass through every line of the ring when that is more (a ring over
    8 MiB: an LLC over 64 MiB): each reading starts from the ring back in the LLC, not from
    the part of it the last warm-up reached."""
    from nearlocal.kernels.chase import LINE

    return max(1 << 17, ring_bytes // LINE)


def memory_ring_bytes(llc_bytes: int, span_bytes: int) -> int:
    """Over the LLC twice, and as wide as the largest memory-bound case (its page walks are
    part of what moves), within [64 MiB, 1 GiB] unless the LLC alone asks for more."""
    floor = max(MIN_MEMORY_RING, 2 * llc_bytes)
    return max(floor, min(span_bytes, MAX_MEMORY_RING))


register_probe(HostProbe(
    "core", "chase over 16 KiB (an L1 hit per hop): the core's clock", lambda llc, span: 16 << 10,
    hops=4096, samples=15, warm_hops=lambda ring: 4096, bounds="all"))
register_probe(HostProbe(
    "llc", "chase over an eighth of the LLC (its hops hit the LLC when the host leaves it to "
    "this VM): the LLC's state", llc_ring_bytes, hops=4096, samples=15, warm_hops=llc_warm_hops,
    bounds="llc"))
register_probe(HostProbe(
    "memory", "chase over the run's largest memory-bound span (64 MiB - 1 GiB, at least 2 x "
    "LLC), in a default dram region's pages: the host's memory latency", memory_ring_bytes,
    hops=512, samples=15, warm_hops=lambda ring: 1 << 16, bounds="memory"))


def fitting_bytes(wanted: int, available: int | None) -> int:
    """`wanted`, halved while it would take more than MEMORY_SHARE of the memory available (not
    below 64 KiB): the prober must not starve the cases of memory."""
    if available is None:
        return wanted
    while wanted > MEMORY_SHARE * available and wanted > 64 << 10:
        wanted //= 2
    return wanted


def ring_sizes(llc_bytes: int, span_bytes: int, available: int | None) -> dict[str, int]:
    return {p.name: fitting_bytes(p.ring_bytes(llc_bytes, span_bytes), available)
            for p in HOST_PROBES.values()}


def probe_ring(nbytes: int, seed: int = 7) -> tuple[mmap.mmap, np.ndarray]:
    """A one-cycle random ring over nbytes of fresh private anonymous memory, mapped as a
    default dram region is (4 KiB pages whatever THP's mode: `regions.memory.advise_pages`).
    numpy's own allocations would be THP-backed here: numpy advises huge pages for them."""
    from nearlocal.kernels.chase import LINE, build_ring
    from nearlocal.regions.memory import advise_pages, populate

    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise_pages(buf, "4K")
    populate(buf)
    words = np.frombuffer(buf, np.uint64)
    build_ring(words, nbytes // LINE, seed)
    return buf, words


@dataclass
class ProbeRing:
    """A probe's laid ring and where its walk stands: each reading continues from there."""

    probe: HostProbe
    buf: mmap.mmap  # the mapping `words` views: kept open as long as the ring is walked
    words: np.ndarray
    position: np.ndarray  # the word index the next reading starts from

    @classmethod
    def lay(cls, probe: HostProbe, nbytes: int) -> ProbeRing:
        buf, words = probe_ring(nbytes)
        return cls(probe, buf, words, np.zeros(1, np.uint64))

    def reading(self) -> list[int]:
        """`samples` walks of `hops` after `warm_hops` untimed, each in raw TSC ticks (per_hop_ns
        turns them into ns per hop as a chase case's are), so its loads hit where the probe says
        (L1 for core; memory, through the TLB and the cached page tables, as a chase case's,
        for memory)."""
        from nearlocal.kernels.yardstick import probe_time_chase, probe_walk

        warm = self.probe.warm_hops(self.words.nbytes)
        self.position[0] = probe_walk(self.words, self.position[0], warm)
        ticks = np.empty(self.probe.samples, np.uint64)
        probe_time_chase(self.words, self.probe.hops, ticks, self.position)
        return [int(t) for t in ticks]


def lay_rings(sizes: dict[str, int]) -> list[ProbeRing]:
    return [ProbeRing.lay(HOST_PROBES[name], nbytes) for name, nbytes in sizes.items()]


def measure_host(rings: list[ProbeRing]) -> dict[str, list[int]]:
    """Per probe, one reading of its laid ring (raw ticks)."""
    return {ring.probe.name: ring.reading() for ring in rings}


def per_hop_ns(fact: dict, samples: list[float]) -> list[float]:
    """A reading's samples in ns per hop: raw ticks less the prober's timer overhead, over the
    TSC's rate and the hops (run.json's facts of the probe say all three); runs stored before
    raw ticks were kept hold ns per hop already."""
    if "tsc_hz" not in fact:
        return [float(x) for x in samples]
    scale = 1e9 / float(fact["tsc_hz"]) / int(fact["hops"])
    overhead = float(fact.get("overhead_ticks", 0.0))
    return [max(float(t) - overhead, 0.0) * scale for t in samples]


def probe_facts(sizes: dict[str, int], tsc_hz: float) -> dict[str, dict]:
    """What run.json says of each probe beside its raw samples (compare sets side by side only
    probes whose ring and hops agree: another ring is another yardstick); the prober adds the
    timer overhead it measured (`overhead_ticks`) once it is ready; `code`: the fingerprint of
    the kernel they walk (kernels/yardstick.py: another probe code is another yardstick)."""
    from nearlocal.kernels.yardstick import code_fingerprint

    code = code_fingerprint()
    return {name: {"summary": HOST_PROBES[name].summary, "ring_bytes": nbytes,
                   "hops": HOST_PROBES[name].hops, "bounds": HOST_PROBES[name].bounds,
                   "sample_unit": "TSC ticks per sample of `hops` hops", "tsc_hz": tsc_hz,
                   "code": code}
            for name, nbytes in sizes.items()}


def load_kernels() -> None:
    """Lay and walk a 4 KiB ring once: numba loads the probes' kernels from its cache (the
    worker fork server does this, so the prober is not charged for it)."""
    from nearlocal.kernels.yardstick import probe_time_chase, probe_walk

    buf, words = probe_ring(4096)
    position = np.array([probe_walk(words, 0, 1)], np.uint64)
    probe_time_chase(words, 1, np.empty(1, np.uint64), position)
    del words
    buf.close()


def _prober_main(conn, sizes: dict[str, int]) -> None:
    """The prober: lay the rings, say ready, then one reading per "walk" until None. Its own
    error is sent as ("failed", why); a closed pipe (the runner
    gone) just ends it."""
    import os

    from nearlocal.engine.children import ignore_interrupts

    ignore_interrupts()  # the runner handles Ctrl-C and stops it
    with contextlib.suppress(EOFError, OSError, KeyboardInterrupt):
        try:
            rings = lay_rings(sizes)
        except Exception as exc:  # the yardstick's failure must not fail the run: say it, end
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ready",))
            while conn.recv() is not None:
                try:
                    reading = measure_host(rings)
                except Exception as exc:
                    conn.send(("failed", f"{type(exc).__name__}: {exc}"))
                    break
                conn.send(("reading", reading))
    os._exit(0)


class HostProber:
    """The process that holds the probes' rings for a whole run and walks them when asked: one
    fixed set of pages per run, so a move of its readings is the host's, not a new placement.
    Anything that goes wrong ends the probes (`failure` says why), never the run."""

    def __init__(self, context, sizes: dict[str, int], tsc_hz: float, overhead_ticks: float = 0.0,
                 started: Callable[[int | None], None] | None = None):
        """`overhead_ticks`: the run's timer overhead (its one clock), what each walk's ticks
        carry besides the hops; `started(pid)`: told the prober's pid once it runs, before it
        lays its rings (the busy recorder samples where it runs)."""
        self.facts = probe_facts(sizes, tsc_hz)
        self.failure: str | None = None
        self._open = True
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_prober_main, args=(child, sizes), daemon=True)
        from nearlocal.engine.children import start_child

        start_child(self._process)
        child.close()
        if started is not None:
            started(self._process.pid)
        try:
            ready = self._reply(PROBER_START_S, "laying its rings")
        except BaseException:  # Ctrl-C while it lays them: no prober is left behind
            self.close()
            raise
        if ready is not None:
            for fact in self.facts.values():
                fact["overhead_ticks"] = float(overhead_ticks)

    def _reply(self, timeout_s: float, doing: str) -> tuple | None:
        deadline = time.monotonic() + timeout_s
        while self._open:
            try:
                if self._conn.poll(0.1):
                    message = self._conn.recv()
                    if message[0] != "failed":
                        return message
                    self._end(f"the host prober failed {doing}: {message[1]}")
                    return None
            except (EOFError, OSError):
                self._end(f"the host prober died {doing}")
            else:
                if not self._process.is_alive() and not self._conn.poll(0):
                    self._end(f"the host prober died {doing}")
                elif time.monotonic() > deadline:
                    self._end(f"the host prober took over {timeout_s:.0f} s {doing}")
        return None

    def walk(self) -> dict[str, list[int]] | None:
        """One reading of every probe (raw ticks); None once the prober has ended."""
        if not self._open:
            return None
        try:
            self._conn.send("walk")
        except OSError:  # BrokenPipeError among them
            self._end("the host prober died")
            return None
        message = self._reply(PROBER_WALK_S, "walking its rings")
        return None if message is None else message[1]

    def _end(self, failure: str | None) -> None:
        if self.failure is None:
            self.failure = failure
        self._open = False
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def close(self) -> None:
        if self._open:
            self._end(None)
