"""pytest-benchmark glue for `pytest --pyargs nearlocal.bench` (and `pytest bench/`): the same
cases as `nearlocal run`, measured through the same phases (warm-up, trials until the stopping
rule), in DEFAULT_PROCESSES worker processes by the run's own runner (`--nearlocal-processes K`;
1: in this process), each drawing `--nearlocal-placements` page placements as `run` does
(engine/worker.py), and handed to pytest-benchmark as one round per kernel repetition. A
process's pages were once its one draw of page placement: on the 2-vCPU AMD VM a 16 KiB nt-store
read 180 ns in some processes and 260-280 ns in others, so two one-process sessions of unchanged
code read 1.44x apart with 10 ns IQRs; with K = 8 four sessions read 180-270 ns, each pair within
the wider session's IQR; with 8 x 2 placements three sessions read as `run` did (180.2 ns).

pytest-benchmark times a round as `timer()` after the call minus `timer()` before it. Here the
timer is a `KernelClock` that only moves when a round's target advances it by that repetition's
in-kernel time (rdtscp inside the numba loop, CUDA events on a GPU), so every statistic, JSON file,
autosave and `--benchmark-compare-fail` sees kernel-measured times, never Python's clock around a
call. The plugin (nearlocal/bench/plugin.py) only declares options and parametrizes; everything
else is here.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from nearlocal.bench import MARKERS
from nearlocal.core.cases import Case
from nearlocal.core.sampling import DEFAULT_PLACEMENTS, StoppingRule, relative_half_width
from nearlocal.core.suites import get_suite, suite_cases
from nearlocal.engine.worker import WorkerSettings, measure, open_case
from nearlocal.errors import Unavailable, UsageError
from nearlocal.regions import parse_region, region_kind

if TYPE_CHECKING:
    import pytest

    from nearlocal.gate.verdict import Comparison
    from nearlocal.probe import HostInventory
    from nearlocal.store.reader import RunData



class KernelClock:
    """A pytest-benchmark timer fed by the kernel's own measurements (seconds)."""

    # pytest-benchmark records the timer's name in the JSON options
    __name__ = "nearlocal.bench.benchmarks.KernelClock"

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# The timer of every generated test: the plugin names it in each test's `benchmark` marker
# (plugin.py), pytest-benchmark's public way to choose a test's timer; run_benchmark feeds it.
KERNEL_CLOCK = KernelClock()


@dataclass
class BenchHost:
    """What every generated test shares: the probed box and the timer overhead, measured once."""

    inventory: HostInventory
    allow_write: bool = False
    target_rel_ci: float = 0.01
    processes: int = 1  # worker processes per case (--nearlocal-processes); 1: in this process
    placements: int = DEFAULT_PLACEMENTS  # drawn per process (--nearlocal-placements)
    # what the session measured, (row, raw, ns, process, placement) per case: the run
    # --nearlocal-save stores and --nearlocal-baseline judges
    measured: list[tuple] = field(default_factory=list, repr=False)
    # the plan's entry of every generated test's case, by case id (suite_params plans them)
    planned: dict[str, Any] = field(default_factory=dict, repr=False)
    # per generated test (its node id, the fixture's `fullname`): pytest-benchmark's max_time
    # (s) and min_rounds, from its options and the test's `benchmark` marker (plugin.py)
    limits: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)
    _clock: Any = field(default=None, repr=False)

    @property
    def overhead_ticks(self) -> float:
        return self.clock.overhead_ticks

    def settings(self, rule: StoppingRule) -> WorkerSettings:
        """What a worker of a run with this session's clock and box would measure with."""
        return WorkerSettings(rule, self.inventory.tsc_hz, self.allow_write, clock=self.clock,
                              inventory=self.inventory, placements=self.placements)

    @property
    def clock(self) -> Any:
        """The TSC's calibration (timer overhead, step), measured once per session."""
        if self._clock is None:
            from nearlocal.kernels.timer import measure_clock

            self._clock = measure_clock()
        return self._clock


def check_suite(name: str) -> None:
    get_suite(name)  # UsageError naming the valid suites


def case_test_id(case: Case) -> str:
    """`nt-store/dram/wb/16KiB` -> `nt-store-dram-wb-16KiB` (pytest ids, -k, compare names)."""
    return case.id.replace("/", "-")


def case_markers(case: Case) -> list[str]:
    method = case.method_entry
    names = [method.marker, *method.markers]
    names += region_kind(parse_region(case.region)).markers
    return [name for name in dict.fromkeys(names) if name in MARKERS]


def suite_params(suite: str, marker: str, host: BenchHost) -> list[pytest.ParameterSet]:
    """One pytest param per case of `suite` whose method carries marker `marker`; cases that cannot
    run here carry a skip mark with the probe's reason. The value is the case as a plain dict so
    pytest-benchmark can write it to JSON."""
    import pytest

    params = []
    cases = [case for case in suite_cases(suite, host.inventory) if case.method_entry.marker == marker]
    for entry in plan(cases, host).entries:
        case = entry.case
        host.planned[case.id] = entry
        marks = [getattr(pytest.mark, name) for name in case_markers(case)]
        if entry.reason:  # e.g. a node the suite names does not exist on this box: skipped too
            marks.append(pytest.mark.skip(reason=entry.reason))
        params.append(pytest.param(case.to_dict(), id=case_test_id(case), marks=marks))
    return params


def plan(cases: list[Case], host: BenchHost):
    """The plan stage, as `nearlocal run` plans: one process (this one), the session's CI target;
    the budget is pytest-benchmark's (stopping_rule), read when each test runs."""
    from nearlocal.engine.plan import RunSettings, plan_cases

    settings = RunSettings(StoppingRule().budget_s, host.target_rel_ci * 100, processes=1,
                           allow_write=host.allow_write)
    return plan_cases(cases, host.inventory, settings)


def machine_info(host: BenchHost) -> dict:
    """Added to pytest-benchmark's machine_info so `nearlocal import` knows the hardware: only
    what identifies it (probe.identity_summary)."""
    from nearlocal import __version__
    from nearlocal.probe import identity_summary

    inv = host.inventory
    return {"host_id": inv.host_id, "nearlocal_version": __version__,
            "inventory": identity_summary(inv)}


def stopping_rule(benchmark: Any, host: BenchHost) -> StoppingRule:
    """pytest-benchmark's --benchmark-max-time is the per-case budget and --benchmark-min-rounds
    raises the minimum sample count (a `benchmark` marker's max_time / min_rounds before them, as
    pytest-benchmark reads them: host.limits); --nearlocal-ci is the convergence target."""
    default = StoppingRule()
    max_time, min_rounds = host.limits.get(benchmark.fullname, (default.budget_s, 0))
    return StoppingRule(budget_s=float(max_time), target_rel_ci=host.target_rel_ci,
                        min_samples=max(default.min_samples, int(min_rounds)))


def run_benchmark(benchmark: Any, case_data: dict, host: BenchHost) -> dict:
    """Measure one case and record it in pytest-benchmark; returns the row `nearlocal run` stores."""
    case = Case.from_dict(case_data)
    entry = host.planned.get(case.id) or plan([case], host).entries[0]
    if not entry.runs:  # a case pytest was asked to run all the same (-p no:skipping)
        raise UsageError(f"{case.id}: {entry.reason}")
    row = dict(entry.row)
    if benchmark.disabled:  # --benchmark-disable: pedantic runs the kernel once, untimed
        with open_case(entry.resolved, host.inventory.tsc_hz, host.overhead_ticks, host.allow_write,
                       host.inventory, host.clock.quantum_ticks) as opened:
            benchmark.pedantic(opened.session.sample, args=(1,))
        return row
    if host.processes > 1:
        row, raw, ns, process, placement = _in_processes(entry, stopping_rule(benchmark, host), host)
    else:  # in pytest's own process, by the worker's own measure(): the same row as run's
        try:
            measured, raw, ns, placement = measure(entry.resolved,
                                                   host.settings(stopping_rule(benchmark, host)))
        except Unavailable as exc:  # refused once opened: skipped, as `run` stores it
            _skip(str(exc))
        measured.pop("chosen", None)
        row.update(measured, processes=1)
        process = np.zeros(len(ns), np.int32)
    row["host_id"] = host.inventory.host_id
    row["rel_ci_half_width"] = _finite(relative_half_width(ns))
    host.measured.append((dict(row), np.asarray(raw, np.float64), np.asarray(ns, np.float64),
                          process, placement))

    clock = KERNEL_CLOCK  # this test's timer (its `benchmark` marker): each round its sample
    clock.now = 0.0
    seconds = np.asarray(ns, dtype=np.float64) * 1e-9
    rounds = iter(seconds.tolist())
    benchmark.pedantic(lambda: clock.advance(next(rounds)), rounds=len(ns), iterations=1,
                       warmup_rounds=0)
    if len(ns) and not math.isclose(benchmark.stats.stats.median, float(np.median(seconds)),
                                    rel_tol=1e-6, abs_tol=1e-15):
        raise RuntimeError(f"{case.id}: pytest-benchmark timed the rounds with another timer than "
                           "the kernel's (a `benchmark` marker's timer replaced nearlocal's?)")
    benchmark.extra_info.update(json.loads(json.dumps(row, default=str)))
    return row


class _Collected:
    """The sink (engine/sink.py RunSink) a bench case's runner writes to: the one row and its
    samples, kept here. A bench case keeps neither host probes (its runner has probe_host=False)
    nor a busy record (none is started for one case at a time)."""

    keeps_busy = False

    def __init__(self) -> None:
        self.found: tuple | None = None

    def add_case(self, row: dict, raw: np.ndarray | None = None, ns: np.ndarray | None = None,
                 process: np.ndarray | None = None, placement: np.ndarray | None = None) -> None:
        self.found = (row, raw, ns, process, placement)

    def add_host_reading(self, pass_index: int, readings: dict[str, list[float]],
                         facts: dict[str, dict]) -> None:
        pass

    def add_host_failure(self, reason: str) -> None:
        pass

    def add_busy(self, record: dict) -> None:
        pass  # never called: keeps_busy is False


def _in_processes(entry: Any, rule: StoppingRule, host: BenchHost) -> tuple[dict, Any, Any, Any, Any]:
    """The case measured as `nearlocal run --processes K` measures it (the runner, K fresh
    worker processes sharing the budget, the session's one clock): (row, raw, ns, process,
    placement), the last two per sample."""
    from nearlocal.engine.runner import Runner

    collected = _Collected()
    runner = Runner(host.inventory, host.settings(rule), collected, processes=host.processes,
                    probe_host=False)
    runner.run([entry])
    row, raw, ns, process, placement = collected.found or (
        {"status": "failed", "reason": "not measured"}, None, None, None, None)
    if row.get("status") == "skipped":  # refused once opened (errors.Unavailable)
        _skip(str(row.get("reason")))
    if row.get("status") != "ok" or ns is None:
        raise RuntimeError(f"{entry.case.id}: {row.get('status')}: {row.get('reason')}")
    return row, raw, ns, process, placement


def _skip(reason: str) -> NoReturn:
    import pytest

    pytest.skip(reason)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------- the session as a run, judged


def store_session(host: BenchHost, root: Path, suite: str) -> Path:
    """The session's measured cases as a run of kind `bench` under `root` (the store `nearlocal
    compare`, `show` and `report` read): rows and raw samples as `nearlocal run` stores them,
    each sample tagged with the process and placement that took it."""
    import time

    from nearlocal.engine.metadata import run_metadata
    from nearlocal.store.writer import Store

    # what run.json says of any run (versions, settings, the clock), as `run` writes it
    rule = StoppingRule(target_rel_ci=host.target_rel_ci)
    meta = run_metadata(host.inventory, host.settings(rule), suite, kind="bench",
                        command=["pytest", *sys.argv[1:]], processes=host.processes)
    store = Store.create(root, meta)
    for row, raw, ns, process, placement in host.measured:
        store.add_case({key: value for key, value in row.items()
                        if key not in ("host_id", "rel_ci_half_width")}, raw, ns, process, placement)
    return store.finish(ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interrupted=False)


def judge_session(host: BenchHost, base: RunData, root: Path, suite: str, save: bool,
                  threshold: float, alpha: float,
                  mode: str = "code") -> tuple[Comparison, Path | None]:
    """Compare the session with a stored run by nearlocal's own model (`nearlocal compare`): the
    cases the session ran, against the same cases of the base (the rest of the base is not
    "missing": a -k or -m selection chose them out). Returns the comparison and the stored run
    (None unless save)."""
    import tempfile

    from nearlocal.gate.identity import host_differences
    from nearlocal.gate.verdict import compare_runs
    from nearlocal.store.reader import RunData, load

    with tempfile.TemporaryDirectory(prefix="nearlocal-bench-") as scratch:
        path = store_session(host, root if save else Path(scratch), suite)
        cand = load(path)
    ran = set(cand.cases["case_id"].astype(str))
    cases = base.cases[base.cases["case_id"].astype(str).isin(ran)]
    samples = base.samples[base.samples["case_id"].astype(str).isin(ran)]
    base = RunData(base.path, base.meta, cases, samples, base.incomplete)
    differences = host_differences(base.meta, cand.meta)
    if differences:
        raise UsageError(f"--nearlocal-baseline {base.run_id} comes from other hardware ("
                         + "; ".join(differences) + ")")
    return compare_runs(base, cand, threshold, alpha, mode=mode), (path if save else None)
