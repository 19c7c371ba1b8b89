"""A path model per way of moving bytes, fitted from a run's rows (or stated by a reference box):

    T(n, s) = a * calls(n) + n * c(s),   c(s) = d(s) + s / BW(s)

`a` is the per-call cost: the smallest single-transfer row less its bytes at the best bandwidth
the single-transfer rows reach. `calls(n)` is the method's rule (`Method.delivery`: one launch,
one copy per fragment, one RDMA work request per max_sge pieces). `c(s)`, one fragment's cost
inside a call, comes from the many-fragment rows, (T - a * calls(n)) / n at their fragment size,
interpolated in log size between them; `d(s)` is what c(s) adds to the single-transfer curve.
Without many-fragment rows c(s) is that curve less `a` (d taken as 0, said). A single transfer
is T1(s) = a + s / BW(s): the single-transfer rows themselves, interpolated. Outside the measured
sizes nothing is extrapolated silently: the figure carries a note naming the nearest size.
Every prediction names the rows (case ids) it came from.

A row stands for a hop only when what it moved came from memory and landed in memory (its
`reaches_memory` and `source_reaches_memory`, core/rows.py), and a way stands for a gather only
when its method can read scattered fragments (a read access: nt-copy only writes, so it can
scatter but not gather). A way the CPU moves is bounded by the box's own ceiling for its source:
the best read of that region from memory the run measured with as many threads or more (a CPU
method that lands nothing, e.g. `load --threads N` beyond the LLC): no figure reads faster (said
in a note), and a run without such a row says so."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from nearlocal.core.methods import CALL_RULES, Delivery, load_methods
from nearlocal.lazy import lazy_import
from nearlocal.params import decode_params_or_none
from nearlocal.units import format_size
from nearlocal.whatif.paths import HOPS

pd = lazy_import("pandas")  # the command line's help and its registration import this module


@dataclass(frozen=True)
class Point:
    """One row's figure: a single transfer's time at `size`, or one fragment's cost at the
    fragment size `size` (many-fragment rows)."""

    size: int
    ns: float
    case_id: str


@dataclass(frozen=True)
class Prediction:
    ns: float
    rows: tuple[str, ...]  # case ids, or the reference's name
    notes: tuple[str, ...] = ()
    outside: bool = False  # the size lies outside what the rows measured (a note says how)


class _At(NamedTuple):
    """A curve's figure at one size, the rows it came from, and whether it left them."""

    ns: float
    notes: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()
    outside: bool = False


def _curve(points: tuple[Point, ...], size: int, what: str, origin: float | None = None) -> _At:
    """The curve through `points` at `size`: linear in size between neighbours (a transfer's
    time is a fixed cost plus bytes over a bandwidth, piecewise); below the smallest, its figure,
    or with `origin` (the per-call cost a) the line from (0, a) to it: its bandwidth beyond a (a
    curve of memory-sized rows only, 64 MiB, must not give an 8 KiB transfer 64 MiB's time);
    beyond the largest, the last segment's slope (its marginal bandwidth), said in a note."""
    ordered = sorted(points, key=lambda p: p.size)
    low, high = ordered[0], ordered[-1]
    if size < low.size:
        if origin is not None and origin < low.ns:
            return _At(origin + (low.ns - origin) * size / low.size, (
                f"{what} at {format_size(size)} is below the smallest measured "
                f"({format_size(low.size)}): at its bandwidth beyond a",), (low.case_id,), True)
        return _At(low.ns, (f"{what} at {format_size(size)} is below the smallest measured "
                            f"({format_size(low.size)}): its figure taken",), (low.case_id,), True)
    if size > high.size:
        before = ordered[-2] if len(ordered) > 1 else None
        slope = ((high.ns - before.ns) / (high.size - before.size)
                 if before is not None and high.ns > before.ns else high.ns / high.size)
        note = (f"{what} at {format_size(size)} is beyond the largest measured "
                f"({format_size(high.size)}): extrapolated at its marginal bandwidth")
        used = (high.case_id,) if before is None else (before.case_id, high.case_id)
        return _At(high.ns + (size - high.size) * slope, (note,), used, True)
    for left, right in itertools.pairwise(ordered):
        if left.size <= size <= right.size:
            share = (size - left.size) / (right.size - left.size) if right.size > left.size else 0
            return _At(left.ns + share * (right.ns - left.ns), (), (left.case_id, right.case_id))
    return _At(low.ns, (), (low.case_id,))  # one point, at its size


@dataclass(frozen=True)
class Ceiling:
    """The box's best read of one region from memory: what no CPU-moved figure reading that
    region may exceed."""

    region: str
    bytes_per_ns: float  # = GB/s
    threads: int
    case_id: str
    method: str

    def note(self) -> str:
        return (f"the box's best read of {self.region} from memory, {self.method} with "
                f"{self.threads} thread{'s' if self.threads != 1 else ''} "
                f"({self.bytes_per_ns:.1f} GB/s, row {self.case_id})")


@dataclass(frozen=True)
class PathFit:
    """One way of moving bytes over a hop: a method between two regions with its params
    (measured), or a reference box's stated figures (`bandwidth_gbps` set)."""

    hop: str
    way: str  # what it is, in words: "memcpy dram -> dram" or "reference beluga-h20"
    calls: str  # a CALL_RULES key
    call_ns: float  # a
    singles: tuple[Point, ...] = ()
    fragmented: tuple[Point, ...] = ()
    facts: dict = field(default_factory=dict)  # the rows' effective params and info (max_sge)
    source: str = "measured"  # "measured" or "reference NAME (kind, source, date)"
    bandwidth_gbps: float | None = None  # a reference's: T1(s) = a + s / BW
    fragment_ns: float = 0.0  # a reference's d
    notes: tuple[str, ...] = ()  # what the fit itself had to assume
    gathers: bool = True  # its method can read scattered fragments (a read), not only scatter
    ceiling: Ceiling | None = None  # the box's best read of its source (a CPU-moved way's)
    gpus: tuple[int, ...] = ()  # the GPUs its rows moved bytes to or from (gpu:K), measured

    @property
    def measured(self) -> bool:
        return self.bandwidth_gbps is None

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(p.case_id for p in (*self.singles, *self.fragmented)) or (self.source,)

    def calls_for(self, fragments: int) -> int:
        return calls(self.calls, fragments, self.facts)

    def single(self, size: int) -> _At:
        """T1(s): one contiguous transfer of `size` bytes."""
        if not self.measured:
            return _At(self.call_ns + size / self.bandwidth_gbps, (), (self.source,))
        if not self.singles:  # the model stands on many-fragment rows alone
            at = _curve(self.fragmented, size, "a fragment")
            return at._replace(ns=self.call_ns + at.ns, notes=(*at.notes, "no single-transfer "
                               "rows: one transfer taken as one call of one fragment"))
        return _curve(self.singles, size, "a single transfer", self.call_ns)

    def per_fragment(self, size: int) -> _At:
        """c(s): one fragment of `size` bytes inside a call: the many-fragment rows' curve
        within their sizes; outside them the single-transfer curve less a, plus the per-fragment
        cost d of the nearest many-fragment row (said)."""
        if not self.measured:
            return _At(self.fragment_ns + size / self.bandwidth_gbps, (), (self.source,))
        low = min((p.size for p in self.fragmented), default=None)
        high = max((p.size for p in self.fragmented), default=None)
        if low is not None and (low <= size <= high or not self.singles):
            return _curve(self.fragmented, size, "a fragment")
        at = self.single(size)
        if low is None:
            return at._replace(ns=max(at.ns - self.call_ns, 0.0), notes=(
                *at.notes, "no many-fragment rows: per-fragment cost d not measured, taken as 0"))
        nearest = min(self.fragmented, key=lambda p: abs(math.log(p.size / size)))
        d = nearest.ns - max(self.single(nearest.size).ns - self.call_ns, 0.0)
        note = (f"fragments of {format_size(size)} lie outside the many-fragment rows "
                f"({format_size(low)} .. {format_size(high)}): the single-transfer curve less a, "
                f"plus d at {format_size(nearest.size)}")
        return _At(at.ns - self.call_ns + d, (*at.notes, note), (*at.rows, nearest.case_id), True)

    def predict(self, fragments: int, size: int) -> Prediction:
        """T(n, s) for `fragments` pieces of `size` bytes each, never faster than the box's
        ceiling for the source (said when it binds)."""
        n = max(1, int(fragments))
        if n == 1:
            at = self.single(size)
            ns = at.ns
        else:
            at = self.per_fragment(size)
            ns = max(self.call_ns * self.calls_for(n) + n * at.ns, 0.0)
        rows, notes = at.rows, (*self.notes, *at.notes)
        if self.ceiling is not None and ns * self.ceiling.bytes_per_ns < n * size:
            fitted = n * size / ns if ns > 0 else math.inf
            ns = n * size / self.ceiling.bytes_per_ns
            rows = (*rows, self.ceiling.case_id)
            notes = (*notes, f"the fit gives {fitted:.1f} GB/s, above {self.ceiling.note()}: "
                             "taken at that ceiling")
        return Prediction(ns, tuple(dict.fromkeys(rows)), notes, at.outside)


# ---------------------------------------------------------------------------------------------
# Fitting from a run's rows


def _isolated(effective: dict) -> bool:
    """Rows timed as isolated transfers, as one reload is (methods without drain count); a
    `movers=k` row (k > 1) is one of k transfers at once: contention (contention.py reads it),
    not a transfer alone."""
    return (str(effective.get("drain", "before")) == "before"
            and str(effective.get("movers", "1")).strip() in ("1", ""))


def _cache_resident(reaches_memory: object) -> bool:
    """A row stored as not reaching memory; older rows without the column count as reaching it
    (as compare takes them)."""
    return reaches_memory is not None and reaches_memory == reaches_memory \
        and not bool(reaches_memory)


def _ends(row: pd.Series) -> tuple[str, str] | None:
    """(source class, destination class) of a row as a reload moves bytes: a read moves the
    region's fragments into the peer; a write moves the peer into the region, and stands for a
    reload only when contiguous (no layout side: a scatter is not a gather)."""
    region, peer = str(row.get("pool_class")), str(row.get("peer_pool_class"))
    if row.get("access") == "read":
        return region, peer
    count = pd.to_numeric(row.get("fragment_count"), errors="coerce")
    return (peer, region) if count == 1 else None


def usable_rows(cases: pd.DataFrame) -> pd.DataFrame:
    """The rows a path model may stand on: measured transfers of methods that deliver the bytes
    (Method.delivery), timed as isolated transfers, on write-back memory, whose source and
    destination both reached memory (a reload's gigabytes never sit in a CPU cache: a row that
    read its source from a cache, nt-copy's 16 KiB among them although its stores reach memory,
    would make the host side read fast), with a median; each with its hop, delivery, whether
    its method can gather (a read access) and effective params."""
    methods = load_methods()
    keep = []
    for index, row in cases.iterrows():
        method = methods.get(str(row.get("method")))
        delivery: Delivery | None = method.delivery if method else None
        median = pd.to_numeric(row.get("median_ns"), errors="coerce")
        effective = decode_params_or_none(row.get("effective_params"))
        ends = _ends(row)
        if (delivery is None or ends is None or row.get("status") != "ok"
                or _cache_resident(row.get("reaches_memory"))
                or _cache_resident(row.get("source_reaches_memory"))
                or row.get("measures", "transfer") != "transfer" or median != median
                or median <= 0 or str(row.get("attr", "wb")) not in ("wb", "")
                or not _isolated(effective)):
            continue
        src, dst = ends
        for hop in HOPS.values():
            if hop.takes(delivery.mover, src, dst):
                keep.append((index, hop.name, delivery.calls, effective, delivery.mover,
                             "read" in method.accesses))
    if not keep:
        return cases.iloc[0:0].assign(hop=[], calls=[], effective=[], mover=[], gathers=[])
    frame = cases.loc[[k[0] for k in keep]].copy()
    for position, column in enumerate(("hop", "calls", "effective", "mover", "gathers"), 1):
        frame[column] = [k[position] for k in keep]
    return frame


def _threads(effective: dict, info: object) -> int:
    """How many threads a row ran with: its info's count (cpu.threads), else its `threads`
    param (`all` of an unknown count: taken as many, so that only another `all` bounds it)."""
    if isinstance(info, dict) and isinstance(info.get("threads"), int):
        return max(1, info["threads"])
    text = str(effective.get("threads", "1"))
    return max(1, int(text)) if text.isdigit() else 1 << 20


def read_ceilings(cases: pd.DataFrame) -> list[Ceiling]:
    """Each region's reads from memory a CPU-moved way is bounded by: ok transfer rows of a CPU
    method that reads and lands nothing (load, nt-load: Method.delivery None), on write-back
    memory, whose source reached memory (the span fills the LLC), one per row."""
    methods = load_methods()
    found = []
    for _, row in cases.iterrows():
        method = methods.get(str(row.get("method")))
        median = pd.to_numeric(row.get("median_ns"), errors="coerce")
        moved = pd.to_numeric(row.get("bytes_moved"), errors="coerce")
        if (method is None or method.marker != "cpu" or method.delivery is not None
                or row.get("access") != "read" or row.get("status") != "ok"
                or row.get("measures", "transfer") != "transfer"
                or str(row.get("attr", "wb")) not in ("wb", "")
                or not (median > 0 and moved > 0)  # NaN: neither
                or _cache_resident(row.get("reaches_memory"))
                or _cache_resident(row.get("source_reaches_memory"))):
            continue
        effective = decode_params_or_none(row.get("effective_params"))
        found.append(Ceiling(str(row["region"]), float(moved) / float(median),
                             _threads(effective, row.get("info")), str(row["case_id"]),
                             str(row["method"])))
    return found


def ceiling_for(ceilings: list[Ceiling], region: str, threads: int) -> Ceiling | None:
    """The best read of `region` with `threads` threads or more (None: the run has none)."""
    fit = [c for c in ceilings if c.region == region and c.threads >= threads]
    return max(fit, key=lambda c: c.bytes_per_ns, default=None)


def _facts(rows: pd.DataFrame) -> dict:
    facts: dict = {}
    for info, effective in zip(rows["info"], rows["effective"], strict=True):
        facts.update(effective)
        if isinstance(info, dict):
            facts.update({k: v for k, v in info.items() if k in ("max_sge", "sge")})
    return facts


def _median_by_size(points: Iterable[Point]) -> tuple[Point, ...]:
    by_size: dict[int, list[Point]] = {}
    for point in points:
        by_size.setdefault(point.size, []).append(point)
    merged = []
    for _size, group in sorted(by_size.items()):
        group.sort(key=lambda p: p.ns)
        merged.append(group[len(group) // 2])
    return tuple(merged)


def calls(rule: str, fragments: int, facts: dict) -> int:
    """How many calls a read of `fragments` pieces costs by `rule` (a CALL_RULES key)."""
    return max(1, int(CALL_RULES[rule](max(1, fragments), facts)))


def fit_group(hop: str, way: str, rows: pd.DataFrame, rule: str,
              ceilings: list[Ceiling] | None = None) -> PathFit | None:
    """A hop's model from the rows of one way of moving bytes; None when they hold no
    single-transfer row and no many-fragment row. `ceilings` (read_ceilings): where the CPU
    moves the bytes, the best read of the source bounds the figures (a run without one: said)."""
    fragments = pd.to_numeric(rows["fragment_count"], errors="coerce").fillna(1).astype(int)
    sizes = pd.to_numeric(rows["size_bytes"], errors="coerce").fillna(0).astype(int)
    frag_bytes = pd.to_numeric(rows["fragment_bytes"], errors="coerce").fillna(0).astype(int)
    medians = pd.to_numeric(rows["median_ns"], errors="coerce")
    singles = _median_by_size(Point(int(s), float(t), str(c)) for s, t, c, n in zip(
        sizes, medians, rows["case_id"], fragments, strict=True) if n <= 1 and s > 0)
    notes = []
    if singles:
        peak = max(p.size / p.ns for p in singles)  # bytes per ns at the best single transfer
        low = singles[0]
        call_ns = max(0.0, low.ns - low.size / peak)
    else:
        call_ns = 0.0
        notes.append("no single-transfer rows: per-call cost a not measured, taken as 0")
    facts = _facts(rows)
    fragmented = []
    for size, n, ns, case_id in zip(frag_bytes, fragments, medians, rows["case_id"], strict=True):
        if n > 1 and size > 0:
            calls_n = calls(rule, int(n), facts)
            # unclamped: below zero when calls overlap (a stream of async copies costs less per
            # copy than one isolated copy's a), so a * calls(n) + n * c(s) gives the row back
            fragmented.append(Point(int(size), (float(ns) - call_ns * calls_n) / n,
                                    str(case_id)))
    if not singles and not fragmented:
        return None
    ceiling = None
    if ceilings is not None and "mover" in rows and (rows["mover"] == "cpu").all():
        first = rows.iloc[0]
        source = str(first["region"] if first.get("access") == "read" else first["peer"])
        threads = max(_threads(e, i) for e, i in zip(rows["effective"], rows["info"], strict=True))
        ceiling = ceiling_for(ceilings, source, threads)
        if ceiling is None:
            notes.append(f"the run has no read of {source} from memory with {threads} thread"
                         f"{'s' if threads != 1 else ''} or more (e.g. `nearlocal run --method "
                         f"load --region {source} --pattern 1GiB --threads N`): the figure is not "
                         "bounded by the box's memory read")
    gathers = bool(rows["gathers"].all()) if "gathers" in rows else True
    return PathFit(hop, way, rule, call_ns, singles, _median_by_size(fragmented), facts,
                     notes=tuple(notes), gathers=gathers, ceiling=ceiling, gpus=_gpus(rows))


def _gpus(rows: pd.DataFrame) -> tuple[int, ...]:
    """The GPU devices a way's rows moved bytes to or from (their regions and peers of the GPU
    pool class): which GPU a path's figure is, for the links it sits behind."""
    from nearlocal.regions.base import gpu_device  # not at import: `--help` loads no numpy

    found = set()
    for region, pool_class in (("region", "pool_class"), ("peer", "peer_pool_class")):
        if region in rows and pool_class in rows:
            found.update(gpu_device(r, c) for r, c in zip(rows[region], rows[pool_class],
                                                          strict=True))
    return tuple(sorted(g for g in found if g is not None))


def _way(row: pd.Series) -> str:
    params = ",".join(f"{k}={v}" for k, v in sorted(decode_params_or_none(row.get("params")).items()))
    return (f"{row['method']} {row['region']} -> {row['peer']}"
            + (f" [{params}]" if params else ""))


def fit_run(cases: pd.DataFrame) -> dict[str, list[PathFit]]:
    """Every hop the run measured -> its ways of moving bytes, each fitted from its own rows
    (one way: one method between one region and one peer, with its params)."""
    rows = usable_rows(cases)
    models: dict[str, list[PathFit]] = {}
    if rows.empty:
        return models
    ceilings = read_ceilings(cases)
    ways = [_way(row) for _, row in rows.iterrows()]
    rows = rows.assign(way=ways)
    for (hop, way), group in rows.groupby(["hop", "way"], sort=True):
        model = fit_group(str(hop), str(way), group, str(group["calls"].iloc[0]), ceilings)
        if model is not None:
            models.setdefault(str(hop), []).append(model)
    return models
