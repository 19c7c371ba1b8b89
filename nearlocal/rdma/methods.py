"""The rdma-* methods: one-sided RDMA write / read and an RPC (RDMA write + poll, or send/recv)
over an RC queue pair between rank 0 and rank 1 of an MPI job (the rack machinery: endpoints
exchanged over MPI, one run). Each rank registers its own region (dram, a NUMA node,
device-dax): no shared pool.

Rank 0 posts; rank 1 is the target (one-sided) or the RPC server. The timed loops are compiled
(rdma/kernels.py); MPI only exchanges endpoints, starts phases and carries the check's bytes.
After timing, rank 1's memory is sent to rank 0 and compared to what rank 0 wrote (or read):
a check, not a timing, stated in the row (`data_check`).
"""

from __future__ import annotations

import os
import time

import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import Delivery
from nearlocal.core.movers import MOVER_PARAMS, MOVER_SAMPLES_KEPT, MoverTally, parse_movers
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import run_trials
from nearlocal.core.suites import Suite, extend_suite, register_suite
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.probe import verbs  # ctypes only: libibverbs is loaded when a case runs
from nearlocal.rack.framework import RackContext, RackMethod, RackRow, register_rack
from nearlocal.rack.mpi import in_mpi_job
from nearlocal.rdma.requests import (
    MOVER_ID_SHIFT,
    SGE_VARIANTS,
    build_chain,
    build_recv,
    plan_requests,
    sge_limit,
)

kernels = lazy_import("nearlocal.rdma.kernels")

SUITE_REGION = "dram"
PATTERNS = ("16KiB", "128x20KiB", "1024x160B", "kv:qwen2.5-32b:flash-attn:dense")
RPC_MESSAGE = "64B"
CPU_FLAGS = ("rdtscp",)  # the timer; the NIC moves the bytes (no flush instruction is used)
MAX_WINDOW = 8  # transfers in flight in the pipelined (data movement) run
PIPELINE_SAMPLES = 16
REPLY_OFFSET = 4096  # the RPC's reply slot / reply buffer, after the request's
DEFAULT_MTU = 1024  # the path MTU every case had before `mtu` (RoCE over a 1500 B Ethernet MTU)
MTUS = tuple(verbs.MTU_ENUM)  # 256 .. 4096: the path MTUs verbs.h names
SUITE_MTU = 4096  # the suite's large-MTU rows (InfiniBand's, RoCE's over jumbo frames)
SUITE_MOVERS = 2  # the rdma suite's 16 KiB rows by k queue pairs at once
CONTENTION_PATTERN = "kv:qwen2.5-32b:flash-attn:dense"  # the contention suite's: a dense KV block
CONTENTION_MOVERS = (1, 2, 4, 8)  # queue pairs at once (QPs, not CPUs: the same on any box)
TRANSPORTS = ("write", "send")  # rdma-rpc: RDMA write + poll (default), or send/recv
EVERY_HOST_NEEDS = "an RDMA device"  # the line when one host of the job lacks it
# movers=k (rdma-write / rdma-read): k queue pairs, each its own transfer of the whole pattern
RDMA_PARAMS = {"sge": "batched", "device": "", "mtu": str(DEFAULT_MTU), **MOVER_PARAMS}
RPC_PARAMS = {"device": "", "mtu": str(DEFAULT_MTU), "transport": "write"}
OPCODES = {"rdma-write": verbs.WR_RDMA_WRITE, "rdma-read": verbs.WR_RDMA_READ}
WITHOUT_MPI = ("the rdma-* methods run between two ranks of an MPI job: launch `mpiexec -n 2 "
               "nearlocal run --suite rdma` (pip install 'nearlocal[mpi]')")


# --- which device, what it allows ------------------------------------------------------------

def _devices():
    from nearlocal.probe.rdma import probe_rdma
    from nearlocal.sysroot import SysRoot

    return probe_rdma(SysRoot.default())


def pick_device(info, name: str):
    """The device named (UsageError when it does not exist), else the first with an active port."""
    if name:
        device = info.device(name)
        if device is None:
            known = ", ".join(d.name for d in info.devices) or "none"
            raise UsageError(f"RDMA device {name!r} does not exist (this host has: {known})")
        if device.active_port() is None:
            raise UsageError(f"RDMA device {name!r} has no ACTIVE port")
        return device
    return next((d for d in info.devices if d.active_port()), None)


def requests_for(method: str, pattern: Pattern, variant: str, limits: dict,
                 movers: int = 1) -> np.ndarray:
    """The work requests of one transfer, or UsageError when the device cannot take them (with
    `movers` k: k transfers, each on its own QP, in a region k times one's)."""
    limit = sge_limit(variant, limits, OPCODES.get(method, 0))
    plan = plan_requests(pattern.frags, limit)
    max_wr = int(limits.get("max_qp_wr") or 0)
    if max_wr and len(plan) > max_wr:
        raise UsageError(f"{method}: pattern {pattern.text} needs {len(plan)} work requests per "
                         f"transfer (sge={variant}, {limit} SGEs each) but the device's queue "
                         f"pair holds {max_wr} (max_qp_wr): use sge=batched or fewer pieces")
    max_mr = int(limits.get("max_mr_size") or 0)
    span = movers * _region_bytes(pattern)
    if max_mr and span > max_mr:
        movers_text = f" ({movers} movers' slots)" if movers > 1 else ""
        raise UsageError(f"{method}: pattern {pattern.text} spans {span} bytes{movers_text}, "
                         f"beyond the device's max_mr_size {max_mr}")
    return plan


def _region_bytes(pattern: Pattern) -> int:
    """One transfer's slot in a rank's region: its span, pages rounded (mover m's at m x it)."""
    return -(-max(pattern.src_span, pattern.dst_span, 2 * REPLY_OFFSET) // 4096) * 4096


def movers_of(params: dict) -> int:
    """movers=k: the queue pairs (and transfers) at once; 1 for a method without it."""
    return parse_movers(params.get("movers", "1"))


def _pool_bytes(resolved, ranks: int) -> int:
    """What each rank maps of its region: one slot per mover."""
    return movers_of(resolved.params) * _region_bytes(resolved.pattern)


def path_mtu(params: dict, method: str = "rdma-*") -> int:
    """The case's path MTU in bytes (UsageError for a value verbs.h has no enum for)."""
    text = str(params.get("mtu", DEFAULT_MTU))
    if not text.isdigit() or int(text) not in MTUS:
        raise UsageError(f"{method}: mtu={text} must be one of {', '.join(map(str, MTUS))} "
                         "(the path MTUs verbs.h names)")
    return int(text)


def _check_case(method: str):
    def check(params: dict, pattern: Pattern) -> None:
        variant = str(params.get("sge", "batched"))
        if variant not in SGE_VARIANTS:
            raise UsageError(f"{method}: sge={variant} must be one of {', '.join(SGE_VARIANTS)}")
        transport = str(params.get("transport", "write"))
        if transport not in TRANSPORTS:
            raise UsageError(f"{method}: transport={transport} must be one of "
                             f"{', '.join(TRANSPORTS)}")
        path_mtu(params, method)
        movers = movers_of(params) if method in OPCODES else 1
        info = _devices()
        device = pick_device(info, str(params.get("device", "")))
        if device is not None and "error" not in device.limits and method in OPCODES:
            requests_for(method, pattern, variant, device.limits, movers)
    return check


def _check_rpc_pattern(pattern: Pattern) -> None:
    if pattern.count != 1 or not 16 <= pattern.total_bytes <= REPLY_OFFSET:
        raise UsageError(f"rdma-rpc takes one message size of 16 B to {REPLY_OFFSET} B (e.g. "
                         f"{RPC_MESSAGE}), not {pattern.text!r}")


def mtu_needs(params: dict, inventory) -> str | None:
    """Why the case's path MTU cannot run on this box: above the active MTU of the port it would
    use (the one `device` names, else the first device with an active port). A skipped row in a
    suite; bad input when every case selected is one (engine/plan.py: the user named it). None
    when the port's active MTU is unknown (the connection then checks both ends' own)."""
    rdma = getattr(inventory, "rdma", None)
    if rdma is None or rdma.reason:
        return None  # host_needs says why no rdma-* case runs at all
    try:
        mtu = path_mtu(params)
        device = pick_device(rdma, str(params.get("device", "")))
    except UsageError:
        return None  # check_case refuses it as bad input
    port = device.active_port() if device is not None else None
    active = getattr(port, "active_mtu", 0) if port is not None else 0
    if active and mtu > active:
        return (f"mtu={mtu} is above {device.name} port {port.port}'s active MTU {active}: the "
                f"path MTU cannot exceed it (mtu={active} or less runs here)")
    return None


def host_needs(inventory) -> str | None:
    """Why this host cannot run an rdma-* method, MPI aside (probe's reason: no device, ...)."""
    rdma = getattr(inventory, "rdma", None)
    return rdma.reason if rdma is not None and rdma.reason else None


def _needs(inventory) -> str | None:
    return host_needs(inventory) or (None if in_mpi_job() else WITHOUT_MPI)


# --- the connection: each rank's QP on its own region, endpoints over MPI ---------------------

class _Link:
    """This rank's QP connected to the other rank's (0 <-> 1), its region registered. With
    `queue_pairs` k > 1 (movers=k): k QPs on one device context, protection domain, registered
    region and CQ, QP m connected to the other rank's QP m (`qps`, `peers`; `qp` / `peer` are
    the first)."""

    def __init__(self, ctx: RackContext, max_send_wr: int, max_sge: int, recv_cq: bool = False,
                 queue_pairs: int = 1):
        from nearlocal.probe.rdma import gid_index

        device = pick_device(_devices(), str(ctx.params.get("device", "")))
        if device is None:
            raise RuntimeError("no RDMA device with an active port on this host")
        port = device.active_port()
        self.device, self.port = device, port
        self.mtu = path_mtu(ctx.params, ctx.case.method)
        self.lib = verbs.load_library()
        self.region = ctx.pool.array
        # every QP's signalled completions (one per chain) and, after an error, its flushed ones
        depth = queue_pairs * max_send_wr + 1
        most = int(device.limits.get("max_cqe") or 0)
        self.qp = verbs.QueuePair(self.lib, device.name, port.port, gid_index(port), port.lid,
                                  self.region, max_send_wr, max_sge, recv_cq=recv_cq,
                                  cq_depth=min(depth, most) if most else depth)
        self.qps = [self.qp]
        try:
            for _ in range(queue_pairs - 1):
                self.qps.append(verbs.QueuePair(self.lib, device.name, port.port,
                                                gid_index(port), port.lid, self.region,
                                                max_send_wr, max_sge, share=self.qp))
            peer_rank = 1 - ctx.rank
            mine = [qp.endpoint(int.from_bytes(os.urandom(3), "little")) for qp in self.qps]
            ctx.world.send(mine, peer_rank, ctx.timeout_s, "sending its RDMA endpoints")
            self.peers = ctx.world.recv(peer_rank, ctx.timeout_s, "receiving the RDMA endpoints")
            self.peer = self.peers[0]
            _check_ends(self.mtu, {ctx.rank: mine[0].active_mtu, peer_rank: self.peer.active_mtu})
            for qp, me, peer in zip(self.qps, mine, self.peers, strict=True):
                qp.connect(me, peer, self.mtu)
        except BaseException:
            self.close()
            raise
        self.wc = np.zeros(verbs.WC_BYTES, np.uint8)
        self.bad = np.zeros(1, np.uint64)

    def args(self, wrs: np.ndarray) -> tuple:
        """The leading arguments of every kernel (addresses): post_send, poll_cq, qp, cq, WR
        chain, bad WR, work completion."""
        return (np.uint64(self.qp.post_send), np.uint64(self.qp.poll_cq), np.uint64(self.qp.qp),
                np.uint64(self.qp.cq), np.uint64(wrs.ctypes.data),
                np.uint64(self.bad.ctypes.data), np.uint64(self.wc.ctypes.data))

    def recv_args(self, send_wr: np.ndarray, recv_wr: np.ndarray) -> tuple:
        """The leading arguments of the send/recv RPC's kernels (addresses): post_send,
        post_recv, poll_cq, qp, send CQ, receive CQ, send WR, receive WR, bad WR, work
        completion."""
        return (np.uint64(self.qp.post_send), np.uint64(self.qp.post_recv),
                np.uint64(self.qp.poll_cq), np.uint64(self.qp.qp), np.uint64(self.qp.cq),
                np.uint64(self.qp.recv_cq), np.uint64(send_wr.ctypes.data),
                np.uint64(recv_wr.ctypes.data), np.uint64(self.bad.ctypes.data),
                np.uint64(self.wc.ctypes.data))

    def facts(self) -> dict:
        limits = {k: v for k, v in self.device.limits.items() if k != "error"}
        return {"device": self.device.name, "port": self.port.port,
                "link_layer": self.port.link_layer, "path_mtu": self.mtu,
                "active_mtu": self.qp.active_mtu or None,
                "peer_active_mtu": self.peer.active_mtu or None, **limits}

    def close(self) -> None:
        for qp in reversed(self.qps):  # the sharers first, then the QP they share
            qp.close()


def _check_ends(mtu: int, active: dict[int, int]) -> None:
    """Both ranks raise alike (each has both ends' active MTU) when the path MTU is above either
    port's: rank 0's plan checked its own port only, rank 1 may sit on another host."""
    for rank, value in sorted(active.items()):
        if value and mtu > value:
            raise RuntimeError(f"mtu={mtu} is above rank {rank}'s port active MTU {value}: the "
                               "path MTU cannot exceed either end's")


def _failed(why: int, what: str) -> RuntimeError:
    names = {1: "ibv_post_send failed", 2: "ibv_poll_cq failed",
             3: "a work completion came back with an error status", 4: "no completion in time",
             7: "ibv_post_recv failed", 8: "a reply's sequence word is not its request's",
             9: "a completion's wr_id names no mover"}
    return RuntimeError(f"{what}: {names.get(why, f'kernel status {why}')}")


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


# --- rdma-write / rdma-read ------------------------------------------------------------------

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


# --- rdma-rpc: request and reply each RDMA-written into a polled slot, or each a SEND ---------

PROTOCOLS = {
    "write": "RC, RDMA write of the request into the server's slot, RDMA write of the reply into "
             "the client's slot, both polled",
    "send": "RC, SEND of the request into the server's posted receive, SEND of the reply into "
            "the client's; both sides poll their receive CQ (one of its own)"}
TIMED = {
    "write": "ibv_post_send of the request -> the reply's sequence word seen in rank 0's reply "
             "slot (rank 0's clock)",
    "send": "ibv_post_send of the request's SEND -> the reply's receive completion polled on "
            "rank 0's receive CQ (rank 0's clock; the reply's receive is posted before the "
            "clock starts, the request's send completion reaped after it stops)"}


def _rpc_run(ctx: RackContext) -> dict:
    if ctx.rank > 1:
        ctx.barrier("while ranks 0 and 1 connect")
        return {}
    transport = str(ctx.params.get("transport", "write"))
    size = ctx.pattern.total_bytes
    words = -(-size // 8)
    seq_index = words - 1  # the last word: written last by the NIC, the one both sides poll
    region = ctx.pool.array
    region[:2 * REPLY_OFFSET] = 0
    link = _Link(ctx, 1, 1, recv_cq=transport == "send")
    try:
        slot = region[:words * 8].view(np.uint64)
        reply = region[REPLY_OFFSET:REPLY_OFFSET + words * 8].view(np.uint64)
        # rank 0 sends its request buffer (offset 0) into rank 1's slot (offset 0); rank 1
        # sends its reply buffer (REPLY_OFFSET) into rank 0's reply slot (REPLY_OFFSET): by RDMA
        # write at those addresses, or by SEND into a receive posted there
        source, target = (0, REPLY_OFFSET) if ctx.rank == 0 else (REPLY_OFFSET, 0)
        frags = np.array([[source, source, words * 8]], np.int64)
        plan = plan_requests(frags, 1)
        base = int(region.ctypes.data)
        if transport == "send":
            wrs, sge_buffer = build_chain(frags, plan, base, link.qp.lkey, 0, 0, verbs.WR_SEND)
            recv_wr, recv_sge = build_recv(base + target, words * 8, link.qp.lkey)
            if ctx.rank == 1:  # the first request's receive, posted before rank 0 may send
                link.qp.post_receive(recv_wr)
        else:
            wrs, sge_buffer = build_chain(frags, plan, base, link.qp.lkey, link.peer.addr,
                                          link.peer.rkey, verbs.WR_RDMA_WRITE)
            recv_wr = recv_sge = None
        if ctx.rank == 0:
            slot[:seq_index] = np.arange(seq_index, dtype=np.uint64) + 7
        ctx.barrier("while ranks 0 and 1 connect")
        timeout = np.uint64(ctx.timeout_s * ctx.tsc_hz)
        if ctx.rank == 1:
            return _rpc_serve(ctx, link, wrs, recv_wr, slot, reply, words, timeout)
        client = _RpcClient(ctx, link, wrs, recv_wr, slot, reply, seq_index, timeout)
        try:
            ticks, ns, elapsed, converged = run_trials(client, ctx.rule)
        finally:
            client.stop()
        echoed = bool(np.array_equal(reply[:seq_index], slot[:seq_index]))
        del sge_buffer, recv_sge
        return {"raw": ticks, "ns": ns, "elapsed_s": elapsed, "converged": converged,
                "echoed": echoed, "message_bytes": words * 8, "transport": transport,
                **link.facts()}
    finally:
        link.close()


class _RpcClient:
    def __init__(self, ctx, link, wrs, recv_wr, request, reply, seq_index, timeout):
        self.ctx, self.link, self.wrs, self.recv_wr = ctx, link, wrs, recv_wr
        self.request, self.reply, self.seq_index, self.timeout = request, reply, seq_index, timeout
        self.next_seq = 1

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.zeros(n, np.uint64)
        request_seq = _address(self.request, self.seq_index)
        reply_seq = _address(self.reply, self.seq_index)
        if self.recv_wr is None:
            why = kernels.rpc_client(*self.link.args(self.wrs), request_seq, reply_seq,
                                     np.uint64(self.next_seq), ticks, self.timeout)
        else:
            why = kernels.rpc_send_client(*self.link.recv_args(self.wrs, self.recv_wr),
                                          request_seq, reply_seq, np.uint64(self.next_seq),
                                          ticks, self.timeout)
        self.next_seq += n
        if why != kernels.OK:
            raise _failed(why, "RPC round trip")
        return ticks.astype(np.float64), self.ctx.ns(ticks)

    def stop(self) -> None:
        """The STOP sequence, written into the server's slot or sent into its posted receive
        (not timed, not answered); its send completion reaped."""
        self.request[self.seq_index] = kernels.STOP
        why = kernels.post_to_completion(*self.link.args(self.wrs), np.zeros(1, np.uint64),
                                         self.timeout)
        if why != kernels.OK:
            raise _failed(why, "sending the RPC server its stop")


def _address(words: np.ndarray, index: int) -> np.uint64:
    return np.uint64(words.ctypes.data + 8 * index)


def _rpc_serve(ctx, link, wrs, recv_wr, slot, reply, words, timeout) -> dict:
    state = np.zeros(2, np.int64)
    idle = np.uint64(0.05 * ctx.tsc_hz)
    deadline = time.monotonic() + ctx.timeout_s + 20 * ctx.rule.budget_s
    while True:
        if recv_wr is None:
            why = kernels.rpc_server(*link.args(wrs), _address(slot, 0), _address(reply, 0),
                                     words, state, timeout, idle)
        else:
            why = kernels.rpc_send_server(*link.recv_args(wrs, recv_wr), _address(slot, 0),
                                          _address(reply, 0), words, state, timeout, idle)
        if why == kernels.STOPPED:
            return {"served": int(state[1])}
        if why != kernels.IDLE:
            raise _failed(why, "RPC server")
        if time.monotonic() > deadline:
            raise RuntimeError("the RPC client on rank 0 neither sent requests nor stopped")


def _rpc_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    got = results[0]
    served = results[1].get("served", 0)
    transport = got.get("transport", "write")
    check = ("ok: the last reply equals its request" if got["echoed"]
             else "FAILED: the last reply differs from its request")
    info = {k: got[k] for k in ("device", "port", "link_layer", "path_mtu", "active_mtu",
                                "peer_active_mtu", "max_sge", "max_qp_wr", "converged",
                                "elapsed_s", "message_bytes") if k in got}
    info.update({"server_rank": 1, "requests_served": served, "data_check": check,
                 "transport": transport, "protocol": PROTOCOLS[transport],
                 "timer_overhead_ticks": ctx.overhead_ticks, "timed": TIMED[transport]})
    failed = "" if got["echoed"] else check
    return [RackRow(0, np.asarray(got["raw"]), np.asarray(got["ns"]), info, failed,
                    {"work_requests_per_sample": 1})]


# --- registration ----------------------------------------------------------------------------

register_rack(RackMethod("rdma-write", _one_sided_run, _one_sided_rows, _pool_bytes,
                         shared_pool=False,
                         host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "one-sided RDMA write on an RC QP, rank 0 -> rank 1: the pattern's pieces as work "
              "requests split by the device's max_sge (sge=one: one per piece; movers=k: k "
              "queue pairs, each its own transfer at once)", RDMA_PARAMS,
              needs=_needs, check_case=_check_case("rdma-write"), case_needs=mtu_needs, cpu_flags=CPU_FLAGS,
              stores_in_region=True, delivery=Delivery("nic", "per-work-request"))
register_rack(RackMethod("rdma-read", _one_sided_run, _one_sided_rows, _pool_bytes,
                         shared_pool=False,
                         host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "one-sided RDMA read on an RC QP: rank 0 reads rank 1's memory into the pattern's "
              "pieces (max_sge_rd SGEs per request; sge=one: one per piece; movers=k: k queue "
              "pairs, each its own transfer at once)", RDMA_PARAMS,
              needs=_needs, check_case=_check_case("rdma-read"), case_needs=mtu_needs, accesses=("read",),
              cpu_flags=CPU_FLAGS, stores_in_region=True,
              delivery=Delivery("nic", "per-work-request"))
register_rack(RackMethod("rdma-rpc", _rpc_run, _rpc_rows,
                         lambda resolved, ranks: 2 * REPLY_OFFSET, shared_pool=False, host_needs=host_needs,
                         every_host_needs=EVERY_HOST_NEEDS),
              "an RPC over RDMA RC (B15): the request RDMA-written into rank 1's slot, the reply "
              "RDMA-written back, both sides polling memory (transport=send: SEND into a posted "
              "receive each way, receive completions polled)", RPC_PARAMS, needs=_needs,
              check_pattern=_check_rpc_pattern, check_case=_check_case("rdma-rpc"), case_needs=mtu_needs,
              sample_bytes=lambda pattern: 2 * pattern.total_bytes, cpu_flags=CPU_FLAGS,
              stores_in_region=True)


def rdma_cases() -> list[Case]:
    """Each pattern written and read one request per piece and SGE-batched, the RPC both ways,
    a 16 KiB write and read at path MTU 4096: on a port whose active MTU is lower (RoCE over
    a 1500 B Ethernet MTU, soft-RoCE's 1024) those two are skipped rows saying so
    (mtu_needs), the rest of the suite runs; and a 16 KiB write and read by SUITE_MOVERS queue
    pairs at once (movers=k: contention's smallest case, beside the k = 1 rows above)."""
    cases = []
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        for pattern in PATTERNS:
            for variant in SGE_VARIANTS:
                cases.append(Case(method, SUITE_REGION, "wb", pattern, access=access,
                                  params=(("sge", variant),)))
    cases.append(Case("rdma-rpc", SUITE_REGION, "wb", RPC_MESSAGE))
    cases.append(Case("rdma-rpc", SUITE_REGION, "wb", RPC_MESSAGE, params=(("transport", "send"),)))
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        cases.append(Case(method, SUITE_REGION, "wb", "16KiB", access=access,
                          params=(("sge", "batched"), ("mtu", str(SUITE_MTU)))))
    for method, access in (("rdma-write", "write"), ("rdma-read", "read")):
        cases.append(Case(method, SUITE_REGION, "wb", "16KiB", access=access,
                          params=(("sge", "batched"), ("movers", str(SUITE_MOVERS)))))
    return cases


def contention_cases() -> list[Case]:
    """The contention suite's RDMA rows (issue 57): a dense KV block read SGE-batched by k = 1,
    2, 4, 8 queue pairs at once (each its own transfer of the whole block): the rdma hop's
    per-mover and aggregate bandwidth and service times at k. An MPI job's, like every rdma-*
    case (outside one, skipped rows saying how to launch it)."""
    return [Case("rdma-read", SUITE_REGION, "wb", CONTENTION_PATTERN, access="read",
                 params=(("sge", "batched"),) + ((("movers", str(k)),) if k > 1 else ()))
            for k in CONTENTION_MOVERS]


register_suite(Suite("rdma", "RDMA over verbs between two ranks of an MPI job: write / read of "
                     "each fragment pattern (one request per piece, and SGE-batched; 16 KiB also "
                     "at path MTU 4096 and by 2 queue pairs at once), an RPC by RDMA write and by "
                     "send/recv (B1, B2, B13-B15's RDMA side)", [rdma_cases]))
extend_suite("contention", contention_cases)
