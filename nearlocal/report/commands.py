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
    from nearlocal.store import load
    from nearlocal.terminal import console

    # each file checked before anything is read: a directory, a FIFO, a missing or unwritable
    # directory, a name too long are one line
    files = {reporter: safeio.check_output(f"--{reporter.name}", getattr(args, reporter.name))
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
    if not args.quiet and not files:  # writing a file prints where, nothing more
        REPORT_FORMATS.default.show(report)
    for reporter, path in files.items():  # each whole or not at all; an OSError: one line
        written = reporter.write(report, path, f"--{reporter.name}")
        console.print(f"wrote {written[0]}" + (f" and {len(written) - 1} PNG plots beside it"
                                               if len(written) > 1 else ""))
    return 0


def register(subparsers) -> None:
    from nearlocal.report.formats import REPORT_FORMATS

    parser = subparsers.add_parser(
        "report", help="the papers' figures beside stored runs: terminal, Markdown, HTML",
        description="Mirror Beluga's and SwiftCache's tables with this box's medians. Several "
                    "runs become side-by-side columns (box A vs box B, before vs after).")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run ids or run directories (default: the latest run)")
    for reporter in REPORT_FORMATS.others():  # --html PATH, --markdown PATH
        parser.add_argument(f"--{reporter.name}", metavar="PATH", help=reporter.help)
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--reference",
                        help="the Serving section fills the hops a run lacks from this reference "
                             "box (`nearlocal whatif --reference list`), labelled per term")
    parser.add_argument("--quiet", action="store_true",
                        help="do not print the tables (with --html / --markdown they are not "
                        "printed anyway: one line says where the file is)")
    parser.set_defaults(func=_report)


register_command("report", register)
