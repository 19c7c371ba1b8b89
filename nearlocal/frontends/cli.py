"""The one entry point. Thin: parses, calls, prints. Bad input: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from nearlocal.core.sampling import DEFAULT_PLACEMENTS, PLACEMENTS_HELP
from nearlocal.errors import UsageError
from nearlocal.frontends.selection import (
    region_list,
    run_settings,
    selected_cases,
)
from nearlocal.reporters import add_json_option, emit, json_path, json_wanted, side_console


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")

    def format_help(self) -> str:
        """Help texts that name registry entries (suites, methods) are filled in only when help
        is printed: loading every method module costs time no other command should pay."""
        for action in self._actions:
            lazy = getattr(action, "lazy_help", None)
            if lazy is not None:
                action.help = lazy().replace("%", "%%")
        return super().format_help()


def _suites_help() -> str:
    from nearlocal.core.suites import SUITES, get_suite

    get_suite("quick")  # importing the method modules declares their suites
    return "the cases to run (default quick): " + "; ".join(
        f"{suite.name} = {suite.summary}" for suite in SUITES.values())


def _regions_help() -> str:
    from nearlocal.regions import REGION_KINDS, load_providers

    load_providers()
    return "region specs, comma list or repeated: " + ", ".join(
        kind.syntax for kind in REGION_KINDS.values())


def _patterns_help() -> str:
    from nearlocal.core.methods import load_methods
    from nearlocal.core.patterns import pattern_kinds_help

    load_methods()  # the method modules declare the pattern kinds
    return ("fragment patterns, comma list or repeated: 1024x160B, 1024x160B@4KiB, "
            + ", ".join(pattern_kinds_help()))


def _processes_help() -> str:
    from nearlocal.engine.processes import default_processes_text

    return ("worker processes per case, in passes over all cases, sharing the budget (default: "
            f"a first look gets {default_processes_text(False)}; with --for-gate "
            f"{default_processes_text(True)})")


def _threads_help() -> str:
    from nearlocal.core.methods import methods_with_param

    return ("N or all: that many pinned threads on distinct CPUs ("
            + ", ".join(methods_with_param("threads", "cpu")) + ")")


def _methods_help() -> str:
    from nearlocal.core.methods import load_methods

    return ("method names, comma list or repeated: " + ", ".join(load_methods()))


SIZE_HELP = ("sizes, comma list or repeated: 64, 160B, 16KiB, 1GiB. Binary units: KiB/MiB/GiB and "
             "the bare k/M/G (4k = 4KiB = 4096 B); KB/MB/GB are decimal (4KB = 4000 B)")


def _probe(args: argparse.Namespace) -> int:
    from nearlocal import availability
    from nearlocal.frontends import console
    from nearlocal.probe import probe

    inventory = probe(calibrate=False)  # the TSC is calibrated where it is used: `run` (1 s of numba)
    regions = region_list("--region", args.region)
    if regions:
        from nearlocal.regions.describe import describe_regions

        inventory.extra["regions"] = describe_regions(regions, inventory)
    rows = availability.matrix(inventory, allow_write=args.allow_write, regions=tuple(regions))
    verdicts = availability.region_verdicts(inventory)
    emit(console.PROBE_FORMATS, console.Probed(inventory, rows, verdicts), args)
    return 0


def _run(args: argparse.Namespace) -> int:
    from nearlocal.engine.metadata import run_metadata
    from nearlocal.engine.plan import plan_cases, settle_llc
    from nearlocal.engine.stability.selfcheck import summary_line
    from nearlocal.frontends import console
    from nearlocal.frontends.measure import measure_run
    from nearlocal.probe import probe
    from nearlocal.safeio import check_output
    from nearlocal.store.schema import JSON_COLUMNS
    from nearlocal.subcommands import run_modes

    if (args.take_turns is None) != (args.turn is None):
        raise UsageError("--take-turns DIR and --turn ARM/ARMS go together")
    modes = run_modes()  # declared by the families that bring them (rack's MPI job)
    active = next((mode for mode in modes if mode.active()), None)
    if active is not None:  # launched by mpiexec / srun: one run across every rank (docs/rack.md)
        return active.run(args)
    settings = run_settings(args)
    check_output("--json", json_path(args))  # before measuring, not after
    inventory = settle_llc(probe(), Path(args.out))  # cache classes held for this box
    cases = selected_cases(args, inventory)

    def refuse(chosen: list) -> None:  # cases that need a mode this process is not run in
        for mode in modes:
            if mode.refuse is not None:
                mode.refuse(chosen, inventory)

    plan = plan_cases(cases, inventory, settings, check_selection=refuse)
    plan.refuse_bad_input()
    meta = run_metadata(inventory, plan.worker_settings(), args.suite,
                        processes=settings.processes, max_processes=settings.max_processes,
                        kind="run", for_gate=args.for_gate)
    turns = None
    if args.take_turns is not None:
        from nearlocal.engine.stability.turns import Turns

        turns = Turns.open(args.take_turns, args.turn)
        meta["turns"] = turns.facts()
    from nearlocal.core.suites import get_suite
    from nearlocal.cpu.pool import pool_note

    meta["pool"] = pool_note(inventory, suite=args.suite)  # what local memory is compared with
    said = side_console(args)  # stderr where stdout carries the JSON
    if get_suite(args.suite).compares_pool and not args.quiet:
        said.print(meta["pool"])
    measured = measure_run(plan, Path(args.out), meta, quiet=args.quiet, turns=turns)
    path, interrupted, meta = measured.path, measured.interrupted, measured.meta
    if measured.rows is not None:  # the rows just stored, as the store's table holds them
        from nearlocal.store.reader import cases_frame

        cases = cases_frame(measured.rows)
    else:  # interrupted: the stored run has every row it kept
        from nearlocal.store import load

        run = load(path)
        meta, cases = run.meta, run.cases
    # --json PATH: an OSError names the stored run (note_kept in Store.finish)
    emit(console.RUN_FORMATS, console.RunRows(
        meta, cases, columns=tuple(c for c in JSON_COLUMNS if c in cases)), args,
        text=not args.quiet)
    check = meta.get("self_check") or {}
    # a suspect run says so, always, and so does a box whose settings or links make figures
    # unstable
    if check and (check.get("suspect") or check.get("settings") or check.get("links")
                  or not args.quiet):
        said.print(summary_line(check), markup=False, highlight=False)
    said.print(f"stored {path}" + (" (incomplete: interrupted)" if interrupted else ""))
    return (143 if isinstance(interrupted, Terminated) else 130) if interrupted else 0


def _runs(args: argparse.Namespace) -> int:
    from nearlocal.frontends.console import RUNS_FORMATS
    from nearlocal.store.catalogue import list_runs, remove_unstarted, require_store, unstarted
    from nearlocal.store.reader import survey_run
    from nearlocal.store.schema import run_kind

    said = side_console(args)
    if args.remove_unstarted:
        removed = remove_unstarted(require_store(Path(args.out)))
        for path in removed:
            said.print(f"removed {path} (stopped before it started: nothing measured)")
        if not removed:
            said.print("no run stopped before it started")
    listed = []
    for path in list_runs(require_store(Path(args.out)), include_unstarted=True):
        meta, state = survey_run(path)  # a damaged run is listed and marked, never fatal
        inventory = meta.get("inventory") if isinstance(meta.get("inventory"), dict) else {}
        listed.append({"run": path.name, "path": str(path),
                       "kind": run_kind(meta) if meta and not unstarted(path) else "",
                       "suite": meta.get("suite", ""), "started": meta.get("started", ""),
                       "cases": meta.get("n_cases", ""), "complete": not state,
                       "state": state or "", "host": inventory.get("hostname", "")})
    emit(RUNS_FORMATS, {"store": args.out, "runs": listed}, args)
    return 0


def _show(args: argparse.Namespace) -> int:
    from nearlocal.engine.stability.selfcheck import summary_line
    from nearlocal.frontends import console
    from nearlocal.store import load

    run = load(args.run, Path(args.out))
    emit(console.RUN_FORMATS, console.RunRows(run.meta, run.cases, include_skipped=args.all),
         args)
    if not json_wanted(args):
        check = run.meta.get("self_check")  # as `run` said it when it stored the run
        if isinstance(check, dict) and check:
            console.console.print(summary_line(check), markup=False, highlight=False)
    if run.incomplete:  # on stderr: `show --json` stays valid JSON
        print(f"nearlocal: run {run.run_id} is incomplete ({run.incomplete}): "
              f"{len(run.cases)} cases", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from nearlocal import __version__

    parser = _Parser(prog="nearlocal", description="How close to local memory is each memory "
                     "path of this box? probe, run a suite, report it beside the papers' figures.",
                     epilog="`nearlocal run --help` lists the suites and methods.")
    parser.add_argument("--version", action="version", version=f"nearlocal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    probe = sub.add_parser("probe", help="what this box has and what can run here")
    add_json_option(probe)
    probe.add_argument("--allow-write", action="store_true",
                       help="judge writing cases on user-owned regions as allowed")
    probe.add_argument("--region", action="append", help="regions to judge too (comma list or "
                       "repeated); a file's region shows its file system and disk, e.g. "
                       "storage:/data/kv.bin")
    probe.set_defaults(func=_probe)

    run = sub.add_parser("run", help="run a suite (default quick) and store the run")
    run.add_argument("--suite", default="quick").lazy_help = _suites_help
    run.add_argument("--method", action="append").lazy_help = _methods_help
    run.add_argument("--region", action="append").lazy_help = _regions_help
    run.add_argument("--attr", action="append", help="wb, uc, wc (comma list or repeated)")
    run.add_argument("--size", action="append", help=SIZE_HELP)
    run.add_argument("--pattern", action="append").lazy_help = _patterns_help
    run.add_argument("--peer", action="append", help="the other side of every transfer "
                     "(default dram; e.g. gpu:0), comma list or repeated")
    run.add_argument("--param", action="append",
                     help="a method parameter KEY=VALUE, e.g. qd=16 (repeatable)")
    run.add_argument("--threads").lazy_help = _threads_help
    run.add_argument("--cpus", help="CPU list for --threads, e.g. 0-3 (default: the region's "
                     "NUMA node's CPUs)")
    run.add_argument("--budget", default="0.5", help="time budget per case (default 0.5 s)")
    run.add_argument("--ci", type=float, default=1.0,
                     help="stop when the median's 95%% CI half-width is within this %% (default 1)")
    run.add_argument("--processes", type=int, default=None).lazy_help = _processes_help
    run.add_argument("--placements", type=int, default=DEFAULT_PLACEMENTS,
                     help=PLACEMENTS_HELP.replace("%", "%%"))
    from nearlocal.gate.modes import MODES, modes_help

    run.add_argument("--for-gate", choices=tuple(MODES), metavar="MODE",
                     help="a run a CI gate will compare (`compare --mode MODE`): the processes "
                          "its verdicts need. " + modes_help(default=None).replace("%", "%%"))
    run.add_argument("--out", default="results", help="the store's root (default ./results)")
    add_json_option(run, "the case rows as a JSON array: written to PATH (the table printed "
                    "too), or on stdout in place of the table")
    run.add_argument("--allow-write", action="store_true",
                     help="allow writing to devdax: regions and existing files named here")
    run.add_argument("--take-turns", metavar="DIR",
                     help="measure pass by pass in turns with the other arms of a group meeting "
                     "in DIR (each its own `nearlocal run`, e.g. the baseline's checkout and the "
                     "candidate's), so both see the same host; with --turn")
    run.add_argument("--turn", metavar="ARM/ARMS", help="this run's arm of the group, e.g. 0/2")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=_run)

    runs = sub.add_parser("runs", help="list stored runs")
    runs.add_argument("--out", default="results")
    runs.add_argument("--remove-unstarted", action="store_true",
                      help="first remove the runs killed before they started (no run.json, "
                           "nothing measured, over a minute old), then list")
    add_json_option(runs)
    runs.set_defaults(func=_runs)

    show = sub.add_parser("show", help="print one run")
    show.add_argument("run", nargs="?", help="run id or directory (default: latest)")
    show.add_argument("--out", default="results")
    add_json_option(show, "the rows as a JSON array (every column): on stdout in place of the "
                    "table, or written to PATH")
    show.add_argument("--all", action="store_true", help="include skipped rows")
    show.set_defaults(func=_show)

    from nearlocal.subcommands import add_commands

    add_commands(sub)  # every other command: the registry, filled by its entry-point group
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: what was measured is stored, nearlocal's files removed."""


def _terminate(signum: int, frame: object) -> None:
    from nearlocal.engine.children import raising_interrupt  # imported by _main already

    raise raising_interrupt(Terminated)


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C, as Python's own handler raises it, remembered (engine.children)."""
    from nearlocal.engine.children import raising_interrupt

    raise raising_interrupt(KeyboardInterrupt)


def _interrupt_signal(kind: type) -> int | None:
    """The signal behind an interrupt that C code swallowed (engine.children.resend_swallowed)."""
    if not issubclass(kind, KeyboardInterrupt):
        return None
    return signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT


def _refuse_undecodable(argv: list[str]) -> None:
    """Undecodable bytes in an argument (a path from another locale) arrive as surrogates: no
    run id, case id or report can hold them, so they are one line before anything starts."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"argument {arg!a} holds bytes that are not UTF-8 text: "
                             "nearlocal keeps names as text; rename the file or use another "
                             "path") from None


def main(argv: list[str] | None = None) -> int:
    from nearlocal import safeio

    safeio.reset_kept()
    with safeio.guarded_streams() as stdout_closed:
        return _main(sys.argv[1:] if argv is None else argv, stdout_closed)


def _main(argv: list[str], stdout_closed: bool) -> int:
    from nearlocal.safeio import quiet_library_colours

    quiet_library_colours()
    from nearlocal.engine.children import interrupt_seen, resend_swallowed

    interrupt_seen()
    main_thread = threading.current_thread() is threading.main_thread()
    previous_hook = sys.unraisablehook
    if main_thread:  # a Ctrl-C numba's callbacks (or an import's lock callback) swallowed ends the
        # command; set before SIGTERM's handler, so that no signal of ours meets Python's own hook
        sys.unraisablehook = resend_swallowed(previous_hook, _interrupt_signal)
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    # Ctrl-C the same, where Python's own handler has it (an inherited SIG_IGN stays)
    previous_int = signal.getsignal(signal.SIGINT) if main_thread else None
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        if stdout_closed:
            raise UsageError("stdout is closed: nearlocal prints its results there; redirect "
                             "it to a file or to /dev/null")
        _refuse_undecodable(argv)
        try:  # relative paths, the worker processes' start: all need it
            os.getcwd()
        except OSError as exc:
            raise UsageError(f"the current directory cannot be used ({exc.strerror}: removed "
                             "while this shell was in it?): cd to an existing directory") from None
        args = build_parser().parse_args(argv)
        if isinstance(getattr(args, "out", None), str) and not args.out.strip():
            raise UsageError("--out is empty: give the store's root directory (default "
                             "./results)")  # Path("") is the current directory
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe (`show --json | head`) surfaces here, not at exit
        return code
    except UsageError as exc:
        print(f"nearlocal: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("nearlocal: " + ("terminated" if isinstance(exc, Terminated) else "interrupted"),
              file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:  # the reader went away: not an error of ours, and no traceback
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # the last resort of safeio's policy: a file the OS refused
        from nearlocal import safeio

        where = f"{safeio.printable(exc.filename)}: " if exc.filename else ""
        kept = safeio.kept_note()
        print(f"nearlocal: error: {where}{safeio.os_error_text(exc)}"
              + (f"; {kept}" if kept else ""), file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        sys.unraisablehook = previous_hook


if __name__ == "__main__":
    sys.exit(main())
