"""`nearlocal accept SPEC`: measure the spec's cases as `run` does (the same engine call:
frontends/measure.py), or take a stored run, and judge it (nearlocal/acceptance/: the spec, the
verdicts, their JUnit and table) and keep the verdicts in that run's run.json."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nearlocal.core.sampling import DEFAULT_PLACEMENTS, PLACEMENTS_HELP
from nearlocal.subcommands import register_command

if TYPE_CHECKING:
    from nearlocal.acceptance.spec import Spec

# The acceptance modules (the spec's cases, the regions, the probe, numpy) load when `accept`
# runs, not when the command line is built: `nearlocal --help` should not pay for them.


def measure_cases(spec: Spec, out: Path, budget: str | None, allow_write: bool,
                  processes: int | None = None, placements: int | None = None) -> Path:
    """Run exactly the spec's cases through the plan stage and the runner, as `nearlocal run`
    does; returns the run path. Cases this box cannot run (a missing node, a CPU flag) are stored
    skipped with the reason. Worker processes per case: --processes, else the spec's [run]
    processes, else the default `nearlocal run` uses for this budget (so accept's rows are
    measured as run's are); page placements: --placements, else the spec's, else run's default."""
    from nearlocal.acceptance.spec import check_pool
    from nearlocal.engine.metadata import run_metadata
    from nearlocal.engine.plan import RunSettings, plan_cases, settle_llc
    from nearlocal.frontends.measure import measure_into
    from nearlocal.probe import probe

    inventory = settle_llc(probe(), out)  # cache classes held for this box
    check_pool(spec, inventory)
    settings = RunSettings.from_options(budget or spec.budget, spec.ci,
                                        processes or spec.processes, allow_write=allow_write,
                                        budget_option="--budget" if budget else "budget",
                                        for_gate=True,  # a verdict, as a gate's
                                        placements=placements or spec.placements
                                        or DEFAULT_PLACEMENTS)
    # a case the box refuses (numa:1 on a one-node box) is not measured, not a bad spec; nor is
    # a spec whose every case writes to memory not allowed: its requirements fail, not measured
    plan = plan_cases(spec.cases(), inventory, settings).refused_as_skipped()
    meta = run_metadata(inventory, plan.worker_settings(),
                        f"accept:{spec.path.name}", kind="accept",
                        spec=str(spec.path.resolve()), processes=settings.processes,
                        pool=spec.pool or None)
    path, interrupted = measure_into(plan, out, meta)
    if interrupted:  # Ctrl-C / SIGTERM: what was measured is stored, marked interrupted
        raise interrupted
    return path


def _accept(args) -> int:
    from nearlocal.acceptance.judge import acceptance_record, judge_run
    from nearlocal.acceptance.render import ACCEPT_FORMATS
    from nearlocal.acceptance.spec import parse_spec
    from nearlocal.engine.plan import check_placements, check_processes
    from nearlocal.reporters import check_outputs, emit, json_wanted, side_console, write_outputs
    from nearlocal.store.reader import load
    from nearlocal.units import parse_budget

    spec = parse_spec(args.spec, args.region, args.peer)

    if args.processes is not None:
        check_processes(args.processes)
    if args.placements is not None:
        check_placements(args.placements)
    if args.budget is not None:  # an empty --budget is refused, not the spec's
        parse_budget(args.budget)  # before anything is loaded or measured
    check_outputs(ACCEPT_FORMATS, args)
    said = side_console(args)  # stderr where stdout carries the JSON
    if args.run:
        run = load(args.run, Path(args.out))
    else:
        run = load(measure_cases(spec, Path(args.out), args.budget,
                                 args.allow_write or spec.allow_write, args.processes,
                                 args.placements))
        said.print(f"stored {run.path}")
    record = acceptance_record(spec, run, judge_run(spec, run))
    if not json_wanted(args):
        ACCEPT_FORMATS.default.show(record)
    if run.incomplete:
        said.print(f"[yellow]run {run.run_id} is incomplete ({run.incomplete}): requirements "
                      "whose cases it lacks fail as not measured[/]")
    write_outputs(ACCEPT_FORMATS, record, args)  # an OSError: one line naming the file
    emit(ACCEPT_FORMATS, record, args, text=False)  # --json: on stdout or to PATH
    _keep(run, record, said)  # after the files asked for: a full disk is then their one line
    return 0 if record.passed else 1


def _keep(run, record, said) -> None:
    """The verdicts go into the run they judged, for the report to read; a run that cannot keep
    them (still being written, not writable) is said, and the verdict stands."""
    from nearlocal.acceptance.verdicts import store_acceptance
    from nearlocal.errors import UsageError
    from nearlocal.terminal import err_console

    try:
        where = store_acceptance(run, record)
    except UsageError as exc:
        err_console.print(f"verdicts not kept in the run: {exc}", markup=False, highlight=False)
        return
    said.print(f"verdicts kept in {where}", markup=False, highlight=False)


def _processes_help() -> str:
    from nearlocal.engine.processes import default_processes_text

    return ("worker processes per case (default: the spec's [run] processes, else as `nearlocal "
            f"run --for-gate`: {default_processes_text(True)})")


def register(sub) -> None:
    from nearlocal.acceptance.render import ACCEPT_FORMATS  # the store, no numpy
    from nearlocal.reporters import add_format_options

    parser = sub.add_parser("accept", help="judge a run (or measure now) against a TOML spec")
    parser.add_argument("spec", help="the requirements, e.g. examples/acceptance/local-dram.toml")
    parser.add_argument("run", nargs="?", help="judge this stored run instead of measuring now")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    parser.add_argument("--region", help="aim the spec at this region (its pool): any region "
                                         "`nearlocal probe` lists, e.g. numa:2 or devdax:/dev/dax0.0")
    parser.add_argument("--peer", help="the other side of the spec's transfers ({peer} in it)")
    parser.add_argument("--budget", help="per-case time budget (default: the spec's [run] budget)")
    parser.add_argument("--processes", type=int, default=None).lazy_help = _processes_help
    parser.add_argument("--placements", type=int, default=None, help=PLACEMENTS_HELP.replace(
        f"(default {DEFAULT_PLACEMENTS})", "(default: the spec's [run] placements, else "
        f"{DEFAULT_PLACEMENTS})").replace("%", "%%"))
    parser.add_argument("--allow-write", action="store_true",
                        help="allow writing to devdax: regions and existing files")
    add_format_options(parser, ACCEPT_FORMATS)  # --junit PATH, --json [PATH]
    parser.set_defaults(func=_accept)


register_command("accept", register)
