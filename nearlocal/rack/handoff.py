"""rack-handoff: one writer (rank 0) publishes records in the pool (rpc's single-writer store),
readers on the other ranks look them up, copy and check them: announce -> usable."""

from __future__ import annotations

import time

import numpy as np

from nearlocal.core.cases import ResolvedCase
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import run_trials
from nearlocal.lazy import lazy_import
from nearlocal.rack.framework import RackContext, RackRow
from nearlocal.rpc.protocols import protocol_code

# numba kernels: compiled when a case runs, not when the methods register (issue 19)
kernels = lazy_import("nearlocal.rack.kernels")
rec = lazy_import("nearlocal.rpc.records")
sync = lazy_import("nearlocal.rpc.kernels.sync")

FLAG_SAMPLES = 200


def _record_shape(pattern: Pattern) -> tuple[int, int]:
    """(records, bytes per record): one record per fragment of the pattern, each a whole number
    of cache lines (16KiB: one record; 1024x160B: 1024 records, each looked up on its own)."""
    lengths = pattern.frags[:, 2]
    return len(lengths), int(-(-int(lengths.max()) // 64) * 64)


def _handoff_layout(pattern: Pattern, ranks: int) -> rec.Layout:
    records, record_bytes = _record_shape(pattern)
    return rec.Layout(records, record_bytes, max(ranks - 1, 1), 1)


def handoff_bytes(resolved: ResolvedCase, ranks: int) -> int:
    return kernels.CONTROL_BYTES + _handoff_layout(resolved.pattern, ranks).nbytes


class _HandoffWriter:
    """A session (for run_trials): each sample announces a freshly written batch."""

    clock = "tsc"

    def __init__(self, ctx, control, cwords, sraw, swords, layout, code):
        self.ctx, self.control, self.cwords = ctx, control, cwords
        self.sraw, self.swords, self.layout, self.code = sraw, swords, layout, code
        self.state = np.ones(1, np.int64)  # version 1: what init_store wrote
        self.timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)
        self.info: dict = {}

    def sample(self, n: int, flag_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.zeros(n, np.uint64)
        status = kernels.handoff_write(self.control, self.cwords, self.sraw, self.swords,
                                       self.layout.records, self.ctx.size - 1, self.state,
                                       flag_only, ticks, self.code, self.timeout)
        if status != kernels.OK:
            raise RuntimeError(f"a reader did not acknowledge a handoff within "
                               f"{self.ctx.timeout_s:g} s")
        return ticks.astype(np.float64), self.ctx.ns(ticks)


def _flag_roundtrips(writer: _HandoffWriter, seconds: float) -> np.ndarray:
    """Flag-only handoffs (no records): up to FLAG_SAMPLES, for at most `seconds`."""
    batches = []
    start = time.perf_counter()
    while sum(map(len, batches)) < FLAG_SAMPLES and (time.perf_counter() - start < seconds
                                                     or not batches):
        batches.append(writer.sample(10, flag_only=True)[1])
    return np.concatenate(batches)


def handoff_run(ctx: RackContext) -> dict:
    code = protocol_code(str(ctx.params.get("protocol", "flush")))
    layout = _handoff_layout(ctx.pattern, ctx.size)
    raw = ctx.pool.array
    control = raw[:kernels.CONTROL_BYTES]
    cwords = control.view(np.uint64)
    sraw = raw[kernels.CONTROL_BYTES:kernels.CONTROL_BYTES + layout.nbytes]
    if ctx.rank == 0:
        control[:] = 0
        sync.flush_written(control, 0, cwords.size, code)
        swords = rec.init_store(sraw, layout, 1 << 62, "flush" if code else "coherent")
    ctx.barrier("after the handoff store was written")
    swords = sraw.view(np.uint64)
    if ctx.rank:
        return _handoff_reader(ctx, control, cwords, sraw, swords, layout, code)
    writer = _HandoffWriter(ctx, control, cwords, sraw, swords, layout, code)
    try:
        ticks, ns, elapsed, converged = run_trials(writer, ctx.rule)
        flag_ns = _flag_roundtrips(writer, max(ctx.rule.budget_s / 4, 0.02))
    finally:
        sync.publish_flag(cwords, kernels.A_STOP, np.uint64(1), code)
    return {"raw": ticks, "ns": ns, "elapsed_s": elapsed, "converged": converged,
            "flag_ns": flag_ns, "records": layout.records, "record_bytes": layout.record_bytes}


def _handoff_reader(ctx, control, cwords, sraw, swords, layout, code) -> dict:
    reader = ctx.rank - 1
    local = np.empty(layout.payload_words, np.uint64)
    monitor = np.zeros(4, np.int64)
    state = np.array([0, 0], np.int64)  # nothing announced yet (the writer starts at 2)
    timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)
    idle = np.uint64(0.05 * ctx.tsc_hz)
    deadline = time.monotonic() + ctx.timeout_s + 10 * ctx.rule.budget_s
    while True:
        why = kernels.handoff_read(control, cwords, sraw, swords, layout.records, reader,
                                   layout.reader_base(reader), local, monitor, state, code,
                                   timeout, idle)
        if why == kernels.STOPPED:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the handoff writer on rank 0 neither announced nor stopped "
                               "before the deadline")
    return {"handled": int(state[0]) - 1, "refused": int(state[1])}


def handoff_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    got = results[0]
    refused = {r: results[r]["refused"] for r in range(1, ctx.size)}
    flag_ns = float(np.median(got["flag_ns"]))
    median = float(np.median(got["ns"]))
    info = {"protocol": str(ctx.params.get("protocol", "flush")), "records": got["records"],
            "record_bytes": got["record_bytes"], "readers": list(range(1, ctx.size)),
            "reader_hosts": ctx.hostnames[1:], "flag_roundtrip_ns": flag_ns,
            "usable_ns": max(median - flag_ns / 2, 0.0), "refused_records": refused,
            "handled_versions": {r: results[r]["handled"] for r in range(1, ctx.size)},
            "converged": got["converged"], "elapsed_s": got["elapsed_s"],
            "timer_overhead_ticks": ctx.overhead_ticks,
            "timed": "announce -> the last reader's acknowledgement, on the writer's clock; "
                     "usable_ns takes off half the flag-only round trip (the acknowledgement's "
                     "way back)"}
    failed = f"readers refused records: {refused}" if any(refused.values()) else ""
    return [RackRow(0, np.asarray(got["raw"]), np.asarray(got["ns"]), info, failed)]
