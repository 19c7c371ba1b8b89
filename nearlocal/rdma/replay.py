"""The RDMA path of `nearlocal replay` (`--method rdma-read`, issue 57 item 3): a trace's KV
reloads read over RDMA out of a pool in rank 1's memory into rank 0's buffers, at the requests'
arrival times, by G queue pairs on one CQ (docs/whatif.md "A replay", docs/rdma.md).

An MPI job of two ranks, as the rdma-* methods run (mpiexec -n 2; MPI carries the set-up, the
endpoints and the check's bytes, never a timed interval). Rank 1 lays out the replay's pool
(workloads/replay.py's layout, rank 0 sends its size and region) in its own registered region
and waits. Rank 0 registers G destination buffers (one region of G slots), opens G RC queue
pairs on one CQ (rdma/link.py's `_Link`, the movers=k link) and runs the compiled loop
(rdma/kernels.py `replay_reads`): spin on the TSC to each request's arrival, post its reads on a
free QP (one READ per remote-contiguous run of the pool's fragments: requests.plan_replay), its
start the clock read just before the post, its end the clock read when its last completion is
polled. Per request, wait and transfer as the host replay's (`workloads.replay.ReplayTimes`,
`summarise`); after the replay the bytes of a few fragments of each QP's last request are
compared with rank 1's."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.probe import verbs
from nearlocal.rack.mpi import World
from nearlocal.rdma.device import _devices, path_mtu, pick_device
from nearlocal.rdma.link import _failed, _Link
from nearlocal.rdma.methods import RDMA_PARAMS
from nearlocal.rdma.requests import (
    MOVER_ID_SHIFT,
    SGE_VARIANTS,
    build_parts,
    plan_replay,
    sge_limit,
)
from nearlocal.workloads.replay import LEAD_S, ReplayTimes

kernels = lazy_import("nearlocal.rdma.kernels")

METHOD = "rdma-read"
PARAMS = {k: RDMA_PARAMS[k] for k in ("sge", "device", "mtu")}  # movers: --movers
SET_UP_S = 120.0  # endpoints, the pool laid out and registered (TCG: slow)
CHECK_FRAGMENTS = 16  # fragments of each QP's last request compared with rank 1's bytes
MOST_QUEUE_PAIRS = 64
PAGE = 4096
WITHOUT_MPI = ("--method rdma-read replays between two ranks of an MPI job: rank 1 holds the "
               "pool, rank 0 reads it (`mpiexec -n 2 nearlocal replay --method rdma-read ...`; "
               "pip install 'nearlocal[mpi]')")
TIMED = ("each request's reads alone: the clock read just before its first ibv_post_send on a "
         "free queue pair -> its last read's completion polled off the CQ the G queue pairs "
         "share (rank 0's clock; its SGEs pointed at the QP's own buffer before the clock "
         "starts; a request past max_qp_wr posted in parts, each after the last's completion)")
CONCURRENCY = ("G queue pairs (RC) on one device context, protection domain, registered region "
               "and completion queue; one thread spins to each arrival, posts on a free QP and "
               "polls the shared CQ (wr_id names the QP): a FIFO queue with G servers on the NIC "
               "and the link, not G CPUs")


def check_params(pairs: list[str]) -> dict:
    """`--param KEY=VALUE` of the RDMA replay (sge, device, mtu: as `nearlocal run --method
    rdma-read` takes them): bad input is one line."""
    params = dict(PARAMS)
    for text in pairs:
        key, sep, value = text.partition("=")
        if not sep or key not in PARAMS:
            raise UsageError(f"--param {text}: the RDMA replay takes {', '.join(PARAMS)} "
                             "(KEY=VALUE)")
        params[key] = value
    if params["sge"] not in SGE_VARIANTS:
        raise UsageError(f"--param sge={params['sge']}: use {' or '.join(SGE_VARIANTS)}")
    path_mtu(params, METHOD)
    return params


def check_movers(movers: int) -> None:
    if not 1 <= movers <= MOST_QUEUE_PAIRS:
        raise UsageError(f"--movers {movers}: give 1 to {MOST_QUEUE_PAIRS} queue pairs (the "
                         "RDMA replay's movers are queue pairs, not CPUs)")


def device_limits(params: dict) -> tuple[str, dict]:
    """Rank 0's device (the one `device` names, else the first with an active port) and its
    limits; bad input when there is none."""
    info = _devices()
    if info.reason:
        raise UsageError(f"--method {METHOD}: {info.reason}")
    device = pick_device(info, str(params.get("device", "")))
    if device is None:
        raise UsageError(f"--method {METHOD}: no RDMA device with an ACTIVE port on this host")
    return device.name, {k: v for k, v in device.limits.items() if k != "error"}


def _site(world: World, params: dict, pool, timeout_s: float) -> SimpleNamespace:
    """What `_Link` reads of a RackContext."""
    return SimpleNamespace(world=world, rank=world.rank, params=params, pool=pool,
                           timeout_s=timeout_s, case=SimpleNamespace(method=METHOD))


def _pages(size: int) -> int:
    return -(-max(size, 1) // PAGE) * PAGE


def intact(dst: np.ndarray, length: np.ndarray, k: int) -> bool:
    """Whether fragment k of a request still holds its bytes at the end: no later fragment of
    the request landed over it (a request larger than its buffer wraps around it, and a fragment
    that would straddle the end starts again at 0)."""
    later_dst, later_len = dst[k + 1:], length[k + 1:]
    return not bool(np.any((later_dst < dst[k] + length[k]) & (later_dst + later_len > dst[k])))


def check_ranges(swapped: np.ndarray, request_frags: np.ndarray, served: np.ndarray,
                 movers: int, most: int = CHECK_FRAGMENTS) -> list[tuple[int, int, int, int]]:
    """(queue pair, destination offset, pool offset, bytes) of the fragments the check compares:
    for each QP, up to `most` spread over the last request it served, those no later fragment of
    it overwrote (its last always)."""
    out = []
    for q in range(movers):
        mine = np.flatnonzero(served == q)
        if not mine.size:
            continue
        r = int(mine[-1])
        lo, hi = int(request_frags[r]), int(request_frags[r + 1])
        dst, length = swapped[lo:hi, 0], swapped[lo:hi, 2]
        picks = np.unique(np.linspace(0, hi - lo - 1, min(most, hi - lo)).astype(np.int64))
        out += [(q, int(swapped[lo + k, 0]), int(swapped[lo + k, 1]), int(swapped[lo + k, 2]))
                for k in picks.tolist() if intact(dst, length, k)]
    return out


@dataclass
class Checked:
    fragments: int = 0
    bytes: int = 0
    differing: int = 0

    def line(self) -> str:
        if self.differing:
            return f"FAILED: {self.differing} of {self.bytes} bytes differ from rank 1's"
        return (f"ok: {self.bytes} bytes in {self.fragments} fragments (each queue pair's last "
                "request) equal rank 1's")


class ReplayReads:
    """Rank 0's side: connected to rank 1 at construction (rank 1 runs `serve`), then `run`
    replays requests (more than once: --load's calibration first), `close` ends rank 1's part.
    `frags` / `first`: the window's whole cut (the QPs are sized by its largest part)."""

    def __init__(self, world: World, params: dict, region: str, pool_bytes: int,
                 dst_bytes: int, movers: int, frags: np.ndarray, first: np.ndarray,
                 tsc_hz: float, allow_write: bool = False):
        self.world, self.params, self.movers, self.hz = world, params, movers, tsc_hz
        self.device, self.limits = device_limits(params)
        self.sge = sge_limit(str(params["sge"]), self.limits, verbs.WR_RDMA_READ)
        self.max_wr = int(self.limits.get("max_qp_wr") or 0)
        _, wrs, part_first, _ = plan_replay(frags, first, self.sge, self.max_wr)
        widest = int(np.diff(part_first).max()) if part_first.size > 1 else 1
        sges = int(wrs[:, 1].max()) if len(wrs) else 1
        self.slot = _pages(dst_bytes)
        self.dst_bytes = dst_bytes
        world.send({"region": region, "pool_bytes": pool_bytes, "movers": movers,
                    "params": params, "allow_write": allow_write}, 1, SET_UP_S,
                   "sending rank 1 the replay's pool")
        self.peer = world.recv(1, 4 * SET_UP_S, "hearing that rank 1 laid out the pool")
        if self.peer.get("error"):
            raise UsageError(f"rank 1 ({self.peer.get('host')}): {self.peer['error']}")
        self.buffers = _open_dram(movers * self.slot)
        self.buffers.array[:] = 0xA5  # a read that never landed differs from rank 1's bytes
        try:
            self.link = _Link(_site(world, params, self.buffers, SET_UP_S), widest, sges,
                              queue_pairs=movers)
        except BaseException:
            self.buffers.close()
            raise
        self.checked = Checked()
        self.runs = 0

    def facts(self) -> dict:
        """What the output says of the link (device, MTUs, limits) and the work requests."""
        return {**self.link.facts(), "sge": self.params["sge"], "sge_limit": self.sge,
                "queue_pairs": [{"qp": m, "qp_num": qp.qp_num}
                                for m, qp in enumerate(self.link.qps)],
                "concurrency": CONCURRENCY, "peer": self.peer}

    def run(self, frags: np.ndarray, first: np.ndarray, arrival_s: np.ndarray) -> ReplayTimes:
        """Move every request's fragments at its arrival time (s from time zero) as reads of
        rank 1's pool into the buffer of the QP that takes it; then the check."""
        from nearlocal.kernels.cpu import timer_overhead
        from nearlocal.kernels.movers import read_tsc

        if len(first) != len(arrival_s) + 1:
            raise ValueError("first must hold one offset per request and one past the last")
        link = self.link
        swapped, wrs, part_first, request_parts = plan_replay(frags, first, self.sge,
                                                              self.max_wr)
        wr_buf, sge_buf = build_parts(swapped, wrs, part_first, link.qp.lkey, link.peer.addr,
                                      link.peer.rkey)
        wr_base = np.uint64(wr_buf.ctypes.data)
        size = np.uint64(verbs.WR_BYTES)
        heads = wr_base + part_first[:-1].astype(np.uint64) * size
        tails = wr_base + (part_first[1:].astype(np.uint64) - np.uint64(1)) * size
        base = int(self.buffers.array.ctypes.data)
        bases = np.array([base + m * self.slot for m in range(self.movers)], np.uint64)
        dst_off = np.ascontiguousarray(swapped[:, 0].astype(np.uint64))
        n = len(arrival_s)
        starts, ends = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
        served = np.full(n, -1, np.int64)
        qps = np.array([qp.qp for qp in link.qps], np.uint64)
        sink = np.zeros(1, np.uint64)
        overhead = np.zeros(257, np.uint64)
        timer_overhead(self.buffers.array, self.buffers.array, frags[:0], overhead, sink)
        overhead_ticks = float(np.median(overhead[1:].astype(np.float64)))
        timeout = np.uint64(SET_UP_S * self.hz)
        args = (np.uint64(link.qp.post_send), np.uint64(link.qp.poll_cq), qps,
                np.uint64(link.qp.cq), np.uint64(link.bad.ctypes.data),
                np.uint64(link.wc.ctypes.data), bases, np.uint64(sge_buf.ctypes.data), dst_off,
                np.ascontiguousarray(first, np.int64), request_parts, heads, tails,
                MOVER_ID_SHIFT)
        kernels.replay_reads(*args, np.zeros(0, np.uint64), starts[:0], ends[:0], served[:0],
                             timeout)  # compiled here, before time zero
        arrival = np.asarray(arrival_s, np.float64)
        span = float(arrival.max()) if n else 0.0
        self.world.send({"wait_s": span + LEAD_S}, 1, SET_UP_S, "telling rank 1 a replay starts")
        cpu = min(os.sched_getaffinity(0))
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})  # the one posting thread on one CPU, as a mover is
        try:
            zero = int(read_tsc()) + int(LEAD_S * self.hz)
            due = (zero + np.round(arrival * self.hz)).astype(np.uint64)
            why = kernels.replay_reads(*args, due, starts, ends, served, timeout)
        finally:
            os.sched_setaffinity(0, allowed)
        if why != kernels.OK:
            raise _failed(why, "the replay's reads")
        del wr_buf, sge_buf  # posted for the last time: every completion was polled
        self._check(swapped, np.asarray(first, np.int64), served)
        self.runs += 1
        scale = 1e9 / self.hz
        zero_f = np.float64(zero)
        return ReplayTimes(
            arrival_ns=(due.astype(np.float64) - zero_f) * scale,
            start_ns=(starts.astype(np.float64) - zero_f) * scale,
            end_ns=(ends.astype(np.float64) - zero_f - overhead_ticks) * scale,
            mover=served, cpus=[cpu], timer_overhead_ns=overhead_ticks * scale,
            source={"region": self.peer.get("region"), **(self.peer.get("source") or {})})

    def _check(self, swapped: np.ndarray, first: np.ndarray, served: np.ndarray) -> None:
        ranges = check_ranges(swapped, first, served, self.movers)
        self.world.send({"check": [(pool, length) for _, _, pool, length in ranges]}, 1,
                        SET_UP_S, "asking rank 1 for the check's bytes")
        remote = self.world.recv(1, SET_UP_S, "receiving rank 1's bytes for the check")
        region = self.buffers.array
        for (q, dst, _, length), theirs in zip(ranges, remote, strict=True):
            mine = region[q * self.slot + dst:q * self.slot + dst + length]
            self.checked.fragments += 1
            self.checked.bytes += length
            self.checked.differing += int(np.count_nonzero(mine != np.asarray(theirs)))

    def close(self) -> None:
        try:
            self.world.send({"done": True}, 1, SET_UP_S, "ending rank 1's part")
        finally:
            self.link.close()
            self.buffers.close()


def _open_dram(size: int):
    """Rank 0's G destination buffers: one `dram` region of G slots (one registration)."""
    from nearlocal.regions import load_providers, parse_region, region_kind

    load_providers()
    spec = parse_region("dram")
    return region_kind(spec).open(spec, size, "wb", True)


def _fill(array: np.ndarray) -> None:
    """Bytes no two fragments share (a read from the wrong place shows): word w holds a mix of
    its own offset."""
    words = array[: array.size // 8 * 8].view(np.uint64)
    words[:] = np.arange(words.size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) \
        + np.uint64(0x5851F42D4C957F2D)


def _open_pool(region: str, size: int, allow_write: bool):
    """Rank 1's pool: the region opened as the rdma-* methods open theirs, registered with
    write access (verbs' one access mask), so a user's region needs --allow-write; one of
    nearlocal's own (dram, numa:N) is filled with bytes the check can tell apart."""
    from nearlocal.regions import check_capacity, parse_region, region_kind

    spec = parse_region(region)
    kind = region_kind(spec)
    owned = kind.user_owned(spec)
    if owned and not allow_write:
        raise UsageError(f"--region {region}: rank 1 registers the pool for the NIC with write "
                         "access; a region of yours needs --allow-write (its bytes are read, "
                         "never written)")
    check_capacity(spec, size)
    pool = kind.open(spec, size, "wb", True)
    if not owned:
        _fill(pool.array)
    return pool


def serve(world: World, check_region: Callable[[str], str]) -> int:
    """Rank 1's part: lay out the pool rank 0 names in its own region, register it, connect G
    queue pairs, then wait (rank 0's reads need nothing of this CPU) and answer the checks.
    `check_region(region)`: the front end's check of the region on this host (bad input: a
    UsageError), returning why this box's figures are not a real machine's ("" on bare metal)."""
    import socket

    setup = world.recv(0, 4 * SET_UP_S, "hearing the replay's pool")
    if setup.get("abort"):
        return 2  # rank 0 refused the command line (it says why)
    pool = None
    try:
        emulated = check_region(setup["region"])  # on this host, as rank 0 checked its own
        pool = _open_pool(setup["region"], int(setup["pool_bytes"]), setup["allow_write"])
    except UsageError as exc:
        world.send({"error": str(exc), "host": socket.gethostname()}, 0, SET_UP_S,
                   "telling rank 0 why not")
        if pool is not None:
            pool.close()
        return 2
    try:
        world.send({"host": socket.gethostname(), "region": setup["region"],
                    "source": dict(pool.info), "emulated": emulated},
                   0, SET_UP_S, "telling rank 0 the pool is laid out")
        link = _Link(_site(world, setup["params"], pool, SET_UP_S), 1, 1,
                     queue_pairs=int(setup["movers"]))
        try:
            wait = 4 * SET_UP_S
            while True:
                message = world.recv(0, wait, "waiting for rank 0's replay")
                if message.get("done"):
                    return 0
                if "wait_s" in message:
                    wait = 4 * SET_UP_S + 2 * float(message["wait_s"])
                    continue
                bytes_ = [np.array(pool.array[o:o + n]) for o, n in message["check"]]
                world.send(bytes_, 0, SET_UP_S, "sending the check's bytes")
                wait = 4 * SET_UP_S
        finally:
            link.close()
    finally:
        pool.close()

