"""Writing a run: `<root>/<run-id>/{run.json, cases.parquet, samples.parquet}`.

While a run is in progress each finished case is appended to `partial/` (one JSON line and one
samples file per case), so a crash or Ctrl-C loses nothing already measured; `finish()` writes
the Parquet files through temporary names and renames them into place. A run killed before
`finish()` (SIGKILL, power loss, a full disk) is read back from `partial/` by `load()`
(reader.py) as an incomplete run: what was measured stays readable, and says that it is
incomplete.

Files follow the umask (a CI store is often shared by a group), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

from nearlocal import safeio
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.store.reader import cases_frame, read_partial
from nearlocal.store.schema import SCHEMA_VERSION

np = lazy_import("numpy")
pa = lazy_import("pyarrow")
pq = lazy_import("pyarrow.parquet")

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
        rows, samples = read_partial(self.partial)
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
