"""The worker process: maps regions, opens a method's session and takes samples in phases
(check -> warm-up -> trials -> summary). A case that crashes it (SIGBUS from a vanished dax device,
SIGSEGV) takes down only this process; the parent records the signal and starts a new one."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.harness.cases import Case
from nearlocal.harness.methods import SessionContext, get_method, load_methods
from nearlocal.harness.stats import StoppingRule, summarize
from nearlocal.regions import parse_region, region_kind
from nearlocal.workloads.patterns import parse_pattern


@dataclass(frozen=True)
class WorkerSettings:
    rule: StoppingRule
    tsc_hz: float
    allow_write: bool


def measure(
    case: Case, settings: WorkerSettings, overhead_ticks: float
) -> tuple[dict, np.ndarray, np.ndarray]:
    method = get_method(case.method)
    pattern = parse_pattern(case.pattern)
    if case.access == "write":
        pattern = pattern.swapped()  # scattered pieces land in the region, packed in the peer
    region_spec, peer_spec = parse_region(case.region), parse_region(case.peer)
    region_size = pattern.src_span if case.access == "read" else pattern.dst_span
    peer_size = pattern.dst_span if case.access == "read" else pattern.src_span
    region = region_kind(region_spec).open(region_spec, region_size, case.attr, settings.allow_write)
    try:
        peer = region_kind(peer_spec).open(peer_spec, peer_size, "wb", True)
        try:
            src, dst = (region, peer) if case.access == "read" else (peer, region)
            ctx = SessionContext(case, pattern, src, dst, settings.tsc_hz, overhead_ticks,
                                 {**method.params, **case.param_dict})
            session = method.open_session(ctx)
            try:
                raw, ns, elapsed, converged = _trials(session, settings.rule)
            finally:
                session.close()
            info = {**region.info, **session.info}
            return {"clock": session.clock, "converged": converged, "elapsed_s": elapsed,
                    "info": info, **summarize(ns, pattern.total_bytes)}, raw, ns
        finally:
            peer.close()
    finally:
        region.close()


def _trials(session, rule: StoppingRule) -> tuple[np.ndarray, np.ndarray, float, bool]:
    start = time.perf_counter()
    session.sample(1)  # warm-up: compile, fault in, settle the cache state
    warm0 = time.perf_counter()
    session.sample(2)
    per_sample = (time.perf_counter() - warm0) / 2
    start_trials = time.perf_counter()
    raws, nss, have = [], [], 0
    ns_all = np.empty(0)
    while True:
        raw, ns = session.sample(rule.batch_size(per_sample, have))
        raws.append(np.asarray(raw, dtype=np.float64))
        nss.append(np.asarray(ns, dtype=np.float64))
        have += len(ns)
        ns_all = np.concatenate(nss)
        elapsed = time.perf_counter() - start_trials
        per_sample = elapsed / have
        if rule.done(ns_all, elapsed):
            break
    return np.concatenate(raws), ns_all, time.perf_counter() - start, rule.converged(ns_all)


def worker_main(conn, settings: WorkerSettings) -> None:
    from nearlocal.kernels.timer import measure_overhead_ticks

    load_methods()
    overhead = measure_overhead_ticks()
    conn.send(("ready", overhead))
    while True:
        message = conn.recv()
        if message is None:
            return
        case = Case.from_dict(message)
        try:
            row, raw, ns = measure(case, settings, overhead)
            conn.send(("ok", row, raw, ns))
        except UsageError as exc:
            conn.send(("failed", str(exc)))
        except Exception as exc:  # a method's own error fails that case, not the run
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            conn.send(("failed", detail))
