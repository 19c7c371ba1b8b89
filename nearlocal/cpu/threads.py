"""N threads on N distinct CPUs (`--threads N|all`, `--cpus LIST`): peak bandwidth as MLC and
likwid-bench measure it.

A threaded case splits its pattern's fragments into one share per thread (a single contiguous
piece is cut at cache-line boundaries), so the pattern is the TOTAL moved, as in likwid-bench's
`-w S0:1GB:2`. Each thread is a Python thread pinned to its own CPU running a nogil kernel; per
repetition all threads meet on a spin barrier in compiled code, then each brackets its pass with
fenced rdtscp. A sample is last end - first start over the threads (the TSC is one clock on every
core: constant_tsc), so the row's GB/s = total declared bytes / that interval; every thread's own
median and GB/s are kept in the row's info.

The CPUs are the region's NUMA node's (the nearest node with CPUs for a CPU-less one; for `dram`
the node this process runs on, where first touch put its pages), those this process may use;
`--cpus` names them instead.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from nearlocal.core.methods import Method, SessionContext
from nearlocal.errors import UsageError
from nearlocal.kernels.thread_forms import ThreadForm
from nearlocal.sysroot import SysRoot, parse_cpulist

if TYPE_CHECKING:
    from nearlocal.probe.numa import NumaNode

LINE = 64
MAX_CPUS = 8192  # Linux's largest NR_CPUS
THREAD_PARAMS = {"threads": "1", "cpus": ""}
THREAD_TICKS_KEPT = 4096  # samples whose per-thread TSC readings the row keeps

# Every method's multi-thread form, by method: filled by `threaded(method, form)` where the
# method registers (the built-in CPU methods in cpu/methods.py, a plugin's in its module), read
# only where a parameter names a method (loaded-chase's traffic=).
THREAD_FORMS: dict[str, ThreadForm] = {}


def register_thread_form(method: str, form: ThreadForm) -> None:
    """A method's multi-thread form, declared once (a second, different one is a bug)."""
    if THREAD_FORMS.get(method, form) != form:
        raise ValueError(f"method {method!r} already has a thread form")
    THREAD_FORMS[method] = form


def parse_threads(text: str) -> int | None:
    """'all' -> None (every chosen CPU); a positive count -> that count."""
    text = str(text).strip()
    if text == "all":
        return None
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise UsageError(f"malformed --threads {text!r}: use a positive count or 'all'")
    return int(text)


def parse_cpus(text: str) -> list[int]:
    text = str(text).strip()
    if not text:
        return []
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        raise UsageError(f"malformed --cpus {text!r}: use a CPU list such as 0-3,8")
    highest = max(int(number) for number in re.findall(r"\d+", text))
    if highest >= MAX_CPUS:  # checked before the list is expanded: 0-99999999999 is no list
        raise UsageError(f"--cpus {text!r} names CPU {highest}: no machine has more than "
                         f"{MAX_CPUS} CPUs")
    cpus = parse_cpulist(text)
    if len(set(cpus)) != len(cpus):
        raise UsageError(f"--cpus {text!r} names a CPU twice: threads need distinct CPUs")
    return cpus


def check_thread_params(params: dict) -> None:
    count = parse_threads(params.get("threads", "1"))
    cpus = parse_cpus(params.get("cpus", ""))
    if cpus and count is not None and count > len(cpus):
        raise UsageError(f"--threads {count} needs {count} CPUs but --cpus names {len(cpus)}")


def check_threaded_drain(params: dict) -> None:
    """A threaded case starts every repetition from a barrier: only drain=before applies."""
    if str(params.get("drain", "before")) != "before":
        raise UsageError("--threads starts every repetition from a barrier, so drain="
                         f"{params['drain']} does not apply: use drain=before")


def is_threaded(params: dict) -> bool:
    return str(params.get("threads", "1")) != "1" or bool(str(params.get("cpus", "")).strip())


def region_node(region: str) -> int | None:
    """The NUMA node a region spec binds to, if it names one (numa:N, dram:...,node=N,
    interleave:N,... takes its first node)."""
    match = re.fullmatch(r"numa:(\d+)", region) or re.search(r"(?:^dram:|,)node=(\d+)", region) \
        or re.fullmatch(r"interleave:(\d+)(?:,.*)?", region)
    return int(match.group(1)) if match else None


def current_cpu() -> int | None:
    """The CPU this thread runs on now (/proc/self/stat field 39)."""
    try:
        with open("/proc/self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def local_node(nodes: Iterable[NumaNode] | None = None, root: SysRoot | None = None,
               cpu: int | None = None) -> int | None:
    """The node of the CPU we run on (`cpu`, else the one this thread runs on now), among `nodes`
    (else those probed under `root`): where first-touch puts `dram`'s pages."""
    from nearlocal.probe.numa import probe_numa

    if nodes is None:
        nodes = probe_numa(root or SysRoot.default())
    cpu = current_cpu() if cpu is None else cpu
    return next((n.node for n in nodes if cpu in n.cpus), None)


def node_cpus(node: int, root: SysRoot | None = None,
              numa: Iterable[NumaNode] | None = None) -> list[int]:
    """The CPUs of `node`, or of the nearest node that has CPUs when it has none (a CXL node);
    among `numa` (the run's inventory), else the nodes probed under `root`."""
    from nearlocal.probe.numa import probe_numa

    if numa is None:
        numa = probe_numa(root or SysRoot.default())
    nodes = {n.node: n for n in numa}
    if node not in nodes:
        return []
    if nodes[node].cpus:
        return list(nodes[node].cpus)
    distances = nodes[node].distances
    with_cpus = [n for n in nodes.values() if n.cpus]
    if not with_cpus:
        return []
    nearest = min(with_cpus, key=lambda n: (distances[n.node] if n.node < len(distances)
                                            else 255, n.node))
    return list(nearest.cpus)


def choose_cpus(region: str, threads: str, cpus: str, root: SysRoot | None = None,
                allowed: set[int] | None = None,
                numa: Iterable[NumaNode] | None = None) -> list[int]:
    """Distinct CPUs for the threads: --cpus if given, else the region's node's, else all this
    process may use; UsageError when there are fewer than asked for. `numa`: the nodes of the
    run's inventory (else probed under `root`)."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    named = parse_cpus(cpus)
    if named:
        outside = sorted(set(named) - allowed)
        if outside:
            raise UsageError(f"--cpus names CPU {outside[0]}, which this process may not use "
                             f"(allowed: {','.join(map(str, sorted(allowed)))})")
        pool, where = named, "--cpus"
    else:
        node = region_node(region)
        if node is None and (region == "dram" or region.startswith("dram:")):
            node = local_node(numa, root=root)  # the worker faulted dram's pages on its node
        if node is None:
            pool, where = sorted(allowed), "this process's CPUs"
        else:
            pool = [c for c in node_cpus(node, root, numa) if c in allowed]
            where = f"the CPUs near node {node}"
    count = parse_threads(threads)
    if count is None:
        count = len(pool)
    if count < 1 or count > len(pool):
        raise UsageError(f"{count} threads need {count} distinct CPUs but {where} "
                         f"give {len(pool)} ({','.join(map(str, pool)) or 'none'}): "
                         "lower --threads or pass --cpus")
    return pool[:count]


def split_frags(frags: np.ndarray, n: int) -> list[np.ndarray]:
    """One share of the fragment table per thread, about equal in bytes. Several fragments are
    dealt out in contiguous groups; one fragment is cut at 64-byte boundaries."""
    if n == 1:
        return [frags]
    if frags.shape[0] >= n:
        return [np.ascontiguousarray(part) for part in np.array_split(frags, n)]
    if frags.shape[0] != 1:
        raise UsageError(f"{frags.shape[0]} fragments cannot be shared by {n} threads")
    src, dst, length = (int(v) for v in frags[0])
    lines = length // LINE
    if lines < n:
        raise UsageError(f"{length} bytes cannot be shared by {n} threads: give each at "
                         f"least one {LINE}-byte line")
    cuts = [LINE * (lines * k // n) for k in range(n)] + [length]
    return [np.array([[src + a, dst + a, b - a]], np.int64) for a, b in itertools.pairwise(cuts)]


def run_pinned(jobs: list[tuple[int, object]]) -> list[object]:
    """Run each (cpu, callable) in its own thread pinned to that CPU; results in order.
    An exception in a thread is raised here, after every thread has finished."""
    results: list[object] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(index: int, cpu: int, job) -> None:
        try:
            os.sched_setaffinity(0, {cpu})  # pid 0 = this thread on Linux
            results[index] = job()
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, cpu, job), daemon=True)
               for i, (cpu, job) in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


class ThreadedSession:
    """N pinned threads over N shares of the pattern; a sample = one barrier-started repetition,
    last end - first start (ns, timer overhead removed)."""

    clock = "tsc"

    def __init__(self, form: ThreadForm, ctx: SessionContext):
        from nearlocal.kernels.parallel import threaded_kernel

        self.ctx = ctx
        self.cpus = choose_cpus(ctx.case.region, ctx.params.get("threads", "1"),
                                ctx.params.get("cpus", ""), numa=ctx.numa)
        self.shares = split_frags(ctx.pattern.frags, len(self.cpus))
        self.share_bytes = [int(s[:, 2].sum()) for s in self.shares]
        self.kernel = threaded_kernel(form)
        none = np.zeros(0, np.uint64)  # compile here, not in a thread the others would wait for
        self.kernel(ctx.src.array, ctx.dst.array, self.shares[0], np.zeros(1, np.uint64), 1,
                    none, none, np.zeros(1, np.uint64))
        self.per_thread: list[list[np.ndarray]] = [[] for _ in self.cpus]
        self.skews: list[np.ndarray] = []  # per repetition: last start - first start (ns)
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "threads": len(self.cpus),
                     "cpus": self.cpus,
                     "timed": "per repetition, every thread's pass over its share "
                              f"({form.timed}), all started on one barrier; a sample "
                              "is last end - first start; start_skew_*_ns: how far apart the "
                              "threads left the barrier (last start - first start), part of "
                              "every sample; thread_ticks: each thread's start and end TSC "
                              f"readings for the first {THREAD_TICKS_KEPT} samples",
                     "per_thread": [], "thread_ticks": []}

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        count = len(self.cpus)
        gate = np.zeros(1, np.uint64)
        starts = np.zeros((count, n), np.uint64)
        ends = np.zeros((count, n), np.uint64)
        sinks = np.zeros((count, 1), np.uint64)
        src, dst = self.ctx.src.array, self.ctx.dst.array

        def job(k: int):
            return lambda: self.kernel(src, dst, self.shares[k], gate, count, starts[k],
                                       ends[k], sinks[k])

        run_pinned([(cpu, job(k)) for k, cpu in enumerate(self.cpus)])
        ticks = ends.max(axis=0).astype(np.float64) - starts.min(axis=0).astype(np.float64)
        overhead = self.ctx.timer_overhead_ticks
        scale = 1e9 / self.ctx.tsc_hz
        skew = starts.max(axis=0).astype(np.float64) - starts.min(axis=0).astype(np.float64)
        self.skews.append(skew * scale)
        kept = sum(len(batch["starts"][0]) for batch in self.info["thread_ticks"])
        if kept < THREAD_TICKS_KEPT:  # the row's info is JSON: bounded, the samples are not
            room = THREAD_TICKS_KEPT - kept
            self.info["thread_ticks"].append({"starts": starts[:, :room].tolist(),
                                              "ends": ends[:, :room].tolist()})
        for k in range(count):
            own = (ends[k].astype(np.float64) - starts[k].astype(np.float64) - overhead) * scale
            self.per_thread[k].append(np.maximum(own, 0.0))
        self._summarise()
        return ticks, np.maximum(ticks - overhead, 0.0) * scale

    def _summarise(self) -> None:
        rows = []
        for cpu, parts, nbytes in zip(self.cpus, self.per_thread, self.share_bytes, strict=True):
            median = float(np.median(np.concatenate(parts)))
            rows.append({"cpu": cpu, "bytes": nbytes, "median_ns": median,
                         "gbps": nbytes / median if median > 0 else None})
        self.info["per_thread"] = rows
        skews = np.concatenate(self.skews)
        self.info["start_skew_median_ns"] = float(np.median(skews))
        self.info["start_skew_max_ns"] = float(skews.max())

    def close(self) -> None:
        pass


def threaded(method: Method, form: ThreadForm | None) -> Method:
    """The method with `threads` / `cpus` parameters: one thread keeps its own session; more
    (or named CPUs) run ThreadedSession. `form`: the method's multi-thread form, declared here,
    where the method registers (cpu/methods.py, tests/plugin_method.py); with None the method
    is returned unchanged."""
    if form is None:
        return method
    register_thread_form(method.name, form)
    single, own_check = method.open_session, method.check_params

    def open_session(ctx: SessionContext):
        if is_threaded(ctx.params):
            return ThreadedSession(form, ctx)
        return single(ctx)

    def check(params: dict) -> None:
        check_thread_params(params)
        if is_threaded(params):
            check_threaded_drain(params)
        if own_check:
            own_check(params)

    return replace(method, params={**method.params, **THREAD_PARAMS}, open_session=open_session,
                   check_params=check)


def apply_thread_args(cases: list, threads: str | None, cpus: str | None,
                      numa: Iterable[NumaNode] | None = None) -> list:
    """`--threads N|all` / `--cpus LIST` on the selected cases: set on those whose method has a
    multi-thread form, the others dropped; none left is a usage error. `--cpus` alone means one
    thread per named CPU. `numa`: the run's inventory's nodes (else probed)."""

    for option, value in (("--threads", threads), ("--cpus", cpus)):
        if value is not None and not str(value).strip():
            raise UsageError(f"{option} is empty: give "
                             + ("a positive count or 'all'" if option == "--threads"
                                else "a CPU list such as 0-3,8"))
    if threads is None and cpus is None:
        return cases
    extra = {"threads": threads or "all"}
    if cpus:
        extra["cpus"] = cpus
    check_thread_params(extra)
    kept = [replace(case, params=(*[(k, v) for k, v in case.params if k not in extra],
                                  *extra.items()))
            for case in cases if "threads" in case.method_entry.params]
    for case in kept:  # too few CPUs is bad input: exit 2 before anything runs
        node = region_node(case.region)
        if node is None or node_cpus(node, numa=numa):  # a missing node: validate()'s to say
            choose_cpus(case.region, case.param_dict.get("threads", "all"),
                        case.param_dict.get("cpus", ""), numa=numa)
    if not kept:
        from nearlocal.core.methods import methods_with_param

        raise UsageError("--threads / --cpus: none of the selected methods has a multi-thread "
                         f"form (those that do: {', '.join(methods_with_param('threads', 'cpu'))})")
    return list(dict.fromkeys(kept))
