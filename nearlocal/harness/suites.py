"""Suites: named lists of cases. Each is declared once; `all` is the union of the others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from nearlocal.errors import UsageError
from nearlocal.harness.cases import Case
from nearlocal.harness.methods import load_methods
from nearlocal.units import format_size

QUICK_SIZES = sorted({64 * 4**k for k in range(11)} | {16 * 1024})  # 64 B .. 64 MiB, and 16 KiB
CPU_METHODS = ("load", "store", "nt-store", "nt-copy", "nt-load", "clflush-load", "clflushopt-load",
               "store-clwb", "movdir64b", "memcpy")


@dataclass(frozen=True)
class Suite:
    name: str
    summary: str
    parts: list[Callable[[], list[Case]]]

    def cases(self) -> list[Case]:
        return [case for part in self.parts for case in part()]


SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    if suite.name in SUITES:
        raise ValueError(f"suite {suite.name!r} declared twice")
    SUITES[suite.name] = suite
    return suite


def extend_suite(name: str, part: Callable[[], list[Case]]) -> None:
    """Add cases to a suite declared elsewhere (e.g. DSA rows in `quick`)."""
    SUITES[name].parts.append(part)


def get_suite(name: str) -> Suite:
    load_methods()  # method modules declare their suites too
    if name not in SUITES:
        raise UsageError(f"unknown suite {name!r}: valid suites are {', '.join(SUITES)}")
    return SUITES[name]


def suite_cases(name: str) -> list[Case]:
    cases = [replace(case, suite=name) for case in get_suite(name).cases()]
    return list(dict.fromkeys(cases))


def _quick() -> list[Case]:
    """Every CPU method on local DRAM over sizes; uc/wc rows so the axis is visible (skipped here)."""
    return [
        Case(method, "dram", attr, format_size(size))
        for attr in ("wb", "uc", "wc")
        for method in CPU_METHODS
        for size in QUICK_SIZES
    ]


def _all() -> list[Case]:
    return [case for name, suite in SUITES.items() if name != "all" for case in suite.cases()]


register_suite(Suite("quick", "every CPU method on local DRAM, 64 B to 64 MiB (runs anywhere)",
                     [_quick]))
register_suite(Suite("all", "every suite's cases", [_all]))
