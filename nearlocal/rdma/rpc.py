"""rdma-rpc: an RPC over RDMA RC between ranks 0 and 1, the request and reply each RDMA-written
into a polled slot (transport=write) or each a SEND into a posted receive (transport=send);
rank 1 serves until rank 0 sends its stop."""

from __future__ import annotations

import time

import numpy as np

from nearlocal.core.sampling import run_trials
from nearlocal.lazy import lazy_import
from nearlocal.probe import verbs  # ctypes only: libibverbs is loaded when a case runs
from nearlocal.rack.framework import RackContext, RackRow
from nearlocal.rdma.device import REPLY_OFFSET
from nearlocal.rdma.link import _failed, _Link
from nearlocal.rdma.requests import build_chain, build_recv, plan_requests

kernels = lazy_import("nearlocal.rdma.kernels")


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
