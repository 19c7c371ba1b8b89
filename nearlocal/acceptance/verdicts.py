"""Verdicts as plain data, kept in the run they judge: `nearlocal accept` stores each spec's
verdicts in the run's run.json (`acceptance`, a list, one entry per spec and pool), and the report
reads them from there, never from the spec file again (a spec edited or deleted since does not
change what the run was judged to be). The table, JUnit and --json print the same records."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from nearlocal.store.meta import update_run_meta
from nearlocal.store.reader import RunData

FIELD = "acceptance"  # run.json's key (store/schema.py checks its shape)


def _number(value: object) -> float:
    """A stored figure: null (not measured) is NaN again."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else math.nan


def _or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


@dataclass(frozen=True)
class VerdictRecord:
    """One requirement's verdict: what it bounds, the bound, what was measured and its margin, or
    why it was not measured, and the rows a derived figure came from. Enough to print it without
    the spec."""

    requirement: str  # its name
    case: str  # what it bounds: a case id, or a what-if figure's id (derived)
    metric: str
    kind: str  # max, min, max_ratio, min_ratio
    bound: float
    passed: bool
    measured: float = math.nan
    margin: float = math.nan  # fraction of the bound still to spare (negative: missed by)
    reason: str = ""  # why it was not measured ("" when it was)
    reference: str | None = None  # a ratio's other case
    derived: bool = False  # a what-if figure, not a case's
    seconds: float = 0.0  # wall time the run spent measuring its cases
    derived_from: tuple[str, ...] = ()  # a derived figure's rows

    @property
    def is_max(self) -> bool:
        return self.kind.startswith("max")

    def to_dict(self) -> dict:
        """The stored form (and --json's): NaN as null."""
        return {"requirement": self.requirement, "case": self.case, "metric": self.metric,
                "bound": self.bound, "kind": self.kind, "reference": self.reference,
                "derived": self.derived, "measured": _or_none(self.measured),
                "margin": _or_none(self.margin), "passed": self.passed, "reason": self.reason,
                "seconds": self.seconds, "derived_from": list(self.derived_from)}

    @classmethod
    def from_dict(cls, data: dict) -> VerdictRecord:
        """A stored verdict (its shape checked where run.json is read; nulls are absent values)."""
        seconds = _number(data.get("seconds"))
        reference = data.get("reference")
        return cls(requirement=str(data.get("requirement") or "?"),
                   case=str(data.get("case") or ""), metric=str(data.get("metric") or ""),
                   kind=str(data.get("kind") or "max"), bound=_number(data.get("bound")),
                   passed=data.get("passed") is True, measured=_number(data.get("measured")),
                   margin=_number(data.get("margin")), reason=str(data.get("reason") or ""),
                   reference=None if reference is None else str(reference),
                   derived=data.get("derived") is True,
                   seconds=seconds if math.isfinite(seconds) else 0.0,
                   derived_from=tuple(str(r) for r in data.get("derived_from") or ()))


@dataclass(frozen=True)
class AcceptanceRecord:
    """A spec's verdicts on one run: the spec (its file, resolved, and the SHA-256 of what was
    read), where it was aimed, when it was judged, one VerdictRecord per requirement."""

    spec: str
    spec_sha256: str
    title: str
    pool: str  # the region under test ("" when the spec names none)
    peer: str
    judged: str  # UTC, ISO 8601
    verdicts: tuple[VerdictRecord, ...]
    run_id: str = ""  # the run judged (not stored: the run.json holding it says)

    @property
    def key(self) -> tuple[str, str]:
        """A run keeps one entry per spec and pool: judged again, it replaces the older one."""
        return self.spec, self.pool

    @property
    def failed(self) -> tuple[VerdictRecord, ...]:
        return tuple(v for v in self.verdicts if not v.passed)

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict:
        return {"spec": self.spec, "spec_sha256": self.spec_sha256, "title": self.title,
                "pool": self.pool, "peer": self.peer, "judged": self.judged,
                "verdicts": [v.to_dict() for v in self.verdicts]}

    @classmethod
    def from_dict(cls, data: dict, run_id: str) -> AcceptanceRecord:
        return cls(str(data.get("spec") or "?"), str(data.get("spec_sha256") or ""),
                   str(data.get("title") or Path(str(data.get("spec") or "?")).stem),
                   str(data.get("pool") or ""), str(data.get("peer") or ""),
                   str(data.get("judged") or ""),
                   tuple(VerdictRecord.from_dict(v) for v in data.get("verdicts") or ()), run_id)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def store_acceptance(run: RunData, record: AcceptanceRecord) -> Path:
    """Keep the record in the run's run.json, replacing the entry of the same spec and pool;
    returns the run.json. A run still being written, damaged or not writable: UsageError."""

    def merged(entries: object) -> list[dict]:
        kept = [e for e in entries or () if isinstance(e, dict) and
                (str(e.get("spec")), str(e.get("pool") or "")) != record.key]
        return [*kept, record.to_dict()]

    update_run_meta(Path(run.path), FIELD, merged)
    return Path(run.path) / "run.json"


def stored_acceptance(meta: dict, run_id: str) -> list[AcceptanceRecord]:
    """The verdicts a run keeps (none for a run never judged, or judged before they were kept)."""
    return [AcceptanceRecord.from_dict(entry, run_id) for entry in meta.get(FIELD) or ()
            if isinstance(entry, dict)]


NOT_KEPT = ("not judged when stored: the run kept no verdicts (accepted before accept stored "
            "them; `nearlocal accept SPEC RUN` judges it and keeps them)")


@dataclass(frozen=True)
class HostVerdict:
    """One spec's stored verdicts on a run of a host, or why a run has none to show: the report
    states these, it never judges."""

    spec: str  # as the run stored it ("" when its run.json is too damaged to tell)
    pool: str
    run_id: str
    record: AcceptanceRecord | None = None
    problem: str = ""  # why no verdict is shown for this run ("" with a record)


def is_accept_run(meta: dict) -> bool:
    return bool(meta.get("spec")) or meta.get("kind") == "accept"


def host_acceptance(meta: dict, run_id: str, path: Path | None) -> list[HostVerdict]:
    """The verdicts kept for a run's host, as `nearlocal accept` stored them in the runs it
    judged: the run's own, else the latest per spec and pool among the same store's runs of the
    same host (`path`: the run's directory; None: no store to look in). Nothing is judged again:
    an accept run stored before verdicts were kept says so (NOT_KEPT). A later accept run that
    cannot be read (damaged, incomplete) or kept none is said, with why, before the older verdict
    shown in its place, never an older PASS standing silently for it; so is a later run whose
    run.json is too damaged to tell its kind."""
    from nearlocal.store.catalogue import list_runs
    from nearlocal.store.reader import survey_run

    own = stored_acceptance(meta, run_id)
    if own:
        return [HostVerdict(r.spec, r.pool, r.run_id, r) for r in own]
    if is_accept_run(meta):
        return [HostVerdict(str(meta.get("spec") or "?"), str(meta.get("pool") or ""), run_id,
                            problem=NOT_KEPT)]
    if path is None:
        return []
    latest: dict[tuple[str, str], tuple[int, AcceptanceRecord]] = {}
    missing: dict[tuple[str, str], list[tuple[str, str]]] = {}  # newer than the latest: why none
    unreadable: list[tuple[int, str, str]] = []  # run.json damaged: kind and host unknown
    for order, run in enumerate(list_runs(Path(path).parent)):  # oldest first
        found, state = survey_run(run)
        if not found:
            unreadable.append((order, run.name, state))
            continue
        if found.get("host_id") != meta.get("host_id"):
            continue
        key = (str(found.get("spec")), str(found.get("pool") or ""))
        if state:
            if is_accept_run(found):
                missing.setdefault(key, []).append((run.name, "not judged: the run is " + (
                    state if state.startswith("damaged") else f"incomplete ({state})")))
            continue
        kept = stored_acceptance(found, str(found.get("run_id") or run.name))
        for record in kept:
            latest[record.key] = (order, record)
            missing.pop(record.key, None)
        if not kept and is_accept_run(found):
            missing.setdefault(key, []).append((run.name, NOT_KEPT))
    out: list[HostVerdict] = []
    for key in dict.fromkeys([*latest, *missing]):
        record = latest[key][1] if key in latest else None
        instead = f"; the verdict shown is the older run {record.run_id}'s" if record else ""
        out += [HostVerdict(*key, run_id, problem=why + instead)
                for run_id, why in reversed(missing.get(key, []))]
        out += [HostVerdict(*key, record.run_id, record)] if record else []
    if latest:  # a damaged run.json names no kind: said when it is later than a verdict shown
        first = min(order for order, _ in latest.values())
        out += [HostVerdict("", "", name, problem=f"not judged: the run is {state}; if it was a "
                            "later accept run, its verdict is missing here")
                for order, name, state in unreadable if order > first]
    return out
