"""The registry of subcommands beside probe, run, runs and show (frontends/cli.py), and of `run`'s
other modes (`RunMode`: an MPI job's): each declared once, by the module that runs it, a command
with the function that adds its parser. The modules are the
entry-point group plugins.COMMAND_GROUP (nearlocal's own in its pyproject.toml, a third party's in
its distribution's), so the command line names none of them and a family's command lives in the
family (a front-end face of it, e.g. nearlocal/rpc/commands.py).

`nearlocal --help` imports every command module: one may import nothing heavy at its top (numpy,
pandas, numba, rich load inside the command's function; tests/test_startup.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nearlocal.plugins import declare


@dataclass(frozen=True)
class Command:
    """`add(subparsers)` adds the parser of the subcommand `name` and sets its `func`."""

    name: str
    add: Callable[[Any], None]
    module: str  # the module that declared it, for the one line naming a clash


COMMANDS: dict[str, Command] = {}


def register_command(name: str, add: Callable[[Any], None]) -> Callable[[Any], None]:
    """Declare the subcommand `name`, added by `add(subparsers)`; a name declared twice (two
    plugins, or one and nearlocal) is a bug of the second."""
    if name in COMMANDS:
        raise ValueError(f"command {name!r} declared twice ({COMMANDS[name].module}, "
                         f"{add.__module__})")
    COMMANDS[name] = Command(name, add, add.__module__)
    return add


def load_commands() -> list[Command]:
    """Every declared command, in the order their modules load (the group's entry-point names)."""
    from nearlocal.plugins import COMMAND_GROUP, load_group

    load_group(COMMAND_GROUP)
    return list(COMMANDS.values())


def add_commands(subparsers) -> None:
    """Add every declared command's parser; one whose `add` adds no parser of its name is a bug."""
    for command in load_commands():
        command.add(subparsers)
        if command.name not in subparsers.choices:
            raise ValueError(f"command {command.name!r} ({command.module}) added no parser of "
                             "that name")


@dataclass(frozen=True)
class RunMode:
    """Another way `nearlocal run` runs, declared by the family that brings it (rack's MPI job,
    from its command face nearlocal/rack/commands.py), so the command line names none.
    `active()`: this process runs under it (launched by mpiexec); `run(args)`: the command run
    there, its exit code; `refuse(cases, inventory)`: bad input for a plain run's selection that
    needs the mode (every rack case outside an MPI job), or None."""

    name: str
    active: Callable[[], bool]
    run: Callable[[Any], int]
    refuse: Callable[[list, Any], None] | None = None


RUN_MODES: dict[str, RunMode] = {}


def register_run_mode(mode: RunMode) -> RunMode:
    """Declare a run mode; a name declared twice is a bug of the second."""
    return declare(RUN_MODES, mode.name, mode, "run mode")


def run_modes() -> list[RunMode]:
    """Every declared run mode (their modules are the command group's: loaded here too)."""
    load_commands()
    return list(RUN_MODES.values())
