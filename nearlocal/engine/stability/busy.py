"""How busy the box was while a run measured: /proc/stat's per-CPU counters at the run's start
and end, the CPU time of the run's own processes over the same span, and where they ran.

A first-look run with a memory-bandwidth hog streaming on the other CPU of the 2-vCPU VM read
chase 1 GiB 316 ns (264 quiet) and printed `self-check: ok`: nothing in the run's own figures
says another process competed with it. /proc/stat says how busy every CPU was; the hard part is
not to read the run's own processes as a busy box. The timed worker is not pinned (a one-thread
method runs where the scheduler puts it; a threaded one pins its threads to the CPUs it chose),
so the recorder samples, a few times a second, which CPU each running thread of the run's worker
and prober (and their children) is on; the run's own CPU time is shared out over the CPUs in
those proportions. What a CPU was busy with beyond that share is other work (`busy_shares`).

All of it is plain data in run.json's `busy`; the self-check judges it (selfcheck.py beside
this).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

from nearlocal.sysroot import SysRoot

# how often the recorder looks where the run's threads run: it wakes in the run's parent while
# workers time, so seldom (a run long enough to judge, MIN_TICKS, gets a few samples at least)
SAMPLE_S = 0.2
# /proc/stat's per-CPU columns: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice: never added again.
BUSY_COLUMNS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq
IDLE_COLUMNS = (3, 4)  # idle, iowait
STEAL_COLUMN = 7
# Per CPU, what other work may take of the run's wall time before the run says so: half of the
# CPU. A quiet box's background (kernel threads, a shell, an agent) is a few %; a hog streaming
# on a CPU is ~100 %. The run's own share of each CPU is estimated from samples a few times a
# second (its error falls as 1/sqrt(samples)) and the runner's own process (polling, storing) may
# have run anywhere: the midpoint between quiet and hogged separates them on any box without
# being tuned to one.
OTHERS_SHARE = 0.5
# Over the whole box: other work spread over CPUs (a hog the scheduler moves between them) is
# named when it adds up to OTHERS_SHARE of a CPU, or BOX_SHARE of every CPU on a big box (a
# background spread thin over 64 CPUs is no hog; one concentrated on a CPU is named by that CPU).
BOX_SHARE = 0.05
STEAL_SHARE = 0.25  # a VM's CPU the hypervisor gave away this share of the run: slow figures
MIN_TICKS = 50  # a CPU counted over fewer clock ticks (0.5 s at 100 Hz) is not judged
# The memory probe's reading at the run's end against its start: a move beyond this (either way)
# is the host's memory path changing under the run. Typical process-to-process moves are ~7 %
# (docs/timing.md); a hog starting or stopping mid-run moves a 1 GiB chase by 20-50 %.
MEMORY_MOVE = 1.3


def read_proc_stat(root: SysRoot) -> dict[int, list[int]]:
    """Per CPU, /proc/stat's counters (clock ticks), as listed."""
    counters: dict[int, list[int]] = {}
    for line in (root.read("/proc/stat", "") or "").splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit():
            with contextlib.suppress(ValueError):
                counters[int(name[3:])] = [int(v) for v in rest.split()]
    return counters


def _stat_fields(root: SysRoot, path: str) -> list[str] | None:
    text = root.read(path)
    if not text or ")" not in text:
        return None
    return text.rpartition(")")[2].split()  # field n of proc(5) is [n - 3]


def _process_table(root: SysRoot) -> dict[int, int]:
    """pid -> parent pid, every process /proc lists."""
    parents = {}
    for name in root.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(root, f"/proc/{name}/stat")
            if fields and len(fields) > 1 and fields[1].lstrip("-").isdigit():
                parents[int(name)] = int(fields[1])
    return parents


def descendants(parents: dict[int, int], pid: int) -> list[int]:
    """Every descendant of pid, deepest first (children before their parents)."""
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    order, stack = [], [pid]
    while stack:
        here = stack.pop()
        for child in children.get(here, []):
            order.append(child)
            stack.append(child)
    return order[::-1]


def tree_cpu_ticks(root: SysRoot, pid: int) -> int:
    """CPU time (clock ticks) of pid and every descendant, each with the children it has reaped
    (utime + stime + cutime + cstime): the run's workers are children of its fork server, which
    reaps them. Read children first: one reaped between two reads is then counted twice, never
    missed (the run's own time reads high, the others' low: no false alarm)."""
    total = 0
    for each in [*descendants(_process_table(root), pid), pid]:
        fields = _stat_fields(root, f"/proc/{each}/stat")
        if fields and len(fields) > 14:
            with contextlib.suppress(ValueError):
                total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total


def running_cpus(root: SysRoot, pids: list[int], skip_tid: int | None = None) -> list[int]:
    """The CPU of every running thread (state R) of pids and their children (where the kernel
    lists them: /proc/PID/task/TID/children)."""
    cpus, seen, stack = [], set(), list(pids)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for tid in root.listdir(f"/proc/{pid}/task"):
            if tid == str(skip_tid):
                continue
            fields = _stat_fields(root, f"/proc/{pid}/task/{tid}/stat")
            if fields and len(fields) > 36 and fields[0] == "R" and fields[36].isdigit():
                cpus.append(int(fields[36]))
            stack.extend(int(c) for c in (root.read(f"/proc/{pid}/task/{tid}/children") or "").split()
                         if c.isdigit())
    return cpus


@dataclass
class _Mark:
    wall: float
    stat: dict[int, list[int]]
    times: os.times_result
    tree_ticks: int


class BusyRecorder:
    """Marks the run's start and end and samples where its processes run in between (a daemon
    thread). `track(pid)`: a process of the run that measures (a worker, the prober). Nothing
    here may fail the run: a /proc it cannot read leaves the record without that part."""

    def __init__(self, root: SysRoot | None = None, interval_s: float = SAMPLE_S):
        self.root = root or SysRoot.default()
        self.interval_s = interval_s
        self._pids: set[int] = set()
        self._where: dict[int, int] = {}
        self._samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start: _Mark | None = None

    def _mark(self) -> _Mark:
        return _Mark(time.monotonic(), read_proc_stat(self.root), os.times(),
                     tree_cpu_ticks(self.root, os.getpid()))

    def start(self) -> None:
        self._start = self._mark()
        self._thread = threading.Thread(target=self._sample, name="nearlocal-busy", daemon=True)
        self._thread.start()

    def track(self, pid: int | None) -> None:
        if pid is not None:
            self._pids.add(pid)

    def _sample(self) -> None:
        me = threading.get_native_id()
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # a thread of its own: never the run's failure
                cpus = running_cpus(self.root, [*sorted(self._pids), os.getpid()], skip_tid=me)
                self._samples += 1
                for cpu in cpus:
                    self._where[cpu] = self._where.get(cpu, 0) + 1

    def stop(self) -> dict:
        """run.json's `busy`: the raw counters at both ends, the run's own CPU seconds (this
        process alone, its waited-for children, and its whole process tree from /proc), and per
        CPU how many samples found a thread of the run running there."""
        self._stop.set()
        if self._thread is not None:
            # a Ctrl-C can land between the thread's creation and its start: not started, it
            # has nothing to join (join would raise RuntimeError)
            with contextlib.suppress(RuntimeError):
                self._thread.join(5)
        start, end = self._start, self._mark()
        if start is None:
            return {}
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        cpus = sorted(set(start.stat) & set(end.stat))
        return {
            "wall_s": end.wall - start.wall, "clock_ticks_per_s": hz,
            "cpus": cpus, "stat_start": [start.stat[c] for c in cpus],
            "stat_end": [end.stat[c] for c in cpus],
            "self_cpu_s": (end.times.user + end.times.system) - (start.times.user + start.times.system),
            "children_cpu_s": (end.times.children_user + end.times.children_system)
            - (start.times.children_user + start.times.children_system),
            "tree_cpu_s": (end.tree_ticks - start.tree_ticks) / hz,
            "allowed_cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus,
            "samples": self._samples, "where": [[c, n] for c, n in sorted(self._where.items())],
        }


# ------------------------------------------------------------------ judged from the plain record


def busy_shares(record: dict) -> dict[int, dict[str, float]]:
    """Per CPU, from run.json's `busy`: `busy` (its share of the span busy with anything),
    `own` (the run's own CPU time shared out by where its threads were seen), `others` (busy
    beyond own, less what the runner's own process may have spent there: it runs anywhere),
    `steal` (a VM's CPU given away by the hypervisor), `ticks` (the span in clock ticks).
    Empty when the record lacks what it needs."""
    try:
        cpus = [int(c) for c in record["cpus"]]
        starts, ends = record["stat_start"], record["stat_end"]
        hz = float(record.get("clock_ticks_per_s") or 100)
        own_s = max(float(record.get("tree_cpu_s") or 0.0),
                    float(record.get("self_cpu_s") or 0.0) + float(record.get("children_cpu_s") or 0.0))
        anywhere_s = max(0.0, float(record.get("self_cpu_s") or 0.0))
        where = {int(c): int(n) for c, n in record.get("where") or []}
    except (KeyError, TypeError, ValueError):
        return {}
    seen = sum(where.values())
    shares = {}
    for cpu, start, end in zip(cpus, starts, ends, strict=False):
        delta = [max(0, int(b) - int(a)) for a, b in zip(start, end, strict=False)]
        delta += [0] * (10 - len(delta))
        busy = sum(delta[i] for i in BUSY_COLUMNS)
        ticks = busy + sum(delta[i] for i in IDLE_COLUMNS) + delta[STEAL_COLUMN]
        if ticks <= 0:
            continue
        # no sample saw the run running (a run too short to sample): its whole time may have
        # been on any CPU, the reading least likely to name one wrongly
        own = own_s * hz * (where.get(cpu, 0) / seen if seen else 1.0)
        others = max(0.0, busy - own - anywhere_s * hz)
        shares[cpu] = {"busy": busy / ticks, "own": min(1.0, own / ticks),
                       "others": min(1.0, others / ticks), "steal": delta[STEAL_COLUMN] / ticks,
                       "ticks": float(ticks)}
    return shares


def busy_lines(record: dict | None, siblings: dict[int, list[int]] | None = None) -> list[str]:
    """The busy box, said: a CPU more than OTHERS_SHARE busy with other work (named as the SMT
    sibling of a CPU the run measured on, where it is one), a CPU the hypervisor took over
    STEAL_SHARE of. `siblings`: per CPU its thread siblings (the box settings)."""
    if not isinstance(record, dict) or not record:
        return []
    shares = busy_shares(record)
    where = {int(c): int(n) for c, n in record.get("where") or [] if int(n) > 0}
    lines = []
    judged = {cpu: share for cpu, share in shares.items() if share["ticks"] >= MIN_TICKS}
    total = sum(share["others"] for share in judged.values())
    if judged and not any(share["others"] > OTHERS_SHARE for share in judged.values()) \
            and total > max(OTHERS_SHARE, BOX_SHARE * len(judged)):
        busiest = sorted(judged.items(), key=lambda item: -item[1]["others"])[:3]
        lines.append(f"processes other than this run kept {total:.2f} CPUs busy on average while "
                     "it measured (" + ", ".join(f"CPU {cpu} {100 * share['others']:.0f} %"
                                                 for cpu, share in busiest)
                     + "): figures may be slow or spread")
    for cpu, share in shares.items():
        if share["ticks"] < MIN_TICKS:
            continue
        if share["others"] > OTHERS_SHARE:
            mates = [c for c in (siblings or {}).get(cpu, []) if c != cpu and c in where]
            role = (f" (the SMT sibling of CPU {', '.join(map(str, mates))}, where this run measured)"
                    if mates and cpu not in where else "")
            lines.append(f"CPU {cpu}{role} was {100 * share['others']:.0f} % busy with other work "
                         "while this run measured: figures may be slow or spread")
        if share["steal"] > STEAL_SHARE:
            lines.append(f"CPU {cpu} lost {100 * share['steal']:.0f} % of the run to the "
                         "hypervisor (steal): figures may be slow or spread")
    return lines


def memory_move(host_probe: dict | None) -> tuple[float, float] | None:
    """The memory probe's median ns a hop at its first reading and at its last (run.json's
    `host_probe`), or None with fewer than two readings."""
    from nearlocal.engine.stability.hostprobe import per_hop_ns

    if not isinstance(host_probe, dict):
        return None
    fact = (host_probe.get("probes") or {}).get("memory")
    readings = [p.get("memory") for p in host_probe.get("passes") or []
                if isinstance(p, dict) and p.get("memory")]
    if not isinstance(fact, dict) or len(readings) < 2:
        return None
    import numpy as np

    first, last = (float(np.median(per_hop_ns(fact, r))) for r in (readings[0], readings[-1]))
    return (first, last) if first > 0 and last > 0 else None


def memory_line(host_probe: dict | None) -> str | None:
    move = memory_move(host_probe)
    if move is None:
        return None
    first, last = move
    ratio = max(first, last) / min(first, last)
    if ratio <= MEMORY_MOVE:
        return None
    return (f"the host's memory latency moved {ratio:.2f}x {'slower' if last > first else 'faster'} "
            f"from the run's start to its end (memory probe {first:.0f} -> {last:.0f} ns a hop): "
            "something else used the memory path while this run measured")
