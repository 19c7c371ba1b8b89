"""`nearlocal report`: the papers' tables beside one or more stored runs (terminal, Markdown,
self-contained HTML)."""

from __future__ import annotations

import argparse
from pathlib import Path

from nearlocal import safeio


def _output_path(text: str | None, option: str, suffixes: tuple[str, ...]) -> Path | None:
    """Checked before anything is read: a directory, a FIFO, a missing or unwritable directory,
    a name too long are one line (safeio.check_output)."""
    return safeio.check_output(option, text)


def _report(args: argparse.Namespace) -> int:
    from nearlocal.report.render_html import write_html
    from nearlocal.report.render_markdown import write_markdown
    from nearlocal.report.render_terminal import print_report
    from nearlocal.report.tables import build_report
    from nearlocal.store import load
    from nearlocal.terminal import console

    html = _output_path(args.html, "--html", (".html", ".htm"))
    markdown = _output_path(args.markdown, "--markdown", (".md",))
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
    if not args.quiet and not (html or markdown):  # writing a file prints where, nothing more
        print_report(report, console)
    if html:  # written whole or not at all; an OSError: one line with the errno
        console.print(f"wrote {write_html(report, html)}")
    if markdown:
        files = write_markdown(report, markdown)
        console.print(f"wrote {files[0]}" + (f" and {len(files) - 1} PNG plots beside it"
                                             if len(files) > 1 else ""))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="the papers' figures beside stored runs: terminal, Markdown, HTML",
        description="Mirror Beluga's and SwiftCache's tables with this box's medians. Several "
                    "runs become side-by-side columns (box A vs box B, before vs after).")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run ids or run directories (default: the latest run)")
    parser.add_argument("--html", help="write one self-contained HTML file (plots inline)")
    parser.add_argument("--markdown", help="write Markdown, with PNG plots beside it")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--reference",
                        help="the Serving section fills the hops a run lacks from this reference "
                             "box (`nearlocal whatif --reference list`), labelled per term")
    parser.add_argument("--quiet", action="store_true",
                        help="do not print the tables (with --html / --markdown they are not "
                        "printed anyway: one line says where the file is)")
    parser.set_defaults(func=_report)
