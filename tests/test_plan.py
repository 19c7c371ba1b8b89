"""The plan stage: one probe per run, each case checked once, skip kinds (not texts) decide, and
method sets that come from the registry (a plugin's method joins quick and the pool)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nearlocal import plugins
from nearlocal.core import cases as case_rules
from nearlocal.core import methods as method_registry
from nearlocal.core.cases import Case, SkipKind
from nearlocal.cpu.threads import THREAD_FORMS
from nearlocal.engine.plan import Refuse, Run, RunSettings, Skip, plan_cases
from nearlocal.frontends.cli import main
from nearlocal.probe import probe
from nearlocal.store import load
from nearlocal.sysroot import SysRoot
from tests.fakesys import cxl_box
from tests.report_fixtures import make_run, row

PLUGIN = "unwarmed-load"


def load_plugin(monkeypatch, module: str, load=method_registry.load_methods) -> None:
    """`module` loaded the way a user's plugin is: NEARLOCAL_PLUGINS, read when a registry
    first loads (`load`; the caller unregisters what it declared)."""
    monkeypatch.setenv("NEARLOCAL_PLUGINS", module)
    monkeypatch.setattr(plugins, "_loaded", set())
    sys.modules.pop(module, None)
    load()


@pytest.fixture
def plugin(monkeypatch):
    load_plugin(monkeypatch, "tests.plugin_method")
    yield method_registry.get_method(PLUGIN)
    method_registry.METHODS.pop(PLUGIN, None)
    THREAD_FORMS.pop(PLUGIN, None)
    sys.modules.pop("tests.plugin_method", None)


def test_one_probe_and_one_check_per_case_in_a_run(tmp_path, monkeypatch):
    """`nearlocal run --method load`: the box is probed once (suites, threads, the runner use
    that inventory) and each case's skip decision is asked once. No worker is started: every
    request to one fails the case at once."""
    import nearlocal.probe as probe
    from nearlocal.engine.workers import MeasuringWorker

    probes, skips = [], []
    real_probe, real_skip = probe.probe, case_rules.skip
    monkeypatch.setattr(probe, "probe", lambda *a, **k: probes.append(1) or real_probe(*a, **k))
    monkeypatch.setattr(case_rules, "skip", lambda *a, **k: skips.append(a[0].id) or real_skip(*a, **k))
    monkeypatch.setattr(MeasuringWorker, "ask", lambda self, case, message: {
        "status": "failed", "reason": "no worker in this test"})
    code = main(["run", "--method", "load", "--size", "4KiB,64KiB", "--budget", "0.02",
                 "--quiet", "--out", str(tmp_path)])
    assert code == 0
    assert len(probes) == 1
    cases = load("latest", tmp_path).cases
    assert sorted(skips) == sorted(cases["case_id"]) and len(skips) == len(set(skips))
    assert set(cases["status"]) <= {"failed", "skipped"}


def test_skip_kinds_decide_what_a_run_refuses():
    inventory = probe(calibrate=False, gpu=False)
    settings = RunSettings(0.02, processes=1)
    huge = plan_cases([Case("load", "dram", pattern=f"{2**45}B")], inventory, settings)
    (entry,) = huge.entries
    assert isinstance(entry.decision, Skip) and entry.decision.kind is SkipKind.CANNOT_HOLD
    with pytest.raises(Exception, match="cannot hold"):
        huge.refuse_bad_input()
    fine = plan_cases([Case("load", "dram", pattern="4KiB"), Case("load", "numa:99")], inventory,
                      settings)
    assert isinstance(fine.entries[0].decision, Run) and fine.entries[0].row["size_bytes"] == 4096
    assert isinstance(fine.entries[1].decision, Refuse)
    accepted = fine.refused_as_skipped()
    assert accepted.entries[1].decision.kind is SkipKind.NOT_ON_BOX
    accepted.refuse_bad_input()  # one case runs: nothing to refuse


@pytest.mark.parametrize("kwargs, message", [
    ({"budget_s": 0.5, "processes": 0}, "--processes must be between 1 and 100, got 0"),
    ({"budget_s": 0.5, "ci_percent": 100.0}, "--ci must be a percentage"),
])
def test_run_settings_are_checked_once(kwargs, message):
    from nearlocal.errors import UsageError

    with pytest.raises(UsageError, match=message):
        RunSettings(**kwargs)
    # a first look: at most 8 processes, never more; a run made for a gate: 32, growing for a
    # case whose processes disagree; processes given: never more
    assert RunSettings(0.5).processes == 8 and RunSettings(0.5).max_processes == 8
    gate = RunSettings(0.5, for_gate=True)
    assert gate.processes == 32 and gate.max_processes == 128
    assert RunSettings(0.02).processes == 1 and RunSettings(0.02, for_gate=True).processes == 1
    assert RunSettings(0.5, processes=8, for_gate=True).max_processes == 8


def test_the_runner_refuses_a_process_count_instead_of_clamping_it(tmp_path):
    from nearlocal.engine.runner import Runner

    with pytest.raises(ValueError, match="processes"):
        Runner(None, RunSettings(0.1).worker_settings(probe(calibrate=False, gpu=False)), None,
               processes=0)


def test_a_plugin_method_joins_quick_the_pool_and_the_report(plugin, tmp_path, monkeypatch):
    from nearlocal.core import suites
    from nearlocal.cpu import threads
    from nearlocal.engine.worker import open_case
    from nearlocal.kernels.timer import measure_clock
    from nearlocal.report.tables import build_report

    monkeypatch.setattr(threads, "current_cpu", lambda: 0)  # the fake box's node 0
    inventory = probe(SysRoot(cxl_box(tmp_path / "sys")), calibrate=False, gpu=False)
    quick = [c for c in suites.suite_cases("quick", inventory) if c.method == PLUGIN]
    assert {c.region for c in quick} == {"dram", "numa:1", "devdax:/dev/dax0.0"}
    assert Case(PLUGIN, "dram", "wb", "16KiB") in quick
    assert PLUGIN in suites.CPU_METHODS

    # it really measures: its kernel, timed inside compiled code, on local DRAM
    here = probe(calibrate=False, gpu=False)
    with open_case(Case(PLUGIN, "dram", "wb", "4KiB"), here.tsc_hz or 2e9,
                   measure_clock().overhead_ticks, False, here) as opened:
        raw, ns = opened.session.sample(5)
    assert len(ns) == 5 and np.all(np.asarray(raw) > 0)

    run = make_run(tmp_path / "store", [row(PLUGIN, "dram", median=1000.0),
                                        row(PLUGIN, "numa:1", median=2500.0)])
    near = build_report([load(run)]).section("near-cases").table
    (found,) = [r for r in near.rows if r[0] == PLUGIN]
    assert found[4] == "numa:1" and found[8] == pytest.approx(2.5)


def test_a_plugin_cpu_method_gets_threads_from_its_one_file(plugin, tmp_path):
    """The ThreadForm handed to `threaded` in tests/plugin_method.py: --threads' help names the
    method, a run with --threads measures it on pinned threads in a worker, and the stored row
    says what each thread's interval held."""
    from nearlocal.frontends.cli import _threads_help

    assert PLUGIN in _threads_help()
    code = main(["run", "--method", PLUGIN, "--size", "64KiB", "--threads", "all",
                 "--budget", "0.02", "--processes", "1", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    (row,) = load("latest", tmp_path).cases.to_dict("records")
    assert row["status"] == "ok" and row["case_id"] == f"{PLUGIN}/dram/wb/64KiB/threads=all"
    assert "no warm-up pass" in row["info"]["timed"] and row["info"]["per_thread"]
    assert sum(t["bytes"] for t in row["info"]["per_thread"]) == 64 * 1024


@pytest.fixture
def plugin_region(monkeypatch):
    from nearlocal.regions import REGION_KINDS, load_providers

    load_plugin(monkeypatch, "tests.plugin_region", load_providers)  # no method looked up first
    yield REGION_KINDS["scratch"]
    REGION_KINDS.pop("scratch", None)
    sys.modules.pop("tests.plugin_region", None)


def test_a_plugin_region_kind_is_its_provider_and_one_registration(plugin_region, tmp_path):
    """One file (tests/plugin_region.py): probe lists it, --region's help names it, a run on it
    plans, measures in a worker process and stores its row, which says what kind it was."""
    from nearlocal import availability
    from nearlocal.frontends.cli import _regions_help

    assert "scratch" in _regions_help()
    inventory = probe(calibrate=False, gpu=False)
    assert "scratch" in availability.region_verdicts(inventory)
    code = main(["run", "--method", "load,store", "--region", "scratch", "--size", "4KiB",
                 "--budget", "0.02", "--processes", "1", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    cases = load("latest", tmp_path).cases
    assert set(cases["status"]) == {"ok"} and set(cases["region_kind"]) == {"scratch"}
    assert set(cases["pool_class"]) == {"local"}


def test_a_method_that_never_touches_its_peer_maps_one_line_of_it():
    """A 1 GiB chase mapped, populated and filled a 1 GiB peer it never read (1-4 s a process)."""
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import PEER_STUB_BYTES

    gib = 1 << 30
    assert Case("chase", "dram", "wb", "1GiB").spans() == (gib, PEER_STUB_BYTES)
    assert Case("load", "dram", "wb", "64MiB").spans() == (64 << 20, PEER_STUB_BYTES)
    assert Case("store", "dram", "wb", "4KiB").spans() == (4096, PEER_STUB_BYTES)
    # copies move bytes between the two: the peer spans the pattern
    assert Case("memcpy", "dram", "wb", "64MiB").spans() == (64 << 20, 64 << 20)
    assert Case("nt-copy", "dram", "wb", "1024x160B").spans()[1] == 1024 * 160
