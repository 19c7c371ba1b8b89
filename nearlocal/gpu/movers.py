"""k concurrent movers on the GPU (`movers=k`, issue 57): k requests moved at once between host
memory and the GPU, each on its own CUDA stream, each out of its own slots into its own buffer -
the contention a serving path's host->gpu / pool->gpu hop sees under load. With `devices=D` the k
movers are spread round robin over D GPUs (the peer's and the next D - 1), each mover's buffer on
its own GPU: the same hop with several devices pulling at once.

The pattern and the calls are the method's own: mover m is the method's ordinary session (its
calls, its prime, its byte check) over the pattern shifted to m's slots (a host mapping k times
the pattern's span, one device mapping per GPU), on its own stream; this module only queues the
k sessions' work together and times it. So a `movers=k` row joins the same method's k = 1 row
(its ordinary row) in the contention fit (whatif/contention.py), k a column (params) beside it.

Device time, as a single mover's (gpu/timing.py): the work queued behind the blocking kernel on a
stream of the peer's GPU (the control stream). Per repetition, on the control stream: the spin,
then the `gate` event; every mover's stream waits on the gate, runs its 1-byte prime copy
(prime=1) and records `primed`; the control stream waits on every `primed` and records `start`;
every mover's stream waits on `start`, records its own start event, queues its calls or launch
and records its own end event; the control stream waits on every mover's end and records
`stop`. So:
- start..stop, one event pair spanning all k (the primes outside it, the cross-stream waits in
  it) -> the aggregate: k x bytes over the span, minus an empty span's cost;
- each mover's own start..end (events on its own stream and GPU) -> its service time while the
  k - 1 others ran theirs, minus an empty own interval's cost. Sample r of the row is mover
  r mod k's, so the row's median and GB/s are per mover, as the CPU movers' (cpu/movers.py).
Many calls (one cudaMemcpyAsync per fragment) are queued in chunks, each chunk of every mover
behind its own blocking kernel, the chunks' intervals summed (`queued_chunks`). If the host was
late (the start event completed before every mover's calls were queued) the interval is thrown
away and the spin lengthened. Only device timing: an e2e figure of k streams would be the host's
issue loop, not the movers."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import numpy as np

from nearlocal.core.methods import Method, SessionContext
from nearlocal.core.movers import MOVER_SAMPLES_KEPT, parse_movers
from nearlocal.errors import Unavailable, UsageError
from nearlocal.gpu.regions import gpu_access
from nearlocal.gpu.timing import ATTEMPTS, FIRST_CHUNK, MAX_SPIN_NS, MIN_SPIN_NS, OVERHEAD_SAMPLES

GPU_MOVER_PARAMS = {"movers": "1", "devices": "1"}
MAX_GPU_MOVERS = 64  # streams at once: beyond this the row says nothing a serving path meets
PAD = 4096


def parse_devices(text: object) -> int:
    text = str(text).strip()
    if not re.fullmatch(r"\d{1,3}", text) or int(text) < 1:
        raise UsageError(f"malformed devices={text!r}: use a positive count of GPUs the movers "
                         "are spread over (1: the peer's alone)")
    return int(text)


def check_gpu_mover_params(params: dict) -> None:
    """movers=k (1..64 streams), devices=D (1..k GPUs), device timing only: bad input, exit 2."""
    k = parse_movers(params.get("movers", "1"))
    devices = parse_devices(params.get("devices", "1"))
    if k > MAX_GPU_MOVERS:
        raise UsageError(f"movers={k}: at most {MAX_GPU_MOVERS} concurrent streams")
    if devices > k:
        raise UsageError(f"devices={devices} spreads the movers over that many GPUs: give at "
                         f"least as many movers (movers={k})")
    if k > 1 and str(params.get("timing", "device")) != "device":
        raise UsageError("movers=k is timed on the device (events per stream and one pair "
                         "spanning all k): timing=e2e would time the host's issue loop")


def devices_needed(params: dict, inventory) -> str | None:
    """A case's devices=D beyond the box's GPUs: a skipped row (Method.case_needs)."""
    try:
        devices = parse_devices(params.get("devices", "1"))
    except UsageError:
        return None  # check_params refuses it
    count = len(inventory.gpu.devices) if inventory is not None else 0
    if devices > 1 and devices > count:
        return f"devices={devices}: this box has {count} GPU(s)"
    return None


def _round_up(value: int, align: int = PAD) -> int:
    return -(-max(value, 1) // align) * align


class GpuMoversSession:
    """k movers, each the method's own session on its own stream over its own slots; a sample is
    one mover's interval (see the module)."""

    clock = "cuda-event"

    def __init__(self, ctx: SessionContext, single, method: str):
        import cupy as cp

        from nearlocal.kernels import cuda as kernels
        from nearlocal.regions import parse_region, region_kind

        self.cp, self.ctx = cp, ctx
        k = parse_movers(ctx.params.get("movers", "1"))
        spread = parse_devices(ctx.params.get("devices", "1"))
        if str(ctx.params.get("timing", "device")) != "device":
            raise UsageError("movers=k is timed on the device only (timing=device)")
        reading = ctx.case.access == "read"
        host, gpu = (ctx.src, ctx.dst) if reading else (ctx.dst, ctx.src)
        base = gpu_access(gpu).device
        if base is None or gpu_access(host).device is not None:
            raise UsageError(f"movers=k on {method} moves between host memory and a GPU: use a "
                             "host region and --peer gpu:K")
        count = int(cp.cuda.runtime.getDeviceCount())
        if spread > count:
            raise Unavailable(f"devices={spread}: this box has {count} GPU(s)")
        self.gpus = [(base + m % spread) % count for m in range(k)]
        frags = ctx.pattern.frags
        host_col, gpu_col = (0, 1) if reading else (1, 0)
        host_span = _round_up(int((frags[:, host_col] + frags[:, 2]).max(initial=0)))
        gpu_span = _round_up(int((frags[:, gpu_col] + frags[:, 2]).max(initial=0)))
        slot = [self.gpus[:m].count(g) for m, g in enumerate(self.gpus)]  # m's slot on its GPU
        self.regions: list = []
        self.subs: list = []
        try:
            host_map = region_kind(host.spec).open(host.spec, k * host_span, host.attr,
                                                   host.writable)
            self.regions.append(host_map)
            gpu_maps = {}
            for g in dict.fromkeys(self.gpus):
                spec = parse_region(f"gpu:{g}")
                gpu_maps[g] = region_kind(spec).open(spec, self.gpus.count(g) * gpu_span, "wb",
                                                     True)
                self.regions.append(gpu_maps[g])
            single_params = {**ctx.params, "movers": "1", "devices": "1"}
            for m, g in enumerate(self.gpus):
                shift = np.zeros(3, np.int64)
                shift[host_col], shift[gpu_col] = m * host_span, slot[m] * gpu_span
                pattern = replace(ctx.pattern, frags=np.ascontiguousarray(frags + shift))
                src, dst = (host_map, gpu_maps[g]) if reading else (gpu_maps[g], host_map)
                sub = single(replace(ctx, src=src, dst=dst, pattern=pattern,
                                     params=single_params))
                self.subs.append(sub)
                if getattr(sub, "synchronous", False) or not hasattr(sub, "enqueue_range"):
                    raise UsageError(f"movers=k queues each mover's work on its own stream: "
                                     f"{ctx.case.region} is pageable (the copies may block the "
                                     "host); use pinned or registered:<region>")
        except BaseException:
            self.close()
            raise
        self.k, self.base = k, base
        self.nbytes = int(frags[:, 2].sum())
        self.ops = int(self.subs[0].ops)
        self.primed = getattr(self.subs[0].timer, "prime", None) is not None  # its own rule
        with cp.cuda.Device(base):
            self.kernels = kernels.compiled(cp)
            self.stream = cp.cuda.Stream(non_blocking=True)  # the control stream
            self._spin_out = cp.zeros(1, dtype=cp.uint64)
            self.gate, self.start, self.stop = (cp.cuda.Event() for _ in range(3))
        self.marks = []  # per mover: primed, own start, own end (events of its own GPU)
        for g in self.gpus:
            with cp.cuda.Device(g):
                self.marks.append(tuple(cp.cuda.Event() for _ in range(3)))
        self.spin_ns, self.max_spin_ns, self.chunk = MIN_SPIN_NS, MIN_SPIN_NS, FIRST_CHUNK
        self.retries = self.max_intervals = 0
        self.span_overhead_ns, self.own_overhead_ns = self._calibrate()
        self.own: list[list[np.ndarray]] = [[] for _ in range(k)]
        self.spans: list[np.ndarray] = []
        self.taken = 0
        first = self.subs[0].info
        self.info = {
            **{key: first[key] for key in ("timing", "src_memory", "dst_memory", "calls",
                                           "batch_api", "threads", "width", "pieces")
               if key in first},
            "gpu": base, "movers": k, "devices": spread, "mover_gpus": self.gpus,
            "bytes_per_mover": self.nbytes, "primed": self.primed,
            "timer_overhead_ns": self.own_overhead_ns,
            "timer_overhead_kind": "per mover: an empty own interval (its two events behind the "
                                   "shared start), once per chunk",
            "span_overhead_ns": self.span_overhead_ns,
            "timed": f"per repetition, k = {k} movers (CUDA streams"
                     + (f" over {spread} GPUs" if spread > 1 else "") + "), each the method's "
                     "own calls over the whole pattern out of its own slots into its own buffer, "
                     "queued behind one blocking kernel and released together by one start "
                     "event; sample r is mover r mod k's own interval (its stream's events: "
                     "per-mover service time); aggregate_gbps: k x bytes / (start..stop, the "
                     "one event pair spanning all k, minus an empty span) per repetition; "
                     f"mover_samples_ns: each mover's first {MOVER_SAMPLES_KEPT}",
            "device_contains": "per mover: its stream's events around its calls, after the "
                               "shared start event" + ("; its 1-byte prime copy runs before "
                                                       "the start, outside both intervals"
                                                       if self.primed else ""),
            "per_mover": [], "mover_samples_ns": [[] for _ in range(k)],
            "mapped": {"host": dict(host_map.info),
                       "gpu": {str(g): dict(r.info) for g, r in gpu_maps.items()}},
        }

    # -- one repetition ---------------------------------------------------------------------
    def _try(self, lo: int, hi: int, empty: bool) -> tuple[float, np.ndarray] | None:
        cp, control = self.cp, self.stream
        with cp.cuda.Device(self.base):
            self.kernels.spin(self.spin_ns, int(self._spin_out.data.ptr), control)
            self.gate.record(control)
        for sub, g, (primed, _, _) in zip(self.subs, self.gpus, self.marks, strict=True):
            with cp.cuda.Device(g):
                sub.stream.wait_event(self.gate)
                if self.primed:
                    sub.prime()
                primed.record(sub.stream)
        with cp.cuda.Device(self.base):
            for primed, _, _ in self.marks:
                control.wait_event(primed)
            self.start.record(control)
        t0 = time.perf_counter_ns()
        for sub, g, (_, own_start, own_end) in zip(self.subs, self.gpus, self.marks, strict=True):
            with cp.cuda.Device(g):
                sub.stream.wait_event(self.start)
                own_start.record(sub.stream)
                if not empty:
                    sub.enqueue_range(lo, hi)
                own_end.record(sub.stream)
        with cp.cuda.Device(self.base):
            for _, _, own_end in self.marks:
                control.wait_event(own_end)
            self.stop.record(control)
        host_ns = time.perf_counter_ns() - t0
        early = self.start.done  # the GPU reached the work before the host finished queueing
        self.stop.synchronize()
        if early:
            self.retries += 1
            self.spin_ns = min(max(2 * self.spin_ns, 2 * host_ns + MIN_SPIN_NS), MAX_SPIN_NS)
            self.max_spin_ns = max(self.max_spin_ns, self.spin_ns)
            return None
        span = cp.cuda.get_elapsed_time(self.start, self.stop) * 1e6
        own = np.array([cp.cuda.get_elapsed_time(a, b) * 1e6 for _, a, b in self.marks])
        return float(span), own

    def _repetition(self, empty: bool = False) -> tuple[float, np.ndarray, int]:
        """(span ns, each mover's ns, intervals) of every mover's ops 0..ops, in chunks."""
        span, own, lo, intervals = 0.0, np.zeros(self.k), 0, 0
        ops = 1 if empty else self.ops
        while lo < ops:
            hi = min(ops, lo + self.chunk)
            got = None
            for _ in range(ATTEMPTS):
                got = self._try(lo, hi, empty)
                if got is not None:
                    break
            if got is None and hi - lo > 1:
                self.chunk = max(1, (hi - lo) // 2)
                continue
            if got is None:
                raise RuntimeError(f"movers={self.k}: one call of each mover outran a "
                                   f"{self.spin_ns} ns blocking kernel {ATTEMPTS} times (the "
                                   "host blocked in the call); no interval to time")
            span, own = span + got[0], own + got[1]
            intervals += 1
            lo = hi
        self.max_intervals = max(self.max_intervals, intervals)
        return span, own, intervals

    def _calibrate(self) -> tuple[float, float]:
        spans, owns = [], []
        for _ in range(OVERHEAD_SAMPLES):
            span, own, _ = self._repetition(empty=True)
            spans.append(span)
            owns.extend(own)
        return float(np.median(spans)), float(np.median(owns))

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.k
        raw = np.zeros((k, n))
        own = np.zeros((k, n))
        spans = np.zeros(n)
        for r in range(n):
            span, mine, intervals = self._repetition()
            raw[:, r] = mine
            own[:, r] = np.maximum(mine - intervals * self.own_overhead_ns, 0.0)
            spans[r] = max(span - intervals * self.span_overhead_ns, 0.0)
        self.spans.append(spans)
        for m in range(k):
            self.own[m].append(own[m])
            kept = self.info["mover_samples_ns"][m]
            room = MOVER_SAMPLES_KEPT - len(kept)
            if room > 0:
                kept.extend(float(v) for v in own[m, :room])
        pick = (self.taken + np.arange(n)) % k  # sample r: mover r mod k
        self.taken += n
        cols = np.arange(n)
        self._summarise()
        return raw[pick, cols] / 1e6, own[pick, cols]  # raw: ms, as cudaEventElapsedTime

    def _summarise(self) -> None:
        rows = []
        for m, (g, parts) in enumerate(zip(self.gpus, self.own, strict=True)):
            median = float(np.median(np.concatenate(parts)))
            rows.append({"stream": m, "gpu": g, "median_ns": median,
                         "gbps": self.nbytes / median if median > 0 else None})
        spans = np.concatenate(self.spans)
        spans = spans[spans > 0]
        self.info.update(
            per_mover=rows,
            span_median_ns=float(np.median(spans)) if spans.size else None,
            aggregate_gbps=(float(np.median(self.k * self.nbytes / spans)) if spans.size
                            else None),
            spin_ns=self.spin_ns, spin_max_ns=self.max_spin_ns, spin_retries=self.retries,
            queued_chunks=self.max_intervals, chunk_ops=self.chunk)

    def close(self) -> None:
        for sub in self.subs:
            sub.close()
        self.subs = []
        for region in reversed(self.regions):
            region.close()
        self.regions = []


def with_gpu_movers(method: Method) -> Method:
    """The GPU method with `movers` and `devices` parameters: movers=1 keeps its own session,
    k > 1 runs GpuMoversSession over k of them; devices=D beyond the box's GPUs is a skipped
    row (Method.case_needs)."""
    single, own_check = method.open_session, method.check_params

    def open_session(ctx: SessionContext):
        if parse_movers(ctx.params.get("movers", "1")) > 1:
            return GpuMoversSession(ctx, single, method.name)
        return single(ctx)

    def check(params: dict) -> None:
        check_gpu_mover_params(params)
        if own_check:
            own_check(params)

    return replace(method, params={**method.params, **GPU_MOVER_PARAMS},
                   open_session=open_session, check_params=check, case_needs=devices_needed)
