"""Rows of one stored run as every section reads them: `prepare()` adds the derived columns
(src / dst / path, pool rank as `pool_rank`, parsed params, transfer or not; an MPI job's stored
`rank` stays the MPI rank), and the helpers pick and compare rows. All arithmetic on rows that
several sections share lives here."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import fields

import pandas as pd

from nearlocal.core.cases import Case
from nearlocal.params import decode_params_or_none
from nearlocal.regions.base import POOL_CLASSES, gpu_device
from nearlocal.report.document import NOT_IN_RUN, Cell, NoValue, RunInfo, Stat
from nearlocal.report.papers import Figure, figure
from nearlocal.store import RunData

__all__ = ["NOT_IN_RUN"]

# ---------------------------------------------------------------------------------------------
# Rows of one run, with the derived columns every section uses

RANKS = {name: rank for rank, name in enumerate(POOL_CLASSES)}  # a class's rank: its position
SHARED_CLASS = RANKS["shared"]  # shm: / file: mappings: this box's own DRAM; lower: other memory
LOCAL_CLASS = RANKS["local"]
GPU_CLASS = RANKS["gpu"]
SIZE_16K = 16 * 1024
SIZE_64K = 64 * 1024


def class_rank(pool_class: object) -> int:
    """A row's `pool_class` (or `peer_pool_class`) as its rank: lower stands for the pool first."""
    return RANKS.get(str(pool_class), RANKS["other"])


def _params_text(params: dict) -> str:
    """A row's params as the report prints them: a float to 6 significant digits."""
    from nearlocal.units import format_number

    return ",".join(f"{k}={format_number(v, 6)}" for k, v in sorted(params.items())) or "-"


def _with_attr(region: str, attr: str) -> str:
    return region if attr in ("wb", "", None) else f"{region}[{attr}]"


# Hand-made or partial rows (an import) may lack a text column: the gaps read as the case's own
# defaults (core.cases.Case), a row that says nothing of its outcome as failed.
_CASE_DEFAULTS = {f.name: f.default for f in fields(Case) if isinstance(f.default, str)}
_TEXT_DEFAULTS = {**dict.fromkeys(("case_id", "method", "marker", "region", "pattern", "params",
                                   "reason"), ""),
                  "attr": _CASE_DEFAULTS["attr"], "peer": _CASE_DEFAULTS["peer"],
                  "access": "read", "params": "{}", "status": "failed"}


def _texts(values: Iterable, index: pd.Index) -> pd.Series:
    return pd.Series(list(values), index=index, dtype=object)


def prepare(run: RunData) -> pd.DataFrame:
    """The run's case rows plus src / dst / path / pool_rank (and peer's, src's, dst's) / parsed
    params."""
    df = run.cases.copy()
    for column, default in _TEXT_DEFAULTS.items():  # hand-made or partial rows: fill the gaps
        values = df[column] if column in df else [None] * len(df)
        df[column] = _texts((str(v) if isinstance(v, str) and v else default
                             for v in values), df.index)
    for column in ("size_bytes", "fragment_count", "fragment_bytes"):
        df[column] = pd.to_numeric(df[column], errors="coerce").fillna(0).astype("int64")
    for column in ("median_ns", "p10_ns", "p90_ns", "gbps", "ci_low_ns", "ci_high_ns",
                   "n_samples"):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("float64")
    write = (df["access"] == "write").tolist()
    region_text = [_with_attr(r, a) for r, a in zip(df["region"], df["attr"], strict=True)]
    src = [p if w else r for p, r, w in zip(df["peer"], region_text, write, strict=True)]
    dst = [r if w else p for p, r, w in zip(df["peer"], region_text, write, strict=True)]
    df["src"], df["dst"] = _texts(src, df.index), _texts(dst, df.index)
    df["path"] = _texts((f"{a} -> {b}" for a, b in zip(src, dst, strict=True)), df.index)
    rank = [class_rank(c) for c in df["pool_class"]]  # declared by the region kind, stored
    df["region_what"] = _texts((POOL_CLASSES.get(str(c), POOL_CLASSES["other"])
                                for c in df["pool_class"]), df.index)
    peer_rank = [class_rank(c) for c in df["peer_pool_class"]]
    df["pool_rank"] = pd.Series(rank, index=df.index, dtype="int64")
    df["peer_pool_rank"] = pd.Series(peer_rank, index=df.index, dtype="int64")
    df["src_pool_rank"] = pd.Series([p if w else r for r, p, w in zip(rank, peer_rank, write,
                                                                 strict=True)],
                               index=df.index, dtype="int64")
    df["dst_pool_rank"] = pd.Series([r if w else p for r, p, w in zip(rank, peer_rank, write,
                                                                 strict=True)],
                               index=df.index, dtype="int64")
    df["src_kind"] = _texts((s.split("[")[0].split(":")[0] for s in src), df.index)
    df["params_d"] = _texts((decode_params_or_none(p) for p in df["params"]), df.index)  # the case's own
    df["effective"] = _texts((decode_params_or_none(p) for p in df["effective_params"]), df.index)
    # a case keeps only the params that differ from its method's defaults (Case), so the count
    # of its own params orders the method's default settings first
    df["n_params"] = pd.Series([len(p) for p in df["params_d"]], index=df.index, dtype="int64")
    df["ok"] = (df["status"] == "ok").astype(bool)
    df["transfer"] = (df["measures"] == "transfer").astype(bool)  # Method.measures, stored
    inventories = _row_inventories(run, df)
    df["emulated"] = _texts(_emulation_notes(inventories), df.index)
    ddio = _ddio_states(inventories, df)
    df["ddio"] = _texts((state for state, _ in ddio), df.index)
    df["ddio_at"] = _texts((where for _, where in ddio), df.index)
    df["contiguous"] = ((df["fragment_count"] <= 1)
                        & ~df["pattern"].map(lambda p: ":" in p).astype(bool) & df["transfer"])
    return df


def _row_inventories(run: RunData, df: pd.DataFrame) -> list[dict]:
    """Each row's box as probed at the run's start: the run's inventory, or in an MPI run the
    inventory of the host that measured the row."""
    def inventory(value) -> dict:
        return value if isinstance(value, dict) else {}

    own = inventory(run.meta.get("inventory"))
    ranks = {str(h.get("hostname")): str(h.get("rank"))
             for h in (run.meta.get("mpi") or {}).get("hosts", [])}
    inventories = run.meta.get("host_inventories") or {}
    hosts = df["host"] if "host" in df else [None] * len(df)
    return [inventory(inventories.get(ranks.get(str(h), ""))) if str(h) in ranks else own
            for h in hosts]


def _emulation_notes(inventories: list[dict]) -> list[str]:
    """Each row's box, if it is not a real machine's (probe.cpu.emulation_note)."""
    from nearlocal.probe.cpu import emulation_note

    return [emulation_note(inventory.get("cpu") or {}) for inventory in inventories]


def _ddio_states(inventories: list[dict], df: pd.DataFrame) -> list[tuple[str, str]]:
    """Each row's DDIO at run time (probe.links.ddio_state): `ddio` the state, `ddio_at` where
    or why; the root port of a GPU the row moved bytes to or from (its region's gpu:K, else its
    peer's), else its box's."""
    from nearlocal.probe.links import ddio_state

    found: dict[tuple, tuple[str, str]] = {}  # per box and GPUs, read once
    states = []
    for inventory, region, region_class, peer, peer_class in zip(
            inventories, df["region"], df["pool_class"], df["peer"], df["peer_pool_class"],
            strict=True):
        gpus = tuple(g for g in (gpu_device(region, region_class), gpu_device(peer, peer_class))
                     if g is not None)
        key = (id(inventory), gpus)
        if key not in found:
            found[key] = ddio_state(inventory.get("topology"), gpus)
        states.append(found[key])
    return states


def stat_of(row) -> Stat | NoValue:
    """A row's latency cell: its statistics, or why it has none."""
    if row["status"] != "ok":
        return NoValue(f"{row['status']}: {row['reason']}" if row["reason"] else row["status"])
    converged = row.get("converged")
    return Stat(float(row["median_ns"]), float(row["p10_ns"]), float(row["p90_ns"]),
                bool(converged) if converged is not None and converged == converged else True,
                _clock_step(row), relative_ci(row))


def relative_ci(row) -> float | None:
    """The half-width of a row's median's 95% CI over the median (what its † says)."""
    low, high, median = (pd.to_numeric(row.get(k), errors="coerce")
                         for k in ("ci_low_ns", "ci_high_ns", "median_ns"))
    if not all(v == v for v in (low, high, median)) or not median or median <= 0:
        return None
    return float((high - low) / 2 / median)


def _clock_step(row) -> float | None:
    """The smallest step this row's figures can move by: the clock's resolution over the
    operations one sample is divided by (the row's ops_per_sample: a chase sample is 4096
    loads)."""
    step = pd.to_numeric(row.get("clock_resolution_ns"), errors="coerce")
    ops = pd.to_numeric(row.get("ops_per_sample"), errors="coerce")
    if not (step == step and step and step > 0):
        return None
    if not (ops == ops and ops and ops >= 1):  # load() gives every row its count
        ops = 1
    return float(step) / float(ops)


def _best(rows: pd.DataFrame, order: Iterable[str] = ("pool_rank", "n_params")) -> pd.Series | None:
    """The row to show: an ok row first, then the most pool-like region."""
    if rows.empty:
        return None
    ordered = rows.assign(_notok=~rows["ok"]).sort_values(["_notok", *order], kind="stable")
    return ordered.iloc[0]


def ratio_or_none(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    if not (denominator > 0) or math.isnan(numerator):
        return None
    return numerator / denominator


def median_ns_of(cell: Cell) -> float | None:
    return cell.median_ns if isinstance(cell, Stat) else None



def _refs(*ids: str) -> list[Figure]:
    return [figure(i) for i in ids]


def _absent(runs: list[RunInfo], frames: list[pd.DataFrame], methods: Iterable[str],
            what: str) -> str:
    methods = list(methods)
    parts = []
    for run, df in zip(runs, frames, strict=True):
        rows = df[df["method"].isin(methods)]
        name = f"run {run.label}: " if len(runs) > 1 else ""
        if rows.empty:
            parts.append(f"{name}the run has no {what} rows")
        else:
            outcomes = rows.loc[~rows["ok"], ["status", "reason"]].value_counts()
            if len(outcomes):
                status, reason = outcomes.index[0]
                parts.append(f"{name}{what} rows were {status}: {reason}")
            else:
                parts.append(f"{name}the {what} rows that ran do not cover this table")
    return "; ".join(parts) + "."



def _isolated(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows timed as isolated transfers (their effective drain=before): what the papers'
    single-operation figures time. Methods without a drain parameter count as isolated."""
    return rows[rows["effective"].map(lambda p: p.get("drain", "before") == "before").astype(bool)]


def _host_only(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["pool_rank"] < GPU_CLASS) & (df["peer_pool_rank"] < GPU_CLASS)]



# ---------------------------------------------------------------------------------------------


def run_info(index: int, run: RunData) -> RunInfo:
    inventory = run.meta.get("inventory") or {}
    counts = run.cases["status"].value_counts().to_dict() if len(run.cases) else {}
    run_id = run.run_id + (f" (INCOMPLETE: {run.incomplete})" if run.incomplete else "")
    return RunInfo(str(index + 1), run_id,
                   str(inventory.get("hostname", "?")), str(run.meta.get("suite", "?")),
                   str(run.meta.get("started", "?")), str(run.path),
                   {k: int(v) for k, v in counts.items()})


