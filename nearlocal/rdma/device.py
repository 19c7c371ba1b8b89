"""Which RDMA device a case uses and what it allows: the device picked, the work requests a
pattern needs within its limits, the path MTU, and the checks of a case's parameters and of the
host (bad input before anything runs, a skipped row for what this box's port refuses)."""

from __future__ import annotations

import numpy as np

from nearlocal.core.movers import parse_movers
from nearlocal.core.patterns import Pattern
from nearlocal.errors import UsageError
from nearlocal.probe import verbs  # ctypes only: libibverbs is loaded when a case runs
from nearlocal.rack.mpi import in_mpi_job
from nearlocal.rdma.requests import SGE_VARIANTS, plan_requests, sge_limit

RPC_MESSAGE = "64B"
REPLY_OFFSET = 4096  # the RPC's reply slot / reply buffer, after the request's
DEFAULT_MTU = 1024  # the path MTU every case had before `mtu` (RoCE over a 1500 B Ethernet MTU)
MTUS = tuple(verbs.MTU_ENUM)  # 256 .. 4096: the path MTUs verbs.h names
TRANSPORTS = ("write", "send")  # rdma-rpc: RDMA write + poll (default), or send/recv
OPCODES = {"rdma-write": verbs.WR_RDMA_WRITE, "rdma-read": verbs.WR_RDMA_READ}
WITHOUT_MPI = ("the rdma-* methods run between two ranks of an MPI job: launch `mpiexec -n 2 "
               "nearlocal run --suite rdma` (pip install 'nearlocal[mpi]')")


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
