"""What the VM rig's fact files share (scripts/vm_check.sh, docs/vm-rig.md): the collector of
facts, the readers of a guest's files, its stored runs and rows, the decoding of a row's JSON
columns, and the what-if's hops on a guest's run. Each vm_*.py keeps only its own facts.

Imported by name (`from vm_lib import ...`): a script run as a file has scripts/ on sys.path, in
the guest (the packed checkout) as on the host. Only the standard library is imported here at
first: nearlocal where a function needs it (vm_pair.py's check runs under a bare python3)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


class Facts:
    """A stage's facts, each held or failed. Called as `fact(ok, text)` it returns ok, so a fact
    that the next ones stand on reads as their condition."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.failed: list[str] = []

    def __call__(self, ok: bool, text: str) -> bool:
        (self.held if ok else self.failed).append(text)
        return ok

    def report(self, held: str, failed: str | None = None) -> list[str]:
        """Prints each held fact after the prefix `held` (and each failed one after `failed`,
        where given); returns the failed ones."""
        for line in self.held:
            print(f"{held}{line}")
        for line in self.failed if failed is not None else ():
            print(f"{failed}{line}")
        return self.failed


def finish(problems: list[str], prefix: str) -> int:
    """A fact file's exit: each failed fact on stderr after `prefix`; 1 if one failed, else 0."""
    for problem in problems:
        print(f"{prefix}{problem}", file=sys.stderr)
    return 1 if problems else 0


def text(path: Path, tail: int = 0, missing: str = "missing") -> str:
    """A guest's file, stripped (its last `tail` characters where given); `missing` without it."""
    found = path.read_text(errors="replace").strip() if path.exists() else missing
    return found[-tail:] if tail else found


def read_json(path: Path) -> dict:
    """A guest's JSON report; {} where it is missing, unreadable or not an object."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def exit_fact(fact: Facts, out: Path, name: str, what: str, ok: tuple[str, ...] = ("0",)) -> str:
    """The fact that a guest's command NAME exited as it should (OUT/NAME.rc in `ok`), the tail
    of its OUT/NAME.err beside it; returns the exit code as the guest wrote it."""
    rc = text(out / f"{name}.rc")
    fact(rc in ok, f"{what} (rc {rc}: {text(out / f'{name}.err', 300, '')})")
    return rc


def decoded(value: object) -> dict:
    """A row's JSON column (info, params) as a dict: the store keeps it as text; {} when empty."""
    if isinstance(value, dict):
        return value
    try:
        found = json.loads(value or "{}")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def param(row, name: str, default: str) -> str:
    """One of a row's own parameters, as text (`default` where the row kept the default)."""
    return str(decoded(row.get("params")).get(name, default))


def latest_run(results: Path):
    """The newest run stored under `results` (nearlocal.store.RunData); None when none loads."""
    runs = sorted(p.parent for p in results.glob("*/run.json"))
    if not runs:
        return None
    from nearlocal.errors import UsageError
    from nearlocal.store import load

    try:
        return load(runs[-1])
    except (OSError, ValueError, UsageError):
        return None


def rows(results: Path) -> list[dict]:
    """The rows of the newest run under `results`, one dict each; [] when there is none."""
    run = latest_run(results)
    return [] if run is None else run.cases.to_dict("records")


def whatif_of(run):
    """`nearlocal whatif` on a guest's run, with the default request."""
    from nearlocal.whatif import Request, inputs_of, whatif

    return whatif(inputs_of(run), Request())


def hop_fact(fact: Facts, result, path: str, hop: str | None = None,
             row_ok: Callable[[str], bool] = lambda row: True) -> bool:
    """The what-if fact: the `hop` term of `path` (its first term where no hop is named) is
    predicted from the run's own measured rows, each of them `row_ok`."""
    found = next((p for p in result.paths if p.path == path), None)
    term = next((t for t in (found.terms if found else ()) if hop in (None, t.hop)), None)
    measured = term is not None and term.source == "measured"
    rows_of = tuple(term.rows) if measured else ()
    return fact(bool(rows_of) and all(row_ok(r) for r in rows_of),
                f"whatif: the {path} path's {hop or 'first'} hop from the run's own rows "
                f"({term.way if term else '-'}: "
                f"{', '.join(rows_of) or (term.source if term else 'no such hop')})")
