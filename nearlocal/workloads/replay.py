"""A serving replay on the box (issue 57, docs/whatif.md "Replay on the box"): each request's KV
prefix hits really move, a gather out of a pool into a mover's own packed buffer, at the
requests' arrival times, with G concurrent movers; per request its wait and its transfer.

Bytes and fragments are real, content is not: the pool is a bounded region of any host kind
(`dram` by default, a device-dax or CXL node as the pool path; larger than 4x the LLC, so a
reload comes from memory), read only (a user's pool is never written), laid out as vLLM lays out
the model's KV cache
(workloads/layouts.py), holding `slots` trace blocks (512 tokens each). Every hit block read takes
the next slot of a ring walked with a stride coprime to the slot count: each read finds its bytes
in memory, never in the LLC a read before it filled (as a reload of KV that was evicted to the
host finds them), and a request's blocks lie apart as an allocator leaves them. A request's hit blocks are
cut into fragments by the same compiled builder `nearlocal kv` uses (selections.build_dense).
Each mover's destination is its own bounded buffer: a request larger than it wraps around it.

The movers (kernels/movers.py) are Python threads pinned to distinct CPUs running a nogil loop
that takes requests in arrival order, spins to each one's arrival on the TSC and times its gather
with fenced rdtscp: a FIFO queue with G servers, all in compiled code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.workloads.layouts import KvGeometry

TRACE_BLOCK_TOKENS = 512  # Mooncake's traces hash the prompt in 512-token blocks
GOLDEN = (math.sqrt(5) - 1) / 2  # a stride of this fraction of the pool scatters the blocks
LEAD_S = 0.25  # the replay's time zero lies this far after the movers are started


@dataclass(frozen=True)
class ReplayPool:
    """The pool a replay reads: `geometry` (pool_blocks = slots x layout blocks a trace block),
    the selected layers and the bytes one layout block of them holds."""

    geometry: KvGeometry
    layers: np.ndarray
    slots: int

    @property
    def per_slot(self) -> int:
        """Layout blocks one 512-token trace block takes."""
        return -(-TRACE_BLOCK_TOKENS // self.geometry.block_tokens)

    @property
    def block_bytes(self) -> int:
        g = self.geometry
        return int(self.layers.size) * g.parts * g.part_block_bytes

    @property
    def region_bytes(self) -> int:
        """The span the selected layers' blocks reach (the layers before them lie unread)."""
        desc = self.geometry.dense(self.layers)
        return int(desc.outer.max()) + (self.geometry.pool_blocks - 1) * desc.block_stride \
            + desc.piece


def pool_for(pattern_text: str, min_bytes: int) -> ReplayPool:
    """The pool a `kv:MODEL:LAYOUT...` text describes, with enough 512-token slots that it spans
    more than `min_bytes` (4x the LLC or more)."""
    from nearlocal.workloads import kv

    plan = kv.parse_plan(pattern_text)
    g = plan.geometry
    per_slot = -(-TRACE_BLOCK_TOKENS // g.block_tokens)
    slot_bytes = per_slot * int(plan.layers.size) * g.parts * g.part_block_bytes
    slots = max(1, min_bytes // slot_bytes + 1)
    geometry = KvGeometry(g.model, g.layout, g.tp, g.block_tokens, g.dtype, g.order,
                          slots * per_slot, g.layer_align)
    return ReplayPool(geometry, plan.layers, slots)


def scatter_step(count: int) -> int:
    """The stride that scatters `count` layout blocks over the pool: coprime to `count` (a
    bijection: no two of a slot cycle's blocks share an id) and near the golden fraction of it,
    so neighbours land far apart."""
    step = max(1, round(count * GOLDEN))
    while count > 2 and (math.gcd(step, count) != 1 or step in (1, count - 1)):
        step += 1
    return step % count or 1


def ring_step(slots: int) -> int:
    """The stride a replay walks the slots with: coprime to their count, so every slot is read
    before one is read again (no read finds the last one's bytes in the LLC), and more than 1
    where it can be, so a request's consecutive blocks do not lie side by side and merge."""
    step = max(1, slots // 2 + 1)
    while math.gcd(step, slots) != 1:
        step += 1
    return step % slots or 1


def request_table(pool: ReplayPool, hit_tokens: int, cursor: int,
                  placement: str = "contiguous") -> tuple[np.ndarray, int]:
    """Layout block ids of a request's hit tokens, and the ring's cursor after it: every hit
    512-token trace block takes the ring's next slot (content is not real, bytes and fragments
    are), its `ceil(tokens / block_tokens)` layout blocks contiguous in the slot, or with
    `scattered` the slot's ids spread over the pool by a bijection (scatter_step), as a
    fragmented allocator leaves them: still no id read twice before every slot was read."""
    bt, per_slot, slots = pool.geometry.block_tokens, pool.per_slot, pool.slots
    step = ring_step(slots)
    blocks = pool.geometry.pool_blocks
    spread = scatter_step(blocks) if placement == "scattered" else 1
    parts = []
    for j in range(-(-hit_tokens // TRACE_BLOCK_TOKENS)):
        tokens = min(TRACE_BLOCK_TOKENS, hit_tokens - j * TRACE_BLOCK_TOKENS)
        count = -(-tokens // bt)
        slot = (cursor * step) % slots
        ids = slot * per_slot + np.arange(count, dtype=np.int64)
        if placement == "scattered":
            ids = (ids * spread) % blocks
        parts.append(ids)
        cursor += 1
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), cursor


def cut_requests(pool: ReplayPool, tables: list[np.ndarray], dst_bytes: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fragments of every request back to back, first[i]: where request i's start, bytes per
    request). A request is cut one 512-token trace block at a time (its `per_slot` layout blocks,
    every layer), in the order its blocks took the ring: a slot is read again only after every
    other slot was, in a request as across requests. Cut layer by layer over all its blocks, a
    request of more blocks than the pool has slots would read each layer's slots again while
    the LLC still held them, and move faster than memory does. Destination offsets pack the
    request in order and wrap around a mover's `dst_bytes` buffer, a fragment never straddling
    its end."""
    from nearlocal.workloads.selections import build_dense

    desc = pool.geometry.dense(pool.layers)
    pieces, first = [], [0]
    for table in tables:
        chunks, packed = [], 0
        for start in range(0, table.size, pool.per_slot):
            frags, _ = build_dense(np.ascontiguousarray(table[start:start + pool.per_slot],
                                                        np.int64), desc)
            frags[:, 1] += packed
            packed += int(frags[:, 2].sum())
            chunks.append(frags)
        frags = np.concatenate(chunks) if chunks else np.zeros((0, 3), np.int64)
        pieces.append(frags)
        first.append(first[-1] + frags.shape[0])
    frags = np.concatenate(pieces) if pieces else np.zeros((0, 3), np.int64)
    if frags.size:
        longest = int(frags[:, 2].max())
        if longest > dst_bytes:
            raise UsageError(f"a fragment of {longest} B does not fit a mover's {dst_bytes} B "
                             "buffer")
        dst = frags[:, 1] % dst_bytes
        frags[:, 1] = np.where(dst + frags[:, 2] > dst_bytes, 0, dst)
    first_arr = np.asarray(first, np.int64)
    nbytes = np.array([int(p[:, 2].sum()) for p in pieces], np.int64)
    return np.ascontiguousarray(frags), first_arr, nbytes


@dataclass(frozen=True)
class ReplayTimes:
    """Per request, ns from the replay's time zero: arrival, start and end of its gather; the
    mover that served it; and the timer overhead subtracted from each transfer."""

    arrival_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    mover: np.ndarray
    cpus: list[int]
    timer_overhead_ns: float
    source: dict = field(default_factory=dict)  # the pool's region and what its open recorded


def _open_dram(size: int):
    from nearlocal.regions import load_providers, parse_region, region_kind

    load_providers()
    spec = parse_region("dram")
    return region_kind(spec).open(spec, size, "wb", True)


PAGE = 4096


def open_source(region: str, size: int):
    """The pool a replay reads: `region` opened read-only (the movers only read it, so a user's
    pool is never written), its pages faulted in before time zero by one read a page, so no
    gather's interval holds a page fault."""
    from nearlocal.regions import check_capacity, parse_region, region_kind

    spec = parse_region(region)
    check_capacity(spec, size)  # a device-dax maps past its end, and SIGBUSes there
    src = region_kind(spec).open(spec, size, "wb", False)
    try:
        int(src.array[::PAGE].sum())
    except BaseException:
        src.close()
        raise
    return src


def run_replay(frags: np.ndarray, first: np.ndarray, arrival_s: np.ndarray, region_bytes: int,
               dst_bytes: int, cpus: list[int], tsc_hz: float, source: str = "dram"
               ) -> ReplayTimes:
    """Move every request's fragments at its arrival time (s from time zero) with one mover per
    CPU in `cpus`, out of `region_bytes` of the `source` region (open_source) into each mover's
    own `dram` buffer."""
    from nearlocal.cpu.threads import run_pinned
    from nearlocal.kernels.cpu import timer_overhead
    from nearlocal.kernels.movers import read_tsc, replay_mover

    if len(first) != len(arrival_s) + 1:
        raise ValueError("first must hold one offset per request and one past the last")
    src, dsts = open_source(source, region_bytes), []
    try:
        dsts.extend(_open_dram(dst_bytes) for _ in cpus)
        n = len(arrival_s)
        starts, ends = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
        served = np.full(n, -1, np.int64)
        sinks = np.zeros((len(cpus), 1), np.uint64)
        # compile (and fault the code in) here, not in a thread its peers would wait on
        replay_mover(src.array, dsts[0].array, frags[:0], np.zeros(1, np.int64),
                     np.zeros(0, np.uint64), np.zeros(1, np.uint64), starts[:0], ends[:0],
                     served[:0], 0, sinks[0])
        overhead = np.zeros(257, np.uint64)
        timer_overhead(src.array, dsts[0].array, frags[:0], overhead, sinks[0])
        overhead_ticks = float(np.median(overhead[1:].astype(np.float64)))
        counter = np.zeros(1, np.uint64)
        zero = int(read_tsc()) + int(LEAD_S * tsc_hz)
        due = (zero + np.round(np.asarray(arrival_s, np.float64) * tsc_hz)).astype(np.uint64)

        def job(m: int):
            return lambda: replay_mover(src.array, dsts[m].array, frags, first, due, counter,
                                        starts, ends, served, m, sinks[m])

        run_pinned([(cpu, job(m)) for m, cpu in enumerate(cpus)])
    finally:
        src.close()
        for dst in dsts:
            dst.close()
    scale = 1e9 / tsc_hz
    base = np.float64(zero)
    return ReplayTimes(
        arrival_ns=(due.astype(np.float64) - base) * scale,
        start_ns=(starts.astype(np.float64) - base) * scale,
        end_ns=(ends.astype(np.float64) - base - overhead_ticks) * scale,
        mover=served, cpus=list(cpus), timer_overhead_ns=overhead_ticks * scale,
        source={"region": source, **src.info})


def quantiles(values: np.ndarray) -> dict:
    """P50, P90, P99, mean and max (ns) of per-request figures; empty: None each."""
    values = np.asarray(values, np.float64)
    if not values.size:
        return {"p50_ns": None, "p90_ns": None, "p99_ns": None, "mean_ns": None, "max_ns": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50_ns": float(p50), "p90_ns": float(p90), "p99_ns": float(p99),
            "mean_ns": float(values.mean()), "max_ns": float(values.max())}


def summarise(times: ReplayTimes, nbytes: np.ndarray, movers: int) -> dict:
    """Plain data: per request its wait, transfer and reload (wait + transfer), and their
    quantiles over the requests that moved bytes; the movers' utilisation (busy time over
    movers x the span from the first arrival to the last end) and the offered load."""
    wait = np.maximum(times.start_ns - times.arrival_ns, 0.0)
    transfer = np.maximum(times.end_ns - times.start_ns, 0.0)
    reload = wait + transfer
    moved = nbytes > 0
    span = (float(times.end_ns.max() - times.arrival_ns.min()) if times.arrival_ns.size
            else 0.0)
    busy = float(transfer.sum())
    arrivals = float(times.arrival_ns.max() - times.arrival_ns.min()) if nbytes.size else 0.0
    return {
        "requests": int(nbytes.size), "requests_with_hits": int(moved.sum()),
        "bytes": int(nbytes.sum()),
        "utilisation": busy / (movers * span) if span > 0 else None,
        "offered_gbps": float(nbytes.sum()) / arrivals if arrivals > 0 else None,
        "moved_gbps": float(nbytes.sum()) / busy if busy > 0 else None,
        "wait": quantiles(wait[moved]), "transfer": quantiles(transfer[moved]),
        "reload": quantiles(reload[moved]),
        "per_request": [
            {"arrival_ns": float(a), "wait_ns": float(w), "transfer_ns": float(t),
             "bytes": int(b), "mover": int(m)}
            for a, w, t, b, m in zip(times.arrival_ns, wait, transfer, nbytes, times.mover,
                                     strict=True)],
    }
