"""`nearlocal report`: the papers' tables beside one or more stored runs (terminal, Markdown,
self-contained HTML)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nearlocal import safeio
from nearlocal.subcommands import register_command


def _report(args: argparse.Namespace) -> int:
    from nearlocal.report.formats import REPORT_FORMATS
    from nearlocal.report.tables import build_report
    from nearlocal.reporters import json_path, json_wanted, side_console
    from nearlocal.store import load

    console = side_console(args)  # stderr where stdout carries the JSON
    # each file checked before anything is read: a directory, a FIFO, a missing or unwritable
    # directory, a name too long are one line
    files = {reporter: safeio.check_output(f"--{reporter.name}", json_path(args)
                                           if reporter.name == "json"
                                           else getattr(args, reporter.name))
             for reporter in REPORT_FORMATS.others()}
    files = {reporter: path for reporter, path in files.items() if path is not None}
    reference = args.reference
    if reference:  # an unknown box is one line before anything is read
        from nearlocal.store import resolve_run
        from nearlocal.whatif import reference_box

        if reference.startswith("run:"):  # found in this store, whatever reads it later
            reference = f"run:{resolve_run(reference.removeprefix('run:'), Path(args.out))}"
        reference_box(reference)
    refs = args.runs or [None]
    data = [load(ref, Path(args.out)) for ref in refs]
    for run in data:  # also in the report's run table; said here so it is not missed
        if run.incomplete:
            console.print(f"[yellow]run {run.run_id} is incomplete ({run.incomplete}): its "
                          f"figures cover only the {len(run.cases)} cases it stored[/]")
    report = build_report(data, reference)
    if json_wanted(args):  # --json alone: the JSON is stdout
        REPORT_FORMATS["json"].show(report)
    elif not args.quiet and not files:  # writing a file prints where, nothing more
        REPORT_FORMATS.default.show(report)
    for reporter, path in files.items():  # each whole or not at all; an OSError: one line
        written = reporter.write(report, path, f"--{reporter.name}")
        console.print(f"wrote {written[0]}" + (f" and {len(written) - 1} PNG plots beside it"
                                               if len(written) > 1 else ""))
    return 0


def register(subparsers) -> None:
    from nearlocal.report.formats import REPORT_FORMATS
    from nearlocal.reporters import add_format_options

    parser = subparsers.add_parser(
        "report", help="the papers' figures beside stored runs: terminal, Markdown, HTML",
        description="Mirror Beluga's and SwiftCache's tables with this box's medians. Several "
                    "runs become side-by-side columns (box A vs box B, before vs after).")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run ids or run directories (default: the latest run)")
    add_format_options(parser, REPORT_FORMATS)  # --html PATH, --markdown PATH, --json [PATH]
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--reference",
                        help="the Serving section fills the hops a run lacks from this reference "
                             "box (`nearlocal whatif --reference list`), labelled per term")
    parser.add_argument("--quiet", action="store_true",
                        help="do not print the tables (with --html / --markdown they are not "
                        "printed anyway: one line says where the file is)")
    parser.set_defaults(func=_report)


register_command("report", register)
