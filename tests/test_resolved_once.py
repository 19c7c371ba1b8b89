"""A case is resolved once, by the plan: the resolved case (pattern and regions parsed, params
merged, spans, row facts) is what the runner sends its worker, and the worker parses nothing of
it again. The run's clock is calibrated once. Counted by wrapping the resolvers wherever a
module imported them."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from nearlocal.core.cases import Case, ResolvedCase, resolve
from nearlocal.frontends.cli import main


def count_calls(monkeypatch, module: str, name: str) -> Counter:
    """Every call of `module.name`, through any module that imported it, counted by first arg."""
    original = getattr(sys.modules[module], name)
    calls: Counter = Counter()

    def counted(*args, **kwargs):
        calls[str(args[0]) if args else ""] += 1
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, name, None) is original and loaded.__name__.startswith("nearlocal"):
            monkeypatch.setattr(loaded, name, counted)
    return calls


def test_a_run_resolves_each_case_once_and_sends_the_worker_the_resolved_case(tmp_path,
                                                                                monkeypatch):
    import nearlocal.kernels.timer  # noqa: F401  (loaded: its measure_clock is wrapped)
    from nearlocal.engine import runner

    patterns = count_calls(monkeypatch, "nearlocal.core.patterns", "parse_pattern")
    clocks = count_calls(monkeypatch, "nearlocal.kernels.timer", "measure_clock")
    sent = []

    def ask(self, case, message):
        sent.append(message)
        return {"status": "failed", "reason": "no worker in this test"}

    monkeypatch.setattr(runner.Runner, "_ask", ask)
    code = main(["run", "--method", "load", "--size", "4KiB,64KiB", "--budget", "0.02",
                 "--processes", "2", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    assert patterns == Counter({"4KiB": 1, "64KiB": 1})  # in the plan, once each
    assert sum(clocks.values()) == 1
    assert sent and all(isinstance(message[1], ResolvedCase) for message in sent)
    assert {message[1].case.pattern for message in sent if message[0] == "measure"} == {
        "4KiB", "64KiB"}


def test_the_worker_opens_a_resolved_case_without_parsing_it_again(monkeypatch):
    from nearlocal.engine.worker import open_case

    case = resolve(Case("load", "dram", "wb", "1024x160B"))
    patterns = count_calls(monkeypatch, "nearlocal.core.patterns", "parse_pattern")
    regions = count_calls(monkeypatch, "nearlocal.regions.base", "parse_region")
    with open_case(case, 1e9, 0.0, False) as opened:
        assert opened.pattern.count == 1024 and opened.region.spec == case.region
    assert not patterns and not regions


@pytest.mark.parametrize("text", ["16KiB", "1024x160B@4KiB"])
def test_a_resolved_case_carries_what_the_worker_needs(text):
    case = Case("memcpy", "dram", "wb", text, params=(("drain", "none"),))
    facts = resolve(case)
    assert facts.pattern.text == text and facts.region.kind == "dram"
    assert facts.params["drain"] == "none" and facts.spans == case.spans(facts.pattern)
