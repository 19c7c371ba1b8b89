"""How many worker processes a case gets: the default from its budget, the first look's, and
more for a case whose processes disagree (settling)."""

from __future__ import annotations

import math

import numpy as np

from nearlocal.core.sampling import SETTLED_SPREAD, draws_disagree, log_spread

MAX_AUTO_PROCESSES = 32
MIN_PROCESS_BUDGET_S = 0.015
# A case whose process medians spread (robust SD of their logs) by more than SETTLED_SPREAD gets
# processes in proportion to its variance, up to SETTLING_FACTOR times the default (auto only)
SETTLING_FACTOR = 4
# Worker processes per case of a run made for no gate (a first look at a box): enough to see
# one process's draw of page placement against others', without the gate's 32 and settling.
FIRST_LOOK_PROCESSES = 8


def default_processes(budget_s: float) -> int:
    """Worker processes per case when not given: one per 0.015 s of the case's budget, 1 to 32
    (the default 0.5 s budget gets 32; a tiny budget, as in quick checks, stays in one process).
    On a shared VM a case's median moves by 7-20% from one process to the next, with the host's
    load over seconds; the gate's standard error of a ratio is that over sqrt(K / 2): 32
    processes bring it to 2-5%, which a `same` within 10% and a 1.3x `slower` both need."""
    return int(min(MAX_AUTO_PROCESSES, max(1, math.floor(budget_s / MIN_PROCESS_BUDGET_S + 1e-9))))


def default_processes_text(for_gate: bool) -> str:
    """The default above in words, for the --processes help texts of `run` and `accept` (from
    these constants, so the help cannot drift from the code)."""
    if not for_gate:
        return f"one per {MIN_PROCESS_BUDGET_S:g} s of --budget, at most {FIRST_LOOK_PROCESSES}"
    return (f"one per {MIN_PROCESS_BUDGET_S:g} s of --budget, at most {MAX_AUTO_PROCESSES}, then "
            f"up to {SETTLING_FACTOR}x that for a case whose processes disagree by over "
            f"{SETTLED_SPREAD:.0%}")


def processes_to_settle(samples: list[np.ndarray], processes: int, max_processes: int) -> int:
    """How many processes a case needs, from its first `processes` ones' samples: as many as
    bring the standard error of its location to what a case spread by SETTLED_SPREAD gets from
    `processes` (K (spread / SETTLED_SPREAD)^2), at most `max_processes`. On the 2-vCPU VM a
    chase of 256 KiB or 4 MiB (the L2 and the L3 shared with co-tenants) and a 16 MiB load
    spread by 20-70 % over processes; 32 processes left a 1.3x slowdown of them `ambiguous`."""
    spread = log_spread(samples)
    if max_processes <= processes or not draws_disagree(spread):
        return processes
    return int(min(max_processes, math.ceil(processes * (spread / SETTLED_SPREAD) ** 2)))
