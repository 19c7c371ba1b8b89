"""Runs on disk: `<root>/<run-id>/{run.json, cases.parquet, samples.parquet}`.

While a run is in progress each finished case is appended to `partial/` (one JSON line and one
samples file per case), so a crash or Ctrl-C loses nothing already measured; `finish()` writes
the Parquet files through temporary names and renames them into place. A run killed before
`finish()` (SIGKILL, power loss, a full disk) is read back from `partial/` by `load()` as an
incomplete run: what was measured stays readable, and says that it is incomplete.

Files follow the umask (a CI store is often shared by a group), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError, error_line
from nearlocal.lazy import lazy_import
from nearlocal.store.schema import (
    CASE_COLUMNS,
    CASE_ROW_FIELDS,
    RUN_KINDS,
    RUN_META_FIELDS,
    SAMPLE_COLUMNS,
    SCHEMA_VERSION,
    frame_problem,
    ops_per_sample,
    run_kind,
    shape_problem,
)

np = lazy_import("numpy")
pd = lazy_import("pandas")
pa = lazy_import("pyarrow")
pq = lazy_import("pyarrow.parquet")

DEFAULT_ROOT = Path("results")
# Columns a cases.parquet must have to be read at all; the others of CASE_COLUMNS are filled in
# empty when missing (a run written by an older version), these mean a damaged file.
REQUIRED_CASE_COLUMNS = ("case_id", "method", "region", "pattern", "status")
REQUIRED_SAMPLE_COLUMNS = ("case_id", "rep", "raw", "ns")  # "process" came with schema 2
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class StoreFull(UsageError):
    """The disk (or quota) filled up while writing a run: one line saying what was kept."""


def _atomic_write_table(path: Path, table: pa.Table) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, safeio.new_file_mode())
    finally:
        os.close(fd)
    try:
        pq.write_table(table, temp, compression="zstd")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def cases_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as the cases table; `info` (free-form per method) is kept as a JSON string on disk."""
    rows = [{**row, "info": json.dumps(row.get("info") or {}, sort_keys=True, default=str)}
            for row in rows]
    frame = pd.DataFrame(rows)
    for column in CASE_COLUMNS:
        if column not in frame:
            frame[column] = None
    extra = [c for c in frame.columns if c not in CASE_COLUMNS]
    return frame[CASE_COLUMNS + extra]


class Store:
    """Writes one run. Create with `Store.create(root, meta)`; call `add_case` per finished case.
    The runner's sink (engine/sink.py RunSink) for a stored run."""

    keeps_busy = True  # run.json's `busy`: the self-check judges it

    def __init__(self, path: Path, meta: dict):
        self.path = path
        self.meta = meta
        self.partial = path / "partial"
        self._added = 0  # cases written so far: names the next partial file

    @classmethod
    def create(cls, root: Path, meta: dict, run_id: str | None = None) -> Store:
        root = Path(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".write-test-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"results directory {root} is not writable: {exc.strerror}") from None
        run_id = run_id or time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
        path = root / run_id
        try:
            path.mkdir()  # never overwrite a run
        except FileExistsError:
            raise UsageError(f"run {path} already exists; runs are never overwritten") from None
        meta = {**meta, "run_id": run_id, "schema_version": SCHEMA_VERSION, "complete": False}
        store = cls(path, meta)
        try:
            (path / "partial").mkdir()
            store._write_meta()
        except BaseException as exc:  # a full disk, Ctrl-C or SIGTERM before the run started:
            # nothing measured to keep, so nothing is left (a directory without run.json is
            # no run any command reads)
            with contextlib.suppress(OSError):
                (path / "run.json").unlink(missing_ok=True)
            for leftover in (path / "partial", path):
                with contextlib.suppress(OSError):
                    leftover.rmdir()
            if isinstance(exc, OSError):
                raise UsageError(f"cannot start run {path}: "
                                 f"{safeio.os_error_text(exc)}") from None
            raise
        return store

    def _write_meta(self) -> None:
        safeio.atomic_write_bytes(self.path / "run.json",
                            json.dumps(self.meta, indent=2, default=str).encode())

    def mark_incomplete(self, reason: str, **facts: object) -> None:
        """Why the run will be incomplete (run.json's `incomplete_reason`, with `facts`), written
        at once: a front end whose job may be killed before `finish` (an MPI launcher's SIGKILL
        after its SIGTERM) still leaves the reason on disk. `finish(interrupted=True)` follows."""
        self.meta.update(facts, incomplete_reason=reason)
        self._write_meta()

    def _full(self, exc: OSError, doing: str, kept: int) -> StoreFull:
        """Any OSError while storing: one line with the errno and what was kept."""
        where = (f"no space left on {self.path.parent}" if exc.errno in _FULL else
                 f"cannot write in {self.path}: {safeio.os_error_text(exc)}")
        return StoreFull(
            f"{where} while {doing}: kept the {kept} "
            f"cases measured before it in {self.path} (an incomplete run; `nearlocal show "
            f"{self.path}` reads it): " + ("free some space and run again "
                                           f"({exc.strerror})" if exc.errno in _FULL else
                                           "fix that and run again"))

    def add_case(self, row: dict, raw: np.ndarray | None = None, ns: np.ndarray | None = None,
                 process: np.ndarray | None = None, placement: np.ndarray | None = None) -> None:
        """Samples first, then the row: a row on disk always has its samples (the row's rename
        is what makes a case part of the run). process: per sample, which of the run's worker
        processes took it (default all 0); placement: which of the case's page placements it
        was taken on, numbered across processes (default: one a process)."""
        name = f"{self._added:06d}"
        self._added += 1
        samples = self.partial / f"{name}.npz"
        try:
            if ns is not None and len(ns):
                tags = np.zeros(len(ns), np.int32) if process is None \
                    else np.asarray(process, np.int32)
                drawn = tags if placement is None else np.asarray(placement, np.int32)
                packed = io.BytesIO()
                np.savez(packed, raw=np.asarray(raw, dtype=np.float64),
                         ns=np.asarray(ns, dtype=np.float64), process=tags, placement=drawn)
                safeio.atomic_write_bytes(samples, packed.getvalue())  # fsynced like the row
            safeio.atomic_write_bytes(self.partial / f"{name}.json", json.dumps(row, default=str).encode())
        except OSError as exc:
            with contextlib.suppress(OSError):
                samples.unlink(missing_ok=True)
            raise self._full(exc, f"storing case {row.get('case_id')}", self._added - 1) from None

    def add_host_reading(self, pass_index: int, readings: dict[str, list[float]],
                         facts: dict[str, dict]) -> None:
        """One worker process's host probe samples (engine/stability/hostprobe.py), kept in run.json."""
        probes = self.meta.setdefault("host_probe", {"probes": facts, "passes": []})
        probes["passes"].append({"pass": pass_index, **readings})

    def add_host_failure(self, reason: str) -> None:
        """Why the host probes ended before the run did (their readings so far are kept)."""
        self.meta.setdefault("host_probe", {"probes": {}, "passes": []})["failure"] = reason

    def add_busy(self, record: dict) -> None:
        """How busy the box was while the run measured (engine/stability/busy.py), kept in run.json."""
        self.meta["busy"] = record

    def finish(self, interrupted: bool = False, derive=None, **meta) -> Path:
        """Parquet files, then run.json saying complete (or not, when interrupted); partial/ goes
        last, so a failure anywhere before leaves a run `load()` still reads. `derive(meta,
        cases, samples) -> dict`: facts computed from the finished run (the self-check), kept
        in run.json."""
        rows, samples = _read_partial(self.partial)
        frame = cases_frame(rows)
        try:
            _atomic_write_table(self.path / "cases.parquet",
                                pa.Table.from_pandas(frame, preserve_index=False))
            _atomic_write_table(self.path / "samples.parquet",
                                pa.Table.from_pandas(samples, preserve_index=False))
            self.meta.update(meta, interrupted=interrupted, complete=not interrupted,
                             n_cases=len(rows))
            if derive is not None:
                self.meta.update(derive(self.meta, frame, samples))
            self._write_meta()
        except OSError as exc:
            with contextlib.suppress(OSError):  # partial/ is the run now
                (self.path / "cases.parquet").unlink(missing_ok=True)
            raise self._full(exc, "writing the run's Parquet files", len(rows)) from None
        safeio.note_kept(f"the run is stored in {self.path}")
        with contextlib.suppress(OSError):  # the run is whole without its partial/ removed
            for path in self.partial.iterdir():
                path.unlink()
            self.partial.rmdir()
        return self.path


def _read_partial(partial: Path) -> tuple[list[dict], pd.DataFrame]:
    """The rows and samples a run has written to partial/ so far (a row whose JSON or samples
    file is unreadable, e.g. cut short by a kill, is left out: it was not finished)."""
    rows, raws, nss, tags, drawn, ids = [], [], [], [], [], []
    for path in sorted(partial.glob("[0-9]*.json")):
        try:
            row = json.loads(path.read_text())
            samples = path.with_suffix(".npz")
            if samples.exists():
                with np.load(samples) as data:
                    raw, ns = data["raw"], data["ns"]
                    tag = data["process"] if "process" in data else np.zeros(len(ns), np.int32)
                    placed = data.get("placement", tag)
            else:
                raw = ns = tag = placed = None
        except (OSError, ValueError, KeyError, EOFError):
            continue
        if not isinstance(row, dict) or not isinstance(row.get("case_id"), str):
            continue
        problem = shape_problem(row, CASE_ROW_FIELDS)
        if problem:  # written by nearlocal, so changed since: damage, not a case cut short
            raise UsageError(f"run {partial.parent.name} is damaged: partial/{path.name}: "
                             f"{problem}")
        rows.append(row)
        if ns is not None:
            raws.append(raw)
            nss.append(ns)
            tags.append(tag)
            drawn.append(placed)
            ids.append((row["case_id"], len(ns)))
    samples = pd.DataFrame({
        "case_id": pd.Series([cid for cid, n in ids for _ in range(n)], dtype="string"),
        "rep": np.concatenate([np.arange(n) for _, n in ids]) if ids else np.array([], int),
        "raw": np.concatenate(raws) if raws else np.array([], float),
        "ns": np.concatenate(nss) if nss else np.array([], float),
        "process": np.concatenate(tags) if tags else np.array([], np.int32),
        "placement": np.concatenate(drawn) if drawn else np.array([], np.int32),
    })[SAMPLE_COLUMNS]
    return rows, samples


@dataclass
class RunData:
    path: Path
    meta: dict
    cases: pd.DataFrame
    samples: pd.DataFrame
    incomplete: str = ""  # why the run is not whole ("" for a finished run): every command says it

    @property
    def run_id(self) -> str:
        return self.meta.get("run_id", self.path.name)

    @property
    def complete(self) -> bool:
        return not self.incomplete

    def require_complete(self, role: str, allow_incomplete: bool = False) -> None:
        """Refuse a run that cannot stand as `role` (a baseline, the base of a comparison): an
        incomplete run, unless allowed, and a run with no measured case at all."""
        if self.incomplete and not allow_incomplete:
            raise UsageError(f"run {self.run_id} is incomplete ({self.incomplete}): it cannot be "
                             f"{role}; pass --allow-incomplete to use it anyway")
        if not len(self.cases) or not (self.cases["status"] == "ok").any():
            raise UsageError(f"run {self.run_id} has no measured case: it cannot be {role}")

    def samples_of(self, case_id: str) -> np.ndarray:
        return self.samples.loc[self.samples["case_id"] == case_id, "ns"].to_numpy()


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


def survey_run(path: Path) -> tuple[dict, str]:
    """(run.json, "" or why the run is incomplete or damaged) without reading it all: what
    `nearlocal runs` lists. A damaged run comes back as ({}, "damaged: ..."), one killed before
    it started as ({"run_id", "started"}, "stopped before it started ...")."""
    if unstarted(path):
        return {"run_id": path.name, "started": started_from_id(path.name)}, unstarted_state(path)
    try:
        meta = read_meta(path)
    except UsageError as exc:
        return {}, "damaged: " + str(exc).split(": ", 1)[-1]
    for name, required in (("cases.parquet", REQUIRED_CASE_COLUMNS),
                           ("samples.parquet", REQUIRED_SAMPLE_COLUMNS)):
        file = path / name
        if file.exists():
            try:
                names = pq.read_schema(file).names
            except Exception as exc:  # truncated, zero bytes, not Parquet
                return meta, (f"damaged: {name} is not a readable Parquet file "
                              f"({error_line(exc)})")
            missing = [column for column in required if column not in names]
            if missing:
                return meta, f"damaged: {name} lacks {', '.join(missing)}"
    state = run_state(path, meta)
    if state and not (path / "cases.parquet").exists() and (path / "partial").is_dir():
        meta = {**meta, "n_cases": len(list((path / "partial").glob("[0-9]*.json")))}
    return meta, state


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


def _read_table(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # truncated, zero bytes, not Parquet: pyarrow raises several kinds
        size = path.stat().st_size if path.exists() else 0
        what = "empty (0 bytes)" if not size else "not a readable Parquet file"
        raise UsageError(f"run {path.parent} is damaged: {path.name} is {what} "
                         f"({error_line(exc)})") from None
    missing = [column for column in required if column not in frame]
    if missing:
        raise UsageError(f"run {path.parent} is damaged: {path.name} lacks the column"
                         f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    problem = frame_problem(frame, path.name)
    if problem:
        raise UsageError(f"run {path.parent.name} is damaged: {problem}")
    return frame


def _info(value: object) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {"text": value}
    return value if isinstance(value, dict) else {}


def load(ref: str | Path | None = None, root: Path = DEFAULT_ROOT) -> RunData:
    """A run's metadata, case rows and raw samples as pandas DataFrames. A run that did not
    finish comes back with `incomplete` saying why (rows from partial/ when it was killed); a
    damaged one is a one-line UsageError."""
    path = resolve_run(ref, root)
    meta = read_meta(path)
    incomplete = run_state(path, meta)
    if (path / "cases.parquet").exists():
        cases = _read_table(path / "cases.parquet", REQUIRED_CASE_COLUMNS)
        samples_path = path / "samples.parquet"
        samples = _read_table(samples_path, REQUIRED_SAMPLE_COLUMNS) if samples_path.exists() \
            else pd.DataFrame(columns=SAMPLE_COLUMNS)
    else:
        rows, samples = _read_partial(path / "partial") if (path / "partial").is_dir() \
            else ([], pd.DataFrame(columns=SAMPLE_COLUMNS))
        cases = cases_frame(rows)
        meta = {**meta, "n_cases": len(rows)}
    if "process" not in samples:  # schema version 1: one worker process per case
        samples["process"] = np.zeros(len(samples), np.int32)
    if "placement" not in samples:  # before placements were drawn: one a process
        samples["placement"] = samples["process"].to_numpy(np.int32)
    for column in CASE_COLUMNS:
        if column not in cases:
            cases[column] = None
    cases["info"] = [_info(value) for value in cases["info"]]
    # rows before placements were drawn: one a process (and one a row before processes)
    drawn = pd.to_numeric(cases["processes"], errors="coerce").fillna(1)
    cases["placements"] = pd.to_numeric(cases["placements"], errors="coerce").fillna(drawn)
    cases["ops_per_sample"] = [ops_per_sample(ops, info)  # rows stored before the column
                               for ops, info in zip(cases["ops_per_sample"], cases["info"], strict=True)]
    # rows stored before they carried these facts: from the registries as they are now
    from nearlocal.core.rows import (
        effective_params_text,
        measures_column,
        pool_class_column,
        source_reaches_memory_column,
    )

    cases["pool_class"] = pool_class_column(list(cases["pool_class"]), list(cases["region"]),
                                            meta.get("inventory"))  # schema 3 (schema.py)
    cases["peer_pool_class"] = pool_class_column(list(cases["peer_pool_class"]),
                                                 list(cases["peer"]), meta.get("inventory"))
    cases["measures"] = measures_column(list(cases["measures"]), list(cases["method"]))
    cases["source_reaches_memory"] = source_reaches_memory_column(
        list(cases["source_reaches_memory"]), list(cases["reaches_memory"]), list(cases["method"]))
    cases["effective_params"] = [
        stored if isinstance(stored, str) and stored else effective_params_text(str(method), params)
        for stored, method, params in zip(cases["effective_params"], cases["method"],
                                          cases["params"], strict=True)]
    return RunData(path, meta, cases, samples, incomplete)


def read_baseline(path: Path) -> dict:
    """A baseline record (`<root>/baselines/<host_id>.json`), validated once here against
    BASELINE_FIELDS; a damaged one is a one-line UsageError naming the file and the field."""
    from nearlocal.store.schema import BASELINE_FIELDS

    raw = safeio.read_input(path, "baseline")
    try:
        record = safeio.parse_nested(json.loads, raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:  # binary, not JSON, nested too deep
        what = "binary" if isinstance(exc, UnicodeDecodeError) else \
            str(exc) if isinstance(exc, safeio.TooDeep) else "not JSON"
        raise UsageError(f"baseline {path} is damaged: {what}") from None
    problem = shape_problem(record, BASELINE_FIELDS)
    if not problem:
        missing = [key for key in ("run", "host_id") if not record.get(key)]
        problem = f"field {missing[0]} is missing" if missing else None
    if problem:
        raise UsageError(f"baseline {path} is damaged: {problem}")
    return record
