"""The store's catalogue: which directories of a results root are runs, in what order, which
were killed before they started, and which run a reference (a path, an id or its prefix,
`latest`, `latest:KIND`) names."""

from __future__ import annotations

import time
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.store.meta import read_meta
from nearlocal.store.schema import RUN_KINDS, run_kind

DEFAULT_ROOT = Path("results")


def _run_order(path: Path) -> tuple[str, int, str]:
    """Oldest first. A run id's time has whole seconds and a random suffix, so runs stored within
    one second are ordered by when their directory last changed (the run's last file), not by
    the suffix: `latest` is then the one stored last."""
    stamp = path.name.partition("-")[0]
    try:
        changed = path.stat().st_mtime_ns
    except OSError:
        changed = 0
    return stamp, changed, path.name


def unstarted(path: Path) -> bool:
    """A run directory `Store.create` began and was killed in (SIGKILL, power loss) before its
    run.json was written: partial/ and no run.json. Nothing was measured in it."""
    return (path / "partial").is_dir() and not (path / "run.json").exists()


def started_from_id(run_id: str) -> str:
    """When a run began, as run.json's `started` spells it, read from its id (UTC); "" for an
    id nearlocal did not make."""
    try:
        when = time.strptime(run_id.partition("-")[0], "%Y%m%dT%H%M%S")
    except ValueError:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", when)


def unstarted_state(path: Path) -> str:
    """What `runs` and `show` say of an unstarted run directory."""
    return ("stopped before it started (no run.json): nothing measured; `nearlocal runs "
            f"--remove-unstarted --out {path.parent}` removes it")


# A run's own Store.create writes run.json a moment after partial/: a directory younger than
# this may be a run starting now, in another process, and is left alone
UNSTARTED_AGE_S = 60.0


def remove_unstarted(root: Path) -> list[Path]:
    """Remove the store's run directories killed before they started (`unstarted`, older than
    UNSTARTED_AGE_S, holding nothing but partial/ and its files): what `runs` lists as
    stopped before it started. Returns what was removed; an OSError is one line."""
    import shutil

    removed = []
    for path in list_runs(root, include_unstarted=True):
        if not unstarted(path):
            continue
        try:
            if time.time() - path.stat().st_mtime < UNSTARTED_AGE_S:
                continue
            if any(p.name != "partial" for p in path.iterdir()):
                continue  # something nearlocal did not put there: not ours to remove
            shutil.rmtree(path)
        except OSError as exc:
            raise UsageError(f"cannot remove {path}: {safeio.os_error_text(exc)}") from None
        removed.append(path)
    return removed


def list_runs(root: Path = DEFAULT_ROOT, include_unstarted: bool = False) -> list[Path]:
    """The store's runs, oldest first; with `include_unstarted` also the directories of runs
    killed before they started (`unstarted`), which only `nearlocal runs` lists."""
    root = Path(root)
    if not root.is_dir():
        return []
    try:
        return sorted((p for p in root.iterdir() if (p / "run.json").is_file()
                       or (include_unstarted and unstarted(p))), key=_run_order)
    except OSError as exc:  # no permission to list it, an I/O error
        raise UsageError(f"cannot read results directory {root}: "
                         f"{safeio.os_error_text(exc)}") from None


def require_store(root: Path) -> Path:
    """The store's root, or a one-line error when it is not a directory."""
    root = Path(root)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UsageError(f"results directory {root} {what}: give the store's root with --out")
    return root


def _kind_of(path: Path) -> str:
    try:
        return run_kind(read_meta(path))
    except UsageError:
        return ""  # damaged run.json: no kind, never `latest`


def resolve_run(ref: str | Path | None, root: Path = DEFAULT_ROOT) -> Path:
    """A run directory from a path, a run id in the store, `latest` or None (the latest `nearlocal
    run`; a run killed part way counts, and says it is incomplete), or `latest:KIND` (the latest
    of another kind: accept, import, bench)."""
    if ref is None or str(ref) == "latest" or str(ref).startswith("latest:"):
        kind = str(ref or "latest").partition(":")[2] or "run"
        if kind not in RUN_KINDS:
            raise UsageError(f"unknown run kind {kind!r} in {ref!r}: use latest or latest:KIND "
                             f"with KIND one of {', '.join(RUN_KINDS)}")
        runs = [p for p in list_runs(root)
                if (p / "cases.parquet").exists() or (p / "partial").is_dir()]
        kinds = {p: _kind_of(p) for p in runs}
        if not runs:
            missing = "" if Path(root).is_dir() else \
                f" ({'not a directory' if Path(root).exists() else 'the directory does not exist'})"
            raise UsageError(f"no runs in {root}{missing}: run `nearlocal run` first, or give "
                             "the store's root with --out")
        wanted = [p for p in runs if kinds[p] == kind]
        if not wanted:
            others = sorted(set(kinds.values()) - {""})
            raise UsageError(f"no runs of kind {kind} in {root} (it holds {', '.join(others)} "
                             f"runs: use latest:{others[0] if others else 'KIND'} or a run id)")
        return wanted[-1]
    path = Path(ref)
    if (path / "run.json").is_file():
        return path
    if (Path(root) / str(ref) / "run.json").is_file():
        return Path(root) / str(ref)
    for named in (path, Path(root) / str(ref)):
        if str(ref) and unstarted(named):
            raise UsageError(f"run {named.name} was {unstarted_state(named)}")
    matches = [p for p in list_runs(root) if p.name.startswith(str(ref))] if str(ref) else []
    if len(matches) == 1:  # a unique prefix of a run id, as `nearlocal runs` lists them
        return matches[0]
    if matches:
        raise UsageError(f"run {ref!r} is ambiguous: it begins {len(matches)} run ids ("
                         f"{', '.join(m.name for m in matches[:3])}{', ...' if len(matches) > 3 else ''}"
                         "); give more of the id")
    raise UsageError(f"no run {ref!r}: give a run directory or a run id from `nearlocal runs`")
