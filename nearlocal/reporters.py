"""What every command's output formats share: the one JUnit XML writer, to which the gate's
comparison and acceptance's verdicts map their results (CI reads both the same way). A utility
below every layer that reports."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

OUTCOMES = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class JUnitCase:
    """One test case: passed (its detail in system-out), failed (a failure whose message and text
    are the detail) or skipped (a skipped element whose message is the detail)."""

    name: str
    classname: str
    seconds: float
    detail: str
    outcome: str = "passed"
    failure_type: str = ""  # the failure's type: what kind of failure CI is told it is

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")


def junit_xml(suite: str, cases: Sequence[JUnitCase], properties: Sequence[tuple[str, str]] = (),
              time_digits: int = 3) -> str:
    """One <testsuite> in <testsuites>, its counts from the cases' outcomes, stamped now (local
    time, as JUnit readers expect); `time_digits`: the decimals of each case's seconds."""
    element = ET.Element("testsuite", name=suite, tests=str(len(cases)),
                         failures=str(sum(c.outcome == "failed" for c in cases)), errors="0",
                         skipped=str(sum(c.outcome == "skipped" for c in cases)),
                         timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if properties:
        listed = ET.SubElement(element, "properties")
        for name, value in properties:
            ET.SubElement(listed, "property", name=name, value=value)
    for case in cases:
        node = ET.SubElement(element, "testcase", classname=case.classname, name=case.name,
                             time=f"{case.seconds:.{time_digits}f}")
        if case.outcome == "failed":
            ET.SubElement(node, "failure", message=case.detail,
                          type=case.failure_type).text = case.detail
        elif case.outcome == "skipped":
            ET.SubElement(node, "skipped", message=case.detail)
        else:
            ET.SubElement(node, "system-out").text = case.detail
    root = ET.Element("testsuites")
    root.append(element)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
