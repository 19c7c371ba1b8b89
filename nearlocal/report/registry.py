"""The registry of report sections, like suites': each section is declared once, with its key and
its place in the report (`order`), by the module that builds it: report/sections/ (the papers'
tables, the summary), a family's report_section.py (rack's, rdma's: a face of the family that may
import the report), a plugin's module. They are the entry-point group plugins.SECTION_GROUP,
loaded by ordered_sections(): the report names none of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from nearlocal.report.document import RunInfo, Section
from nearlocal.store import RunData


@dataclass(frozen=True)
class SectionInputs:
    """What every section is built from: the runs' headers, their prepared rows (report.rows),
    and the stored runs themselves (metadata, inventory)."""

    runs: list[RunInfo]
    frames: list[pd.DataFrame]
    data: list[RunData]
    reference: str | None = None  # `report --reference`: a reference box set beside the runs


@dataclass(frozen=True)
class SectionSpec:
    key: str
    order: int  # the report prints sections by ascending order
    build: Callable[[SectionInputs], Section]
    drop_when_absent: bool = False  # a section with nothing to show is left out, not printed


SECTIONS: dict[str, SectionSpec] = {}


def register_section(key: str, order: int, *, drop_when_absent: bool = False):
    """Decorator: `build(inputs) -> Section` is the report's section `key`, printed at `order`."""

    def register(build: Callable[[SectionInputs], Section]) -> Callable[[SectionInputs], Section]:
        if key in SECTIONS:
            raise ValueError(f"report section {key!r} declared twice")
        if any(spec.order == order for spec in SECTIONS.values()):
            raise ValueError(f"report section {key!r}: order {order} is taken")
        SECTIONS[key] = SectionSpec(key, order, build, drop_when_absent)
        return build

    return register


FramesBuild = Callable[[list[RunInfo], list[pd.DataFrame]], Section]


def register_frames_section(key: str, order: int, build: FramesBuild, *,
                            drop_when_absent: bool = False) -> None:
    """A section built from the runs' headers and prepared rows alone (most paper tables)."""
    register_section(key, order, drop_when_absent=drop_when_absent)(
        lambda inputs: build(inputs.runs, inputs.frames))


def ordered_sections() -> list[SectionSpec]:
    from nearlocal.plugins import SECTION_GROUP, load_group

    load_group(SECTION_GROUP)
    return sorted(SECTIONS.values(), key=lambda spec: spec.order)
