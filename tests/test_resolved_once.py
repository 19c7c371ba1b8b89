"""A case is resolved once, by the plan: the resolved case (method looked up, pattern and regions
parsed, params merged, spans, row facts) is what the runner sends its worker, and the worker
parses nothing of it again. The run's clock is calibrated once. Counted by wrapping the resolvers
wherever a module imported them."""

from __future__ import annotations

import pickle
import sys
from collections import Counter

import pytest

from nearlocal.core.cases import Case, ResolvedCase, resolve


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
    """The plan and the runner of `run --method load --size 4KiB,64KiB --processes 2`: each
    case's method looked up once, its parameters merged once, its pattern and each region or
    peer parsed once; one clock; resolved cases to the worker."""
    import nearlocal.kernels.timer  # noqa: F401  (loaded: its measure_clock is wrapped)
    from nearlocal.engine import runner
    from nearlocal.engine.plan import RunSettings, plan_cases
    from nearlocal.probe import probe
    from nearlocal.store.runs import Store

    inventory = probe(calibrate=False, gpu=False)
    methods = count_calls(monkeypatch, "nearlocal.core.methods", "get_method")
    merges: Counter = Counter()
    merge = Case.__dict__["effective_params"]
    original_merge = merge.func
    monkeypatch.setattr(merge, "func", lambda case: merges.update([case.pattern])
                        or original_merge(case))
    cases = [Case("load", "dram", "wb", size, params=(("drain", "none"),))
             for size in ("4KiB", "64KiB")]
    sent = []

    def ask(self, case, message):
        sent.append(message)
        return {"status": "failed", "reason": "no worker in this test"}

    monkeypatch.setattr(runner.Runner, "_ask", ask)
    patterns = count_calls(monkeypatch, "nearlocal.core.patterns", "parse_pattern")
    regions = count_calls(monkeypatch, "nearlocal.regions.base", "parse_region")
    clocks = count_calls(monkeypatch, "nearlocal.kernels.timer", "measure_clock")
    plan = plan_cases(cases, inventory, RunSettings(0.02, processes=2))
    store = Store.create(tmp_path, {"suite": "t"})
    runner.Runner(inventory, plan.worker_settings(), store, processes=2,
                  compile_first=True, probe_host=False).run(plan.entries)
    assert patterns == Counter({"4KiB": 1, "64KiB": 1})
    assert regions == Counter({"dram": 4})  # each case's region and peer, once each
    assert sum(clocks.values()) == 1
    assert methods == Counter({"load": 2})  # each case's method looked up once, when made
    assert merges == Counter({"4KiB": 1, "64KiB": 1})  # its parameters merged once
    assert sent and all(isinstance(message[1], ResolvedCase) for message in sent)
    assert {message[1].case.pattern for message in sent if message[0] == "measure"} == {
        "4KiB", "64KiB"}
    assert all(message[1].params["drain"] == "none" for message in sent if message[0] == "measure")


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
    assert facts.case.method_entry.name == "memcpy"  # looked up: it stays behind when pickled
    sent = pickle.loads(pickle.dumps(facts))
    assert sent.case == case and sent.case.id == case.id and sent.params == facts.params
