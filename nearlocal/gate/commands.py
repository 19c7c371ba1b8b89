"""`nearlocal compare` and `nearlocal baseline`: options to a comparison and back."""

from __future__ import annotations

import os
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.gate.baselines import (
    BASELINE_REF,
    HISTORY_RUNS,
    baseline_dir,
    baseline_for,
    baseline_records,
    history_noise,
    history_note,
    set_baseline,
)
from nearlocal.gate.modes import DEFAULT_MODE, MODES, modes_help
from nearlocal.reporters import (
    add_json_option,
    command_formats,
    emit,
    json_path,
    json_wanted,
)
from nearlocal.subcommands import register_command
from nearlocal.units import non_negative_int


def parse_percent(text: str) -> float:
    """`5%` or `5` -> 0.05."""
    raw = str(text).strip().removesuffix("%")
    try:
        return float(raw) / 100
    except ValueError:
        raise UsageError(f"malformed threshold {text!r}: give a percentage such as 5%") from None


def check_trees(trees: list[str], runs: tuple) -> None:
    """`--trees BASE CAND`: each run's code came from the checkout named for it (run.json
    `code`): a baseline run that imported the candidate's code (python -c puts the current
    directory first on the path) compares the candidate with itself."""
    named = [str(Path(tree).resolve()) for tree in trees]
    for role, tree, run in zip(("baseline", "candidate"), named, runs, strict=True):
        came = (run.meta.get("code") or {}).get("path")
        if came is None:
            raise UsageError(f"--trees: the {role} run {run.run_id} does not say which tree its "
                             "code came from (stored before runs did)")
        if str(Path(came).resolve()) != tree:
            raise UsageError(f"--trees: the {role} run {run.run_id} measured the code of {came}, "
                             f"not {tree}")


def _compare(args) -> int:
    from nearlocal.gate.identity import host_note
    from nearlocal.gate.render import append_job_summary, write_output
    from nearlocal.gate.verdict import compare_runs
    from nearlocal.store.reader import load

    root = Path(args.out)
    safeio.check_output("--output", args.output)  # before anything is read
    safeio.check_output("--json", json_path(args))
    if args.box and args.mode not in (None, "box"):
        raise UsageError(f"--box and --mode {args.mode} ask two questions: give one")
    mode = "box" if args.box else args.mode or DEFAULT_MODE
    cand = load(args.candidate, root)
    base_ref = baseline_for(cand.meta, root) if args.base == BASELINE_REF else args.base
    base = load(base_ref, root)
    base.require_complete("the base of a comparison", args.allow_incomplete)
    cand.require_complete("the candidate of a comparison", args.allow_incomplete)
    if args.trees:
        check_trees(args.trees, (base, cand))
    note = host_note(base.meta, cand.meta, args.cross_host, (base.run_id, cand.run_id))
    incomplete = [f"run {r.run_id} is INCOMPLETE ({r.incomplete})" for r in (base, cand)
                  if r.incomplete]  # only with --allow-incomplete: said in every format
    unread: list[str] = []
    history, used = history_noise(root, cand, args.history, unread) if args.history else ({}, 0)
    note = "; ".join(filter(None, [note, *incomplete, history_note(unread)]))
    result = compare_runs(base, cand, parse_percent(args.threshold), args.alpha, args.seed, note,
                          history, used, mode)
    from nearlocal.gate.render import COMPARE_FORMATS

    emit(COMPARE_FORMATS, result, args, text=False)  # --json: on stdout, or to PATH
    if not json_wanted(args):
        write_output(result, args.format, args.output)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        append_job_summary(result, os.environ["GITHUB_STEP_SUMMARY"])
    if args.output and args.format != "table":
        from nearlocal.terminal import err_console

        err_console.print(f"{result.head_line()}; "
                          f"{'regression' if result.regressions else 'no regression'}: "
                          f"{result.summary()}; wrote {args.output}", markup=False)
    return result.exit_code


def _print_baselines(listed: dict) -> None:
    from nearlocal.terminal import console

    if "set" in listed:
        record = listed["set"]
        console.print(f"baseline for host {record['host_id']} is run {record['run']} "
                      f"({record['path']})")
        return
    for problem in listed["damaged"]:
        console.print(problem, markup=False)
    if not listed["baselines"]:
        console.print(f"no baselines in {listed['folder']}")
    for record in listed["baselines"]:
        console.print(f"{record['host_id']}  {record.get('hostname') or ''}  run {record['run']}  "
                      f"(set {record.get('set')})")


BASELINE_FORMATS = command_formats("baseline", _print_baselines)


def _baseline(args) -> int:
    from nearlocal.store.baseline import read_baseline
    from nearlocal.store.catalogue import require_store

    root = Path(args.out)
    if args.action == "set":
        path = set_baseline(args.run, root, args.allow_incomplete)
        emit(BASELINE_FORMATS, {"set": {**read_baseline(path), "path": str(path)}}, args)
        return 0
    damaged: list[str] = []
    records = [record for _, record in baseline_records(require_store(root), damaged)]
    emit(BASELINE_FORMATS, {"folder": str(baseline_dir(root)), "baselines": records,
                            "damaged": damaged}, args)
    return 0


def register_compare(sub) -> None:
    from nearlocal.gate.render import COMPARE_FORMATS
    from nearlocal.gate.verdict import DEFAULT_ALPHA

    parser = sub.add_parser("compare", help="compare two runs case by case; exit 1 on a regression")
    parser.add_argument("base", help="run id, directory, `latest`, or `baseline` (this host's)")
    parser.add_argument("candidate", nargs="?", default="latest",
                        help="run id or directory (default: latest)")
    parser.add_argument("--mode", choices=tuple(MODES), default=None,
                        help="the question the gate answers: " + modes_help().replace("%", "%%"))
    parser.add_argument("--box", action="store_true", help="the same as --mode box")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--threshold", default="5%",
                        help="smallest change that counts (default 5%%)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="chance that unchanged code reads any case slower (default 0.01)")
    parser.add_argument("--format", choices=COMPARE_FORMATS.names,
                        default=COMPARE_FORMATS.default.name,
                        help=COMPARE_FORMATS.help().replace("%", "%%"))
    parser.add_argument("--output", help="write the report to this file instead of stdout")
    add_json_option(parser, "the comparison as JSON (as --format json): on stdout in place of "
                    "--format's, or written to PATH as well")
    parser.add_argument("--cross-host", action="store_true",
                        help="compare runs from different hardware anyway")
    parser.add_argument("--history", type=non_negative_int, default=HISTORY_RUNS,
                        help="past baselines of this hardware whose spread floors each case's "
                             f"error (default {HISTORY_RUNS}; 0: none)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="bootstrap seed for one-process runs (default 0)")
    parser.add_argument("--trees", nargs=2, metavar=("BASE", "CAND"),
                        help="the checkouts the two runs' code must come from (run.json `code`; "
                             "scripts/take_turns.sh names them): exit 2 where a run measured "
                             "another tree's code")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="compare an incomplete (interrupted or killed) run anyway")
    parser.set_defaults(func=_compare)


def register_baseline(sub) -> None:
    baseline = sub.add_parser("baseline", help="a named baseline run per host, kept in the store")
    actions = baseline.add_subparsers(dest="action", required=True)
    set_parser = actions.add_parser("set", help="make RUN this host's baseline")
    set_parser.add_argument("run", help="run id, directory or `latest`")
    set_parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    set_parser.add_argument("--allow-incomplete", action="store_true",
                            help="make an incomplete (interrupted or killed) run the baseline")
    add_json_option(set_parser)
    show = actions.add_parser("show", help="list the baselines")
    show.add_argument("--out", default="results", help="the store's root (default ./results)")
    add_json_option(show)
    baseline.set_defaults(func=_baseline)


register_command("compare", register_compare)
register_command("baseline", register_baseline)
