"""rdma-write / rdma-read: one-sided transfers of the pattern's pieces, rank 0 -> rank 1 or
back, timed post -> completion (and pipelined, for the bytes' own time); with movers=k, k queue
pairs at once. After timing, rank 1's memory is checked against rank 0's (`data_check`)."""

from __future__ import annotations

import time

import numpy as np

from nearlocal.core.movers import MOVER_SAMPLES_KEPT, MoverTally
from nearlocal.core.sampling import run_trials
from nearlocal.lazy import lazy_import
from nearlocal.probe import verbs  # ctypes only: libibverbs is loaded when a case runs
from nearlocal.rack.framework import RackContext, RackRow
from nearlocal.rdma.device import OPCODES, _devices, _region_bytes, movers_of, pick_device, requests_for
from nearlocal.rdma.link import _failed, _Link
from nearlocal.rdma.requests import MOVER_ID_SHIFT, build_chain, sge_limit

kernels = lazy_import("nearlocal.rdma.kernels")

MAX_WINDOW = 8  # transfers in flight in the pipelined (data movement) run
PIPELINE_SAMPLES = 16


class _Transfers:
    """run_trials' session: each sample one transfer of the pattern, post -> completion."""

    def __init__(self, ctx: RackContext, link: _Link, wrs: np.ndarray):
        self.ctx, self.link, self.wrs = ctx, link, wrs
        self.timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.zeros(n, np.uint64)
        why = kernels.post_to_completion(*self.link.args(self.wrs), ticks, self.timeout)
        if why != kernels.OK:
            raise _failed(why, "post -> completion")
        return ticks.astype(np.float64), self.ctx.ns(ticks)


def _pipelined_ns(ctx: RackContext, link: _Link, wrs: np.ndarray, window: int) -> np.ndarray:
    """A transfer's time with `window` in flight: what the bytes take once the pipeline is full.
    Samples of 2 x window transfers each, up to PIPELINE_SAMPLES or a quarter of the budget."""
    transfers = 2 * window
    samples = []
    start = time.perf_counter()
    timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)
    while len(samples) < PIPELINE_SAMPLES and (
            not samples or time.perf_counter() - start < ctx.rule.budget_s / 4):
        ticks = np.zeros(1, np.uint64)
        why = kernels.pipelined(*link.args(wrs), window, transfers, ticks, timeout)
        if why != kernels.OK:
            raise _failed(why, "pipelined transfers")
        samples.append(ticks[0])
    return ctx.ns(np.array(samples, np.uint64), per=transfers)


def _fill(array: np.ndarray, seed: int) -> None:
    array[:] = np.random.default_rng(seed).integers(0, 256, array.size, dtype=np.uint8)


def _packed(region: np.ndarray, frags: np.ndarray) -> np.ndarray:
    """The pattern's local pieces, packed in order (what the remote side must hold)."""
    return np.concatenate([region[o:o + n] for o, _, n in frags]) if len(frags) else region[:0]


def _one_sided_run(ctx: RackContext) -> dict:
    method = ctx.case.method
    opcode = OPCODES[method]
    frags = ctx.pattern.frags
    variant = str(ctx.params.get("sge", "batched"))
    movers = movers_of(ctx.params)
    if ctx.rank > 1:
        ctx.barrier("while ranks 0 and 1 connect")
        ctx.barrier("after the transfers")
        return {}
    device = pick_device(_devices(), str(ctx.params.get("device", "")))
    limits = device.limits if device else {}
    plan = requests_for(method, ctx.pattern, variant, limits, movers)
    # movers=k: one transfer in flight per QP; else the pipelined run's window on the one QP
    window = 1 if movers > 1 else max(
        1, min(MAX_WINDOW, int(limits.get("max_qp_wr") or len(plan)) // len(plan)))
    sges = int(plan[:, 1].max())
    link = _Link(ctx, len(plan) * window, sges, queue_pairs=movers)
    region = ctx.pool.array
    slot = _region_bytes(ctx.pattern)  # mover m's pieces and target lie at m x slot, both ranks
    try:
        if ctx.rank == 1:  # the target: what a read fetches, or zeros a write must overwrite
            spans = [region[m * slot:m * slot + ctx.pattern.dst_span] for m in range(movers)]
            for m, span in enumerate(spans):
                _fill(span, 1 + 16 * m) if opcode == verbs.WR_RDMA_READ else span.fill(0)
            ctx.barrier("while ranks 0 and 1 connect")
            ctx.barrier("after the transfers")
            ctx.world.send([np.array(span) for span in spans], 0, ctx.timeout_s,
                           "sending its memory for the check")
            return {}
        for m in range(movers):
            own = region[m * slot:m * slot + ctx.pattern.src_span]
            _fill(own, 2 + 16 * m) if opcode == verbs.WR_RDMA_WRITE else own.fill(0)
        base = int(region.ctypes.data)
        chains = [build_chain(frags, plan, base + m * slot, link.qp.lkey,
                              link.peers[m].addr + m * slot, link.peers[m].rkey, opcode,
                              first_id=m << MOVER_ID_SHIFT) for m in range(movers)]
        ctx.barrier("while ranks 0 and 1 connect")
        got = {"window": window}
        if movers > 1:
            session = _MoverTransfers(ctx, link, [wrs for wrs, _ in chains],
                                      int(frags[:, 2].sum()))
            ticks, ns, elapsed, converged = run_trials(session, ctx.rule)
            got["movers_info"] = session.info
        else:
            ticks, ns, elapsed, converged = run_trials(_Transfers(ctx, link, chains[0][0]),
                                                       ctx.rule)
            got["wire_ns"] = _pipelined_ns(ctx, link, chains[0][0], window)
        del chains  # posted for the last time
        ctx.barrier("after the transfers")
        remote = ctx.world.recv(1, ctx.timeout_s, "receiving rank 1's memory for the check")
        checked = bad = 0
        for m in range(movers):
            local = _packed(region[m * slot:], frags)
            bad += int(np.count_nonzero(local != remote[m][:local.size]))
            checked += int(local.size)
        return {**got, "raw": ticks, "ns": ns, "elapsed_s": elapsed, "converged": converged,
                "requests": len(plan), "sges_per_request": sges,
                "sge_limit": sge_limit(variant, limits, opcode), "movers": movers,
                "bytes_checked": checked, "bytes_differing": bad, **link.facts()}
    finally:
        link.close()


class _MoverTransfers:
    """run_trials' session for movers=k: each repetition k transfers at once, mover m's on QP m
    (all k posted back to back, then their completions polled off the CQ they share); sample r
    is mover r mod k's own post -> completion (MoverTally)."""

    def __init__(self, ctx: RackContext, link: _Link, chains: list[np.ndarray], nbytes: int):
        self.ctx, self.link, self.chains = ctx, link, chains
        self.timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)
        self.qps = np.array([qp.qp for qp in link.qps], np.uint64)
        self.heads = np.array([wrs.ctypes.data for wrs in chains], np.uint64)
        k = len(chains)
        self.info: dict = {
            "concurrency": f"{k} queue pairs (RC) on one device context, protection domain, "
                           "registered region and completion queue; one thread posts each QP's "
                           "whole work-request chain back to back, then polls the shared CQ: k "
                           "transfers in flight at once on the NIC and the link (the CPU posts "
                           "for all; no posting thread per QP; mover m's interval holds the "
                           "posts of the movers after it, each a provider call)",
            "timed": f"per repetition, each of the k = {k} movers' own interval: the clock read "
                     "just before its chain's ibv_post_send -> its last request's completion "
                     "polled off the shared CQ (wr_id names the mover); sample r is mover r mod "
                     "k's (per-mover service time); aggregate_gbps: k x bytes / (last completion "
                     "- first post) per repetition; mover_samples_ns: each mover's first "
                     f"{MOVER_SAMPLES_KEPT}; no pipelined run (data_movement_ns is one QP's)"}
        self.tally = MoverTally(nbytes, [{"qp": m, "qp_num": qp.qp_num}
                                         for m, qp in enumerate(link.qps)], self.info)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.qps.size
        starts = np.zeros((k, n), np.uint64)
        ends = np.zeros((k, n), np.uint64)
        qp = self.link.qp
        why = kernels.movers_to_completion(
            np.uint64(qp.post_send), np.uint64(qp.poll_cq), self.qps, np.uint64(qp.cq),
            self.heads, np.uint64(self.link.bad.ctypes.data), np.uint64(self.link.wc.ctypes.data),
            MOVER_ID_SHIFT, starts, ends, self.timeout)
        if why != kernels.OK:
            raise _failed(why, f"{k} movers' post -> completion")
        return mover_samples(self.ctx, self.tally, starts, ends)


def mover_samples(ctx: RackContext, tally: MoverTally, starts: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The row's samples of one batch of k movers' (k, n) clock readings: each mover's own
    interval, and the repetition's span (first post -> last completion) for the aggregate."""
    ticks = ends.astype(np.float64) - starts.astype(np.float64)
    span = ends.max(axis=0).astype(np.float64) - starts.min(axis=0).astype(np.float64)
    return tally.add(ticks, ctx.ns(ticks), ctx.ns(span))


def _one_sided_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    got = results[0]
    movers = int(got.get("movers", 1))
    median = float(np.median(got["ns"]))
    check = (f"ok: {got['bytes_checked']} bytes on rank 1 equal rank 0's" if not
             got["bytes_differing"] else
             f"FAILED: {got['bytes_differing']} of {got['bytes_checked']} bytes differ")
    info = {k: got[k] for k in ("device", "port", "link_layer", "path_mtu", "active_mtu",
                                "peer_active_mtu", "max_sge", "max_sge_rd", "max_qp_wr",
                                "max_mr_size", "sges_per_request", "sge_limit", "window",
                                "converged", "elapsed_s") if k in got}
    info.update({"sge": str(ctx.params.get("sge", "batched")),
                 "work_requests_per_sample": got["requests"], "data_check": check,
                 "timer_overhead_ticks": ctx.overhead_ticks})
    extra = {"max_sge": got.get("max_sge_rd" if ctx.case.method == "rdma-read" else "max_sge"),
             "work_requests_per_sample": got["requests"]}
    if movers > 1:  # k transfers at once: per-mover samples, the aggregate (no pipelined run)
        info.update(got["movers_info"])
    else:
        data_ns = float(np.median(got["wire_ns"]))
        info.update({
            "data_movement_ns": data_ns,
            "sync_share": max(0.0, 1.0 - data_ns / median) if median > 0 else None,
            "timed": "first ibv_post_send of the sample's work-request chain -> the last "
                     "request's completion polled (rank 0's clock); data_movement_ns: the same "
                     f"transfer's time with up to {got['window']} in flight (pipelined run, "
                     "total / transfers)"})
        extra["data_movement_ns"] = data_ns
    failed = "" if not got["bytes_differing"] else f"data check: {check}"
    return [RackRow(0, np.asarray(got["raw"]), np.asarray(got["ns"]), info, failed, extra)]
