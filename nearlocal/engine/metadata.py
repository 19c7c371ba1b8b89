"""What run.json records about how a run was made: versions, command line, settings, the host
and the tree the code came from."""

from __future__ import annotations

import time

from nearlocal.engine.worker import WorkerSettings
from nearlocal.probe import HostInventory


def code_origin() -> dict:
    """Which tree this process's nearlocal came from: the directory holding the package, its
    git commit and whether its files differ from it (code CI runs two trees in turns, and a
    run that imported the other's code measured the wrong one: compare --trees checks)."""
    import subprocess
    from pathlib import Path

    import nearlocal

    tree = Path(nearlocal.__file__).resolve().parent.parent
    origin: dict = {"path": str(tree)}
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "nearlocal"],
                                   capture_output=True, text=True, timeout=10)
            origin.update(commit=commit.stdout.strip(), dirty=bool(dirty.stdout.strip()))
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout: the path says it
        pass
    return origin


def run_metadata(inventory: HostInventory, settings: WorkerSettings, suite: str, **extra) -> dict:
    """What run.json records about how a run was made: versions, command line, settings, host."""
    import importlib
    import sys

    from nearlocal import __version__

    rule = settings.rule
    versions = {f"{name}_version": importlib.import_module(name).__version__
                for name in ("numba", "llvmlite", "numpy")}
    return {
        "nearlocal_version": __version__, **versions, "python_version": sys.version.split()[0],
        "command": sys.argv, "suite": suite, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"budget_s": rule.budget_s, "target_rel_ci": rule.target_rel_ci,
                     "min_samples": rule.min_samples, "max_samples": rule.max_samples,
                     "allow_write": settings.allow_write},
        "host_id": inventory.host_id, "inventory": inventory.to_dict(), "code": code_origin(),
        **({"clock": settings.clock.to_dict(settings.tsc_hz)} if settings.clock is not None else {}),
        **extra,
    }
