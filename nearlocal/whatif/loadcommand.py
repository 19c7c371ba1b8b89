"""`nearlocal whatif --trace FILE` / `--qps N`: the box's serving paths under load (load.py,
docs/whatif.md "Serving under load"). Options, their checks (all before the run is read, so bad
input writes nothing), and the printers: a table on a terminal, `--json`, `--markdown FILE`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nearlocal.errors import UsageError, naming
from nearlocal.reporters import TextReporter, command_formats, emit, json_wanted

if TYPE_CHECKING:
    from nearlocal.whatif.load import LoadResult, Percentiles, Setup, Workload
    from nearlocal.whatif.serving import Request


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "serving under load", "simulate requests arriving over each serving path (with --trace "
        "or --qps; docs/whatif.md)")
    group.add_argument("--trace", metavar="FILE",
                       help="requests from a Mooncake JSONL trace (timestamp ms, input_length, "
                            "output_length, hash_ids of 512-token blocks)")
    group.add_argument("--qps", type=float,
                       help="a Poisson stream at this many requests/s (with --trace: the trace "
                            "time-scaled to this mean rate)")
    group.add_argument("--requests", type=int, default=10000,
                       help="requests in a Poisson stream (default 10000)")
    group.add_argument("--contexts", default="fixed",
                       help="a stream's contexts: fixed (--context each), uniform:4k:32k, "
                            "exponential (mean --context); default fixed")
    group.add_argument("--store-capacity", default="unbounded",
                       help="the KV store's capacity (bytes of the model's KV, e.g. 2TiB; LRU "
                            "over blocks) or unbounded, where every repeated prefix hits "
                            "(default unbounded)")
    group.add_argument("--links", type=int, default=1,
                       help="links (adapters, NICs) the GPUs share; --gpus-per-link GPUs each "
                            "(default 1)")
    group.add_argument("--link-sharing", default="fifo",
                       help="fifo: one reload at a time per link (default); ps: the reloads in "
                            "flight share it fairly")
    group.add_argument("--movers-per-link", type=int, default=1, dest="movers_per_link",
                       help="fifo: movers per link on one queue, each at the per-mover rate the "
                            "run's movers=k rows measured with k in service (default 1)")
    group.add_argument("--ttft-target",
                       help="P99 TTFT target (e.g. 2s): gives each path's capacity")
    group.add_argument("--path", action="append", dest="load_paths", metavar="PATH",
                       help="simulate this serving path (repeatable; default all)")
    group.add_argument("--seed", type=int, default=0, help="the simulation's seed (default 0)")


def wanted(args: argparse.Namespace) -> bool:
    return args.trace is not None or args.qps is not None


def setup_of(args: argparse.Namespace) -> Setup:
    from nearlocal.units import parse_duration
    from nearlocal.whatif.load import Setup

    target = None
    if args.ttft_target is not None:
        with naming("--ttft-target"):
            target = parse_duration(args.ttft_target)
    setup = Setup(args.links, args.gpus_per_link, args.link_sharing, args.prefill_tokens_per_s,
                  target, tuple(args.load_paths or ()), args.seed, args.movers_per_link)
    setup.check()
    return setup


def _capacity_blocks(text: str, request: Request) -> int | None:
    """--store-capacity as 512-token blocks of the model's KV (every TP rank's)."""
    import dataclasses

    from nearlocal.units import parse_size
    from nearlocal.whatif.serving import shape_of
    from nearlocal.whatif.traffic import TRACE_BLOCK_TOKENS

    if text.strip().lower() == "unbounded":
        return None
    with naming("--store-capacity"):
        capacity = parse_size(text.strip())
    one = dataclasses.replace(request, context=TRACE_BLOCK_TOKENS, cached=1.0, batch=1)
    block = shape_of(one).bytes_per_token * request.tp * TRACE_BLOCK_TOKENS
    if capacity < block:
        raise UsageError(f"--store-capacity {text}: less than one {TRACE_BLOCK_TOKENS}-token "
                         f"block of {request.model}'s KV ({block} bytes)")
    return capacity // block


def workload_of(args: argparse.Namespace, request: Request, parse_tokens) -> Workload:
    """The requests asked for, checked and read (the trace, through its store); `parse_tokens`
    reads a context as the command's --context does."""
    from nearlocal.whatif.load import stream_workload, trace_workload
    from nearlocal.whatif.traffic import parse_contexts, poisson, prefix_hits, read_trace

    if args.qps is not None and not args.qps > 0:
        raise UsageError(f"--qps must be a positive number of requests per second, got "
                         f"{args.qps:g}")
    if args.trace is None:
        if args.store_capacity.strip().lower() != "unbounded":
            raise UsageError("--store-capacity needs --trace: a Poisson stream's requests carry "
                             "no prefixes (--cached gives the share each reloads)")
        contexts = parse_contexts(args.contexts, request.context, parse_tokens)
        return stream_workload(poisson(args.qps, args.requests, contexts, args.seed),
                               request.cached)
    capacity = _capacity_blocks(args.store_capacity, request)
    trace = read_trace(args.trace)
    return trace_workload(trace, prefix_hits(trace, capacity), args.qps)


def _s(value: float | None) -> str:
    from nearlocal.units import format_ns

    return "-" if value is None else format_ns(value * 1e9)


def _pct(p: Percentiles | None) -> str:
    return "-" if p is None else f"{_s(p.p50)} / {_s(p.p90)} / {_s(p.p99)}"


def _header(result: LoadResult) -> list[str]:
    setup = result.setup
    hits = (f"{result.hit_blocks} of {result.total_blocks} blocks hit "
            f"({100 * result.hit_ratio:.1f} %), " if result.hit_ratio is not None else "")
    lines = [f"serving under load, run {result.run}: {result.model}; {result.source}; "
             f"{result.requests} requests over {result.duration_s:.0f} s ({result.qps:.3g} "
             f"requests/s), mean input {result.mean_input_tokens:.0f} tokens; {result.store}: "
             f"{hits}{100 * result.hit_token_share:.1f} % of input tokens reloaded; "
             f"{setup.links} link(s) x {setup.gpus_per_link} GPU(s), link sharing "
             f"{setup.sharing}, seed {setup.seed}"]
    if result.emulated:
        lines.append(f"NOTE: {result.emulated}")
    if result.reference:
        lines.append(f"hops this box did not measure come from {result.reference}")
    lines += [f"assumed: {note}" for note in result.assumptions]
    return lines


COLUMNS = ("path", "TTFT P50 / P90 / P99", "reload wait P50 / P90 / P99",
           "transfer P50 / P90 / P99", "prefill wait P50 / P90 / P99", "link busy", "req/s",
           "capacity")


def _cells(path) -> list[str]:
    if not path.complete:
        return [path.path, path.missing, "-", "-", "-", "-", "-", "-"]
    return [path.path, _pct(path.ttft), _pct(path.reload_wait), _pct(path.transfer),
            _pct(path.prefill_wait), f"{100 * path.link_utilisation:.1f} %",
            f"{path.throughput_rps:.3g}", path.capacity]


def _sources(result: LoadResult) -> list[str]:
    lines = []
    for path in result.paths:
        if not path.complete:
            continue
        lines.append(f"{path.path}: {'; '.join(path.ways)}; rows {', '.join(path.rows)}")
        if path.spread_rows:
            lines.append(f"{path.path}: spread from rows {', '.join(path.spread_rows)}")
        lines += [f"{path.path}: note: {note}" for note in path.notes]
    return lines


def markdown(result: LoadResult) -> str:
    lines = ["## Serving under load", "", *(f"{line}  " for line in _header(result)), "",
             "| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 2) + "---|"]
    lines += ["| " + " | ".join(_cells(path)) + " |" for path in result.paths]
    return "\n".join([*lines, "", "Where each path's figures come from:", "",
                      *(f"- {line}" for line in _sources(result)), ""])


def _print(result: LoadResult) -> None:
    from rich.table import Table

    from nearlocal.terminal import console, print_table

    for line in _header(result):
        console.print(line, markup=False, highlight=False)
    table = Table(title="serving under load, per serving path (seconds)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("path", "capacity") else "right")
    for path in result.paths:
        table.add_row(*_cells(path))
    print_table(table)
    console.print("where each path's figures come from:", markup=False, highlight=False)
    for line in _sources(result):
        console.print(f"  {line}", markup=False, highlight=False)


LOAD_FORMATS = command_formats("whatif", _print, lambda result: result.as_dict())
LOAD_FORMATS.register(TextReporter("markdown", "the table as Markdown", markdown))


def run_load(args: argparse.Namespace, prepared: tuple, run, inputs, reference,
             target) -> int:
    """The simulation over the run's paths, given as asked (the options checked already)."""
    from nearlocal.whatif.contention import contention_of
    from nearlocal.whatif.load import serve

    request, setup, work = prepared
    result = serve(inputs, work, setup, request, reference, run.samples,
                   contention_of(run.cases, run.samples))
    if target is not None:
        LOAD_FORMATS["markdown"].write(result, target, "--markdown")
    emit(LOAD_FORMATS, result, args, text=target is None)
    if target is not None and not json_wanted(args):
        print(f"wrote {args.markdown}")
    return 0


def prepare(args: argparse.Namespace, request: Request, parse_tokens) -> tuple:
    """Every load option checked and the workload read, before anything else happens."""
    request.check()
    setup = setup_of(args)
    return request, setup, workload_of(args, request, parse_tokens)
