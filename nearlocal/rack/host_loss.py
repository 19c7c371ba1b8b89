"""rack-host-loss: the record store's writer on the last rank is SIGKILLed mid-write (rpc's fault
injector), readers on the other ranks must detect it within the lease and never return a torn
record."""

from __future__ import annotations

import numpy as np

from nearlocal.core.cases import Case, ResolvedCase
from nearlocal.core.patterns import Pattern
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.rack.framework import RackContext, RackRow
from nearlocal.rpc.methods import int_param
from nearlocal.rpc.protocols import protocol_code
from nearlocal.units import parse_duration

rec = lazy_import("nearlocal.rpc.records")

HOSTLOSS_RECORDS = 2  # few records: readers and the writer meet on them often (faults' negative test)


def _fault_config(case: Case, pattern: Pattern, ranks: int):
    from nearlocal.rpc.faults import FaultConfig
    from nearlocal.units import parse_size

    params = {**HOSTLOSS_PARAMS, **case.param_dict}
    return FaultConfig(region=case.region, kills=int(params["kills"]),
                       duration_s=parse_duration(params["duration"]),
                       lease_s=parse_duration(params["lease"]), readers=max(ranks - 1, 1),
                       records=int(params["records"]),
                       record_bytes=parse_size(str(pattern.total_bytes)),
                       protocol=params["protocol"], freeze_every=0, corrupt_every=7,
                       grace_s=parse_duration(params["grace"]), allow_write=True)


def _hostloss_layout(case: Case, pattern: Pattern, ranks: int) -> rec.Layout:
    config = _fault_config(case, pattern, ranks)
    epochs = 2 * config.kills + 64
    return rec.Layout(config.records, config.record_bytes, config.readers, epochs)


def hostloss_run(ctx: RackContext) -> dict:
    from nearlocal.rpc import faults

    config = _fault_config(ctx.case, ctx.pattern, ctx.size)
    layout = _hostloss_layout(ctx.case, ctx.pattern, ctx.size)
    code = protocol_code(config.protocol)
    writer_rank = ctx.size - 1
    recheck = str(ctx.params.get("recheck", "on")) == "on"
    faults.warm_up(code)
    if ctx.rank == writer_rank:
        with faults.StopSignals() as signals:
            report = faults.inject(config, layout, ctx.pool, ctx.tsc_hz, code, signals, None,
                                    readers_elsewhere=lambda: ctx.barrier(
                                        "before the readers start"))
        return {"report": report}
    ctx.barrier("before the readers start")
    raw = ctx.pool.array[:layout.nbytes]
    words = raw.view(np.uint64)
    timeout = np.uint64(config.read_timeout * ctx.tsc_hz)
    faults.run_reader(raw, words, layout, ctx.rank, config, timeout, ctx.tsc_hz, code, recheck)
    return {}


def hostloss_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
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


def hostloss_bytes(resolved: ResolvedCase, ranks: int) -> int:
    return _hostloss_layout(resolved.case, resolved.pattern, ranks).nbytes


def check_hostloss(params: dict) -> None:
    for name in ("kills", "records"):
        if int_param(params, name, 1) < 1:
            raise UsageError(f"rack-host-loss: {name}={params[name]} must be at least 1")
    if str(params.get("recheck", "on")) not in ("on", "off"):
        raise UsageError(f"rack-host-loss: recheck={params['recheck']} must be on or off")
    for name in ("lease", "duration", "grace"):
        parse_duration(str(params[name]))


HOSTLOSS_PARAMS = {"protocol": "flush", "kills": "20", "lease": "20ms", "grace": "300ms",
                   "duration": "20s", "records": str(HOSTLOSS_RECORDS), "recheck": "on"}
