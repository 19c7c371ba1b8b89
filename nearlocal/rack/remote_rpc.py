"""rack-rpc-roundtrip / rack-rpc-throughput: rpc-roundtrip's ring in the pool, the client on each
rank k >= 1 in turn, the server (rpc's ServerProcess, unchanged) on rank 0's host."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import numpy as np

from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import run_trials
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.rack.framework import RackContext, RackRow
from nearlocal.rpc.methods import RpcSession, int_param
from nearlocal.rpc.protocols import protocol_code

slots = lazy_import("nearlocal.rpc.slots")
kslots = lazy_import("nearlocal.rpc.kernels.slots")
sync = lazy_import("nearlocal.rpc.kernels.sync")


class _RemoteServer:
    """The server's counters, read from its line of the ring (it runs on rank 0's host)."""

    def __init__(self, raw, words, protocol: int):
        self.raw, self.words, self.protocol = raw, words, protocol

    def bad_requests(self) -> int:
        return int(sync.read_flag(self.raw, self.words, kslots.W_BAD, self.protocol))


class _RackRpcClient(RpcSession):
    """rpc-roundtrip's / rpc-throughput's client (its sample(), unchanged) on a ring whose
    server is another host's process; the ring is this client's to set up, as in RpcSession."""

    def __init__(self, ctx: RackContext, raw: np.ndarray, throughput: bool):
        protocol, message_bytes, ring_bytes = self.configure(ctx, throughput, ctx.timeout_s)
        self.raw = raw[:ring_bytes]
        self.words = slots.init_ring(self.raw, self.slots, message_bytes, protocol)
        self.server = _RemoteServer(self.raw, self.words, self.protocol)

    def close(self) -> None:
        sync.publish_flag(self.words, kslots.W_STOP, np.uint64(1), self.protocol)


def ring_bytes(pattern: Pattern) -> int:
    axes = pattern.axes
    return slots.layout(int(axes["slots"]), int(axes["message_bytes"]))[2]


def _wait_word(raw, words, index: int, protocol: int, want, timeout_s: float, what: str) -> None:
    """Between phases (untimed): poll a pool word until `want(value)` holds."""
    deadline = time.monotonic() + timeout_s
    while not want(int(sync.read_flag(raw, words, index, protocol))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout_s:g} s")
        time.sleep(0.0005)


def rpc_run(ctx: RackContext, throughput: bool) -> dict:
    """Client ranks take turns (1, 2, ...), one server process on rank 0's host answering each."""
    protocol = str(ctx.params.get("protocol", "flush"))
    code = protocol_code(protocol)
    raw = ctx.pool.array
    words = raw[:ring_bytes(ctx.pattern)].view(np.uint64)
    result: dict = {"clients": {}, "server": {}}
    for client in range(1, ctx.size):
        ctx.barrier(f"before rank {client}'s RPC client")
        if ctx.rank == client:
            result["clients"][client] = _rpc_client(ctx, raw, throughput)
        elif ctx.rank == 0:
            result["server"][client] = _rpc_server(ctx, raw, words, code, protocol)
    return result


def _rpc_client(ctx: RackContext, raw: np.ndarray, throughput: bool) -> dict:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    saved = os.sched_getaffinity(0)
    session = _RackRpcClient(ctx, raw, throughput)
    try:
        _wait_word(session.raw, session.words, kslots.W_READY, session.protocol, bool,
                   ctx.timeout_s, "the RPC server on rank 0 did not start")
        os.sched_setaffinity(0, {cpu})
        ticks, ns, elapsed, converged = run_trials(session, ctx.rule)
    finally:
        os.sched_setaffinity(0, saved)
        session.close()
    return {"raw": ticks, "ns": ns, "elapsed_s": elapsed, "converged": converged,
            "info": {**session.info, "client_cpu": cpu}}


def _rpc_server(ctx: RackContext, raw, words, code: int, protocol: str) -> dict:
    """rpc's ServerProcess, unchanged, on rank 0's host, mapping the pool by its name."""
    _wait_word(raw, words, kslots.W_MAGIC, code, lambda v: v == kslots.MAGIC, ctx.timeout_s,
               "the RPC client did not set up its ring")
    slot_count, message_bytes = int(ctx.pattern.axes["slots"]), int(ctx.pattern.axes["message_bytes"])
    handle = {"region": ctx.pool.spec.text, "size": int(ctx.pool.array.size), "attr": "wb"}
    cpu = sorted(os.sched_getaffinity(0))[0]
    server = slots.ServerProcess(handle, words, raw, slot_count, message_bytes, protocol, cpu,
                                 ctx.tsc_hz)
    with contextlib.suppress(subprocess.TimeoutExpired):  # stop() kills it then
        server.process.wait(ctx.timeout_s)  # the client sets the stop word when it is done
    bad = server.bad_requests()
    server.stop()
    sync.publish_flag(words, kslots.W_MAGIC, np.uint64(0), code)  # the next client sets up anew
    return {"bad_requests": bad, "server_cpu": cpu}


def rpc_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    server = results[0]["server"]
    rows = []
    for client in range(1, ctx.size):
        got = results[client]["clients"][client]
        per = int(got["info"]["requests_per_sample"])
        info = {**got["info"], **server[client], "server_rank": 0,
                "server_host": ctx.hostnames[0], "converged": got["converged"],
                "elapsed_s": got["elapsed_s"], "timer_overhead_ticks": ctx.overhead_ticks}
        failed = "the RPC server saw requests with the wrong bytes" \
            if server[client]["bad_requests"] else ""
        rows.append(RackRow(client, np.asarray(got["raw"]), np.asarray(got["ns"]), info, failed,
                            {"requests_per_sample": per}))
    return rows


def check_qd(params: dict) -> None:
    if int_param(params, "qd", 1) < 1:
        raise UsageError(f"queue depth {params['qd']} is not valid: use 1 to the ring's slots")


def message_pair(pattern: Pattern) -> int:
    size = pattern.axes.get("message_bytes")
    return 2 * int(size) if size is not None else pattern.total_bytes
