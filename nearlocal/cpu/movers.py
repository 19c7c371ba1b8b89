"""k concurrent movers (`movers=k`): k requests moved at once, each by its own pinned CPU, each out
of its own slots into its own buffer — the contention a serving path's hop sees under load.

Why a parameter and not `threads`: `threads=N` splits ONE pattern between N threads (the pattern
is the total moved, likwid-bench's aggregate bandwidth); `movers=k` gives each of k threads
the WHOLE pattern, placed at its own offset in a mapping k times the pattern's span (source and
destination alike), so no two movers touch the same lines: k requests served at once. Why a
parameter and not a new method: the pass, its fences and its timing are the method's own, so a
`movers=k` row joins the same method's k = 1 row (its ordinary row) in the fit, k a column
(params) beside it.

Per repetition the k movers meet on the compiled spin barrier and each brackets its own pass with
fenced rdtscp (kernels/parallel.threaded_kernel). Sample r of the row is mover r mod k's own
interval: one request's service time while k - 1 others move theirs, so the row's median and GB/s
are per mover. The row's info keeps every mover's samples (ns, the first MOVER_SAMPLES_KEPT),
each mover's median and GB/s, and per repetition the aggregate: k x bytes over last end - first
start."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from nearlocal.core.methods import Method, SessionContext
from nearlocal.core.movers import MOVER_PARAMS, MOVER_SAMPLES_KEPT, MoverTally, parse_movers
from nearlocal.cpu.threads import check_threaded_drain, choose_cpus, run_pinned
from nearlocal.errors import UsageError
from nearlocal.kernels.thread_forms import ThreadForm

PAGE = 4096


def check_mover_params(params: dict) -> None:
    count = parse_movers(params.get("movers", "1"))
    if count > 1 and str(params.get("threads", "1")) != "1":
        raise UsageError("movers=k gives each of k threads its own whole pattern; threads=N "
                         "splits one pattern between N threads: give one of them, not both")
    if count > 1:
        check_threaded_drain(params)


def _round_up(value: int, align: int = PAGE) -> int:
    return -(-max(value, 1) // align) * align


class MoversSession:
    """k pinned movers, each over its own copy of the pattern; a sample = one mover's pass."""

    clock = "tsc"

    def __init__(self, form: ThreadForm, ctx: SessionContext):
        from nearlocal.kernels.parallel import threaded_kernel
        from nearlocal.regions import check_capacity, region_kind

        self.ctx = ctx
        k = parse_movers(ctx.params.get("movers", "1"))
        self.cpus = choose_cpus(ctx.case.region, str(k), ctx.params.get("cpus", ""),
                                numa=ctx.numa)
        frags = ctx.pattern.frags
        src_span = _round_up(int((frags[:, 0] + frags[:, 2]).max(initial=0)))
        dst_span = _round_up(int((frags[:, 1] + frags[:, 2]).max(initial=0)))
        # one mapping k times the span, of the case's own kinds: mover m's slots lie at m x span
        # (a device-dax maps past its end, and SIGBUSes there: refused first)
        check_capacity(ctx.src.spec, k * src_span)
        check_capacity(ctx.dst.spec, k * dst_span)
        self.src = region_kind(ctx.src.spec).open(ctx.src.spec, k * src_span, ctx.src.attr,
                                                  ctx.src.writable)
        try:
            self.dst = region_kind(ctx.dst.spec).open(ctx.dst.spec, k * dst_span, ctx.dst.attr,
                                                      ctx.dst.writable)
        except BaseException:
            self.src.close()
            raise
        self.shares = [np.ascontiguousarray(frags + np.array([m * src_span, m * dst_span, 0],
                                                             np.int64)) for m in range(k)]
        self.nbytes = int(frags[:, 2].sum())
        self.kernel = threaded_kernel(form)
        none = np.zeros(0, np.uint64)  # compile here, not in a thread the others would wait for
        self.kernel(self.src.array, self.dst.array, self.shares[0], np.zeros(1, np.uint64), 1,
                    none, none, np.zeros(1, np.uint64))
        self.info = {"timer_overhead_ticks": ctx.timer_overhead_ticks, "cpus": self.cpus,
                     "timed": f"per repetition, k = {k} movers started on one barrier, each its "
                              f"own pass over the whole pattern ({form.timed}) "
                              "out of its own slots into its own buffer; sample r is mover "
                              "r mod k's interval (per-mover service time); aggregate_gbps: "
                              "k x bytes / (last end - first start) per repetition; "
                              f"mover_samples_ns: each mover's first {MOVER_SAMPLES_KEPT}",
                     # what the movers' kernel mapped: these k-span mappings, not the case's own
                     "mapped": {"src": dict(self.src.info), "dst": dict(self.dst.info)}}
        self.tally = MoverTally(self.nbytes, [{"cpu": cpu} for cpu in self.cpus], self.info)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = len(self.cpus)
        gate = np.zeros(1, np.uint64)
        starts = np.zeros((k, n), np.uint64)
        ends = np.zeros((k, n), np.uint64)
        sinks = np.zeros((k, 1), np.uint64)
        src, dst = self.src.array, self.dst.array

        def job(m: int):
            return lambda: self.kernel(src, dst, self.shares[m], gate, k, starts[m], ends[m],
                                       sinks[m])

        run_pinned([(cpu, job(m)) for m, cpu in enumerate(self.cpus)])
        overhead, scale = self.ctx.timer_overhead_ticks, 1e9 / self.ctx.tsc_hz
        ticks = ends.astype(np.float64) - starts.astype(np.float64)
        own = np.maximum(ticks - overhead, 0.0) * scale
        span = (ends.max(axis=0).astype(np.float64) - starts.min(axis=0).astype(np.float64)
                - overhead) * scale
        raw, ns = self.tally.add(ticks, own, span)
        return raw.astype(np.uint64), ns

    def close(self) -> None:
        self.dst.close()
        self.src.close()


def with_movers(method: Method, form: ThreadForm | None) -> Method:
    """The method with a `movers` parameter: 1 keeps its own session (or threads'), k > 1 runs
    MoversSession. `form`: the method's multi-thread form, as it declared it where it registers;
    with None (no such form) the method is returned unchanged."""
    if form is None:
        return method
    single, own_check = method.open_session, method.check_params

    def open_session(ctx: SessionContext):
        if parse_movers(ctx.params.get("movers", "1")) > 1:
            return MoversSession(form, ctx)
        return single(ctx)

    def check(params: dict) -> None:
        check_mover_params(params)
        if own_check:
            own_check(params)

    return replace(method, params={**method.params, **MOVER_PARAMS}, open_session=open_session,
                   check_params=check)


# the contention suite's k (workloads/kv_methods.py): doubling up to the CPUs, at most this
MAX_SUITE_MOVERS = 8


def mover_counts(cpus: int, most: int = MAX_SUITE_MOVERS) -> list[int]:
    """1, 2, 4, ... up to min(cpus, most), and `cpus` itself when it is not a power of two."""
    top = max(1, min(cpus, most))
    counts = [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    return counts if counts[-1] == top else [*counts, top]
