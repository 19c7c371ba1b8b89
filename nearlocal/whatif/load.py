"""Serving under load (issue 57, docs/whatif.md): requests arrive (a trace or a Poisson stream,
`traffic`), their prefix hits a KV store, the hit part reloads over a serving path whose
transfer time comes from the box's fitted rows (`serving.path_figures`, the same figure as
`nearlocal whatif`), the miss part is prefilled at a rate the user gives. Out per path: TTFT
percentiles with the reload's wait and transfer apart, link utilisation, throughput, and the
largest load whose P99 TTFT stays under a target.

The simulation is a small event loop of our own, no library: one mover per link first come first
served is Lindley's recursion done in numpy (a cumulative max, so a capacity search reruns it
in microseconds); a link shared by the reloads in flight (processor sharing) is a heapq loop over
virtual time; G movers per link on one queue (`Setup.movers`) is the same loop with at most G
in service. How a link fares with k reloads in flight comes from the run's `movers=k` rows of
the path's largest term's way (`LinkContention`, from `contention.contention_of`): a mover's rate
at k relative to one alone, and its service-time spread at k. Where the run has no such rows a
mover's rate is 1 at every k, an assumption said in the path's notes."""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.whatif.paths import SERVING_PATHS
from nearlocal.whatif.references import ReferenceBox
from nearlocal.whatif.serving import Request, WhatifInputs, path_figures, shape_of
from nearlocal.whatif.traffic import Hits, Stream, Trace, prefix_hits

SHARING = ("fifo", "ps")
GRID_POINTS = 24  # reads cut exactly by `nearlocal kv`'s code; others interpolated between
CAPACITY_FLOOR = 1e-4  # the capacity search's lowest load, as a share of the saturating one
CAPACITY_STEPS = 40


# ---------------------------------------------------------------------------------------------
# The link and the GPU: one mover FIFO, or processor sharing


def fifo(arrival: np.ndarray, work: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each job on one server, first come first served (arrivals sorted):
    end_i = max over j <= i of (a_j + w_j + ... + w_i), a cumulative max (Lindley)."""
    total = np.cumsum(work)
    end = total + np.maximum.accumulate(arrival - (total - work))
    return end - work, end


def processor_sharing(arrival: np.ndarray, work: np.ndarray,
                      aggregate: np.ndarray) -> tuple[np.ndarray, float]:
    """End of each job on one link shared by the k jobs in flight, each moving at
    aggregate[k - 1] / k of the one-mover rate (past the measured k: the last figure); and the
    time the link was busy. Every job attains service alike, so one virtual clock (service
    attained per job) and a heap of finishing marks carry it."""
    n = len(arrival)
    end = np.empty(n)
    heap: list[tuple[float, int]] = []
    rates = aggregate.tolist()
    t = virtual = busy = 0.0
    i = 0
    arrivals, works = arrival.tolist(), work.tolist()
    while i < n or heap:
        k = len(heap)
        speed = rates[min(k, len(rates)) - 1] / k if k else 0.0
        done = t + (heap[0][0] - virtual) / speed if k else math.inf
        if i < n and arrivals[i] <= done:
            if k:
                virtual += (arrivals[i] - t) * speed
                busy += arrivals[i] - t
            t = arrivals[i]
            heapq.heappush(heap, (virtual + works[i], i))
            i += 1
        else:
            busy += done - t
            t = done
            virtual, j = heapq.heappop(heap)
            end[j] = t
    return end, busy


def fifo_servers(arrival: np.ndarray, work: np.ndarray, servers: int,
                 rate=None, draw=None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each job on `servers` movers sharing one queue, first come first served
    (arrivals sorted): a job starts when a mover is free; while k jobs are in service each moves
    at `rate(k)` (its speed relative to a mover alone: None, 1 at every k), so a job's time
    changes as others start and end; `draw(k)` (None: 1) scales a job's work by its service-time
    spread at the k in service when it starts. All in-service jobs move at one speed, so one
    clock of attained work and a heap of finishing marks carry it, as for processor sharing."""
    n = len(arrival)
    start, end = np.empty(n), np.empty(n)
    heap: list[tuple[float, int]] = []
    arrivals, works = arrival.tolist(), work.tolist()
    t = attained = 0.0
    i = queued = 0  # jobs [queued, i) have arrived and wait, in arrival order
    while queued < n or heap:
        k = len(heap)
        speed = (1.0 if rate is None else rate(k)) if k else 0.0
        done = t + (heap[0][0] - attained) / speed if k else math.inf
        if i < n and arrivals[i] <= done:
            if k:
                attained += (arrivals[i] - t) * speed
            t = arrivals[i]
            i += 1
        else:
            attained, j = heapq.heappop(heap)
            t = done
            end[j] = t
        while queued < i and len(heap) < servers:
            scale = 1.0 if draw is None else draw(len(heap) + 1)
            start[queued] = t
            heapq.heappush(heap, (attained + works[queued] * scale, queued))
            queued += 1
    return start, end


@dataclass(frozen=True, eq=False)
class Timeline:
    """Each request's TTFT parts in seconds, and each link's busy time."""

    arrival: np.ndarray
    wait: np.ndarray
    transfer: np.ndarray
    prefill_wait: np.ndarray
    prefill: np.ndarray
    busy: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        return self.wait + self.transfer + self.prefill_wait + self.prefill


def simulate(arrival: np.ndarray, transfer: np.ndarray, prefill: np.ndarray | None = None,
             links: int = 1, gpus_per_link: int = 1, sharing: str = "fifo",
             aggregate: np.ndarray | None = None, movers: int = 1,
             contention: LinkContention | None = None, seed: int = 0) -> Timeline:
    """Requests (sorted arrivals) go to the G = links x gpus_per_link GPUs in turn; GPU g
    reloads over link g // gpus_per_link, then prefills its miss part, first come first served
    in the order the reloads end. `transfer`: a request's reload alone on the link (0: nothing
    hit); `prefill`: its miss part's prefill (None: not counted). With `movers` > 1 (fifo) a
    link has that many movers on one queue (`fifo_servers`), each at the per-mover rate
    `contention` measured at the k in service (None: 1 at every k), each job's time drawn from
    the spread measured at its k (seeded by `seed` and the link); `transfer` is then the
    median alone, and the timeline's transfer is the time each job was in service."""
    n = len(arrival)
    gpus = links * gpus_per_link
    gpu = np.arange(n) % gpus
    link = gpu // gpus_per_link
    wait = np.zeros(n)
    moved = np.zeros(n)
    busy = np.zeros(links)
    rates = np.ones(1) if aggregate is None else aggregate
    for index in range(links):
        mine = np.flatnonzero((link == index) & (transfer > 0))
        if not len(mine):
            continue
        if sharing == "ps":
            end, busy[index] = processor_sharing(arrival[mine], transfer[mine], rates)
            wait[mine] = end - arrival[mine] - transfer[mine]  # the sharing's delay
        elif movers > 1:
            draw = None
            if contention is not None:
                rng = np.random.default_rng((seed, index))
                draw = contention.drawer(rng)
            start, end = fifo_servers(arrival[mine], transfer[mine], movers,
                                      None if contention is None else contention.rate, draw)
            wait[mine] = start - arrival[mine]
            moved[mine] = end - start
            busy[index] = float((end - start).sum()) / movers
            continue
        else:
            start, end = fifo(arrival[mine], transfer[mine])
            wait[mine] = start - arrival[mine]
            busy[index] = float(transfer[mine].sum())
        moved[mine] = transfer[mine]
    prefill_wait = np.zeros(n)
    cost = np.zeros(n) if prefill is None else prefill
    if prefill is not None:
        ready = arrival + wait + moved
        for index in range(gpus):
            mine = np.flatnonzero(gpu == index)
            mine = mine[np.argsort(ready[mine], kind="stable")]
            start, _ = fifo(ready[mine], cost[mine])
            prefill_wait[mine] = start - ready[mine]
    return Timeline(arrival, wait, moved, prefill_wait, cost, busy)


# ---------------------------------------------------------------------------------------------
# A link's contention, from a run's movers=k rows


@dataclass(frozen=True, eq=False)
class LinkContention:
    """How a mover of one way of moving bytes fares with k reloads in flight, from a run's
    `movers=k` rows (`contention.contention_of`): its rate relative to a mover alone (the rows'
    per-mover GB/s at k over k = 1's), linear in k between the measured k and the last figure
    past them; and its service-time spread at k (the rows' raw samples over their median; a k
    without samples: the median)."""

    way: str
    ks: tuple[int, ...]
    relative: tuple[float, ...]  # per-mover rate at ks[i] over k = 1's
    spreads: dict[int, np.ndarray]
    rows: tuple[str, ...]

    def rate(self, k: int) -> float:
        """A mover's rate with k in flight over one alone's; past the last measured k the link
        is taken as saturated there (the aggregate stays, each mover's share shrinks)."""
        last = self.ks[-1]
        if k > last:
            return self.relative[-1] * last / k
        return float(np.interp(k, self.ks, self.relative))

    def aggregate(self, upto: int) -> np.ndarray:
        """The link's rate with k = 1..upto in flight over a mover alone's (processor sharing)."""
        return np.array([k * self.rate(k) for k in range(1, max(upto, max(self.ks)) + 1)])

    def spread(self, k: int) -> np.ndarray | None:
        """The spread of the measured k nearest below (or at) k; past the last, the last's."""
        below = [m for m in self.ks if m <= k and m in self.spreads]
        return self.spreads[below[-1]] if below else None

    def without_spread(self) -> LinkContention:
        """The same rates, every service its median (what the spread adds, apart)."""
        return LinkContention(self.way, self.ks, self.relative, {}, self.rows)

    def drawer(self, rng: np.random.Generator):
        def draw(k: int) -> float:
            ratios = self.spread(k)
            return 1.0 if ratios is None else float(ratios[rng.integers(len(ratios))])
        return draw

    def describe(self) -> str:
        figures = ", ".join(f"k={k}: {r:.3g}" for k, r in zip(self.ks, self.relative,
                                                               strict=True))
        return (f"a mover's rate with k reloads in flight from {self.way}'s movers=k rows "
                f"({', '.join(self.rows)}), relative to one alone: {figures} (linear in k "
                f"between, the aggregate of k={self.ks[-1]} past it); with movers per link its "
                "service time drawn from the spread of those rows' samples at k")


UNCONTENDED = ("the run has no movers=k rows for this way: a mover's rate is taken as 1 at every "
               "k (each mover as fast as one alone; an assumption, not a measurement)")


def link_contention(way: str, contention: dict | None, samples=None) -> LinkContention | None:
    """The way's figures from `contention_of(cases, samples)` (its k = 1 row and at least one
    k > 1 row), with the spreads from `samples` (the store's frame) of the rows it names."""
    figures = (contention or {}).get(way) or {}
    if 1 not in figures or len(figures) < 2 or not figures[1].get("per_mover_gbps"):
        return None
    base = float(figures[1]["per_mover_gbps"])
    ks, relative, spreads, rows = [], [], {}, []
    for k, entry in sorted(figures.items()):
        if not entry.get("per_mover_gbps"):
            continue
        ks.append(int(k))
        relative.append(float(entry["per_mover_gbps"]) / base)
        names = tuple(entry.get("rows") or ())
        rows.extend(names)
        ratios = sample_spread(samples, names)
        if ratios is not None:
            spreads[int(k)] = ratios
    return LinkContention(way, tuple(ks), tuple(relative), spreads, tuple(dict.fromkeys(rows)))


# ---------------------------------------------------------------------------------------------
# A path's service model, from the box's rows


@dataclass(frozen=True, eq=False)
class PathService:
    """A serving path's reload of t hit tokens alone on its link: exact (`nearlocal kv`'s cut
    and the fitted hops, as `nearlocal whatif`) at `tokens`, linear in tokens between them; the
    spread of a transfer's time (samples over their median, from the rows of the route's
    largest term; None: the model's median); how its link fares with k reloads in flight
    (`contention`, from the run's movers=k rows of the largest term's way; None: no such rows,
    a mover's rate taken as 1 at every k, said) and the aggregate rate at k it gives."""

    path: str
    what: str
    tokens: np.ndarray
    seconds: np.ndarray
    rows: tuple[str, ...]
    ways: tuple[str, ...]
    measured: bool
    missing: str = ""  # why the path has no figure ("" when it has)
    spread: np.ndarray | None = None
    spread_rows: tuple[str, ...] = ()
    aggregate: np.ndarray = field(default_factory=lambda: np.ones(1))
    notes: tuple[str, ...] = ()
    contention: LinkContention | None = None

    def reload_s(self, hit_tokens: np.ndarray) -> np.ndarray:
        out = np.interp(hit_tokens, self.tokens, self.seconds)
        return np.where(hit_tokens > 0, out, 0.0)


def _grid(values: np.ndarray) -> np.ndarray:
    distinct = np.unique(values[values > 0])
    if len(distinct) <= GRID_POINTS:
        return distinct
    grid = np.geomspace(distinct[0], distinct[-1], GRID_POINTS)
    return np.unique(distinct[np.searchsorted(distinct, grid).clip(0, len(distinct) - 1)])


def sample_spread(samples, rows: tuple[str, ...]) -> np.ndarray | None:
    """The raw samples of `rows` (case ids) in the store's samples frame, each over its row's
    median: how a transfer's time spreads about the figure (None: no samples)."""
    if samples is None or not len(samples) or not rows:
        return None
    picked = samples.loc[samples["case_id"].isin(rows), ["case_id", "ns"]]
    ratios = []
    for _case, group in picked.groupby("case_id", sort=True):
        ns = group["ns"].to_numpy(float)
        ns = ns[np.isfinite(ns) & (ns > 0)]
        if len(ns):
            ratios.append(ns / np.median(ns))
    return np.concatenate(ratios) if ratios else None


def term_way(hop: str, way: str) -> str:
    """A fitted way's name as contention_of keys it: `hop/method` ("memcpy dram -> dram" over
    host-gather: host-gather/memcpy)."""
    return f"{hop}/{way.split()[0]}" if way else hop


def path_service(name: str, request: Request, inputs: WhatifInputs, hit_tokens: np.ndarray,
                 reference: ReferenceBox | None = None, samples=None,
                 contention: dict | None = None) -> PathService:
    """The path's reload time over the hit sizes the workload holds, from the box's rows;
    `contention` (contention_of of the same run) gives its largest term's way under load."""
    what = SERVING_PATHS[name].what
    grid = _grid(hit_tokens)
    if not len(grid):
        return PathService(name, what, np.zeros(1), np.zeros(1), (), (), True,
                           notes=("no request hit the store: nothing reloads",))
    seconds, rows, ways, notes = [], {}, {}, {}
    measured = True
    largest = None
    for position, tokens in enumerate(grid.tolist()):
        one = dataclasses.replace(request, context=int(tokens), cached=1.0, batch=1)
        figures = path_figures(name, one, shape_of(one), inputs.measured, reference,
                               inputs.topology, inputs.box)
        if not figures.complete:
            missing = "; ".join(f"{t.hop} {t.source}" for t in figures.terms if t.ns is None)
            return PathService(name, what, grid, np.zeros(len(grid)), (), (), False,
                               missing=f"incomplete: {missing}")
        seconds.append(figures.reload_ns / 1e9)
        measured &= figures.measured
        for term in figures.terms:
            rows.update(dict.fromkeys(term.rows))
            ways[f"{term.hop}: {term.way if term.source == 'measured' else term.source}"] = None
            if position in (0, len(grid) - 1):  # the smallest and the largest read's notes
                notes.update(dict.fromkeys(term.notes))
        notes.update(dict.fromkeys((*figures.notes, *([figures.shares] if figures.shares else []))))
        largest = figures
    dominant = max(largest.terms, key=lambda t: t.ns)
    spread = sample_spread(samples, dominant.rows) if dominant.source == "measured" else None
    if len(grid) < len(np.unique(hit_tokens[hit_tokens > 0])):
        notes[f"reloads cut exactly at {len(grid)} sizes ({int(grid[0])}..{int(grid[-1])} "
              "tokens), linear in tokens between them"] = None
    contended = (link_contention(term_way(dominant.hop, dominant.way), contention, samples)
                 if dominant.source == "measured" else None)
    notes[contended.describe() if contended else UNCONTENDED] = None
    return PathService(name, what, grid.astype(float), np.asarray(seconds), tuple(rows),
                       tuple(ways), measured, "", spread,
                       dominant.rows if spread is not None else (),
                       contended.aggregate(1) if contended else np.ones(1), tuple(notes),
                       contended)


# ---------------------------------------------------------------------------------------------
# The workload and the setup


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests at load 1 (`base_arrival_s`: a trace's own times, or a stream's unit gaps) and
    the load asked (arrivals are base / load); their input and hit tokens."""

    source: str
    kind: str  # "trace" or "qps"
    base_arrival_s: np.ndarray
    base_rate: float  # requests per second at load 1
    load: float
    input_tokens: np.ndarray
    hit_tokens: np.ndarray
    hit_blocks: int | None = None
    total_blocks: int | None = None
    store: str = ""
    notes: tuple[str, ...] = ()

    @property
    def qps(self) -> float:
        return self.base_rate * self.load


def trace_workload(trace: Trace, hits: Hits | None = None, qps: float | None = None) -> Workload:
    """A trace through a prefix store (unbounded when `hits` is None), at its own times or
    time-scaled to `qps` requests per second on average."""
    hits = hits if hits is not None else prefix_hits(trace)
    if qps is not None and not (qps > 0 and math.isfinite(qps)):
        raise UsageError(f"--qps must be a positive number of requests per second, got {qps}")
    start = trace.arrival_s - trace.arrival_s[0]
    rate = trace.rate if math.isfinite(trace.rate) else 1.0
    load = 1.0 if qps is None else qps / rate
    store = ("unbounded store" if hits.capacity_blocks is None
             else f"LRU store of {hits.capacity_blocks} blocks")
    notes = () if qps is None else (
        f"the trace time-scaled by {load:.4g} to {qps:g} requests/s",)
    return Workload(f"trace {trace.source}", "trace", start, rate, load, trace.input_tokens,
                    hits.tokens, hits.hit_blocks, hits.total_blocks, store, notes)


def stream_workload(stream: Stream, cached: float) -> Workload:
    """A Poisson stream: a synthetic request carries no prefix, so the store is not consulted:
    its `cached` share of the context hits (the request's --cached)."""
    hit = np.rint(stream.input_tokens * cached).astype(np.int64)
    return Workload(f"Poisson at {stream.qps:g} requests/s, contexts {stream.contexts.describe()}"
                    f", seed {stream.seed}", "qps", stream.unit_arrivals, 1.0, stream.qps,
                    stream.input_tokens, hit, store=f"{cached:g} of each context hits (--cached)",
                    notes=("a Poisson stream's requests carry no prefixes: the store is not "
                           "simulated, each reloads its --cached share",))


@dataclass(frozen=True)
class Setup:
    """The serving stack the requests meet: L links, gpus_per_link GPUs on each, how a link is
    shared, the prefill rate per GPU and the TTFT target (both given, never invented)."""

    links: int = 1
    gpus_per_link: int = 1
    sharing: str = "fifo"
    prefill_tokens_per_s: float | None = None
    ttft_target_s: float | None = None
    paths: tuple[str, ...] = ()  # () = every serving path
    seed: int = 0
    movers: int = 1  # movers per link on one queue (fifo): reloads in flight at once

    def check(self) -> None:
        if self.seed < 0:
            raise UsageError(f"--seed must be a whole number >= 0, got {self.seed}")
        if self.movers < 1:
            raise UsageError(f"--movers-per-link must be at least 1, got {self.movers}")
        if self.movers > 1 and self.sharing != "fifo":
            raise UsageError("--movers-per-link is a fifo link's movers: with --link-sharing ps "
                             "every reload in flight moves at once already")
        if self.links < 1:
            raise UsageError(f"--links must be at least 1, got {self.links}")
        if self.gpus_per_link < 1:
            raise UsageError(f"--gpus-per-link must be at least 1, got {self.gpus_per_link}")
        if self.sharing not in SHARING:
            raise UsageError(f"--link-sharing {self.sharing!r}: one of {', '.join(SHARING)}")
        for name, value in (("--prefill-tokens-per-s", self.prefill_tokens_per_s),
                            ("--ttft-target", self.ttft_target_s)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{name} must be a positive number, got {value}")
        unknown = [p for p in self.paths if p not in SERVING_PATHS]
        if unknown:
            raise UsageError(f"--path {unknown[0]!r}: one of {', '.join(SERVING_PATHS)}")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


def percentiles(values: np.ndarray) -> Percentiles:
    p50, p90, p99 = np.percentile(values, [50, 90, 99]) if len(values) else (0.0, 0.0, 0.0)
    return Percentiles(float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class PathLoad:
    """One serving path under the workload (seconds; None where the path has no figure)."""

    path: str
    what: str
    complete: bool
    missing: str
    ttft: Percentiles | None
    reload_wait: Percentiles | None
    transfer: Percentiles | None
    prefill_wait: Percentiles | None
    prefill: Percentiles | None
    link_utilisation: float | None  # the links' busy share, averaged over links
    throughput_rps: float | None  # requests whose first token came, per second of the run
    capacity_qps: float | None  # the largest load whose P99 TTFT <= the target
    capacity: str  # the capacity in words, or why there is none
    rows: tuple[str, ...]
    ways: tuple[str, ...]
    measured: bool
    spread_rows: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadResult:
    run: str
    emulated: str
    reference: str
    model: str
    source: str
    requests: int
    duration_s: float  # the arrivals' span at the load simulated
    qps: float
    mean_input_tokens: float
    hit_ratio: float | None  # blocks hit / blocks (a trace through the store)
    hit_blocks: int | None
    total_blocks: int | None
    hit_token_share: float
    store: str
    setup: Setup
    paths: tuple[PathLoad, ...]
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _draw_spread(service: PathService, n: int, seed: int, index: int) -> np.ndarray:
    if service.spread is None:
        return np.ones(n)
    rng = np.random.default_rng((seed, index))
    return rng.choice(service.spread, n)


def _capacity(work: Workload, transfer: np.ndarray, prefill: np.ndarray | None,
              setup: Setup, service: PathService) -> tuple[float | None, str]:
    target = setup.ttft_target_s
    if target is None:
        return None, "no --ttft-target: capacity not computed"
    aggregate = service.aggregate

    def p99(load: float) -> float:
        timeline = simulate(work.base_arrival_s / load, transfer, prefill, setup.links,
                            setup.gpus_per_link, setup.sharing, aggregate, setup.movers,
                            service.contention, setup.seed)
        return float(np.percentile(timeline.ttft, 99))

    span = float(work.base_arrival_s[-1] - work.base_arrival_s[0]) or 1.0
    if setup.movers > 1:
        contended = service.contention
        aggregate = np.array([setup.movers * (contended.rate(setup.movers) if contended else 1.0)])
    per_load = [transfer.sum() / span / (setup.links * float(aggregate.max()))]
    if prefill is not None:
        per_load.append(prefill.sum() / span / (setup.links * setup.gpus_per_link))
    utilisation = max(per_load)  # of the busiest resource at load 1
    if utilisation <= 0:
        return None, "nothing to move or prefill: no load limits it"
    high = 1.0 / utilisation  # the load that saturates it
    low = high * CAPACITY_FLOOR
    if p99(low) > target:
        return 0.0, (f"none: P99 TTFT > {target:g} s even at {low * work.base_rate:.3g} "
                     "requests/s (the slowest 1 % take longer alone)")
    if p99(high) <= target:
        return high * work.base_rate, (f"{high * work.base_rate:.4g} requests/s: saturation "
                                       "(the busiest link or GPU always busy) before P99 > target")
    for _ in range(CAPACITY_STEPS):
        if high / low < 1.001:
            break
        middle = math.sqrt(low * high)
        low, high = (middle, high) if p99(middle) <= target else (low, middle)
    qps = low * work.base_rate
    return qps, f"{qps:.4g} requests/s (P99 TTFT <= {target:g} s)"


def _assumptions(setup: Setup, work: Workload) -> tuple[str, ...]:
    notes = []
    if setup.sharing == "fifo" and setup.movers == 1:
        notes.append("each link moves one request's KV at a time, first come first served (one "
                     "mover: its k = 1 rows are its figure)")
    elif setup.sharing == "fifo":
        notes.append(f"each link has {setup.movers} movers on one queue, first come first "
                     "served: while k reloads are in service each moves at the per-mover rate the "
                     "run's movers=k rows measured at k, relative to one alone (where a path's "
                     "way has no such rows, 1 at every k: an assumption, said per path)")
    else:
        notes.append("the reloads in flight share a link fairly at the aggregate rate the run's "
                     "movers=k rows measured with k in flight (where a path's way has no such "
                     "rows, one mover's rate: an assumption, said per path); the reload wait is "
                     "what sharing added to a reload alone")
    notes.append(f"requests go to the {setup.links * setup.gpus_per_link} GPUs in turn; "
                 f"{setup.gpus_per_link} GPU(s) share each of the {setup.links} link(s)")
    if setup.prefill_tokens_per_s is None:
        notes.append("no --prefill-tokens-per-s: TTFT here is the reload alone (its wait and "
                     "transfer); the miss part's prefill is not counted")
    else:
        notes.append(f"the miss part is prefilled after the reload, first come first served per "
                     f"GPU, at {setup.prefill_tokens_per_s:g} tokens/s (given; linear in tokens)")
    notes.append("decode, batching and the GPU's other work are not modelled")
    notes.extend(work.notes)
    return tuple(notes)


def serve(inputs: WhatifInputs, work: Workload, setup: Setup, request: Request | None = None,
          reference: ReferenceBox | None = None, samples=None,
          contention: dict | None = None) -> LoadResult:
    """The workload over each serving path of the box (`setup.paths`, or all of them);
    `contention` (contention_of of the run's rows and samples) fills each path's link under
    load where the run measured its way with movers=k."""
    setup.check()
    request = request or Request()
    arrival = work.base_arrival_s / work.load
    hit = work.hit_tokens
    miss = np.maximum(work.input_tokens - hit, 0)
    prefill = (None if setup.prefill_tokens_per_s is None
               else miss / setup.prefill_tokens_per_s)
    results = []
    for name in setup.paths or tuple(SERVING_PATHS):
        index = list(SERVING_PATHS).index(name)  # a path's draws whichever paths run beside it
        service = path_service(name, request, inputs, hit, reference, samples, contention)
        if service.missing:
            results.append(PathLoad(name, service.what, False, service.missing, None, None, None,
                                    None, None, None, None, None, service.missing, (), (), False))
            continue
        transfer = service.reload_s(hit)
        if setup.movers == 1 or service.contention is None:  # else drawn at each job's k
            transfer = transfer * _draw_spread(service, len(hit), setup.seed, index)
        timeline = simulate(arrival, transfer, prefill, setup.links, setup.gpus_per_link,
                            setup.sharing, service.aggregate, setup.movers, service.contention,
                            setup.seed + index)
        ttft = timeline.ttft
        first = float(arrival[0])
        last_end = float((arrival + ttft).max())
        span = max(last_end - first, 1e-12)
        capacity, words = _capacity(work, transfer, prefill, setup, service)
        notes = list(service.notes)
        if service.spread is None:
            notes.append("each transfer takes the model's median (no samples for its rows)")
        else:
            notes.append(f"each transfer's time drawn from the spread of {len(service.spread)} "
                         "samples of its largest term's rows (over their median)")
        results.append(PathLoad(
            name, service.what, True, "", percentiles(ttft), percentiles(timeline.wait),
            percentiles(timeline.transfer),
            None if prefill is None else percentiles(timeline.prefill_wait),
            None if prefill is None else percentiles(timeline.prefill),
            float(timeline.busy.sum() / (setup.links * span)), len(ttft) / span, capacity,
            words, service.rows, service.ways, service.measured, service.spread_rows,
            tuple(notes)))
    total_tokens = float(work.input_tokens.sum())
    return LoadResult(
        inputs.run, inputs.emulated, reference.label if reference else "", request.model,
        work.source, len(arrival), float(arrival[-1] - arrival[0]), work.qps,
        float(work.input_tokens.mean()),
        None if work.total_blocks is None else work.hit_blocks / max(work.total_blocks, 1),
        work.hit_blocks, work.total_blocks,
        float(hit.sum() / total_tokens) if total_tokens else 0.0, work.store, setup,
        tuple(results), _assumptions(setup, work))


# ---------------------------------------------------------------------------------------------
# One request's shape at shares of a path's own capacity (the report's section)


@dataclass(frozen=True)
class AtShare:
    """A path under a Poisson stream of one request shape at `share` of what one link carries
    (its reload alone, back to back): no QPS is assumed, the load is the path's own."""

    share: float
    qps: float
    load: PathLoad


@dataclass(frozen=True)
class PathAtShares:
    path: str
    what: str
    missing: str
    reload_s: float | None  # the request's reload alone on the link
    shares: tuple[AtShare, ...]
    rows: tuple[str, ...]


def at_shares(inputs: WhatifInputs, request: Request, shares: tuple[float, ...] = (0.5, 0.8),
              requests: int = 20000, seed: int = 0, reference: ReferenceBox | None = None,
              samples=None) -> tuple[PathAtShares, ...]:
    """Each serving path fed `request` as a Poisson stream at each share of its one link's
    capacity: the reload's P99 wait and TTFT (reload alone: no prefill rate is assumed)."""
    from nearlocal.whatif.traffic import Contexts, poisson

    out = []
    hit = np.array([request.cached_tokens])
    for name in SERVING_PATHS:
        service = path_service(name, request, inputs, hit, reference, samples)
        if service.missing:
            out.append(PathAtShares(name, service.what, service.missing, None, (), ()))
            continue
        alone = float(service.reload_s(hit)[0])
        found = []
        for share in shares:
            qps = share / alone
            stream = poisson(qps, requests, Contexts("fixed", request.context), seed)
            result = serve(inputs, stream_workload(stream, request.cached),
                           Setup(paths=(name,), seed=seed), request, reference, samples)
            found.append(AtShare(share, qps, result.paths[0]))
        out.append(PathAtShares(name, service.what, "", alone, tuple(found), service.rows))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Acceptance: a load figure of one serving path (acceptance.spec's whatif = { qps = ... })

LOAD_OPTIONS = ("qps", "requests", "contexts", "links", "link_sharing", "seed", "ttft_target")
LOAD_METRICS = ("ttft_p50_ns", "ttft_p90_ns", "ttft_p99_ns", "capacity_qps")


def load_options(options: dict, parse_tokens) -> dict:
    """A requirement's load options checked as the command checks its flags: qps (> 0),
    requests, contexts (read by `parse_tokens`, the command's), links, link_sharing, seed,
    ttft_target (a duration)."""
    from nearlocal.units import parse_duration
    from nearlocal.whatif.traffic import MAX_STREAM_REQUESTS, parse_contexts

    checked = dict(options)
    for key, kind in (("qps", float), ("requests", int), ("links", int), ("seed", int),
                      ("contexts", str), ("link_sharing", str)):
        value = checked.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, int | float if kind is float else kind)):
            raise UsageError(f"whatif: {key} must be {'text' if kind is str else 'a number'}"
                             f"{' (whole)' if kind is int else ''}, got {value!r}")
    qps = checked.get("qps")
    if qps is None:
        raise UsageError(f"whatif: a load figure needs qps (and may give "
                         f"{', '.join(LOAD_OPTIONS[1:])})")
    if not (qps > 0 and math.isfinite(qps)):
        raise UsageError(f"whatif: qps must be a positive number of requests per second, got "
                         f"{qps!r}")
    if not 1 <= checked.get("requests", 10000) <= MAX_STREAM_REQUESTS:
        raise UsageError(f"whatif: requests must lie in 1..{MAX_STREAM_REQUESTS}")
    if checked.get("seed", 0) < 0:
        raise UsageError("whatif: seed must be a whole number >= 0")
    if "ttft_target" in checked:
        checked["ttft_target"] = parse_duration(checked["ttft_target"])
    parse_contexts(checked.get("contexts", "fixed"), 1, parse_tokens)
    Setup(checked.get("links", 1), 1, checked.get("link_sharing", "fifo")).check()
    return checked


def derived_load(inputs: WhatifInputs, path: str, request: Request, options: dict, parse_tokens,
                 samples=None) -> PathLoad:
    """One path under a seeded Poisson stream of `request` (options as load_options gave)."""
    from nearlocal.whatif.traffic import parse_contexts, poisson

    contexts = parse_contexts(options.get("contexts", "fixed"), request.context, parse_tokens)
    seed = options.get("seed", 0)
    stream = poisson(float(options["qps"]), options.get("requests", 10000), contexts, seed)
    setup = Setup(options.get("links", 1), request.gpus_per_link,
                  options.get("link_sharing", "fifo"), request.prefill_tokens_per_s,
                  options.get("ttft_target"), (path,), seed)
    return serve(inputs, stream_workload(stream, request.cached), setup, request,
                 samples=samples).paths[0]
