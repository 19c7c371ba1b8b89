"""The `rack` methods and suite: what only several hosts sharing one pool can measure.

Each rack method is a `Method` (so `--method`, `probe` and case ids work as for any other) and a
`RackMethod` here: what every rank does (`run`, on every rank at once, through the pool), and
how rank 0 turns every rank's result into rows (`rows`). The rpc package's protocols do the
work: slots (rpc-roundtrip's ring), records (the single-writer / multi-reader store) and faults
(the host-loss injector). Samples are TSC ticks taken inside compiled code on one host's clock;
MPI only starts and ends phases (a barrier, the results), never inside a timed interval.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import Delivery, Method, register_method
from nearlocal.core.patterns import Pattern
from nearlocal.core.sampling import StoppingRule, run_trials, summarize
from nearlocal.core.suites import Suite, register_suite
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.rack.mpi import World, in_mpi_job
from nearlocal.rpc.methods import QUEUE_DEPTHS, RpcSession, _check_pattern, _int_param
from nearlocal.rpc.protocols import PROTOCOLS, protocol_code
from nearlocal.units import parse_duration

# numba kernels: compiled when a session opens, not when the methods register (issue 19)
kernels = lazy_import("nearlocal.rack.kernels")
rec = lazy_import("nearlocal.rpc.records")
slots = lazy_import("nearlocal.rpc.slots")
sync = lazy_import("nearlocal.rpc.sync")

SUITE_REGION = "shm:nearlocal-rack"
RPC_PATTERN = "rpc:128x64B"
HANDOFF_PATTERNS = ("16KiB", "kv:qwen2.5-32b:flash-attn:dense", "1024x160B")
AGGREGATE_SIZE = "16MiB"
HOSTLOSS_RECORD = "16KiB"
HOSTLOSS_RECORDS = 2  # few records: readers and the writer meet on them often (faults' negative test)
FLAG_SAMPLES = 200


@dataclass
class RackContext:
    """What every rank's part of a rack case gets: the world, the pool (mapped on this host at
    the same name), every rank's host id and name, this host's clock."""

    world: World
    case: Case
    pattern: Pattern
    pool: object  # the MappedRegion of the pool on this host
    host_ids: list[str]
    hostnames: list[str]
    tsc_hz: float
    overhead_ticks: float
    rule: StoppingRule
    params: dict
    timeout_s: float

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def timer_overhead_ticks(self) -> float:  # what RpcSession.sample subtracts
        return self.overhead_ticks

    @property
    def coherent(self) -> bool:
        """Every rank on one host: caches are coherent, the flush protocol is not proven needed."""
        return len(set(self.host_ids)) == 1

    def ns(self, ticks: np.ndarray, per: int = 1) -> np.ndarray:
        raw = np.asarray(ticks, dtype=np.float64)
        return np.maximum(raw - self.overhead_ticks, 0.0) * 1e9 / self.tsc_hz / per

    def barrier(self, what: str) -> None:
        self.world.barrier(self.timeout_s, what)


@dataclass(frozen=True)
class RackRow:
    """One row rank 0 stores: the measuring rank, its samples, what else the row says."""

    rank: int
    raw: np.ndarray
    ns: np.ndarray
    info: dict = field(default_factory=dict)
    failed: str = ""  # a reason: the row is stored as failed (e.g. torn reads)
    extra: dict = field(default_factory=dict)  # further columns (counts)


@dataclass(frozen=True)
class RackMethod:
    name: str
    run: Callable[[RackContext], dict]  # every rank, at once
    rows: Callable[[RackContext, list[dict]], list[RackRow]]  # rank 0, from every rank's result
    pool_bytes: Callable[[Case, int], int]  # bytes of the pool the case uses, for N ranks
    min_ranks: int = 2
    # False: each rank maps its own region by the case's name (RDMA registers it), no token
    # proves it is one memory
    shared_pool: bool = True
    # what the host itself lacks for the method (no RDMA device), MPI aside: a method alone
    # outside MPI on such a host is skipped with this reason, not refused
    host_needs: Callable[[object], str | None] | None = None


RACK_METHODS: dict[str, RackMethod] = {}


def is_rack(case: Case) -> bool:
    return case.method in RACK_METHODS


def shares_pool(case: Case) -> bool:
    """A rack case whose ranks meet in one pool (every host maps the same memory)."""
    return RACK_METHODS[case.method].shared_pool


WITHOUT_MPI = ("the rack methods run across the hosts of an MPI job: launch `mpiexec -n N "
               "nearlocal run --suite rack` (pip install 'nearlocal[mpi]')")


def _needs_mpi(inventory) -> str | None:
    """Outside an MPI job a rack case is skipped with this reason (e.g. in the `all` suite)."""
    return None if in_mpi_job() else WITHOUT_MPI


def refuse_without_mpi(cases: list[Case], inventory=None) -> None:
    """Only rack cases asked for, outside an MPI job: bad input, one line saying how to launch
    (the first case's method's line). Where the host lacks what every one of them needs besides
    MPI (no RDMA device), they are skipped rows with that reason instead."""
    if not cases or in_mpi_job() or not all(is_rack(case) for case in cases):
        return
    if inventory is not None and all(
            RACK_METHODS[c.method].host_needs and RACK_METHODS[c.method].host_needs(inventory)
            for c in cases):
        return
    from nearlocal.core.methods import get_method

    needs = get_method(cases[0].method).needs
    raise UsageError((needs(None) if needs else None) or WITHOUT_MPI)


def register_rack(rack: RackMethod, summary: str, params: dict, check_params=None,
                  check_pattern=None, accesses: tuple[str, ...] = ("write",), sample_bytes=None,
                  needs=_needs_mpi, check_case=None,
                  cpu_flags: tuple[str, ...] = ("rdtscp", "clflushopt"),
                  stores_in_region: bool = False, delivery: Delivery | None = None) -> None:
    """A rack method: a `Method` (--method, probe, case ids) and what its ranks do."""
    def check(values: dict) -> None:
        if "protocol" in params:
            protocol_code(str(values.get("protocol", "flush")))
        if check_params:
            check_params(values)

    register_method(Method(
        cacheable=False,
        name=rack.name, family="cpu", summary=summary, accesses=accesses, state="-",
        open_session=_not_in_a_worker, cpu_flags=cpu_flags, params=params,
        needs=needs, markers=("cpu",), check_params=check, check_pattern=check_pattern,
        check_case=check_case, sample_bytes=sample_bytes, stores_in_region=stores_in_region,
        delivery=delivery))
    RACK_METHODS[rack.name] = rack


def _not_in_a_worker(ctx):
    raise UsageError(f"{ctx.case.method} runs across the ranks of an MPI job, not in a worker")


# --- 1. RPC across hosts: client on rank k, server on rank 0, rpc-roundtrip's ring in the pool --

class _RemoteServer:
    """The server's counters, read from its line of the ring (it runs on rank 0's host)."""

    def __init__(self, raw, words, protocol: int):
        self.raw, self.words, self.protocol = raw, words, protocol

    def bad_requests(self) -> int:
        return int(sync.read_flag(self.raw, self.words, slots.W_BAD, self.protocol))


class _RackRpcClient(RpcSession):
    """rpc-roundtrip's / rpc-throughput's client (its sample(), unchanged) on a ring whose
    server is another host's process; the ring is this client's to set up, as in RpcSession."""

    def __init__(self, ctx: RackContext, raw: np.ndarray, throughput: bool):
        protocol, message_bytes, ring_bytes = self._configure(ctx, throughput, ctx.timeout_s)
        self.raw = raw[:ring_bytes]
        self.words = slots.init_ring(self.raw, self.slots, message_bytes, protocol)
        self.server = _RemoteServer(self.raw, self.words, self.protocol)

    def close(self) -> None:
        sync.publish_flag(self.words, slots.W_STOP, np.uint64(1), self.protocol)


def _ring_bytes(case: Case, ranks: int) -> int:
    from nearlocal.core.patterns import parse_pattern

    axes = parse_pattern(case.pattern).axes
    return slots.layout(int(axes["slots"]), int(axes["message_bytes"]))[2]


def _wait_word(raw, words, index: int, protocol: int, want, timeout_s: float, what: str) -> None:
    """Between phases (untimed): poll a pool word until `want(value)` holds."""
    deadline = time.monotonic() + timeout_s
    while not want(int(sync.read_flag(raw, words, index, protocol))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout_s:g} s")
        time.sleep(0.0005)


def _rpc_run(ctx: RackContext, throughput: bool) -> dict:
    """Client ranks take turns (1, 2, ...), one server process on rank 0's host answering each."""
    protocol = str(ctx.params.get("protocol", "flush"))
    code = protocol_code(protocol)
    raw = ctx.pool.array
    words = raw[:_ring_bytes(ctx.case, ctx.size)].view(np.uint64)
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
        _wait_word(session.raw, session.words, slots.W_READY, session.protocol, bool,
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
    _wait_word(raw, words, slots.W_MAGIC, code, lambda v: v == slots.MAGIC, ctx.timeout_s,
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
    sync.publish_flag(words, slots.W_MAGIC, np.uint64(0), code)  # the next client sets up anew
    return {"bad_requests": bad, "server_cpu": cpu}


def _rpc_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
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


def _check_qd(params: dict) -> None:
    if _int_param(params, "qd", 1) < 1:
        raise UsageError(f"queue depth {params['qd']} is not valid: use 1 to the ring's slots")


def _message_pair(pattern: Pattern) -> int:
    size = pattern.axes.get("message_bytes")
    return 2 * int(size) if size is not None else pattern.total_bytes


# --- 2. Handoff: one writer publishes records, readers on the other hosts take them ------------

def _record_shape(pattern: Pattern) -> tuple[int, int]:
    """(records, bytes per record): one record per fragment of the pattern, each a whole number
    of cache lines (16KiB: one record; 1024x160B: 1024 records, each looked up on its own)."""
    lengths = pattern.frags[:, 2]
    return len(lengths), int(-(-int(lengths.max()) // 64) * 64)


def _handoff_layout(case: Case, ranks: int) -> rec.Layout:
    from nearlocal.core.patterns import parse_pattern

    records, record_bytes = _record_shape(parse_pattern(case.pattern))
    return rec.Layout(records, record_bytes, max(ranks - 1, 1), 1)


def _handoff_bytes(case: Case, ranks: int) -> int:
    return kernels.CONTROL_BYTES + _handoff_layout(case, ranks).nbytes


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


def _handoff_run(ctx: RackContext) -> dict:
    code = protocol_code(str(ctx.params.get("protocol", "flush")))
    layout = _handoff_layout(ctx.case, ctx.size)
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


def _handoff_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
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


# --- 3. Aggregate bandwidth: every rank on its own slice of the pool at once ---------------------

def _slice_bytes(case: Case) -> int:
    from nearlocal.core.patterns import parse_pattern

    return -(-parse_pattern(case.pattern).total_bytes // 4096) * 4096


def _check_contiguous(pattern: Pattern) -> None:
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


def _aggregate_run(ctx: RackContext) -> dict:
    from nearlocal.kernels.cpu import time_load, time_store

    size = _slice_bytes(ctx.case)
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


def _aggregate_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    stats = []
    for got in results:
        alone = summarize(ctx.ns(got["alone"]), got["bytes"])
        together = summarize(ctx.ns(got["together"]), got["bytes"])
        stats.append((alone, together))
    total = float(np.nansum([t["gbps"] for _, t in stats]))
    total_alone = float(np.nansum([a["gbps"] for a, _ in stats]))
    rows = []
    for rank, (got, (alone, together)) in enumerate(zip(results, stats, strict=True)):
        info = {"slice_bytes": got["bytes"], "slice_offset": rank * got["bytes"],
                "alone_gbps": alone["gbps"], "alone_median_ns": alone["median_ns"],
                "together_gbps": together["gbps"], "total_gbps": total,
                "sum_alone_gbps": total_alone,
                "share": together["gbps"] / total if total > 0 else None,
                "ranks": ctx.size, "timer_overhead_ticks": ctx.overhead_ticks,
                "timed": "passes over this rank's slice; started together by one barrier, each "
                         "rank on its own clock; the total is the sum of the ranks' GB/s"}
        rows.append(RackRow(rank, np.asarray(got["together"], np.float64),
                            ctx.ns(got["together"]), info, extra={"total_gbps": total}))
    return rows


# --- 4. Host loss: the writer on the last rank is SIGKILLed mid-write, readers elsewhere -------

def _fault_config(ctx_or_case, ranks: int):
    from nearlocal.rpc.faults import FaultConfig
    from nearlocal.units import parse_size

    case = ctx_or_case if isinstance(ctx_or_case, Case) else ctx_or_case.case
    params = {**HOSTLOSS_PARAMS, **case.param_dict}
    from nearlocal.core.patterns import parse_pattern

    return FaultConfig(region=case.region, kills=int(params["kills"]),
                       duration_s=parse_duration(params["duration"]),
                       lease_s=parse_duration(params["lease"]), readers=max(ranks - 1, 1),
                       records=int(params["records"]),
                       record_bytes=parse_size(str(parse_pattern(case.pattern).total_bytes)),
                       protocol=params["protocol"], freeze_every=0, corrupt_every=7,
                       grace_s=parse_duration(params["grace"]), allow_write=True)


def _hostloss_layout(case: Case, ranks: int) -> rec.Layout:
    config = _fault_config(case, ranks)
    epochs = 2 * config.kills + 64
    return rec.Layout(config.records, config.record_bytes, config.readers, epochs)


def _hostloss_run(ctx: RackContext) -> dict:
    from nearlocal.rpc import faults

    config = _fault_config(ctx, ctx.size)
    layout = _hostloss_layout(ctx.case, ctx.size)
    code = protocol_code(config.protocol)
    writer_rank = ctx.size - 1
    recheck = str(ctx.params.get("recheck", "on")) == "on"
    faults._warm_up(code)
    if ctx.rank == writer_rank:
        with faults._Signals() as signals:
            report = faults._inject(config, layout, ctx.pool, ctx.tsc_hz, code, signals, None,
                                    readers_elsewhere=lambda: ctx.barrier(
                                        "before the readers start"))
        return {"report": report}
    ctx.barrier("before the readers start")
    raw = ctx.pool.array[:layout.nbytes]
    words = raw.view(np.uint64)
    timeout = np.uint64(config.read_timeout * ctx.tsc_hz)
    faults._reader(raw, words, layout, ctx.rank, config, timeout, ctx.tsc_hz, code, recheck)
    return {}


def _hostloss_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    writer_rank = ctx.size - 1
    report = dict(results[writer_rank]["report"])
    report.pop("config", None)
    detect = report.get("detect_ms") or {}
    note = ""
    if not ctx.coherent:  # fault and detection were timed on two hosts' clocks
        detect, note = {}, "detection times need one clock: the hosts differ"
        report["detections_late"] = 0
        report["detect_ms"] = {}
    recheck = str(ctx.params.get("recheck", "on")) == "on"
    problems = [f"{name} {report[name]}" for name in ("torn_reads", "torn_reads_returned",
                                                      "missed_detections", "detections_late",
                                                      "writes_after_loss") if report.get(name)]
    report["passed"] = not problems  # again: late detections are not judged across clocks
    if not recheck:
        problems.append("the readers' sequence recheck is off (negative control)")
    info = {**report, "writer_rank": writer_rank, "writer_host": ctx.hostnames[writer_rank],
            "readers": [r for r in range(ctx.size) if r != writer_rank],
            "fallback": "the reader recomputes the record (FALLBACK_STALE) instead of waiting",
            "recheck": recheck, "detect_note": note}
    ns = np.empty(0)  # a fault run's figures are counts and the detection statistics (info)
    extra = {"kills": report["writer_kills"], "detections": report["stale_detections"],
             "detect_median_ms": detect.get("median"), "torn_reads": report["torn_reads"]}
    failed = "; ".join(problems)
    return [RackRow(writer_rank, ns, ns, info, failed, extra)]


def _hostloss_bytes(case: Case, ranks: int) -> int:
    return _hostloss_layout(case, ranks).nbytes


def _check_hostloss(params: dict) -> None:
    for name in ("kills", "records"):
        if _int_param(params, name, 1) < 1:
            raise UsageError(f"rack-host-loss: {name}={params[name]} must be at least 1")
    if str(params.get("recheck", "on")) not in ("on", "off"):
        raise UsageError(f"rack-host-loss: recheck={params['recheck']} must be on or off")
    for name in ("lease", "duration", "grace"):
        parse_duration(str(params[name]))


HOSTLOSS_PARAMS = {"protocol": "flush", "kills": "20", "lease": "20ms", "grace": "300ms",
                   "duration": "20s", "records": str(HOSTLOSS_RECORDS), "recheck": "on"}


register_rack(RackMethod("rack-rpc-roundtrip", lambda ctx: _rpc_run(ctx, False), _rpc_rows, _ring_bytes),
          "rpc-roundtrip across hosts: the client on each rank k >= 1 in turn, the server on "
          "rank 0, the ring in the pool", {"protocol": "flush"}, check_pattern=_check_pattern,
          sample_bytes=_message_pair)
register_rack(RackMethod("rack-rpc-throughput", lambda ctx: _rpc_run(ctx, True), _rpc_rows,
                     _ring_bytes),
          "rpc-throughput across hosts: qd requests in flight from rank k to one server "
          "thread on rank 0 (Mops = 1000 / median_ns)", {"protocol": "flush", "qd": "1"},
          check_params=_check_qd, check_pattern=_check_pattern, sample_bytes=_message_pair)
register_rack(RackMethod("rack-handoff", _handoff_run, _handoff_rows, _handoff_bytes),
          "rank 0 publishes records (single writer, records.py), every other rank looks them "
          "up, copies and checks them: announce -> usable", {"protocol": "flush"})
register_rack(RackMethod("rack-aggregate", _aggregate_run, _aggregate_rows,
                     lambda case, ranks: ranks * _slice_bytes(case), min_ranks=1),
          "every rank reads (or writes) its own slice of the pool, alone in turn, then all at "
          "once from one barrier: total GB/s and each host's share", {},
          check_pattern=_check_contiguous, accesses=("read", "write"))
register_rack(RackMethod("rack-host-loss", _hostloss_run, _hostloss_rows, _hostloss_bytes),
          "the record store's writer on the last rank is SIGKILLed mid-write; readers on the "
          "other ranks must detect it within the lease, never return a torn record, recompute",
          HOSTLOSS_PARAMS, check_params=_check_hostloss, sample_bytes=lambda pattern: 0)


def _rack_cases() -> list[Case]:
    cases = []
    for protocol in PROTOCOLS:
        params = (("protocol", protocol),)
        cases.append(Case("rack-rpc-roundtrip", SUITE_REGION, "wb", RPC_PATTERN, params=params))
        cases += [Case("rack-rpc-throughput", SUITE_REGION, "wb", RPC_PATTERN,
                       params=(*params, ("qd", str(qd)))) for qd in QUEUE_DEPTHS]
        cases += [Case("rack-handoff", SUITE_REGION, "wb", pattern, params=params)
                  for pattern in HANDOFF_PATTERNS]
    cases.append(Case("rack-aggregate", SUITE_REGION, "wb", AGGREGATE_SIZE, access="read"))
    cases.append(Case("rack-aggregate", SUITE_REGION, "wb", AGGREGATE_SIZE, access="write"))
    cases.append(Case("rack-host-loss", SUITE_REGION, "wb", HOSTLOSS_RECORD))
    return cases


register_suite(Suite("rack", "across the hosts of an MPI job on one shared pool: cross-host RPC "
                     "(B15), handoff publish -> usable, aggregate bandwidth (B12), host loss",
                     [_rack_cases]))
