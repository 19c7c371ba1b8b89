"""One rack case's parts on the ranks of an MPI job: what a rank's part gets (`RackContext`,
from the case as rank 0's plan resolved it), its part run, rank 0 gathering every rank's result
within the method's straggler time, and the order rack cases run in."""

from __future__ import annotations

import time
from typing import Any

from nearlocal.rack.hosts import lost_line
from nearlocal.rack.mpi import RankLost, World


def rack_context(job: World, resolved, plan: Any, hosts: list[dict], pools: dict):
    """What this rank's part of a rack case gets, from the case as rank 0's plan resolved it."""
    from nearlocal.rack.framework import RackContext

    return RackContext(job, resolved.case, resolved.pattern, pools[resolved.case.region],
                       [h["kernel_id"] for h in hosts], [h["hostname"] for h in hosts],
                       plan.settings.tsc_hz, plan.settings.overhead_ticks, plan.settings.rule,
                       dict(resolved.params), plan.case_timeout_s)


def run_part(ctx) -> tuple[str, object]:
    """This rank's part of a rack case: ("ok", result) or ("failed", one line)."""
    import traceback

    from nearlocal.rack.framework import RACK_METHODS

    try:
        return "ok", RACK_METHODS[ctx.case.method].run(ctx)
    except Exception as exc:  # RankLost too: a barrier another rank never reached
        return "failed", traceback.format_exception_only(type(exc), exc)[-1].strip()


def gather_parts(job: World, method, ctx, plan: Any, hosts: list[dict],
                  waiting: list) -> tuple[list, dict[int, str]]:
    """Rank 0's own part, then every other rank's result: [(status, value) or None for a lost
    rank], and {lost rank: line}. Once rank 0's part finished, the others get the method's
    straggler wait (the ranks met at its barriers); after a failure of rank 0's part the others
    may still be waiting at a barrier, so they get the case's whole timeout."""
    from nearlocal.rack.framework import straggler_s

    results: list = [None] * job.size
    results[0] = run_part(ctx)
    wait = straggler_s(method, ctx, results[0][1]) if results[0][0] == "ok" \
        else plan.case_timeout_s + 60
    deadline = time.monotonic() + wait
    gone: dict[int, str] = {}
    for rank in range(1, job.size):
        waiting[0] = rank
        try:
            results[rank] = job.recv(rank, max(deadline - time.monotonic(), 1.0),
                                     f"measuring {ctx.case.id}")
        except RankLost as exc:
            gone[rank] = lost_line(exc, hosts)
    return results, gone


def rack_order(entries: list) -> list:
    """The rack cases in the plan's order, those that may lose a host (host loss under the VM
    rig) after every other: a lost host skips every rack case after it."""
    from nearlocal.rack.framework import RACK_METHODS

    return sorted(entries, key=lambda entry: RACK_METHODS[entry.case.method].may_lose_host)
