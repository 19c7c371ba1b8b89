"""rack-aggregate: every rank reads (or writes) its own slice of the pool, alone in turn, then all
at once from one barrier: the total GB/s and each host's share."""

from __future__ import annotations

import time

import numpy as np

from nearlocal.core.movers import MOVER_SAMPLES_KEPT
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import summarize
from nearlocal.errors import UsageError
from nearlocal.rack.framework import RackContext, RackRow

AGGREGATE_SIZE = "16MiB"


def slice_bytes(pattern: Pattern) -> int:
    return -(-pattern.total_bytes // 4096) * 4096


def check_contiguous(pattern: Pattern) -> None:
    if pattern.count != 1:
        raise UsageError(f"rack-aggregate reads one contiguous slice per rank: give a size, not "
                         f"{pattern.text!r} (e.g. {AGGREGATE_SIZE})")


def _timed_passes(ctx: RackContext, kernel, src, dst, frags, seconds: float) -> np.ndarray:
    """Repetitions of one pass over the slice for `seconds` (batches between them, untimed)."""
    sink = np.zeros(1, np.uint64)
    batches = []
    start = time.perf_counter()
    count = 4
    while time.perf_counter() - start < seconds or not batches:
        ticks = np.zeros(count, np.uint64)
        kernel(src, dst, frags, ticks, sink, True)
        batches.append(ticks)
        count = min(count * 2, 1024)
    return np.concatenate(batches)


def aggregate_run(ctx: RackContext) -> dict:
    from nearlocal.kernels.cpu import time_load, time_store

    size = slice_bytes(ctx.pattern)
    offset = ctx.rank * size
    scratch = np.zeros(64, np.uint8)
    pool = ctx.pool.array
    if ctx.case.access == "write":
        kernel, src, dst = time_store, scratch, pool
        frags = np.array([[0, offset, size]], np.int64)
    else:
        kernel, src, dst = time_load, pool, scratch
        frags = np.array([[offset, 0, size]], np.int64)
    kernel(src, dst, frags, np.zeros(1, np.uint64), np.zeros(1, np.uint64), True)  # compile
    seconds = max(ctx.rule.budget_s / (ctx.size + 1), 0.02)
    alone = np.empty(0)
    for turn in range(ctx.size):
        ctx.barrier(f"before rank {turn} reads the pool alone")
        if turn == ctx.rank:
            alone = _timed_passes(ctx, kernel, src, dst, frags, seconds)
    ctx.barrier("before every rank reads the pool at once")
    together = _timed_passes(ctx, kernel, src, dst, frags, seconds)
    return {"alone": alone, "together": together, "bytes": size}


def movers_are(ctx: RackContext) -> str:
    """What the case's k movers are, for the contention fit's way: ranks on how many hosts."""
    hosts = len(set(ctx.host_ids))
    if hosts == ctx.size:
        return "MPI ranks, one per host" if hosts > 1 else "an MPI rank"
    return "MPI ranks on one host" if hosts == 1 else f"MPI ranks on {hosts} hosts"


def aggregate_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    """One row per rank: its samples the passes while every rank read at once (k = the job's
    size); its info the passes alone (`alone_samples_ns`, k = 1) and what the contention fit
    reads (whatif/contention.py: `movers`, `movers_group`, `movers_are`, `aggregate_gbps`)."""
    stats, alone_ns = [], []
    for got in results:
        alone_ns.append(ctx.ns(got["alone"]))
        alone = summarize(alone_ns[-1], got["bytes"])
        together = summarize(ctx.ns(got["together"]), got["bytes"])
        stats.append((alone, together))
    total = float(np.nansum([t["gbps"] for _, t in stats]))
    total_alone = float(np.nansum([a["gbps"] for a, _ in stats]))
    per_mover = [{"rank": rank, "host": ctx.hostnames[rank], "median_ns": t["median_ns"],
                  "gbps": t["gbps"]} for rank, (_, t) in enumerate(stats)]
    rows = []
    for rank, (got, (alone, together)) in enumerate(zip(results, stats, strict=True)):
        info = {"slice_bytes": got["bytes"], "slice_offset": rank * got["bytes"],
                "alone_gbps": alone["gbps"], "alone_median_ns": alone["median_ns"],
                "together_gbps": together["gbps"], "total_gbps": total,
                "sum_alone_gbps": total_alone,
                "share": together["gbps"] / total if total > 0 else None,
                "ranks": ctx.size, "timer_overhead_ticks": ctx.overhead_ticks,
                # the contention fit's fields (k movers, one row each)
                "movers": ctx.size, "movers_group": ctx.case.id, "movers_are": movers_are(ctx),
                "bytes_per_mover": got["bytes"], "aggregate_gbps": total,
                "per_mover": per_mover,
                "alone_samples_ns": [float(v) for v in alone_ns[rank][:MOVER_SAMPLES_KEPT]],
                "timed": "passes over this rank's slice; the row's samples: the passes while "
                         "every rank read at once (started together by one barrier, each rank "
                         "on its own clock); alone_samples_ns: this rank's passes with no other "
                         f"rank running (the first {MOVER_SAMPLES_KEPT}); the total "
                         "(aggregate_gbps) is the sum of the ranks' GB/s"}
        rows.append(RackRow(rank, np.asarray(got["together"], np.float64),
                            ctx.ns(got["together"]), info, extra={"total_gbps": total}))
    return rows
