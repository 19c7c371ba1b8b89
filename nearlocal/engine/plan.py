"""The plan stage: selected cases + the probed box -> a Plan, the one way `run`, `accept`,
`pytest bench/` and the MPI job start measuring.

Each entry is a resolved case: its pattern parsed once, its effective params, the bytes it maps
and moves, the row facts every row of it carries (`core.rows.row_facts`, derived here and nowhere
after) and one decision: Run, Skip(kind, reason) (this box cannot run it: stored as a skipped row)
or Refuse(error) (bad input: exit 2).
What the front ends decide from a plan (a run of only too-large cases is refused) is decided from
the skip kinds, never from a reason's text. The runner takes the decisions as they are: nothing
is asked twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from nearlocal.core import cases as case_rules
from nearlocal.core.cases import Case, ResolvedCase, SkipKind
from nearlocal.core.patterns import Pattern, parse_pattern
from nearlocal.core.rows import row_facts
from nearlocal.core.sampling import DEFAULT_PLACEMENTS, MAX_PLACEMENTS, StoppingRule
from nearlocal.engine.processes import FIRST_LOOK_PROCESSES, SETTLING_FACTOR, default_processes
from nearlocal.engine.worker import WorkerSettings
from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory
from nearlocal.units import parse_budget

MAX_PROCESSES = 100
# Skip kinds that refuse a run when every selected case has one of them (`--size 1TiB` on shm:,
# writes to a read-only file system): the user asked for something the box cannot take.
REFUSED_WHEN_ALL = frozenset({SkipKind.CANNOT_HOLD, SkipKind.READ_ONLY})

__all__ = ["MAX_PROCESSES", "CaseDecision", "Plan", "PlanEntry", "Refuse", "Run", "RunSettings",
           "Skip", "SkipKind", "check_placements", "check_processes", "plan_cases", "settle_llc"]


@dataclass(frozen=True)
class Run:
    """The case runs."""


@dataclass(frozen=True)
class Skip:
    kind: SkipKind
    reason: str


@dataclass(frozen=True)
class Refuse:
    """Bad input: `error` is the one line a front end prints (exit 2)."""

    error: str


CaseDecision = Run | Skip | Refuse  # what the plan decided for one case


def check_processes(processes: object, option: str = "--processes") -> None:
    if type(processes) is not int or not 1 <= processes <= MAX_PROCESSES:
        raise UsageError(f"{option} must be between 1 and {MAX_PROCESSES}, got {processes}")


def check_placements(placements: object, option: str = "--placements") -> None:
    if type(placements) is not int or not 1 <= placements <= MAX_PLACEMENTS:
        raise UsageError(f"{option} must be between 1 and {MAX_PLACEMENTS}, got {placements}")


@dataclass(frozen=True)
class RunSettings:
    """How a run measures, validated once here (UsageError naming the option): the per-case
    budget in seconds, the CI target in percent, worker processes per case, --threads / --cpus
    and --allow-write. Processes not given follow the job: a run made for a gate (`for_gate`:
    `run --for-gate`, `accept`) gets the default for the budget and up to SETTLING_FACTOR times
    that for a case whose processes disagree (`max_processes`), which the gate's verdicts need
    on a shared box; a first look gets at most FIRST_LOOK_PROCESSES and no settling."""

    budget_s: float
    ci_percent: float = 1.0
    processes: int | None = None
    threads: str | None = None
    cpus: str | None = None
    allow_write: bool = False
    for_gate: bool = False
    placements: int = DEFAULT_PLACEMENTS  # drawn per process where a case's regions allow
    max_processes: int = field(default=0, init=False, compare=False)  # processes given: no more

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_s, int | float) and math.isfinite(self.budget_s)
                and self.budget_s > 0):
            raise UsageError(f"--budget must be a positive number of seconds, got {self.budget_s}")
        if not 0 < self.ci_percent < 100:
            raise UsageError(f"--ci must be a percentage between 0 and 100, got {self.ci_percent:g}")
        settle = self.processes is None and self.for_gate
        if self.processes is None:
            auto = default_processes(self.budget_s)
            object.__setattr__(self, "processes",
                               auto if self.for_gate else min(auto, FIRST_LOOK_PROCESSES))
        check_processes(self.processes)
        check_placements(self.placements)
        object.__setattr__(self, "max_processes",
                           self.processes * (SETTLING_FACTOR if settle else 1))

    @classmethod
    def from_options(cls, budget: str, ci: float = 1.0, processes: int | None = None,
                     threads: str | None = None, cpus: str | None = None,
                     allow_write: bool = False, budget_option: str = "--budget",
                     for_gate: bool = False, placements: int = DEFAULT_PLACEMENTS) -> RunSettings:
        return cls(parse_budget(budget, budget_option), ci, processes, threads, cpus, allow_write,
                   for_gate, placements)

    def worker_settings(self, inventory: HostInventory, clock=None) -> WorkerSettings:
        """What each worker gets: the stopping rule, the run's clock (None: the runner
        calibrates it) and the run's inventory."""
        rule = StoppingRule(budget_s=self.budget_s, target_rel_ci=self.ci_percent / 100)
        return WorkerSettings(rule=rule, tsc_hz=inventory.tsc_hz, allow_write=self.allow_write,
                              clock=clock, inventory=inventory, placements=self.placements)


@dataclass
class PlanEntry:
    case: Case
    decision: CaseDecision
    # the case resolved once (pattern, regions, params, spans, bytes moved): what its worker
    # and an MPI job's ranks get; None only for a case refused as bad input
    resolved: ResolvedCase | None = None
    # row_facts(): the columns every row of it has, kept here in the parent (no worker reads them)
    row: dict = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        return isinstance(self.decision, Run)

    @property
    def reason(self) -> str | None:
        """What a row of a case that does not run says (None for one that runs)."""
        if isinstance(self.decision, Skip):
            return self.decision.reason
        if isinstance(self.decision, Refuse):
            return self.decision.error
        return None


@dataclass
class Plan:
    entries: list[PlanEntry]
    inventory: HostInventory
    settings: RunSettings
    _worker: WorkerSettings | None = field(default=None, repr=False, compare=False)

    def worker_settings(self) -> WorkerSettings:
        """What every worker of this plan's run gets, with the run's one clock: calibrated here
        once (the run.json that records it and the runner that hands it out share it)."""
        if self._worker is None:
            from nearlocal.kernels.timer import measure_clock

            self._worker = self.settings.worker_settings(self.inventory, measure_clock())
        return self._worker

    @property
    def cases(self) -> list[Case]:
        return [entry.case for entry in self.entries]

    @property
    def runnable(self) -> list[PlanEntry]:
        return [entry for entry in self.entries if entry.runs]

    def refuse_bad_input(self) -> None:
        """What `nearlocal run` refuses before measuring (UsageError, exit 2): the first case
        that is bad input; a selection whose every case the box cannot hold; a selection whose
        every case writes to memory the user did not allow."""
        for entry in self.entries:
            if isinstance(entry.decision, Refuse):
                raise UsageError(entry.decision.error)
        kinds = [entry.decision.kind if isinstance(entry.decision, Skip) else None
                 for entry in self.entries]
        if not kinds:
            return
        if all(kind in REFUSED_WHEN_ALL for kind in kinds):  # e.g. --size 1TiB on shm:
            raise UsageError(self.entries[0].decision.reason)
        if all(kind is SkipKind.NEEDS_ALLOW_WRITE for kind in kinds):
            raise UsageError("every selected case writes to memory you did not allow: pass "
                             "--allow-write to write to "
                             + ", ".join({entry.case.written for entry in self.entries}))

    def refused_as_skipped(self) -> Plan:
        """Refused cases as skipped rows (kind NOT_ON_BOX): how `accept` stores a requirement
        the box cannot take (numa:7 on a one-node box is not measured, not a bad spec)."""
        entries = [replace(entry, decision=Skip(SkipKind.NOT_ON_BOX, entry.decision.error))
                   if isinstance(entry.decision, Refuse) else entry for entry in self.entries]
        return replace(self, entries=entries)


def plan_entries(cases: Iterable[Case], inventory: HostInventory,
                 allow_write: bool = False) -> list[PlanEntry]:
    """Each case checked and resolved once on this box: what a Runner runs (`plan_cases` adds
    --threads / --cpus and a front end's rule on the whole selection)."""
    return [_entry(case, inventory, allow_write) for case in cases]


def _entry(case: Case, inventory: HostInventory, allow_write: bool) -> PlanEntry:
    pattern = specs = None
    try:  # the pattern and both regions parsed once here, for every rule and the row below
        pattern = parse_pattern(case.pattern)
        specs = case_rules.parse_specs(case)
        case_rules.validate(case, inventory, pattern, specs)
    except UsageError as exc:
        return PlanEntry(case, Refuse(str(exc)), row=_refused_row(case, inventory, pattern, specs))
    resolved = case_rules.resolve(case, pattern, specs)  # spans and bytes moved, once
    found = case_rules.skip(case, inventory, allow_write, pattern, specs, resolved.spans)
    decision = Skip(*found) if found else Run()
    return PlanEntry(case, decision, resolved, _facts(resolved, inventory))


def _facts(resolved: ResolvedCase, inventory: HostInventory) -> dict:
    return row_facts(resolved, inventory.cpuless_nodes, inventory.cpu.llc_bytes,
                     inventory.cpu.l2_bytes, inventory.cpu.cpuid_llc_bytes)


def _refused_row(case: Case, inventory: HostInventory, pattern: Pattern | None,
                 specs: case_rules.Specs | None) -> dict:
    """The columns a skipped row of a refused case would have (accept stores one), where its
    pattern and regions parsed; {} where they did not (nothing is parsed again for them)."""
    if pattern is None or specs is None:
        return {}
    try:
        return _facts(case_rules.resolve(case, pattern, specs), inventory)
    except (UsageError, ValueError, KeyError):
        return {}


def settle_llc(inventory: HostInventory, store: Path | dict) -> HostInventory:
    """The inventory with the LLC its cases are classified by held steady for this box by the
    store at `store` (store/boxes.py: the store's latest run of the box, unless this run's probe
    left the 2x band around it), or by what `held_llcs` read from it (an MPI job: rank 0 reads
    its store and every rank settles its own box by it): a VM's measured LLC moves between
    runs, and a case's `llc_resident` / `reaches_memory` must not move with it. The readings go
    into this run's inventory (run.json), which is all the next run reads. cpuid's LLC (bare
    metal) stands."""
    cpu = inventory.cpu
    if not cpu.measured_llc_bytes:
        return inventory
    import dataclasses

    from nearlocal.store.boxes import box_key, held_llcs, settled_llc

    box = box_key({"hostname": inventory.hostname, "cpu": dataclasses.asdict(cpu)})
    held = store if isinstance(store, dict) else held_llcs(Path(store), box)
    llc, readings, how = settled_llc(held, box, cpu.measured_llc_bytes)
    settled = replace(cpu, measured_llc_bytes=llc, llc_readings=readings,
                      llc_source=f"{cpu.llc_source}; cases classified by {llc / 2**20:g} MiB: {how}")
    return replace(inventory, cpu=settled)


def plan_cases(cases: Iterable[Case], inventory: HostInventory, settings: RunSettings,
               check_selection: Callable[[list[Case]], None] | None = None) -> Plan:
    """The plan of `cases` on this box: --threads / --cpus applied, then `check_selection` on
    the cases that are left (a front end's rule on the whole selection: UsageError), then each
    case checked once."""
    from nearlocal.cpu.threads import apply_thread_args

    cases = apply_thread_args(list(cases), settings.threads, settings.cpus, inventory.numa)
    if check_selection is not None:
        check_selection(cases)
    return Plan(_named_beyond_device(plan_entries(cases, inventory, settings.allow_write)),
                inventory, settings)


def _named_beyond_device(entries: list[PlanEntry]) -> list[PlanEntry]:
    """A selection whose every case asks the box's device for more than it takes (SkipKind
    BEYOND_DEVICE: `--param mtu=4096` on a port whose active MTU is 1024) is bad input, the user
    named it: each such case is refused. Among other cases (a suite's) each stays a skipped row
    naming why. Decided here, not in one front end, so an MPI job's ranks refuse it too."""
    if entries and all(isinstance(entry.decision, Skip)
                       and entry.decision.kind is SkipKind.BEYOND_DEVICE for entry in entries):
        return [replace(entry, decision=Refuse(entry.decision.reason)) for entry in entries]
    return entries
