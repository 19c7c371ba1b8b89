"""The gate's two modes, named by the user (`compare --mode`, `run --for-gate`,
`pytest --nearlocal-mode`): which question a comparison answers and how the host's own moves
count. Both need the same worker processes of a run made for them (`run --for-gate`:
engine.plan.RunSettings). Light: the CLI's help reads it."""

from __future__ import annotations

from dataclasses import dataclass

from nearlocal.errors import UsageError


@dataclass(frozen=True)
class Mode:
    name: str
    question: str
    # "noise" (unpaired runs: a case that moved with its layer is ambiguous; runs that took
    # turns shared the host, so no probe excuses a case there) or "findings"
    host_moves: str
    recipe: str  # how its runs are made, for --help


MODES = {
    "code": Mode("code", "did my code get slower?", "noise",
                 "baseline and candidate built from two trees on one host, best taking turns "
                 "(run --take-turns: paired, one host, so no probe move excuses a case); "
                 "unpaired, the host's moves are noise"),
    "box": Mode("box", "did this box get slower?", "findings",
                "the candidate against this box's own baseline; a case that is slower is "
                "slower, and the host probes name the layer that moved"),
}
DEFAULT_MODE = "code"


def get_mode(name: str) -> Mode:
    if name not in MODES:
        raise UsageError(f"unknown gate mode {name!r}: choose one of {', '.join(MODES)}")
    return MODES[name]


def modes_help(default: str | None = DEFAULT_MODE) -> str:
    """One clause per mode, from the registry."""
    text = "; ".join(f"{m.name}: {m.question} ({m.recipe})" for m in MODES.values())
    return text + (f" (default {default})" if default else "")
