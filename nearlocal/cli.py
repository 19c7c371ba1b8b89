"""The one entry point. Thin: parses, calls, prints. Bad input: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from nearlocal.errors import UsageError

# Modules that add subcommands: each has `register(subparsers)` setting `func` on its parser.
COMMAND_MODULES: list[str] = ["nearlocal.workloads.commands", "nearlocal.report.commands",
                              "nearlocal.ci_commands", "nearlocal.rpc.commands"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _probe(args: argparse.Namespace) -> int:
    from nearlocal import availability, console
    from nearlocal.hwprobe import probe

    inventory = probe()
    rows = availability.matrix(inventory, allow_write=args.allow_write)
    if args.json:
        print(json.dumps({"inventory": inventory.to_dict(), "availability": rows}, indent=2,
                         default=str))
    else:
        console.print_inventory(inventory, rows)
    return 0


def _selected_cases(args: argparse.Namespace):
    from nearlocal.harness.cases import Case
    from nearlocal.harness.methods import get_method
    from nearlocal.harness.suites import suite_cases
    from nearlocal.units import format_size, parse_size_list

    cases = suite_cases(args.suite)
    params = _parse_params(args.param or [])
    manual = args.method or args.region or args.attr or args.size or args.pattern or args.peer
    if not manual:
        return [replace(case, params=(*case.params, *params.items())) for case in cases] \
            if params else cases
    for name in args.method or []:
        get_method(name)
    methods = args.method or list(dict.fromkeys(c.method for c in cases))
    regions = args.region or list(dict.fromkeys(c.region for c in cases))
    attrs = args.attr or ["wb"]
    patterns = [format_size(s) for s in parse_size_list(args.size or [])] + list(args.pattern or [])
    patterns = patterns or list(dict.fromkeys(c.pattern for c in cases))
    peer = args.peer or "dram"
    return [Case(m, r, a, p, peer=peer, params=tuple(params.items()), suite=args.suite)
            for m, r, a, p in itertools.product(methods, regions, attrs, patterns)]


def _parse_params(texts: list[str]) -> dict[str, str]:
    params = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"malformed --param {text!r}: use KEY=VALUE, e.g. qd=16")
        params[key.strip()] = value.strip()
    return params


def _run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nearlocal import console
    from nearlocal.harness import cases as case_rules
    from nearlocal.harness.runner import Runner, run_metadata
    from nearlocal.harness.stats import StoppingRule
    from nearlocal.harness.worker import WorkerSettings
    from nearlocal.hwprobe import probe
    from nearlocal.results.schema import JSON_COLUMNS
    from nearlocal.results.store import Store
    from nearlocal.units import parse_duration

    budget = parse_duration(args.budget)
    if not 0 < args.ci < 100:
        raise UsageError(f"--ci must be a percentage between 0 and 100, got {args.ci:g}")
    if args.json and not Path(args.json).parent.resolve().is_dir():
        raise UsageError(f"--json: directory {Path(args.json).parent} does not exist")
    inventory = probe()
    cases = _selected_cases(args)
    from nearlocal.harness.threads import apply_thread_args

    cases = apply_thread_args(cases, args.threads, args.cpus)
    for case in cases:
        case_rules.validate(case, inventory)
    reasons = [case_rules.unavailable(c, inventory, args.allow_write) for c in cases]
    if cases and all(r and "--allow-write" in r for r in reasons):
        raise UsageError("every selected case writes to memory you did not allow: "
                         "pass --allow-write to write to " + ", ".join({c.region for c in cases}))
    rule = StoppingRule(budget_s=budget, target_rel_ci=args.ci / 100)
    settings = WorkerSettings(rule=rule, tsc_hz=inventory.tsc_hz, allow_write=args.allow_write)
    meta = run_metadata(inventory, settings, args.suite)
    from nearlocal.harness.pool import pool_note

    meta["pool"] = pool_note(inventory)  # what local memory is compared with (one line)
    if args.suite in ("quick", "mlc", "all") and not args.quiet:
        console.console.print(meta["pool"])
    store = Store.create(Path(args.out), meta)
    interrupted = False
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console.console, transient=True,
                  disable=args.quiet) as progress:
        task = progress.add_task("measuring", total=len(cases))

        def on_case(row: dict) -> None:
            progress.update(task, advance=1, description=f"{row['case_id']:<48.48}")

        runner = Runner(inventory, settings, store, on_case)
        try:
            runner.run(cases)
        except KeyboardInterrupt:
            interrupted = True
    path = store.finish(ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interrupted=interrupted)
    from nearlocal.results import load

    run = load(path)
    if args.json:
        Path(args.json).write_text(
            run.cases[JSON_COLUMNS].to_json(orient="records", indent=1))
    if not args.quiet:
        console.print_run(run.meta, run.cases)
    console.console.print(f"stored {path}")
    return 130 if interrupted else 0


def _runs(args: argparse.Namespace) -> int:
    from rich.table import Table

    from nearlocal.console import console
    from nearlocal.results.store import list_runs

    table = Table(title=f"runs in {args.out}", title_justify="left")
    for column in ("run", "suite", "started", "cases", "complete", "host"):
        table.add_column(column)
    for path in list_runs(Path(args.out)):
        meta = json.loads((path / "run.json").read_text())
        table.add_row(path.name, str(meta.get("suite", "")), str(meta.get("started", "")),
                      str(meta.get("n_cases", "")), str(meta.get("complete", False)),
                      str(meta.get("inventory", {}).get("hostname", "")))
    console.print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    from nearlocal import console
    from nearlocal.results import load

    run = load(args.run, Path(args.out))
    if args.json:
        print(run.cases.to_json(orient="records", indent=1))
    else:
        console.print_run(run.meta, run.cases, include_skipped=args.all)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nearlocal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    probe = sub.add_parser("probe", help="what this box has and what can run here")
    probe.add_argument("--json", action="store_true", help="machine-readable output")
    probe.add_argument("--allow-write", action="store_true",
                       help="judge writing cases on user-owned regions as allowed")
    probe.set_defaults(func=_probe)

    run = sub.add_parser("run", help="run a suite (default quick) and store the run")
    run.add_argument("--suite", default="quick")
    run.add_argument("--method", action="append", help="method name (repeatable)")
    run.add_argument("--region", action="append", help="region spec, e.g. dram, numa:1, "
                     "devdax:/dev/dax0.0 (repeatable)")
    run.add_argument("--attr", action="append", help="wb, uc or wc (repeatable)")
    run.add_argument("--size", action="append", help="sizes: 64, 16KiB, 1GiB; lists allowed")
    run.add_argument("--pattern", action="append", help="fragment pattern, e.g. 1024x160B")
    run.add_argument("--peer", help="the other side of every transfer (default dram)")
    run.add_argument("--param", action="append",
                     help="a method parameter KEY=VALUE, e.g. qd=16 (repeatable)")
    run.add_argument("--threads", help="N or all: that many pinned threads on distinct CPUs "
                     "(load, store, nt-store, memcpy, loaded-chase)")
    run.add_argument("--cpus", help="CPU list for --threads, e.g. 0-3 (default: the region's "
                     "NUMA node's CPUs)")
    run.add_argument("--budget", default="0.5", help="time budget per case (default 0.5 s)")
    run.add_argument("--ci", type=float, default=1.0,
                     help="stop when the median's 95%% CI half-width is within this %% (default 1)")
    run.add_argument("--out", default="results", help="the store's root (default ./results)")
    run.add_argument("--json", help="also write the case rows as a JSON array to this path")
    run.add_argument("--allow-write", action="store_true",
                     help="allow writing to devdax: regions and existing files named here")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=_run)

    runs = sub.add_parser("runs", help="list stored runs")
    runs.add_argument("--out", default="results")
    runs.set_defaults(func=_runs)

    show = sub.add_parser("show", help="print one run")
    show.add_argument("run", nargs="?", help="run id or directory (default: latest)")
    show.add_argument("--out", default="results")
    show.add_argument("--json", action="store_true")
    show.add_argument("--all", action="store_true", help="include skipped rows")
    show.set_defaults(func=_show)

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"nearlocal: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nearlocal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
