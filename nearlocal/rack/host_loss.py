"""rack-host-loss: the record store's writer on the last rank is SIGKILLed mid-write (rpc's fault
injector), readers on the other ranks must detect it within the lease and never return a torn
record. When the last rank's whole host is lost during the case (the rig kills its VM), the
readers stop by their own deadline and rank 0 stores their counters (`hostloss_rows_after_loss`):
the survivors still judge the owner lost and return no torn record."""

from __future__ import annotations

import numpy as np

from nearlocal.core.cases import Case, ResolvedCase
from nearlocal.core.patterns import Pattern
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.rack.framework import STRAGGLER_S, RackContext, RackRow
from nearlocal.rpc.methods import int_param
from nearlocal.rpc.protocols import protocol_code
from nearlocal.units import parse_duration

rec = lazy_import("nearlocal.rpc.records")

HOSTLOSS_RECORDS = 2  # few records: readers and the writer meet on them often (faults' negative test)
# rank 0's wait for the writer once its reader stopped by its own deadline, never told to stop:
# by then the writer is READER_MARGIN_S past the injector's bound, so a live one has answered
OVERDUE_WRITER_S = 5.0


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
    ended = faults.run_reader(raw, words, layout, ctx.rank, config, timeout, ctx.tsc_hz, code,
                              recheck)
    counters = rec.RecordStore(raw, layout, config.protocol, reader=ctx.rank).counters()
    counters["max_read_ms"] = counters.pop("max_read_ticks") / ctx.tsc_hz * 1e3
    return {"reader": {**counters, **ended}}


def hostloss_straggler_s(ctx: RackContext, own: dict) -> float:
    """Rank 0's wait for the other ranks' results once its reader is done: the writer finishes
    after its readers (its last epoch, reaping, totals); a reader never told to stop had its
    writer overdue already (OVERDUE_WRITER_S)."""
    if not own.get("reader", {}).get("told_to_stop", True):
        return OVERDUE_WRITER_S
    return STRAGGLER_S + _fault_config(ctx.case, ctx.pattern, ctx.size).end_bound_s


def hostloss_rows(ctx: RackContext, results: list[dict]) -> list[RackRow]:
    return [_writer_row(ctx, results[ctx.size - 1]["report"])]


def _writer_row(ctx: RackContext, report: dict) -> RackRow:
    """The writer's row: the injector's whole report (every reader's counters, its kills)."""
    writer_rank = ctx.size - 1
    report = dict(report)
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
    return RackRow(writer_rank, ns, ns, info, failed, extra)


def hostloss_rows_after_loss(ctx: RackContext, results: list, lost: dict[int, str]) -> list[RackRow]:
    """Rows when ranks were lost during the case (results: None for a lost rank): the writer's
    row if it answered, a row of each surviving reader's own counters, and a failed row for each
    lost rank naming it and its host."""
    writer_rank = ctx.size - 1
    recheck = str(ctx.params.get("recheck", "on")) == "on"
    writer_lost = writer_rank in lost
    rows = [] if writer_lost else [_writer_row(ctx, results[writer_rank]["report"])]
    ns = np.empty(0)
    for rank, got in enumerate(results):
        if rank == writer_rank or got is None:
            continue
        reader = got["reader"]
        problems = [f"{name} {reader[name]}" for name in ("torn_reads", "torn_reads_returned")
                    if reader[name]]
        if writer_lost and not reader["owner_judged_lost"]:
            problems.append("the lost writer's epoch was not judged lost by this reader")
        if not recheck:
            problems.append("the readers' sequence recheck is off (negative control)")
        info = {**reader, "role": "reader", "writer_rank": writer_rank,
                "writer_host": ctx.hostnames[writer_rank], "writer_lost": writer_lost,
                "lost_ranks": sorted(lost), "recheck": recheck,
                "fallback": "the reader recomputes the record (FALLBACK_STALE) instead of waiting",
                "detect_note": "this reader's own counters: the writer's report (kills, "
                               "detection times) was lost with its host" if writer_lost else
                               "this reader's own counters"}
        extra = {"detections": reader["stale_detections"], "torn_reads": reader["torn_reads"],
                 "torn_reads_returned": reader["torn_reads_returned"],
                 "reads_ok": reader["reads_ok"]}
        rows.append(RackRow(rank, ns, ns, info, "; ".join(problems), extra))
    for rank, line in sorted(lost.items()):
        role = "the writer" if rank == writer_rank else "a reader"
        why = f"lost: {line}: its host stopped answering during the host-loss case ({role} ran there)"
        rows.append(RackRow(rank, ns, ns, {"role": "writer" if rank == writer_rank else "reader",
                                           "lost": True, "lost_why": line}, why))
    return rows


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
