"""A case is resolved once, by the plan: the resolved case (method looked up, pattern and regions
parsed, params merged, spans, bytes moved) is what the runner sends its worker, and the worker
parses and computes nothing of it again; the row facts are derived once, by the plan, and stay in
the parent. The run's clock is calibrated once. Counted by wrapping the resolvers wherever a
module imported them."""

from __future__ import annotations

import pickle
import sys
from collections import Counter

import pytest

from nearlocal.core.cases import Case, ResolvedCase, resolve
from nearlocal.core.methods import Method


def _first_arg(args: tuple) -> str:
    return str(args[0]) if args else ""


def count_calls(monkeypatch, module: str, name: str, key=_first_arg) -> Counter:
    """Every call of `module.name`, through any module that imported it, counted by `key(args)`
    (the first argument as text)."""
    original = getattr(sys.modules[module], name)
    calls: Counter = Counter()

    def counted(*args, **kwargs):
        calls[key(args)] += 1
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, name, None) is original and loaded.__name__.startswith("nearlocal"):
            monkeypatch.setattr(loaded, name, counted)
    return calls


def count_derived(monkeypatch) -> tuple[Counter, Counter]:
    """Calls of Case.spans and Method.bytes_moved, counted by the case's pattern text."""
    spans, moved = Counter(), Counter()
    original_spans, original_moved = Case.spans, Method.bytes_moved

    def counted_spans(case, pattern=None):
        spans[case.pattern] += 1
        return original_spans(case, pattern)

    def counted_moved(method, pattern):
        moved[pattern.text] += 1
        return original_moved(method, pattern)

    monkeypatch.setattr(Case, "spans", counted_spans)
    monkeypatch.setattr(Method, "bytes_moved", counted_moved)
    return spans, moved


def test_a_run_resolves_each_case_once_and_sends_the_worker_the_resolved_case(tmp_path,
                                                                                monkeypatch):
    """The plan and the runner of `run --method load --size 4KiB,64KiB --processes 2`: each
    case's method looked up once, its parameters merged once, its pattern and each region or
    peer parsed once, its spans, bytes moved and row facts derived once; one clock; resolved
    cases to the worker, without the row facts (the runner builds rows, the worker never reads
    them)."""
    import nearlocal.kernels.timer  # noqa: F401  (loaded: its measure_clock is wrapped)
    from nearlocal.engine import runner
    from nearlocal.engine.plan import RunSettings, plan_cases
    from nearlocal.engine.workers import MeasuringWorker
    from nearlocal.probe import probe
    from nearlocal.store.writer import Store

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

    monkeypatch.setattr(MeasuringWorker, "ask", ask)
    patterns = count_calls(monkeypatch, "nearlocal.core.patterns", "parse_pattern")
    regions = count_calls(monkeypatch, "nearlocal.regions.base", "parse_region")
    clocks = count_calls(monkeypatch, "nearlocal.kernels.timer", "measure_clock")
    facts = count_calls(monkeypatch, "nearlocal.core.rows", "row_facts",
                        key=lambda args: args[0].case.pattern)
    spans, moved = count_derived(monkeypatch)
    plan = plan_cases(cases, inventory, RunSettings(0.02, processes=2))
    store = Store.create(tmp_path, {"suite": "t"})
    runner.Runner(inventory, plan.worker_settings(), store, processes=2,
                  compile_first=True, probe_host=False).run(plan.entries)
    assert patterns == Counter({"4KiB": 1, "64KiB": 1})
    assert regions == Counter({"dram": 4})  # each case's region and peer, once each
    assert sum(clocks.values()) == 1
    assert methods == Counter({"load": 2})  # each case's method looked up once, when made
    assert merges == Counter({"4KiB": 1, "64KiB": 1})  # its parameters merged once
    assert spans == moved == facts == Counter({"4KiB": 1, "64KiB": 1})
    assert all(b"reaches_memory" not in pickle.dumps(message) for message in sent)
    assert sent and all(isinstance(message[1], ResolvedCase) for message in sent)
    assert {message[1].case.pattern for message in sent if message[0] == "measure"} == {
        "4KiB", "64KiB"}
    assert all(message[1].params["drain"] == "none" for message in sent if message[0] == "measure")


def test_the_worker_measures_a_resolved_case_without_deriving_it_again(monkeypatch):
    """What a worker does with a plan's case (open it, measure it): no pattern or region parsed,
    no spans or bytes moved computed again."""
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine.worker import WorkerSettings, measure, open_case
    from nearlocal.kernels.timer import measure_clock

    case = resolve(Case("load", "dram", "wb", "1024x160B"))
    settings = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3), 1e9, False,
                              clock=measure_clock(), placements=2)
    patterns = count_calls(monkeypatch, "nearlocal.core.patterns", "parse_pattern")
    regions = count_calls(monkeypatch, "nearlocal.regions.base", "parse_region")
    spans, moved = count_derived(monkeypatch)
    with open_case(case, 1e9, 0.0, False) as opened:
        assert opened.pattern.count == 1024 and opened.region.spec == case.region
    row, _, ns, _ = measure(case, settings)
    assert row["status"] == "ok" and len(ns)
    assert row["gbps"] > 0  # from the resolved case's bytes moved
    assert not patterns and not regions and not spans and not moved


@pytest.mark.parametrize("text", ["16KiB", "1024x160B@4KiB"])
def test_a_resolved_case_carries_what_the_worker_needs(text):
    case = Case("memcpy", "dram", "wb", text, params=(("drain", "none"),))
    facts = resolve(case)
    assert facts.pattern.text == text and facts.region.kind == "dram"
    assert facts.params["drain"] == "none" and facts.spans == case.spans(facts.pattern)
    assert facts.bytes_moved == case.method_entry.bytes_moved(facts.pattern)
    assert facts.case.method_entry.name == "memcpy"  # looked up: it stays behind when pickled
    sent = pickle.loads(pickle.dumps(facts))
    assert sent.case == case and sent.case.id == case.id and sent.params == facts.params


def test_an_mpi_job_resolves_each_case_once_per_rank_and_rack_ranks_get_rank_0s(tmp_path):
    """`mpiexec -n 2 nearlocal run --suite rack-test-once` (a plain case and two rack cases):
    each rank plans the command line on its own host (the job checks it on every host), so
    each case's pattern is parsed and its spans and row facts derived once per rank, there.
    Nothing is parsed or derived after the plan, in any rank or worker: a rack case's ranks are
    sent rank 0's resolved case, and its rows start from rank 0's row facts."""
    import os

    from nearlocal.store import load
    from tests.test_rack import MPIEXEC, NEARLOCAL, TINY, mpirun

    if MPIEXEC is None:
        pytest.skip("mpi4py and an MPI (pip install 'nearlocal[mpi]') are not installed")
    counts, out = tmp_path / "counts.tsv", tmp_path / "out"
    proc = mpirun(["-n", "2", *NEARLOCAL, "run", "--suite", "rack-test-once", "--out", str(out),
                   *TINY], cwd=tmp_path,
                  env={"NEARLOCAL_PLUGINS": "tests.rack_plugin,tests.count_plugin",
                       "NEARLOCAL_TEST_COUNTS": str(counts),
                       "NEARLOCAL_TEST_RACK_POOL": f"shm:nearlocal-test-once-{os.getpid()}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = load(None, out)
    assert set(run.cases["status"]) == {"ok"}, run.cases[["case_id", "status", "reason"]]
    calls: dict[str, Counter] = {"parse": Counter(), "spans": Counter(), "row_facts": Counter()}
    for line in counts.read_text().splitlines():
        rank, what, key = line.split("\t")
        calls[what][(rank, key)] += 1
    ids = {case_id.rsplit("/rank=", 1)[0] for case_id in run.cases["case_id"]}
    patterns = set(run.cases["pattern"])
    assert len(ids) == len(patterns) == 3
    assert calls["parse"] == Counter({(rank, text): 1 for rank in "01" for text in patterns})
    assert calls["spans"] == calls["row_facts"] == Counter(
        {(rank, case_id): 1 for rank in "01" for case_id in ids})
    rack = run.cases[run.cases["method"].str.startswith("rack-")]
    assert set(rack["rank"]) == {0, 1}  # every rank measured its part of them
    assert rack["reaches_memory"].all() and rack["bytes_moved"].notna().all()  # rank 0's facts
