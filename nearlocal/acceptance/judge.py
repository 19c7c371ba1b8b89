"""A spec judged on a run's rows: one RequirementResult per requirement, passed or failed with
the figure and its margin, or failed as not measured with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nearlocal.acceptance.spec import Requirement, Spec
from nearlocal.acceptance.verdicts import AcceptanceRecord, VerdictRecord, now
from nearlocal.core.cases import Case
from nearlocal.errors import UsageError
from nearlocal.store.reader import RunData


@dataclass
class RequirementResult:
    """One requirement judged on a run: passed or not, the figure measured and the margin, or
    why it was not measured (`record()`: its verdict in run.json, the table, JUnit and --json)."""

    requirement: Requirement
    passed: bool
    measured: float = math.nan
    margin: float = math.nan  # fraction of the bound still to spare (negative: missed by)
    reason: str = ""
    seconds: float = 0.0  # wall time spent measuring its case (and reference)
    rows: tuple[str, ...] = ()  # a derived figure's: the case ids it came from

    def record(self) -> VerdictRecord:
        """As plain data: what run.json keeps and every printer prints."""
        r = self.requirement
        return VerdictRecord(r.name, r.subject, r.metric, r.kind, r.bound, self.passed,
                             self.measured, self.margin, self.reason,
                             r.reference.id if r.reference else None, r.derived is not None,
                             self.seconds, self.rows)


def acceptance_record(spec: Spec, run: RunData, results: list[RequirementResult]) -> AcceptanceRecord:
    """The spec's verdicts on the run, judged now, as the record the run keeps."""
    return AcceptanceRecord(str(spec.path.resolve()), spec.sha256, spec.title, spec.pool,
                            spec.peer, now(), tuple(r.record() for r in results), run.run_id)


def _value(rows: dict[str, dict], case: Case, metric: str) -> tuple[float, str]:
    row = rows.get(case.id)
    if row is None:
        return math.nan, f"not measured: {case.id} is not in the run"
    if row.get("status") != "ok":
        return math.nan, f"not measured: {case.id}: {row.get('reason') or row.get('status')}"
    value = row.get(metric)
    if value is None or not math.isfinite(float(value)):
        return math.nan, f"not measured: {case.id} has no {metric}"
    return float(value), ""


def _normalised_id(row: dict) -> str | None:
    """The row's case id as a Case spells it today (runs stored before sizes were spelled once
    kept `--pattern 16384` as 16384); None when the row is not a case."""
    try:
        return Case.from_dict(row).id
    except (UsageError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _seconds(rows: dict[str, dict], *cases: Case | None) -> float:
    """Wall time the run spent on these cases (elapsed_s over every worker process)."""
    total = 0.0
    for case in cases:
        value = (rows.get(case.id) or {}).get("elapsed_s") if case is not None else None
        if value is not None and math.isfinite(float(value)):
            total += float(value)
    return total


def judge_run(spec: Spec, run: RunData) -> list[RequirementResult]:
    records = run.cases.to_dict("records")
    rows = {key: r for r in records if (key := _normalised_id(r))}
    rows.update({str(r["case_id"]): r for r in records})  # the stored id wins
    verdicts = []
    inputs = None
    for req in spec.requirements:
        if req.derived is not None:
            if inputs is None:  # the run's hops fitted once for every derived requirement
                from nearlocal.whatif import inputs_of

                inputs = inputs_of(run)
            verdicts.append(_derived_verdict(req, inputs, run.samples))
            verdicts[-1].seconds = _seconds(rows, *req.measure)
            continue
        verdicts.append(_verdict(req, rows))
        verdicts[-1].seconds = _seconds(rows, req.case, req.reference)
    return verdicts


def _derived_verdict(req: Requirement, inputs, samples=None) -> RequirementResult:
    """A what-if figure judged like a case's: only this box's rows stand for it."""
    from nearlocal.whatif.serving import path_figures, shape_of

    derived = req.derived
    if derived.load:
        return _load_verdict(req, inputs, samples)
    path = path_figures(derived.path, derived.request, shape_of(derived.request),
                        inputs.measured)
    rows = tuple(dict.fromkeys(r for t in path.terms for r in t.rows))
    if not path.complete:
        missing = "; ".join(f"{t.hop} {t.source}" for t in path.terms if t.ns is None)
        return RequirementResult(req, False, reason=f"not measured: {derived.path}: {missing}",
                                 rows=rows)
    measured = getattr(path, req.metric)
    if measured is None or not math.isfinite(float(measured)):
        what = ("give whatif a layer_compute_us" if req.metric == "pipelined_ns" else
                "the run's figure is zero")
        return RequirementResult(req, False, reason=f"not measured: {derived.path} has no "
                                 f"{req.metric} ({what})", rows=rows)
    measured = float(measured)
    if req.is_max:
        passed, margin = measured <= req.bound, (req.bound - measured) / req.bound
    else:
        passed, margin = measured >= req.bound, (measured - req.bound) / req.bound
    return RequirementResult(req, passed, measured, margin, rows=rows)


def _load_verdict(req: Requirement, inputs, samples) -> RequirementResult:
    """A figure under load (whatif.load: a seeded Poisson stream over the path), judged alike."""
    from nearlocal.whatif.commands import parse_tokens
    from nearlocal.whatif.load import derived_load

    derived = req.derived
    path = derived_load(inputs, derived.path, derived.request, dict(derived.load), parse_tokens,
                        samples)
    if not path.complete:
        return RequirementResult(req, False, reason=f"not measured: {derived.path}: "
                                 f"{path.missing.removeprefix('incomplete: ')}", rows=path.rows)
    if req.metric == "capacity_qps":
        measured = path.capacity_qps
    else:
        measured = getattr(path.ttft, req.metric.removeprefix("ttft_").removesuffix("_ns")) * 1e9
    if measured is None or not math.isfinite(float(measured)):
        return RequirementResult(req, False, reason=f"not measured: {derived.path} has no "
                                 f"{req.metric} ({path.capacity})", rows=path.rows)
    measured = float(measured)
    if req.is_max:
        passed, margin = measured <= req.bound, (req.bound - measured) / req.bound
    else:
        passed, margin = measured >= req.bound, (measured - req.bound) / req.bound
    return RequirementResult(req, passed, measured, margin, rows=path.rows)


def _verdict(req: Requirement, rows: dict[str, dict]) -> RequirementResult:
    """One requirement judged on the run's rows (a missing or unmeasured case fails, saying why)."""
    measured, reason = _value(rows, req.case, req.metric)
    if not reason and req.reference is not None:
        ref, reason = _value(rows, req.reference, req.metric)
        reason = reason.replace("not measured:", "not measured: reference", 1)
        measured = measured / ref if ref > 0 else math.nan
        if not reason and not math.isfinite(measured):
            reason = f"not measured: reference {req.reference.id} has a zero {req.metric}"
    if reason:
        return RequirementResult(req, False, reason=reason)
    if req.is_max:
        passed, margin = measured <= req.bound, (req.bound - measured) / req.bound
    else:
        passed, margin = measured >= req.bound, (measured - req.bound) / req.bound
    return RequirementResult(req, passed, measured, margin)
