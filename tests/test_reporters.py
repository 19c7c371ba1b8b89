"""The output formats every command shares (nearlocal/reporters.py): each command's registry of
reporters, which its format options come from, and the one JUnit writer."""

from __future__ import annotations

import argparse
import re
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


def _subcommand(name: str) -> argparse.ArgumentParser:
    from nearlocal.frontends.cli import build_parser

    (commands,) = [a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


def test_each_commands_format_options_come_from_its_registry():
    from nearlocal.acceptance.render import ACCEPT_FORMATS
    from nearlocal.gate.render import COMPARE_FORMATS
    from nearlocal.report.formats import REPORT_FORMATS

    (fmt,) = [a for a in _subcommand("compare")._actions if a.dest == "format"]
    assert tuple(fmt.choices) == COMPARE_FORMATS.names == ("table", "markdown", "json", "junit")
    assert fmt.default == "table"
    for command, formats in (("accept", ACCEPT_FORMATS), ("report", REPORT_FORMATS)):
        options = {o for a in _subcommand(command)._actions for o in a.option_strings}
        assert {f"--{r.name}" for r in formats.others()} <= options
        assert f"--{formats.default.name}" not in options  # the default is what it prints
    assert [r.name for r in ACCEPT_FORMATS.others()] == ["junit", "json"]
    assert [r.name for r in REPORT_FORMATS.others()] == ["html", "markdown", "json"]


def test_an_unknown_format_is_one_line_naming_the_known_ones():
    from nearlocal.errors import UsageError
    from nearlocal.gate.render import COMPARE_FORMATS

    with pytest.raises(UsageError, match=r"compare has no format 'csv' \(valid: table, "
                                         r"markdown, json, junit\)"):
        COMPARE_FORMATS["csv"]


def _stamped(text: str) -> str:
    """The text without JUnit's timestamp (the second it was written)."""
    return re.sub(r'timestamp="[^"]*"', 'timestamp=""', text)


def test_every_format_gives_its_whole_output_as_text_and_writes_it(tmp_path):
    """The report's three formats, acceptance's three: report() is what write() puts in the
    file (a table as plain text, no colour codes)."""
    from nearlocal.acceptance.render import ACCEPT_FORMATS
    from nearlocal.acceptance.verdicts import AcceptanceRecord, VerdictRecord
    from nearlocal.report.formats import REPORT_FORMATS
    from nearlocal.report.tables import build_report
    from nearlocal.store import load
    from tests.report_fixtures import make_run, row

    record = AcceptanceRecord("/specs/s.toml", "", "s", "", "dram", "", (
        VerdictRecord("load within 1 us", "load/dram/wb/16KiB", "median_ns", "max", 1000.0, True,
                      100.0, 0.9),), "r1")
    report = build_report([load(make_run(tmp_path / "store", [row("load", "dram")]))])
    for formats, model in ((ACCEPT_FORMATS, record), (REPORT_FORMATS, report)):
        for reporter in formats:
            text = reporter.report(model)
            assert text and "\x1b[" not in text, reporter.name
            path = tmp_path / f"out-{formats.command}.{reporter.name}"
            written = reporter.write(model, path, f"--{reporter.name}")
            assert written[0] == path
            if reporter.name != "markdown":  # the written Markdown names its plots after PATH
                assert _stamped(path.read_text()) == _stamped(text), reporter.name
    assert "| load within 1 us | 100.0 ns |" in ACCEPT_FORMATS["table"].report(record)
