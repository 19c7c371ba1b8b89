"""Reading a run back: `load()` gives its metadata, case rows and raw samples (a run killed before
it finished, from `partial/`, saying it is incomplete; a damaged one, one line), `survey_run()`
what `nearlocal runs` lists without reading it all. `cases_frame` and `read_partial` are the
cases table and the in-progress rows, shared with the writer (writer.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nearlocal.errors import UsageError, error_line
from nearlocal.lazy import lazy_import
from nearlocal.store.catalogue import DEFAULT_ROOT, resolve_run, started_from_id, unstarted, unstarted_state
from nearlocal.store.meta import read_meta, run_state
from nearlocal.store.schema import (
    CASE_COLUMNS,
    CASE_ROW_FIELDS,
    SAMPLE_COLUMNS,
    frame_problem,
    ops_per_sample,
    shape_problem,
    with_current_names,
)

np = lazy_import("numpy")
pd = lazy_import("pandas")
pq = lazy_import("pyarrow.parquet")

# Columns a cases.parquet must have to be read at all; the others of CASE_COLUMNS are filled in
# empty when missing (a run written by an older version), these mean a damaged file.
REQUIRED_CASE_COLUMNS = ("case_id", "method", "region", "pattern", "status")
REQUIRED_SAMPLE_COLUMNS = ("case_id", "rep", "raw", "ns")  # "process" came with schema 2


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


def read_partial(partial: Path) -> tuple[list[dict], pd.DataFrame]:
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
        rows, samples = read_partial(path / "partial") if (path / "partial").is_dir() \
            else ([], pd.DataFrame(columns=SAMPLE_COLUMNS))
        cases = cases_frame(rows)
        meta = {**meta, "n_cases": len(rows)}
    cases = with_current_names(cases)  # columns stored under an older name (schema.py)
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
