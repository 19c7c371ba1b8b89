"""Suites: named lists of cases. Each is declared once, beside its family; `all` is the union of
the others.

A suite is built from parts; a part with an `inventory` parameter is handed the run's inventory
(the box probed once: pool regions, nodes); the others build the same cases on any box. A suite
declared `joinable` takes parts from other families too (`extend_suite`): `quick` is declared
here once, its generic grid the methods whose `Method.suites` name it, and the DSA, pool and
serving rows join it from their families; a suite not declared joinable refuses them, so what a
suite holds is said where it is declared."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace

from nearlocal.core.cases import Case
from nearlocal.core.methods import load_methods, methods_joining
from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory
from nearlocal.units import format_size

QUICK_SIZES = sorted({64 * 4**k for k in range(11)} | {16 * 1024})  # 64 B .. 64 MiB, and 16 KiB


@dataclass(frozen=True)
class Suite:
    name: str
    summary: str
    parts: list[Callable[..., list[Case]]]  # its own: part() or part(inventory=...)
    # a run of it compares local memory with the box's other CPU memory (cpu/pool.py's regions):
    # the run records which regions those are and `nearlocal run` prints them
    compares_pool: bool = False
    # other families add parts to it with `extend_suite` (quick: DSA, pool and serving rows)
    joinable: bool = False
    # the region its pool cases stand on: `--region` aims those at the pool named and leaves its
    # other cases where they are (pool-vs-rdma: the RDMA rows stay on each host's own DRAM).
    # "" (most suites): --region replaces every case's region
    pool_region: str = ""

    def all_parts(self) -> list[Callable[..., list[Case]]]:
        """Its own parts, then those other families joined to it, in the order they joined."""
        return [*self.parts, *_JOINED.get(self.name, ())]

    def cases(self, inventory: HostInventory) -> list[Case]:
        return [case for part in self.all_parts() for case in _built(part, inventory)]


def _built(part: Callable[..., list[Case]], inventory: HostInventory) -> list[Case]:
    if "inventory" in inspect.signature(part).parameters:
        return part(inventory=inventory)
    return part()


SUITES: dict[str, Suite] = {}
_JOINED: dict[str, list[Callable[..., list[Case]]]] = {}  # suite -> parts other families joined


def register_suite(suite: Suite) -> Suite:
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} declared twice")
    if suite.name in _JOINED and not suite.joinable:
        raise ValueError(f"suite {suite.name!r} is not joinable, yet parts joined it")
    SUITES[suite.name] = suite
    return suite


def extend_suite(name: str, part: Callable[..., list[Case]]) -> None:
    """Add cases to a suite another family declared joinable (e.g. DSA rows in `quick`). It may
    be declared later: the part waits for it (the order of the modules does not matter)."""
    if name in SUITES and not SUITES[name].joinable:
        raise ValueError(f"suite {name!r} is not joinable: declare it with joinable=True to "
                         "let other families add parts")
    _JOINED.setdefault(name, []).append(part)


def get_suite(name: str) -> Suite:
    load_methods()  # method modules declare their suites too
    if name not in SUITES:
        raise UsageError(f"unknown suite {name!r}: valid suites are {', '.join(SUITES)}")
    return SUITES[name]


def suite_cases(name: str, inventory: HostInventory | None = None) -> list[Case]:
    """The suite's cases on the box `inventory` describes (the run's; a caller that has not
    probed the box gets it probed here, without the TSC calibration and the GPUs)."""
    suite = get_suite(name)
    if inventory is None:
        from nearlocal.probe import probe

        inventory = probe(calibrate=False, gpu=False)
    cases = [replace(case, suite=name) for case in suite.cases(inventory)]
    return list(dict.fromkeys(cases))


def _quick() -> list[Case]:
    """Every method that joins quick (Method.suites: the CPU methods) on local DRAM over sizes;
    uc/wc rows so the axis is visible (skipped here)."""
    methods = methods_joining("quick")
    return [
        Case(method, "dram", attr, format_size(size))
        for attr in ("wb", "uc", "wc")
        for method in methods
        for size in QUICK_SIZES
    ]


def _all(inventory: HostInventory) -> list[Case]:
    return [case for name, suite in SUITES.items() if name != "all"
            for case in suite.cases(inventory)]


# quick's pool rows and its pool comparison come from cpu/pool.py, its DSA rows from dsa/methods.py,
# its serving read from workloads/kv_methods.py (each `extend_suite("quick", ...)`)
register_suite(Suite("quick", "every CPU method on local DRAM, 64 B to 64 MiB (runs anywhere)",
                     [_quick], compares_pool=True, joinable=True))
register_suite(Suite("all", "every suite's cases", [_all], compares_pool=True))


def __getattr__(name: str) -> tuple[str, ...]:
    """CPU_METHODS, the name quick's method list once had: the CPU methods that join quick."""
    if name == "CPU_METHODS":
        from nearlocal.core.methods import get_method

        return tuple(m for m in methods_joining("quick") if get_method(m).marker == "cpu")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
