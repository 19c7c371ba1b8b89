"""rack's command face: `nearlocal run` under mpiexec / srun, one run across every rank of the job
(docs/rack.md), declared as a run mode of `run` (nearlocal/subcommands.py), so the command line
names no family. This module is the front end's part: the command line's checks, its cases and
settings on each host, and how rank 0 shows the stored run; the job's engine work is
engine/mpi_job.py. Loaded by the commands group only; it imports nothing heavy at its top."""

from __future__ import annotations

import argparse
from pathlib import Path

from nearlocal.errors import UsageError
from nearlocal.subcommands import RunMode, register_run_mode


def select(args: argparse.Namespace, inventory) -> tuple[list, object]:
    """The command line's cases and run settings on this rank's host: bad input is UsageError,
    which every rank exits 2 with."""
    from nearlocal.frontends.selection import run_settings, selected_cases
    from nearlocal.reporters import json_path

    settings = run_settings(args)
    target = json_path(args)
    if target and not Path(target).resolve().parent.is_dir():
        raise UsageError(f"--json: directory {Path(target).parent} does not exist")
    return selected_cases(args, inventory), settings


def job_plan(args: argparse.Namespace, inventory):
    """This host's plan of the command line, as every rank makes it before the run."""
    from nearlocal.engine.mpi_job import plan_job

    return plan_job(*select(args, inventory), inventory)


def announce(args: argparse.Namespace, stored) -> None:
    """Rank 0: the stored run's rows as `run` shows them, and where it is stored."""
    from nearlocal.frontends import console
    from nearlocal.reporters import emit, side_console
    from nearlocal.store import load

    run = load(stored.path)
    try:
        emit(console.RUN_FORMATS, console.RunRows(run.meta, run.cases), args,
             text=not args.quiet)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # the reader of stdout went away: not the file
            raise
        raise UsageError(f"cannot write --json {args.json}: {exc.strerror}; the run is "
                         f"stored in {stored.path}") from None
    side_console(args).print(f"stored {stored.path} ({stored.ranks} ranks on {stored.hosts} "
                             "host(s))" + (f" (incomplete: {stored.incomplete})"
                                           if stored.incomplete else ""))


def run_job(args: argparse.Namespace) -> int:
    """`nearlocal run` as one MPI job: rank 0 stores the run, the others measure for it."""
    from nearlocal.engine.mpi_job import JobRequest
    from nearlocal.engine.mpi_job import run_job as run_ranks

    if args.take_turns is not None:
        raise UsageError("--take-turns is for runs on one host, not an MPI job's ranks")
    return run_ranks(JobRequest(
        select=lambda inventory: select(args, inventory), out=Path(args.out), suite=args.suite,
        allow_write=args.allow_write, announce=lambda stored: announce(args, stored)))


def in_job() -> bool:
    from nearlocal.rack.mpi import in_mpi_job

    return in_mpi_job()


def refuse_outside(cases: list, inventory) -> None:
    """Rack cases alone, outside an MPI job: one line saying how to launch them."""
    from nearlocal.rack.framework import refuse_without_mpi

    refuse_without_mpi(cases, inventory)


register_run_mode(RunMode("mpi", in_job, run_job, refuse_outside))
