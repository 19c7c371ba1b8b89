"""The `rpc-roundtrip` and `rpc-throughput` methods, the `rpc:` pattern kind and the `rpc` suite.

The region under test holds the ring (the pattern `rpc:SLOTSxSIZE` sizes it); the client is the
measurement worker, the server its own process, each pinned to its own CPU. Samples are TSC ticks
taken inside the compiled client loop: one round trip, or one batch of completions divided by the
requests in it (ns per request; Mops = 1000 / median_ns).
"""

from __future__ import annotations

import os
import re

import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import Method, SessionContext, register_method
from nearlocal.core.patterns import Pattern, register_pattern_kind
from nearlocal.core.suites import Suite, register_suite
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.rpc.protocols import PROTOCOLS, protocol_code
from nearlocal.rpc.shared import share
from nearlocal.units import format_size, parse_size

slots = lazy_import("nearlocal.rpc.slots")
kslots = lazy_import("nearlocal.rpc.kernels.slots")  # compiled when a session opens

SUITE_REGION = "shm:nearlocal-rpc"
SUITE_PATTERN = "rpc:128x64B"
QUEUE_DEPTHS = (1, 8, 32, 128)
TIMEOUT_S = 10.0
MAX_SLOTS = 1 << 16


def parse_rpc_pattern(text: str) -> Pattern:
    """`rpc:SLOTSxSIZE`: a ring of SLOTS slots carrying SIZE-byte messages. Its fragments are the
    request and response payloads, so the region mapped for the case holds the whole ring."""
    match = re.fullmatch(r"rpc:(\d+)x(.+)", text.strip())
    if not match or not 0 < int(match.group(1)) <= MAX_SLOTS:
        raise UsageError(f"malformed RPC pattern {text!r}: use rpc:SLOTSxSIZE with 1 to "
                         f"{MAX_SLOTS} slots, e.g. {SUITE_PATTERN}")
    count, size = int(match.group(1)), parse_size(match.group(2))
    offsets = slots.payload_offsets(count, size)
    local = np.arange(offsets.size, dtype=np.int64) * size
    frags = np.stack([offsets, local, np.full(offsets.size, size, np.int64)], axis=1)
    return Pattern(f"rpc:{count}x{format_size(size)}", frags,
                   {"message_bytes": size, "slots": count})


register_pattern_kind("rpc", parse_rpc_pattern,
                      "rpc:SLOTSxSIZE, a ring of request/response slots (rpc-* methods)")


def int_param(params: dict, name: str, default: int) -> int:
    text = str(params.get(name, "auto"))
    if text == "auto":
        return default
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"parameter {name}={text!r} is not a whole number") from None


def _pick_cpus(params: dict) -> tuple[int, int]:
    allowed = sorted(os.sched_getaffinity(0))
    client = int_param(params, "client_cpu", allowed[0])
    server = int_param(params, "server_cpu", next((c for c in allowed if c != client), client))
    for name, cpu in (("client_cpu", client), ("server_cpu", server)):
        if cpu not in allowed:
            raise UsageError(f"{name}={cpu} is not a CPU this process may run on: "
                             f"{', '.join(map(str, allowed))}")
    if client == server:
        raise UsageError(f"the RPC client and server need two different CPUs; this process may "
                         f"run on {', '.join(map(str, allowed))}")
    return client, server


def _check_params(params: dict) -> None:
    """Parameter values a session would refuse, refused before the run (exit 2)."""
    protocol_code(str(params.get("protocol", "flush")))
    if "qd" in params and int_param(params, "qd", 1) < 1:
        raise UsageError(f"--param qd={params['qd']} is not valid: use 1 to the ring's slots")
    allowed = sorted(os.sched_getaffinity(0))
    for name in ("client_cpu", "server_cpu"):
        cpu = int_param(params, name, allowed[0])
        if cpu not in allowed:  # refused before the run, not a failed row
            raise UsageError(f"--param {name}={cpu} is not a CPU this process may run on: "
                             f"{', '.join(map(str, allowed))}")


def _check_case(params: dict, pattern: Pattern) -> None:
    """qd's limit is the ring's slots, which the pattern gives."""
    slots_count = pattern.axes.get("slots")
    if "qd" in params and slots_count is not None and \
            int_param(params, "qd", 1) > int(slots_count):
        raise UsageError(f"--param qd={params['qd']} is deeper than the ring of "
                         f"{int(slots_count)} slots in {pattern.text!r}: use 1 to "
                         f"{int(slots_count)}")


def check_rpc_pattern(pattern: Pattern) -> None:
    """The ring's shape comes from the pattern: any other pattern is bad input, refused before
    the run (exit 2), not a failed row per case."""
    if pattern.axes.get("slots") is None:
        raise UsageError(f"the rpc-* methods need an rpc:SLOTSxSIZE pattern, got "
                         f"{pattern.text!r} (e.g. {SUITE_PATTERN})")


class RpcSession:
    """Maps the ring in the region under test, starts the server, pins the client."""

    clock = "tsc"

    def __init__(self, ctx: SessionContext, throughput: bool):
        protocol, message_bytes, ring_bytes = self.configure(ctx, throughput, TIMEOUT_S)
        client_cpu, server_cpu = _pick_cpus(ctx.params)
        self.shared = share(ctx.dst, ring_bytes)
        self.raw = self.shared.array
        self.server = None
        self.saved_affinity = os.sched_getaffinity(0)
        try:
            self.words = slots.init_ring(self.raw, self.slots, message_bytes, protocol)
            os.sched_setaffinity(0, {client_cpu})
            self.server = slots.ServerProcess(self.shared.handle, self.words, self.raw,
                                              self.slots, message_bytes, protocol, server_cpu,
                                              ctx.tsc_hz, fork=True)
        except BaseException:
            self.close()
            raise
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, **self.info,
                     "client_cpu": client_cpu, "server_cpu": server_cpu, **self.shared.info}

    def configure(self, ctx, throughput: bool, timeout_s: float) -> tuple[str, int, int]:
        """The ring's and the client's settings from the case, shared with rack's client (whose
        server runs on another host); returns (protocol, message bytes, ring bytes)."""
        self.ctx = ctx
        self.throughput = throughput
        protocol = str(ctx.params.get("protocol", "flush"))
        self.protocol = protocol_code(protocol)
        check_rpc_pattern(ctx.pattern)
        self.slots = int(ctx.pattern.axes["slots"])
        message_bytes = int(ctx.pattern.axes["message_bytes"])
        self.qd = int_param(ctx.params, "qd", 1) if throughput else 1
        if not 1 <= self.qd <= self.slots:
            raise UsageError(f"queue depth {self.qd} is not valid for a ring of {self.slots} "
                             f"slots: use 1 to {self.slots}")
        self.per_batch = max(64, 4 * self.qd)  # short batches: a preempted one is an outlier
        self.ops_per_sample = self.per_batch if throughput else 1  # ns is per request
        self.msg_words, _, ring_bytes = slots.layout(self.slots, message_bytes)
        self.timeout_ticks = np.uint64(timeout_s * ctx.tsc_hz)
        self.state = np.zeros(1, np.int64)
        self.info = {"protocol": protocol, "qd": self.qd, "slots": self.slots,
                     "message_bytes": message_bytes,
                     "requests_per_sample": self.per_batch if throughput else 1}
        return protocol, message_bytes, ring_bytes

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ticks = np.zeros(n, np.uint64)
        if self.throughput:
            status = kslots.time_throughput(self.raw, self.words, self.slots, self.msg_words,
                                           self.protocol, self.state, self.qd, self.per_batch,
                                           ticks, self.timeout_ticks)
        else:
            status = kslots.time_roundtrip(self.raw, self.words, self.slots, self.msg_words,
                                          self.protocol, self.state, ticks, self.timeout_ticks)
        if status != kslots.OK:
            raise RuntimeError(slots.describe_error(status, TIMEOUT_S))
        if self.server.bad_requests():
            raise RuntimeError("the RPC server received requests with the wrong bytes")
        per = self.per_batch if self.throughput else 1
        raw = ticks.astype(np.float64)
        ns = np.maximum(raw - self.ctx.timer_overhead_ticks, 0.0) * 1e9 / self.ctx.tsc_hz / per
        return raw / per, ns

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        os.sched_setaffinity(0, self.saved_affinity)
        self.raw = self.words = None
        self.shared.close()


def _two_cpus(inventory) -> str | None:
    if max(inventory.cpu.logical_cpus, len(inventory.cpu.online_cpus)) < 2:
        return "the RPC client and server need two CPUs"
    return None


def _request_bytes(pattern: Pattern) -> int:
    """A sample is one request: its payload out and its response back (a pattern that is not
    rpc:SLOTSxSIZE keeps its own size; the session refuses it)."""
    size = pattern.axes.get("message_bytes")
    return 2 * int(size) if size is not None else pattern.total_bytes


_CPUS = {"client_cpu": "auto", "server_cpu": "auto"}  # auto: the first two this process may use
_COMMON = {"marker": "cpu", "accesses": ("write",), "state": "-",
           "cpu_flags": ("rdtscp", "clflushopt"), "needs": _two_cpus, "markers": ("cpu",),
           "check_params": _check_params, "check_pattern": check_rpc_pattern,
           "check_case": _check_case,
           "sample_bytes": lambda pattern: _request_bytes(pattern),
           "measures": "operation"}  # one RPC, not a transfer of the slot ring

register_method(Method(
    cacheable=False,
    name="rpc-roundtrip",
    summary="one 64 B (pattern's size) request / response through shared-memory slots, queue "
            "depth 1; server in its own process on another CPU (protocol=flush|coherent)",
    open_session=lambda ctx: RpcSession(ctx, throughput=False),
    params={"protocol": "flush", **_CPUS}, **_COMMON,
))
register_method(Method(
    cacheable=False,
    name="rpc-throughput",
    summary="requests through shared-memory slots with qd in flight, one server thread; a "
            "sample is ns per request over a batch (Mops = 1000 / median_ns)",
    open_session=lambda ctx: RpcSession(ctx, throughput=True),
    params={"protocol": "flush", "qd": "1", **_CPUS}, **_COMMON,
))


def _rpc_cases() -> list[Case]:
    cases = []
    for protocol in PROTOCOLS:
        cases.append(Case("rpc-roundtrip", SUITE_REGION, "wb", SUITE_PATTERN,
                          params=(("protocol", protocol),)))
        cases += [Case("rpc-throughput", SUITE_REGION, "wb", SUITE_PATTERN,
                       params=(("protocol", protocol), ("qd", str(qd)))) for qd in QUEUE_DEPTHS]
    return cases


register_suite(Suite("rpc", "shared-memory RPC slots: round trip and Mops by queue depth, flush "
                     "vs coherent protocol (Beluga B15)", [_rpc_cases]))
