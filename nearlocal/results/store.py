"""Runs on disk: `<root>/<run-id>/{run.json, cases.parquet, samples.parquet}`.

While a run is in progress each finished case is appended to `partial/` (one JSON line and one
samples file per case), so a crash or Ctrl-C loses nothing already measured; `finish()` writes
the Parquet files through temporary names and renames them into place.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nearlocal.errors import UsageError
from nearlocal.results.schema import CASE_COLUMNS, SAMPLE_COLUMNS, SCHEMA_VERSION

DEFAULT_ROOT = Path("results")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _atomic_write_table(path: Path, table: pa.Table) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
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
    """Writes one run. Create with `Store.create(root, meta)`; call `add_case` per finished case."""

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
        (path / "partial").mkdir()
        meta = {**meta, "run_id": run_id, "schema_version": SCHEMA_VERSION, "complete": False}
        store = cls(path, meta)
        store._write_meta()
        return store

    def _write_meta(self) -> None:
        _atomic_write_bytes(self.path / "run.json",
                            json.dumps(self.meta, indent=2, default=str).encode())

    def add_case(self, row: dict, raw: np.ndarray | None = None, ns: np.ndarray | None = None,
                 process: np.ndarray | None = None) -> None:
        """process: per sample, which of the run's worker processes took it (default all 0)."""
        name = f"{self._added:06d}"
        self._added += 1
        if ns is not None and len(ns):
            tags = np.zeros(len(ns), np.int32) if process is None else np.asarray(process, np.int32)
            np.savez(self.partial / f"{name}.npz", raw=np.asarray(raw, dtype=np.float64),
                     ns=np.asarray(ns, dtype=np.float64), process=tags)
        _atomic_write_bytes(self.partial / f"{name}.json", json.dumps(row, default=str).encode())

    def finish(self, **meta) -> Path:
        rows, raws, nss, tags, ids = [], [], [], [], []
        for path in sorted(self.partial.glob("*.json")):
            row = json.loads(path.read_text())
            rows.append(row)
            samples = path.with_suffix(".npz")
            if samples.exists():
                with np.load(samples) as data:
                    raws.append(data["raw"])
                    nss.append(data["ns"])
                    tags.append(data["process"] if "process" in data
                                else np.zeros(len(data["ns"]), np.int32))
                    ids.append((row["case_id"], len(data["ns"])))
        _atomic_write_table(self.path / "cases.parquet",
                            pa.Table.from_pandas(cases_frame(rows), preserve_index=False))
        samples = pd.DataFrame({
            "case_id": pd.Series([cid for cid, n in ids for _ in range(n)], dtype="string"),
            "rep": np.concatenate([np.arange(n) for _, n in ids]) if ids else np.array([], int),
            "raw": np.concatenate(raws) if raws else np.array([], float),
            "ns": np.concatenate(nss) if nss else np.array([], float),
            "process": np.concatenate(tags) if tags else np.array([], np.int32),
        })[SAMPLE_COLUMNS]
        _atomic_write_table(self.path / "samples.parquet",
                            pa.Table.from_pandas(samples, preserve_index=False))
        self.meta.update(meta, complete=True, n_cases=len(rows))
        self._write_meta()
        for path in self.partial.iterdir():
            path.unlink()
        self.partial.rmdir()
        return self.path


@dataclass
class RunData:
    path: Path
    meta: dict
    cases: pd.DataFrame
    samples: pd.DataFrame

    @property
    def run_id(self) -> str:
        return self.meta.get("run_id", self.path.name)

    def samples_of(self, case_id: str) -> np.ndarray:
        return self.samples.loc[self.samples["case_id"] == case_id, "ns"].to_numpy()


def list_runs(root: Path = DEFAULT_ROOT) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if (p / "run.json").is_file()), key=lambda p: p.name)


def resolve_run(ref: str | Path | None, root: Path = DEFAULT_ROOT) -> Path:
    """A run directory from a path, a run id in the store, `latest`, or None (the latest)."""
    if ref is None or str(ref) == "latest":
        runs = [p for p in list_runs(root) if (p / "cases.parquet").exists()]
        if not runs:
            raise UsageError(f"no runs in {root}: run `nearlocal run` first")
        return runs[-1]
    path = Path(ref)
    if (path / "run.json").is_file():
        return path
    if (Path(root) / str(ref) / "run.json").is_file():
        return Path(root) / str(ref)
    raise UsageError(f"no run {ref!r}: give a run directory or a run id from `nearlocal runs`")


def load(ref: str | Path | None = None, root: Path = DEFAULT_ROOT) -> RunData:
    """A run's metadata, case rows and raw samples as pandas DataFrames."""
    path = resolve_run(ref, root)
    meta = json.loads((path / "run.json").read_text())
    if not (path / "cases.parquet").exists():
        raise UsageError(f"run {path} is incomplete (no cases.parquet): it is still running or "
                         "was killed before it finished")
    cases = pd.read_parquet(path / "cases.parquet")
    if "info" in cases:
        cases["info"] = [json.loads(text) if isinstance(text, str) else (text or {})
                         for text in cases["info"]]
    samples_path = path / "samples.parquet"
    samples = pd.read_parquet(samples_path) if samples_path.exists() else pd.DataFrame(
        columns=SAMPLE_COLUMNS)
    if "process" not in samples:  # schema version 1: one worker process per case
        samples["process"] = np.zeros(len(samples), np.int32)
    return RunData(path, meta, cases, samples)
