"""`nearlocal replay`: a serving trace's KV reloads really moved on this box (a gather out of a
pool on any host region, `--region`: dram, the host gather; a device-dax or CXL node, the pool
path), at the trace's arrival times with G concurrent movers; per request its wait and its
transfer, and their P50 / P99 (workloads/replay.py does the moving; docs/whatif.md "Replay on the
box" says what it stands for and how to compare it with the simulation).

What moves the reloads (`--method`) is a registry, REPLAY_METHODS: the host gather (memcpy) is
declared here; another family declares its own from its command face (rdma's `rdma-read`, an
MPI job of two ranks: nearlocal/rdma/commands.py), so this command names no family."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.plugins import declare
from nearlocal.reporters import (
    JUnitCase,
    TextReporter,
    add_format_options,
    check_outputs,
    command_formats,
    emit,
    json_wanted,
    junit_xml,
    write_outputs,
)
from nearlocal.subcommands import register_command
from nearlocal.units import format_size

if TYPE_CHECKING:
    from nearlocal.workloads.replay import ReplayPool

np = lazy_import("numpy")

DEFAULT_SECONDS = 60.0
LLC_FACTOR = 4  # a reload comes from memory: the pool spans more than 4x the LLC
DEFAULT_POOL_FACTOR = 8  # the pool's default span: 8x the LLC
UNKNOWN_LLC_BYTES = 64 << 20
CACHE_RESIDENT = "cache-resident pool: not a memory figure"
TIMED = ("each request's gather alone: memcpy of its fragments out of the pool into its mover's "
         "own dram buffer, between fenced rdtscp (the pool's pages faulted in before time zero)")


def replay_box() -> tuple[float, int, list[int]]:
    """(TSC Hz, the LLC a reload must outgrow: the larger of cpuid's and the measured, CPUs this
    process may use)."""
    from nearlocal.probe.cpu import probe_cpu
    from nearlocal.sysroot import SysRoot

    cpu = probe_cpu(SysRoot.default())
    hz = cpu.tsc_hz_kernel
    if not hz:
        from nearlocal.kernels.timer import calibrate_tsc_hz

        hz = calibrate_tsc_hz()
    llc = max(cpu.llc_bytes, cpu.cpuid_llc_bytes) or UNKNOWN_LLC_BYTES
    return float(hz), int(llc), sorted(os.sched_getaffinity(0))


def pattern_text(args: argparse.Namespace) -> str:
    """The kv: text of the pool's layout (its block table is the replay's, not a selection)."""
    if ":" in args.model:
        raise UsageError(f"--model {args.model!r}: a config path for kv patterns cannot hold ':'")
    parts = ["kv", args.model, args.layout, "dense"]
    options = {"tp": args.tp, "bt": args.block_tokens, "dtype": args.dtype, "order": args.order,
               "layers": args.layers}
    parts += [f"{k}={v}" for k, v in options.items() if v is not None]
    return ":".join(str(p) for p in parts)


HOST_METHOD = "memcpy"


class ReplayMovers(Protocol):
    """The movers one replay opened: `move(frags, first, arrival_s) -> workloads.replay.
    ReplayTimes` moves the requests; `close()`; `facts(emulated)`: what the method adds to the
    replay's data once closed (its `timed`, its own facts, a data check)."""

    def move(self, frags, first, arrival): ...

    def close(self) -> None: ...

    def facts(self, emulated: str) -> dict: ...


@dataclass(frozen=True)
class Opened:
    """What a method's movers are opened with: the command line, the launch's context (the MPI
    world of a method that runs in a job, else None), the pool and the cut requests."""

    args: argparse.Namespace
    context: Any
    pool: ReplayPool
    dst_bytes: int
    frags: Any
    first: Any
    hz: float
    cpus: list[int]


@dataclass(frozen=True)
class ReplayMethod:
    """A `--method` of `nearlocal replay`, declared once. `mover`: what moves the bytes (a hop's
    mover, whatif/paths.py); `words`: the path it stands for ({region} filled); `summary`: for
    --method's help. `check(args, cpus)`: bad input as one line, and the method's parameters
    (defaults included, the replay's data keeps them). `launch(args, build)`: runs the command
    where this method runs, `build(context)` making the data where the movers are (an int:
    this process's exit code, it built no data). `open(opened)`: the movers. `params_help`,
    `allow_write_help`: what --param and --allow-write mean for it ("": it takes none)."""

    name: str
    mover: str
    words: str
    summary: str
    check: Callable[[argparse.Namespace, int], dict]
    launch: Callable[[argparse.Namespace, Callable[[Any], dict]], dict | int]
    open: Callable[[Opened], ReplayMovers]
    params_help: str = ""
    allow_write_help: str = ""


REPLAY_METHODS: dict[str, ReplayMethod] = {}


def register_replay_method(method: ReplayMethod) -> ReplayMethod:
    """Declare a --method of `nearlocal replay`; a name declared twice is a bug of the second."""
    return declare(REPLAY_METHODS, method.name, method, "replay method")


def replay_method(name: str) -> ReplayMethod:
    """The --method named; bad input when none is declared."""
    if name not in REPLAY_METHODS:
        raise UsageError(f"--method {name}: use {' or '.join(REPLAY_METHODS)}")
    return REPLAY_METHODS[name]


def source_of(region: str, method: str = HOST_METHOD) -> tuple[str, str, str]:
    """The pool's region checked as `run` checks one (bad input, or one this box cannot give:
    one line, exit 2): (its pool class, the path it stands for, why the box's figures are not a
    real machine's or "")."""
    from nearlocal.probe import probe
    from nearlocal.probe.cpu import emulation_note
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.regions.base import pool_class_of
    from nearlocal.whatif.paths import HOPS

    spec = parse_region(region)
    kind = region_kind(spec)
    if kind.space != "host":
        raise UsageError(f"--region {region}: the movers gather with the CPU out of host memory, "
                         f"not {kind.space} memory")
    inventory = probe(calibrate=False, gpu=False)
    kind.validate(spec, inventory)
    reason = kind.unavailable(spec, inventory)
    if reason:
        raise UsageError(f"--region {region} cannot be used here: {reason}")
    pool_class = pool_class_of(spec, inventory.cpuless_nodes)
    declared = replay_method(method)
    mover, words = declared.mover, declared.words
    hop = next((h.name for h in HOPS.values() if h.takes(mover, pool_class, "local")), None)
    path = words.format(region=spec.text)
    cpu = inventory.cpu
    return (pool_class, f"{hop} ({path})" if hop else path,
            emulation_note({"model": cpu.model, "flags": cpu.flags}))


def choose_pool(text: str, llc: int, pool_bytes: str | None, region: str
                ) -> tuple[ReplayPool, int, str | None]:
    """(the pool `text` lays on `region`, the span asked of it, and None or CACHE_RESIDENT's
    reason): --pool-bytes, else 8x the LLC. A pool must span more than 4x the LLC, so a reload
    comes from memory; only on a region that cannot hold that much may --pool-bytes ask for less,
    and its figures are then marked. A pool the region cannot hold is refused naming both sizes.
    scripts/replay_check.py cuts the requests by the same pool."""
    from nearlocal.regions import parse_region, region_kind
    from nearlocal.units import parse_size
    from nearlocal.workloads import replay

    spec = parse_region(region)
    kind = region_kind(spec)
    found = kind.capacity(spec) if kind.capacity else None
    holds = found[0] if found else None
    floor = LLC_FACTOR * llc
    want = parse_size(pool_bytes) if pool_bytes else DEFAULT_POOL_FACTOR * llc
    small = holds is not None and holds <= floor  # the region cannot hold a memory figure's pool
    note = None
    if want <= floor:
        if not small:
            raise UsageError(f"--pool-bytes {format_size(want)}: the pool must span more than "
                             f"{LLC_FACTOR}x the LLC ({format_size(floor)}), so a reload comes "
                             "from memory")
        note = (f"{CACHE_RESIDENT} ({region} holds {format_size(holds)}, not more than "
                f"{LLC_FACTOR}x the LLC of {format_size(llc)}: the pool of {format_size(want)} "
                "may be read from the cache)")
    pool = replay.pool_for(text, want)
    if holds is not None and pool.region_bytes > holds:
        asked = f"--pool-bytes {pool_bytes}" if pool_bytes else \
            f"{DEFAULT_POOL_FACTOR}x the LLC of {format_size(llc)}"
        if small:
            fix = (f"give a --pool-bytes it holds to replay it anyway, marked '{CACHE_RESIDENT}' "
                   f"(it holds no more than {LLC_FACTOR}x the LLC, {format_size(floor)})")
        else:
            fix = (f"give a --pool-bytes it holds, over {LLC_FACTOR}x the LLC "
                   f"({format_size(floor)})")
        raise UsageError(f"--region {region} holds {format_size(holds)}, the pool spans "
                         f"{format_size(pool.region_bytes)} ({asked}): {fix}")
    return pool, want, note


def window_of(trace, start_s: float, seconds: float):
    """Indices of the requests arriving from `start_s` seconds after the trace's first, for
    `seconds` (the replay's window; scripts/replay_check.py feeds the simulation the same)."""
    offset = trace.arrival_s - trace.arrival_s[0] - start_s
    return np.flatnonzero((offset >= 0) & (offset < seconds))


def check_args(args: argparse.Namespace, cpus: int) -> None:
    """Bad input, named before anything is read or moved."""
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise UsageError(f"--seconds {args.seconds:g} must be a positive number of seconds")
    if args.time_scale is not None and not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        raise UsageError(f"--time-scale {args.time_scale:g} must be a positive factor")
    if args.load is not None:
        if args.time_scale is not None:
            raise UsageError("--load chooses the time scale: give --load or --time-scale, not both")
        if not 0 < args.load < 1:
            raise UsageError(f"--load {args.load:g} must lie between 0 and 1 (the movers' "
                             "utilisation; at 1 or more the queue grows without end)")
    if not (args.start >= 0 and math.isfinite(args.start)):
        raise UsageError(f"--start {args.start:g} must be a number of seconds >= 0")
    args.method_params = replay_method(args.method).check(args, cpus)
    if args.blocks not in ("contiguous", "scattered"):
        raise UsageError(f"--blocks {args.blocks!r}: use contiguous or scattered")
    if not os.path.isfile(args.trace):
        raise UsageError(f"--trace {args.trace}: no such file")


def build(args: argparse.Namespace, context: Any = None) -> dict:
    """Read, cut, move and summarise: everything `nearlocal replay` reports, as plain data.
    `context`: what the method's launch hands its movers (the MPI world of a method run in a
    job, where this is the rank that moves)."""
    from nearlocal.whatif.traffic import prefix_hits, read_trace
    from nearlocal.workloads import replay

    hz, llc, cpus = replay_box()
    check_args(args, len(cpus))
    if args.out:
        from nearlocal.safeio import check_output

        check_output("--out", args.out)
    text = pattern_text(args)
    pool_class, path, emulated = source_of(args.region, args.method)
    pool, want, pool_note = choose_pool(text, llc, args.pool_bytes, args.region)
    trace = read_trace(args.trace)
    hits = prefix_hits(trace)  # the simulation's store rule, unbounded
    window = window_of(trace, args.start, args.seconds)
    if not window.size:
        raise UsageError(f"--start {args.start:g}: the trace holds no request from there "
                         f"(it spans {trace.duration_s:g} s)")
    tables, cursor = [], 0
    hit_tokens = hits.tokens[window].tolist()
    for tokens in hit_tokens:
        table, cursor = replay.request_table(pool, tokens, cursor, args.blocks)
        tables.append(table)
    dst_bytes = want // args.movers
    frags, first, nbytes = replay.cut_requests(pool, tables, dst_bytes)
    movers = replay_method(args.method).open(Opened(args, context, pool, dst_bytes, frags, first,
                                                    hz, cpus))
    try:
        data = _build_moved(args, movers.move, hz, llc, cpus, text, pool_class, path, emulated,
                            pool, want, pool_note, trace, window, hit_tokens, frags, first,
                            nbytes, dst_bytes)
    finally:
        movers.close()
    data.update(movers.facts(emulated))
    return data


class HostMovers:
    """The host gather: `--movers` pinned CPUs of this process, each memcpy-ing its requests out
    of the pool into its own dram buffer (workloads/replay.py)."""

    def __init__(self, opened: Opened):
        self.opened = opened

    def move(self, frags, first, arrival):
        from nearlocal.workloads import replay

        o = self.opened
        return replay.run_replay(frags, first, arrival, o.pool.region_bytes, o.dst_bytes,
                                 o.cpus[:o.args.movers], o.hz, o.args.region)

    def close(self) -> None:
        pass

    def facts(self, emulated: str) -> dict:
        return {}


def _check_host(args: argparse.Namespace, cpus: int) -> dict:
    if args.param:
        takes = [m.name for m in REPLAY_METHODS.values() if m.params_help]
        raise UsageError(f"--param {args.param[0]}: only --method {' or '.join(takes)} takes "
                         "parameters" if takes else f"--param {args.param[0]}: no --method "
                         "takes parameters")
    if args.movers < 1 or args.movers > cpus:
        raise UsageError(f"--movers {args.movers}: give 1 to {cpus}, the CPUs this process may "
                         "use (each mover runs on a CPU of its own)")
    return {}


register_replay_method(ReplayMethod(
    HOST_METHOD, "cpu", "memcpy, {region} pool -> each mover's dram buffer",
    "the default; the CPU gathers out of --region", _check_host,
    launch=lambda args, build: build(None), open=HostMovers))


def _build_moved(args, move, hz, llc, cpus, text, pool_class, path, emulated, pool, want,
                 pool_note, trace, window, hit_tokens, frags, first, nbytes, dst_bytes) -> dict:
    """The calibration (--load), the replay by `move(frags, first, arrival_s) -> ReplayTimes`
    and its summary."""
    from nearlocal.workloads import replay

    calibration = None
    scale = 1.0 if args.time_scale is None else args.time_scale
    if args.load is not None:
        calibration = _calibrate(move, frags, first, nbytes, args.movers)
        scale = float(nbytes.sum()) / (args.load * args.movers * calibration["gbps_per_mover"]
                                       * args.seconds * 1e9)
        calibration["time_scale"] = scale
    arrival = (trace.arrival_s[window] - trace.arrival_s[0] - args.start) * scale
    times = move(frags, first, arrival)
    g = pool.geometry
    summary = replay.summarise(times, nbytes, args.movers)
    fragments = np.diff(first).tolist()
    for record, i, tokens, count in zip(summary["per_request"], window.tolist(), hit_tokens,
                                        fragments, strict=True):
        record["trace_line"], record["hit_tokens"] = i + 1, int(tokens)  # the simulation's inputs
        record["input_tokens"], record["fragments"] = int(trace.input_tokens[i]), int(count)
    return {
        "trace": str(args.trace), "start_s": args.start, "seconds": args.seconds,
        "time_scale": scale, "load": args.load, "calibration": calibration,
        "trace_requests": len(trace), "movers": args.movers, "cpus": times.cpus,
        "method": args.method, "region": args.region, "pool_class": pool_class, "path": path,
        "params": getattr(args, "method_params", None) or {},  # the method's, defaults included
        "source": times.source,
        "timed": TIMED, "memory_figure": pool_note is None, "pool_note": pool_note,
        "emulated": emulated,
        "pattern": text, "model": g.model.name, "layout": g.layout.name, "tp": g.tp,
        "block_tokens": g.block_tokens, "kv_dtype": g.dtype,
        "layers": f"{int(pool.layers[0])}-{int(pool.layers[-1])}",
        "token_bytes": pool.block_bytes // g.block_tokens,
        "pool_bytes": pool.region_bytes, "pool_slots": pool.slots, "llc_bytes": llc,
        "placement": args.blocks, "dst_bytes_per_mover": dst_bytes,
        "hit_tokens": int(sum(hit_tokens)), "fragments": int(frags.shape[0]),
        "store": "unbounded prefix store (a block hits when an earlier request held it and "
                 "every block before it hit)",
        "tsc_hz": hz, "timer_overhead_ns": times.timer_overhead_ns,
        "wall_s": None, **summary,
    }


CALIBRATION_BYTES = 512 << 20  # a mover's share of the calibration
CALIBRATION_REQUESTS = 8  # a mover's most
CALIBRATION_ROUNDS = 3  # one slow or fast round (a page fault, a neighbour) sets no time scale


def _calibrate(move, frags, first, nbytes, movers: int) -> dict:
    """The window's first requests with hits, their fragments dealt into `movers` shares of equal
    bytes, all due at once: every mover busy for the whole calibration, as under load, so the
    GB/s a mover moves while the others move theirs, which --load sets the time scale by. (Taken
    as whole requests, one large request kept one mover busy alone while the others idled: the
    rate was a lone mover's, and G = 2 replays ran at 1.5x the load asked.)"""
    chosen, total = [], 0
    for i in np.flatnonzero(nbytes > 0).tolist():
        if total >= CALIBRATION_BYTES * movers or len(chosen) >= CALIBRATION_REQUESTS * movers:
            break
        chosen.append(i)
        total += int(nbytes[i])
    if not chosen:
        raise UsageError("--load: no request of the window has a prefix hit to move")
    dealt = np.ascontiguousarray(np.concatenate([frags[first[i]:first[i + 1]] for i in chosen]))
    ends = np.cumsum(dealt[:, 2])
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, movers) / movers, side="right")
    sub_first = np.unique(np.concatenate([[0], cuts, [len(dealt)]])).astype(np.int64)
    rates = []
    for _ in range(CALIBRATION_ROUNDS):
        times = move(dealt, sub_first, np.zeros(len(sub_first) - 1))
        rates.append(total / float((times.end_ns - times.start_ns).sum()))
    return {"requests": len(chosen), "bytes": total, "gbps_per_mover": float(np.median(rates)),
            "rounds_gbps_per_mover": rates,
            "what": f"the window's first {len(chosen)} requests with hits, their fragments "
                    f"dealt into {len(sub_first) - 1} shares of equal bytes, all due at once on "
                    f"the movers; the median of {CALIBRATION_ROUNDS} rounds"}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f} ms"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _print(data: dict) -> None:
    from nearlocal.terminal import console

    console.print(
        f"[bold]replay[/] of {data['seconds']:g} s of {data['trace']} from {data['start_s']:g} s "
        f"(times x"
        f"{data['time_scale']:g}): {data['requests']} requests, {data['requests_with_hits']} "
        f"with prefix hits, {format_size(data['bytes'])} moved in {data['fragments']} fragments")
    console.print(f"  path: {data['path']}")
    console.print(
        f"  bytes: {data['model']} {data['layout']} TP {data['tp']} layers {data['layers']}, "
        f"{data['token_bytes']} B a token ({data['pattern']}); pool {format_size(data['pool_bytes'])} "
        f"({data['pool_slots']} slots of 512 tokens, LLC {format_size(data['llc_bytes'])}), "
        f"{data['placement']} blocks")
    console.print(
        f"  {data['movers']} mover(s) on CPUs {','.join(map(str, data['cpus']))}: utilisation "
        f"{_num(data['utilisation'])}, offered {_num(data['offered_gbps'])} GB/s, moved at "
        f"{_num(data['moved_gbps'])} GB/s a mover")
    if data.get("calibration"):
        cal = data["calibration"]
        console.print(f"  --load {data['load']:g}: time scale {cal['time_scale']:.3f} from a "
                      f"calibration of {cal['requests']} requests at "
                      f"{cal['gbps_per_mover']:.2f} GB/s a mover (the median of "
                      f"{len(cal['rounds_gbps_per_mover'])} rounds)")
    for name in ("wait", "transfer", "reload"):
        q = data[name]
        console.print(f"  {name:8s} P50 {_ms(q['p50_ns'])}  P90 {_ms(q['p90_ns'])}  "
                      f"P99 {_ms(q['p99_ns'])}  max {_ms(q['max_ns'])}")
    for note in (data["pool_note"], data["emulated"]):
        if note:
            console.print(f"  NOTE: {note}")
    if data.get("wall_s") is not None:
        console.print(f"  wall time {data['wall_s']:.1f} s")


def data_check_failed(data: dict) -> bool:
    """The replay's one verdict: --method rdma-read's bytes differ from rank 1's (exit 1)."""
    return str(data.get("data_check", "ok")).startswith("FAILED")


def render_junit(data: dict) -> str:
    """The replay's verdict as a test case: the data check (--method rdma-read), failed where
    the bytes differ; skipped where the path checks none (the host gather)."""
    check = data.get("data_check")
    seconds = data.get("wall_s") or 0.0
    case = (JUnitCase("data check", "nearlocal.replay", seconds, "the host gather checks no "
                      "bytes: nothing judged", "skipped") if check is None else
            JUnitCase("data check", "nearlocal.replay", seconds, check,
                      "failed" if data_check_failed(data) else "passed", "data"))
    return junit_xml(f"nearlocal replay {data['trace']}", [case],
                     [("path", str(data["path"])), ("movers", str(data["movers"]))])


# build()'s data: as text (the default), JSON, and JUnit (--junit PATH)
REPLAY_FORMATS = command_formats("replay", _print)
REPLAY_FORMATS.register(TextReporter("junit", "also write a JUnit XML report here: the data "
                                     "check (--method rdma-read) as a case", render_junit))


def _replay(args: argparse.Namespace) -> int:
    import time

    began = time.monotonic()
    check_outputs(REPLAY_FORMATS, args)
    data = replay_method(args.method).launch(args, lambda context: build(args, context))
    if isinstance(data, int):  # a rank that moved nothing here: its exit code
        return data
    data["wall_s"] = time.monotonic() - began
    if args.out:  # the per-request records: the JSON, whole, whatever is shown
        REPLAY_FORMATS["json"].write(data, args.out, "--out")
    write_outputs(REPLAY_FORMATS, data, args)
    emit(REPLAY_FORMATS, data, args)
    if args.out and not json_wanted(args):
        from nearlocal.terminal import console

        console.print(f"  per-request records: {args.out}")
    return 1 if data_check_failed(data) else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay", help="a serving trace's KV reloads moved on this box, with G concurrent movers",
        description="Replays a Mooncake-format trace's prefix-cache reloads as real gathers "
                    "(memcpy out of a pool larger than 4x the LLC on a host region, read only, "
                    "cut by the model's layout), at the arrival times, with G pinned movers; per "
                    "request its wait and transfer, and their P50 / P99.")
    parser.add_argument("--trace", required=True, help="Mooncake JSONL trace")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                        help=f"replay the trace's first N seconds (default {DEFAULT_SECONDS:g})")
    parser.add_argument("--start", type=float, default=0.0,
                        help="begin N seconds into the trace (the prefix store has seen every "
                             "request before; default 0)")
    parser.add_argument("--time-scale", type=float,
                        help="arrival times are multiplied by X (0.5: twice the rate; default 1)")
    parser.add_argument("--load", type=float,
                        help="choose the time scale for this utilisation of the movers (0-1), from "
                             "a calibration gather on the box (instead of --time-scale)")
    parser.add_argument("--movers", type=int, default=1,
                        help="concurrent movers G, one pinned CPU each (default 1)")
    parser.add_argument("--model", default="qwen2.5-32b",
                        help="built-in model or path of a config.json (default qwen2.5-32b)")
    parser.add_argument("--layout", default="flash-attn", help="KV layout (default flash-attn)")
    parser.add_argument("--tp", type=int, help="tensor parallelism (default 1)")
    parser.add_argument("--block-tokens", type=int, help="tokens per block (layout default)")
    parser.add_argument("--dtype", help="KV dtype (default: the model's)")
    parser.add_argument("--order", help="nhd (default) or hnd")
    parser.add_argument("--layers", help="layers A-B moved (default all): the byte scale that "
                        "fits the replay to the box, fragments keep their real size")
    parser.add_argument("--blocks", default="contiguous",
                        help="a 512-token block's layout blocks contiguous in its slot (default) "
                             "or scattered over the pool")
    parser.add_argument("--region", default="dram",
                        help="the host region the pool lies on, read only (default dram: the "
                             "host gather; devdax:/dev/daxX.Y, numa:N, ...: the pool path)")
    methods = REPLAY_METHODS.values()  # every command module is loaded before parsers are added
    parser.add_argument("--method", default=HOST_METHOD,
                        help="what moves the reloads: " + " or ".join(
                            f"{m.name} ({m.summary})" for m in methods))
    parser.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="; ".join(f"--method {m.name}'s {m.params_help}" for m in methods
                                       if m.params_help) or "no --method takes parameters")
    parser.add_argument("--allow-write", action="store_true",
                        help="; ".join(f"--method {m.name}: {m.allow_write_help}" for m in methods
                                       if m.allow_write_help) or "no --method writes")
    parser.add_argument("--pool-bytes", help="the pool's span (default 8x the LLC; more than 4x, "
                        "unless the region holds no more: its figures are then marked)")
    parser.add_argument("--out", help="write the JSON (per-request records) here")
    add_format_options(parser, REPLAY_FORMATS)  # --json [PATH], --junit PATH
    parser.set_defaults(func=_replay)


register_command("replay", register)
