"""DSA methods: `dsa-memmove` (one memmove descriptor per fragment) and `dsa-batch` (the
fragments as memmoves inside batch descriptors), submitted to a user work queue from compiled
code and timed there with the TSC.

Parameters (Case.params, reaching the session through ctx.params):
  qd      descriptors (or batches) in flight: 1 gives latency, N gives throughput (default 1)
  batch   memmoves per batch descriptor, dsa-batch only (default 8; a single-fragment pattern is
          cut into this many pieces so there is something to batch)
  cc      1 sets the cache-control flag: the destination is written into the LLC, not memory
  wait    spin, pause or umwait (umonitor/umwait on the completion record; needs waitpkg)
  bof     1 sets block-on-fault (the WQ must allow it); 0 lets a fault stop the copy, and the
          driver touches the page and resubmits the rest
  wq      a work queue name (wq0.0) or auto (the first usable one)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nearlocal.core.methods import Delivery, Method, SessionContext, register_method
from nearlocal.dsa import uapi
from nearlocal.errors import UsageError

TIMEOUT_S = 2.0
PARAM_DEFAULTS = {"qd": "1", "cc": "0", "wait": "spin", "bof": "0", "wq": "auto"}


@dataclass
class Backend:
    """Where descriptors go: a real portal, or (tests only) the software work queue."""

    portal: int
    push: object  # njit push function, already checked against the CPU flags
    has_flag: Callable[[str], bool]
    wq: str
    mode: str
    size: int
    max_batch: int
    max_transfer: int
    submit: str  # what `push` executes, for the case row
    close: Callable[[], None] = lambda: None
    block_on_fault: bool | None = None  # the WQ allows the BOF flag


def open_backend(wq_param: str, inventory=None) -> Backend:
    """Pick a usable WQ of the run's inventory (else of the live system, probed now), check the
    CPU flag, map its portal."""
    from nearlocal.dsa.portal import Portal, push_for

    if inventory is not None:
        info, cpu = inventory.dsa, inventory.cpu
    else:
        from nearlocal.probe.cpu import probe_cpu
        from nearlocal.probe.dsa import probe_dsa
        from nearlocal.sysroot import SysRoot

        root = SysRoot.default()
        info, cpu = probe_dsa(root), probe_cpu(root)
    reason = info.reason()
    if reason:
        raise RuntimeError(reason)
    candidates = [wq for wq in info.usable_wqs if cpu.usable(wq.submit_instruction)]
    if wq_param != "auto":
        named = [wq for wq in info.work_queues if wq.name == wq_param]
        if not named:
            raise UsageError(f"unknown DSA work queue {wq_param!r}: this box has "
                             f"{', '.join(w.name for w in info.work_queues) or 'none'}")
        if not named[0].usable:
            raise UsageError(f"DSA work queue {wq_param} is not an enabled user WQ with a "
                             f"/dev/dsa node (state {named[0].state}, type {named[0].type})")
        candidates = named
    if not candidates:
        wq = info.usable_wqs[0]
        raise RuntimeError(f"DSA {wq.name} is {wq.mode} but the CPU lacks {wq.submit_instruction}")
    wq = candidates[0]
    push = push_for(wq.mode or "", cpu.usable)
    device = next(d for d in info.devices if d.name == wq.device)
    portal = Portal.open(wq.dev_path)
    return Backend(portal.address, push, cpu.usable, wq.name, wq.mode or "", wq.size or 1,
                   wq.max_batch_size or device.max_batch_size or 32,
                   wq.max_transfer_size or device.max_transfer_size or 1 << 21,
                   wq.submit_instruction, portal.close, wq.block_on_fault)


def _int_param(params: dict, key: str, low: int, high: int) -> int:
    text = str(params.get(key, ""))
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"DSA parameter {key}={text!r} is not a whole number "
                         f"(valid: {low}..{high})") from None
    if not low <= value <= high:
        raise UsageError(f"DSA parameter {key}={value} is out of range (valid: {low}..{high})")
    return value


@dataclass(frozen=True)
class DsaParams:
    qd: int
    batch: int
    cc: bool
    wait: str
    bof: bool
    wq: str

    @classmethod
    def parse(cls, params: dict, batched: bool) -> DsaParams:
        from nearlocal.dsa.portal import WAITS

        params = {**PARAM_DEFAULTS, **({"batch": "8"} if batched else {}), **params}
        known = {*PARAM_DEFAULTS, "batch"} if batched else set(PARAM_DEFAULTS)
        unknown = sorted(set(params) - known)
        if unknown:
            raise UsageError(f"unknown DSA parameter {unknown[0]!r}: valid are "
                             f"{', '.join(sorted(known))}")
        if params["wait"] not in WAITS:
            raise UsageError(f"DSA parameter wait={params['wait']!r}: valid are {', '.join(WAITS)}")
        return cls(qd=_int_param(params, "qd", 1, 4096),
                   batch=_int_param(params, "batch", 2, 4096) if batched else 1,
                   cc=bool(_int_param(params, "cc", 0, 1)), wait=params["wait"],
                   bof=bool(_int_param(params, "bof", 0, 1)), wq=str(params["wq"]))


def _pieces(frags: np.ndarray, max_transfer: int, split: int) -> list[tuple[int, int, int]]:
    """(src offset, dst offset, length) pieces no longer than the WQ's transfer limit; a lone
    fragment is cut into `split` pieces (dsa-batch needs at least two to batch)."""
    pieces = []
    for src, dst, length in (tuple(int(x) for x in row) for row in frags):
        parts = split if frags.shape[0] == 1 and split > 1 else 1
        parts = max(1, min(parts, length))
        step = max(-(-length // parts), 1)
        step = min(step, max_transfer)
        for off in range(0, length, step):
            pieces.append((src + off, dst + off, min(step, length - off)))
    return pieces


class DsaSession:
    """Builds the descriptors once; each sample runs the compiled submit/wait loop."""

    clock = "tsc"

    def __init__(self, ctx: SessionContext, batched: bool, backend: Backend | None = None):
        from nearlocal.dsa import portal

        self.ctx = ctx
        self.params = DsaParams.parse(dict(ctx.params), batched)
        self.backend = backend or open_backend(self.params.wq, ctx.inventory)
        try:
            self._build(batched)
            self.wait = portal.wait_for(self.params.wait, self.backend.has_flag)
        except BaseException:
            self.backend.close()
            raise
        self.timeout = np.uint64(int(TIMEOUT_S * ctx.tsc_hz))
        self.counters = np.zeros(4, np.uint64)
        self.err = np.zeros(4, np.uint64)
        self.parts: list[np.ndarray] = []

    def _build(self, batched: bool) -> None:
        p, b = self.params, self.backend
        if b.mode == "dedicated" and p.qd > b.size:
            raise UsageError(f"qd={p.qd} exceeds the {b.size} entries of dedicated WQ {b.wq} "
                             "(the device drops what overflows a dedicated WQ)")
        if p.bof and b.block_on_fault is False:
            raise UsageError(f"bof=1 needs a WQ configured with block_on_fault=1; {b.wq} has 0")
        if batched and p.batch > b.max_batch:
            raise UsageError(f"batch={p.batch} exceeds {b.wq}'s max batch size {b.max_batch}")
        flags = uapi.Flag.CRAV | (uapi.Flag.CC if p.cc else 0) | (uapi.Flag.BOF if p.bof else 0)
        src0 = int(self.ctx.src.array.ctypes.data)
        dst0 = int(self.ctx.dst.array.ctypes.data)
        pieces = _pieces(self.ctx.pattern.frags, b.max_transfer, p.batch if batched else 1)
        groups = [pieces[i:i + p.batch] for i in range(0, len(pieces), p.batch)] if batched \
            else [[piece] for piece in pieces]
        n_members = sum(len(g) for g in groups if len(g) > 1)
        self.top = uapi.descriptors(len(groups))
        self.comps = uapi.completion_records(len(groups))
        self.members = uapi.descriptors(max(n_members, 1))
        self.mcomps = uapi.completion_records(max(n_members, 1))
        self.mstart = np.zeros(len(groups) + 1, np.int64)
        self.scratch = uapi.descriptors(1)
        self.scomp = uapi.completion_records(1)
        m = 0
        for i, group in enumerate(groups):
            comp = uapi.address(self.comps, i)
            if len(group) == 1:  # a lone memmove needs no batch (a batch holds at least two)
                s, d, n = group[0]
                uapi.encode_memmove(self.top[i], src0 + s, dst0 + d, n, comp, flags | uapi.Flag.RCR)
            else:
                for j, (s, d, n) in enumerate(group):
                    # members: a record only on failure (CRAV without RCR)
                    uapi.encode_memmove(self.members[m + j], src0 + s, dst0 + d, n,
                                        uapi.address(self.mcomps, m + j), flags)
                uapi.encode_batch(self.top[i], uapi.address(self.members, m), len(group), comp,
                                  uapi.Flag.CRAV | uapi.Flag.RCR)
                m += len(group)
            self.mstart[i + 1] = m
        self.pieces = len(pieces)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        from nearlocal.dsa import portal
        from nearlocal.dsa.kernels import portal as driver

        ticks = np.zeros(n, np.uint64)
        parts = np.zeros((n, 3), np.uint64)
        rc = driver.run_copies(
            self.backend.push, self.wait, np.uint64(self.backend.portal),
            np.uint64(uapi.address(self.top)), np.uint64(uapi.address(self.comps)),
            self.top.shape[0], np.uint64(uapi.address(self.members)),
            np.uint64(uapi.address(self.mcomps)), self.mstart,
            np.uint64(uapi.address(self.scratch)), np.uint64(uapi.address(self.scomp)),
            self.params.qd, self.timeout, ticks, parts, self.counters, self.err)
        if rc:
            raise RuntimeError(f"{self.backend.wq}: {portal.describe_error(self.err)}")
        self.parts.append(parts)
        ns = np.maximum(ticks.astype(np.float64) - self.ctx.timer_overhead_ticks, 0.0)
        return ticks, ns * 1e9 / self.ctx.tsc_hz

    @property
    def info(self) -> dict:
        p, b = self.params, self.backend
        info = {"wq": b.wq, "wq_mode": b.mode, "submit": b.submit, "wait": p.wait, "qd": p.qd,
                "cc": int(p.cc), "bof": int(p.bof), "descriptors": int(self.top.shape[0]),
                "memmoves": self.pieces, "timer_overhead_ticks": self.ctx.timer_overhead_ticks}
        if self.mstart[-1]:
            info["batch"] = p.batch
        if self.parts:
            parts = np.concatenate(self.parts).astype(np.float64) * 1e9 / self.ctx.tsc_hz
            samples = sum(len(x) for x in self.parts)
            for k, name in enumerate(("submit", "device", "poll")):
                info[f"{name}_ns_median"] = float(np.median(parts[:, k]))
            info["polls_per_sample"] = float(self.counters[1]) / samples
            info["enqcmd_retries"] = int(self.counters[0])
            info["page_fault_resubmits"] = int(self.counters[2])
        return info

    def close(self) -> None:
        self.backend.close()


def _needs(inventory) -> str | None:
    reason = inventory.dsa.reason()
    if reason:
        return reason
    usable = inventory.dsa.usable_wqs
    if not any(inventory.cpu.usable(wq.submit_instruction) for wq in usable):
        wq = usable[0]
        return (f"DSA {wq.name} is a {wq.mode} WQ but "
                + inventory.cpu.lacks((wq.submit_instruction,)).replace("CPU lacks", "the CPU lacks"))
    return None


DSA_MEMMOVE = register_method(Method(
    cacheable=False,
    name="dsa-memmove", marker="dsa", state="-", accesses=("write", "read"),
    summary="DSA memmove descriptor per fragment, submitted to a user WQ (movdir64b/enqcmd), "
            "completion record polled",
    open_session=lambda ctx: DsaSession(ctx, batched=False),
    cpu_flags=("rdtscp",), needs=_needs, params=dict(PARAM_DEFAULTS), markers=("dsa",),
    check_params=lambda params: DsaParams.parse(params, batched=False),
    delivery=Delivery("dsa", "per-fragment"),
))
DSA_BATCH = register_method(Method(
    cacheable=False,
    name="dsa-batch", marker="dsa", state="-", accesses=("write", "read"),
    summary="DSA batch descriptors of `batch` memmoves each (one fragment is cut into `batch`)",
    open_session=lambda ctx: DsaSession(ctx, batched=True),
    cpu_flags=("rdtscp",), needs=_needs, params={**PARAM_DEFAULTS, "batch": "8"},
    markers=("dsa",), check_params=lambda params: DsaParams.parse(params, batched=True),
    delivery=Delivery("dsa", "per-fragment"),  # one batch descriptor per fragment
))


def _quick() -> list:
    from nearlocal.core.cases import Case
    from nearlocal.core.suites import QUICK_SIZES
    from nearlocal.units import format_size

    return [Case(method, "dram", "wb", format_size(size))
            for method in ("dsa-memmove", "dsa-batch") for size in QUICK_SIZES]


def _dsa_suite() -> list:
    """Latency (qd 1) and throughput (qd 16), cache control off/on, waits, batch sizes."""
    from nearlocal.core.cases import Case

    cases = []
    for size in ("256B", "4KiB", "16KiB", "64KiB", "1MiB"):
        for access in ("write", "read"):
            for qd in ("1", "16"):
                for cc in ("0", "1"):
                    cases.append(Case("dsa-memmove", "dram", "wb", f"64x{size}", access=access,
                                      params=(("qd", qd), ("cc", cc))))
        for wait in ("pause", "umwait"):
            cases.append(Case("dsa-memmove", "dram", "wb", size, params=(("wait", wait),)))
        for batch in ("4", "16", "64"):
            cases.append(Case("dsa-batch", "dram", "wb", f"64x{size}",
                              params=(("batch", batch), ("qd", "4"))))
    return cases


def _register_suites() -> None:
    from nearlocal.core.suites import Suite, extend_suite, register_suite

    extend_suite("quick", _quick)
    register_suite(Suite("dsa", "DSA memmove and batch: qd 1 / 16, cache control, waits, "
                         "batch sizes (skipped without a user WQ)", [_dsa_suite]))


_register_suites()
