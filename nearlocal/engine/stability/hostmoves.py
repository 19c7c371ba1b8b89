"""How far the box itself moved between two runs, by its host probes (hostprobe.py beside this:
a chase for the core clock, one over an eighth of the LLC, one as wide as the run's largest
memory-bound case), and which probes are a case's yardsticks. The gate asks this module
(gate/verdict.py); the statistic is the gate's own (core/sampling.py's Yuen estimator).

Code CI reads a move as noise only between runs that did not take turns and whose probes
walked the same code (kernels/yardstick.py, its fingerprint in run.json): a case that moved no
further than such a yardstick is `ambiguous`. Runs that took turns shared the host pass by pass,
so a probe that reads differently between them moved with one side's run, not with the host:
it excuses nothing, and the report says what moved it, the candidate's probe code where its
fingerprint differs (issue 56: a chase kernel 1.25x slower made the probes that walked it read
1.25x slower, and excused itself).
Box CI reads a move as a finding: it names the layer that moved."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from nearlocal.core.sampling import MIN_PROCESSES, trimmed_location
from nearlocal.lazy import lazy_import

np = lazy_import("numpy")
scipy_stats = lazy_import("scipy.stats")

LAYERS = {"all": "core clock", "llc": "LLC", "memory": "memory"}  # a probe's `bounds`


class Reach(Protocol):
    """Where a compared case's figures live (the gate's `CaseInput` is one): what picks its
    yardsticks."""

    reaches_memory: bool  # in either run
    llc_resident: bool


@dataclass
class HostMove:
    """One host probe in both runs."""

    probe: str
    bounds: str  # the cases it is the yardstick of: "all", "llc" or "memory"
    base_ns: float
    cand_ns: float
    ratio: float
    low: float  # the ratio's interval, at 1 - alpha
    high: float
    passes: str  # "base/candidate" worker processes it was walked in
    log_se: float  # the standard error of log(ratio)
    moved: bool  # its interval excludes 1
    same_code: bool = True  # both runs' probes walked the same code (runs before: unknown, same)

    def beyond(self, threshold: float) -> bool:
        """Its whole interval beyond the threshold: the layer moved by more than a case may."""
        return self.low > 1 + threshold or self.high < 1 / (1 + threshold)

    def moved_by(self) -> str:
        """Between runs that took turns (one host), what moved it: the candidate's probe code
        when its fingerprint differs, else the candidate's run (its cases around the probe, or
        the pages its own rings were laid in: a 64 MiB ring read 1.10x between two arms of
        unchanged code), never the host."""
        return "candidate probe code" if not self.same_code else "candidate run"

    def by_code(self) -> str:
        """A move between runs that took turns, said as what moved it (they shared the host)."""
        if not self.same_code:
            return (f"{self.probe} {self.ratio:.2f}x on the candidate's turns: the candidate's "
                    "probe code moves it (it differs from the baseline's)")
        return (f"{self.probe} {self.ratio:.2f}x on the candidate's turns: not the host, not "
                "the probe's code (the same in both trees): the candidate's cases around it, "
                "or its run's own probe rings")

    def text(self) -> str:
        return (f"{self.probe} {self.base_ns:.3g} -> {self.cand_ns:.3g} ns "
                f"({self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}])")


def probe_log_medians(meta: dict, probe: str) -> dict[int, float]:
    """Per pass (worker process) that walked `probe`, the log median of its reading, ns per hop
    (runs stored before raw ticks were kept hold ns per hop)."""
    from nearlocal.engine.stability.hostprobe import per_hop_ns

    probes = meta.get("host_probe") or {}
    fact = (probes.get("probes") or {}).get(probe) or {}
    medians = {}
    for k, entry in enumerate(probes.get("passes") or []):
        if isinstance(entry, dict) and entry.get(probe):
            median = float(np.median(per_hop_ns(fact, entry[probe])))
            if median > 0:
                medians[int(entry.get("pass", k))] = math.log(median)
    return medians


def host_moves(base_meta: dict, cand_meta: dict, alpha: float,
               paired: bool = False) -> list[HostMove]:
    """Each probe both runs walked in >= 2 processes: the ratio of the trimmed means of its
    per-process log medians (as a case's) and its Yuen interval at 1 - alpha. Runs that took
    turns (`paired`) compare pass k with pass k, walked in the same round, as their cases are:
    the host's drift cancels, and what is left is the two sides' difference. A probe whose
    ring or walk differs between the runs (another plan's memory span) is left out."""
    facts = (cand_meta.get("host_probe") or {}).get("probes") or {}
    base_facts = (base_meta.get("host_probe") or {}).get("probes") or {}
    moves = []
    for probe, fact in facts.items():
        if any(fact.get(key) != base_facts.get(probe, {}).get(key)
               for key in ("ring_bytes", "hops")):
            continue
        by_b, by_c = probe_log_medians(base_meta, probe), probe_log_medians(cand_meta, probe)
        logs_b, logs_c = np.array(list(by_b.values())), np.array(list(by_c.values()))
        if min(logs_b.size, logs_c.size) < MIN_PROCESSES:
            continue
        common = sorted(set(by_b) & set(by_c))
        mean_b = trimmed_location(logs_b)[0]
        passes = f"{logs_b.size}/{logs_c.size}"
        if paired and len(common) >= MIN_PROCESSES:
            log_ratio, var, h = trimmed_location(np.array([by_c[k] - by_b[k] for k in common]))
            se, df = math.sqrt(var / h), h - 1
            passes += f" ({len(common)} paired)"
        else:
            (mean_b, var_b, h_b), (mean_c, var_c, h_c) = (trimmed_location(logs_b),
                                                          trimmed_location(logs_c))
            log_ratio, se, df = mean_c - mean_b, math.sqrt(var_b / h_b + var_c / h_c), h_b + h_c - 2
        reach = float(scipy_stats.t.isf(alpha / 2, max(df, 1))) * se
        low, high = math.exp(log_ratio - reach), math.exp(log_ratio + reach)
        moves.append(HostMove(probe, str(fact.get("bounds", "all")), math.exp(mean_b),
                              math.exp(mean_b + log_ratio), math.exp(log_ratio), low, high,
                              passes, se, low > 1 or high < 1,
                              fact.get("code") == base_facts[probe].get("code")))
    return moves


def yardsticks(moves: list[HostMove], case: Reach) -> list[HostMove]:
    """The probes a case is judged against: the core probe for every case, the memory probe
    too for one that reaches memory in either run, the LLC probe for one living in the LLC
    (and reaching memory in neither)."""
    llc = not case.reaches_memory and case.llc_resident
    return [m for m in moves if m.bounds == "all" or (case.reaches_memory and m.bounds == "memory")
            or (llc and m.bounds == "llc")]


def excusing(moves: list[HostMove], slower: bool, ratio: float, half: float, threshold: float,
             z: float) -> list[HostMove]:
    """The yardsticks that moved the case's way and that it did not move beyond: its log
    ratio over the probe's, less its own half-interval (`half`, in log) and z probe standard
    errors in quadrature, within log(1 + threshold)."""
    found = []
    for move in moves:
        if not move.moved or (move.ratio > 1) != slower:
            continue
        shift = math.log(ratio / move.ratio) if slower else math.log(move.ratio / ratio)
        if not math.isfinite(half) or \
                shift - math.hypot(half, z * move.log_se) <= math.log1p(threshold):
            found.append(move)
    return found


def layer(move: HostMove) -> str:
    return LAYERS.get(move.bounds, move.probe)
