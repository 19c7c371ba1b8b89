"""The output formats every command shares (nearlocal/reporters.py): the one JUnit writer."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from nearlocal.reporters import JUnitCase, junit_xml


def test_junit_counts_and_lays_out_each_outcome():
    cases = [JUnitCase("a", "x.y", 1.25, "fine"),
             JUnitCase("b", "x.y", 0.5, "too slow", "failed", "regression"),
             JUnitCase("c", "x.z", 0.0, "not in the base", "skipped")]
    root = ET.fromstring(junit_xml("suite s", cases, [("run", "r1")], time_digits=2))
    suite = root.find("testsuite")
    assert {k: suite.get(k) for k in ("name", "tests", "failures", "errors", "skipped")} == \
        {"name": "suite s", "tests": "3", "failures": "1", "errors": "0", "skipped": "1"}
    assert [(p.get("name"), p.get("value")) for p in suite.find("properties")] == [("run", "r1")]
    a, b, c = suite.findall("testcase")
    assert (a.get("classname"), a.get("name"), a.get("time")) == ("x.y", "a", "1.25")
    assert a.find("system-out").text == "fine" and a.find("failure") is None
    failure = b.find("failure")
    assert (failure.get("message"), failure.get("type"), failure.text) == \
        ("too slow", "regression", "too slow")
    assert c.find("skipped").get("message") == "not in the base" and c.find("system-out") is None


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="outcome"):
        JUnitCase("a", "x", 0.0, "", "errored")
