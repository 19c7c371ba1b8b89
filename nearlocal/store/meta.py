"""A run's run.json: read and shape-checked (`read_meta`), what it says of the run's state
(`run_state`), and the one way a finished run's run.json is amended (`update_run_meta`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.store.schema import RUN_META_FIELDS, shape_problem


def read_meta(path: Path) -> dict:
    """run.json as a dict, or a one-line error naming the damage (empty, not JSON, binary, not an
    object)."""
    file = Path(path) / "run.json"
    try:
        raw = safeio.read_input(file, "run.json")
    except UsageError as exc:  # a FIFO, a device, a huge file, unreadable
        raise UsageError(f"run {path} is damaged: {exc}") from None
    try:
        data = safeio.parse_nested(json.loads, raw.decode())
    except UnicodeDecodeError:
        raise UsageError(f"run {path} is damaged: run.json is binary, not JSON") from None
    except safeio.TooDeep as exc:
        raise UsageError(f"run {path} is damaged: run.json is {exc}") from None
    except json.JSONDecodeError as exc:
        what = "empty" if not raw.strip() else f"not JSON ({exc.msg}, line {exc.lineno})"
        raise UsageError(f"run {path} is damaged: run.json is {what}") from None
    if not isinstance(data, dict):
        raise UsageError(f"run {path} is damaged: run.json holds a {type(data).__name__}, "
                         "not an object")
    problem = shape_problem(data, RUN_META_FIELDS)
    if problem:
        raise UsageError(f"run {Path(path).name} is damaged: run.json {problem}")
    return data


@contextlib.contextmanager
def _amending(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) on the run's directory while its run.json is read,
    changed and written back: two `accept`s amending one run at once each keep their verdicts
    (each read the file before the other wrote it, and the second write dropped the first's).
    The directory, not run.json: run.json is replaced by a rename, the directory stays. Where the
    file system refuses flock the update goes on unserialized, as before."""
    fd = None
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # and with it the lock


def update_run_meta(path: Path, field: str, update: Callable[[object], object]) -> dict:
    """Set one field of a finished run's run.json to `update(its value now)`: what was judged of
    the run afterwards (accept's verdicts). Atomic, one amendment at a time (_amending), and
    checked against RUN_META_FIELDS as read_meta checks it, so it never writes what load() would
    call damaged; the run directory keeps its time, so amending a run does not make it `latest`.
    A run still being written (no cases.parquet: its Store writes run.json again at the end),
    damaged or not writable is a one-line UsageError. Returns the new run.json."""
    path = Path(path)
    with _amending(path):
        return _update_run_meta(path, field, update)


def _update_run_meta(path: Path, field: str, update: Callable[[object], object]) -> dict:
    meta = read_meta(path)
    if not (path / "cases.parquet").exists():
        raise UsageError(f"run {path.name} is not finished ({run_state(path, meta)}): its "
                         "run.json is left as it is")
    meta[field] = update(meta.get(field))
    problem = shape_problem(meta, RUN_META_FIELDS)
    if problem:  # the caller's value, not the file: a bug, not bad input
        raise ValueError(f"run {path.name}: {field} would leave run.json damaged: {problem}")
    try:
        times = path.stat()
        safeio.atomic_write_bytes(path / "run.json",
                                  json.dumps(meta, indent=2, default=str).encode())
    except OSError as exc:
        raise UsageError(f"cannot update run {path}: {safeio.os_error_text(exc)}") from None
    with contextlib.suppress(OSError):
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    return meta


def run_state(path: Path, meta: dict) -> str:
    """"" for a finished run, else why it is incomplete (what `runs` and every loader say)."""
    if meta.get("incomplete_reason") and not meta.get("complete"):  # e.g. an MPI rank lost
        return str(meta["incomplete_reason"])
    if (path / "cases.parquet").exists():
        if meta.get("interrupted"):
            return "interrupted"
        if not meta.get("complete", False):
            return "run.json does not say complete"
        if not (path / "samples.parquet").exists():
            return "samples.parquet is missing"
        return ""
    if (path / "partial").is_dir():
        return "not finished (killed, disk full or still running): read from partial/"
    return "no cases were stored"
