"""Page placements: each worker process draws several fresh mappings of a case's buffers, the row
counts them and says how far they disagree, the gate takes them as its unit, and every front end
draws the same number by default."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.sampling import DEFAULT_PLACEMENTS, StoppingRule
from nearlocal.engine.plan import RunSettings, plan_cases
from nearlocal.engine.worker import WorkerSettings, measure, placements_held
from nearlocal.frontends.cli import main
from nearlocal.kernels.timer import measure_clock
from nearlocal.probe import probe
from nearlocal.store.reader import load


@pytest.fixture(scope="module")
def inventory():
    return probe(gpu=False)


def _resolved(inventory, case: Case):
    (entry,) = plan_cases([case], inventory, RunSettings(0.02, processes=1)).entries
    assert entry.runs, entry.reason
    return entry.resolved


def test_placements_are_drawn_only_where_an_open_maps_fresh_pages(inventory, tmp_path, monkeypatch):
    fresh = _resolved(inventory, Case("load", "dram", "wb", "64KiB"))
    named = _resolved(inventory, Case("load", f"file:{tmp_path / 'region'}", "wb", "64KiB"))
    assert placements_held(fresh, 4) == 4
    assert placements_held(fresh, 4, llc_bytes=1 << 20) == 4
    assert placements_held(fresh, 4, llc_bytes=32 << 10) == 1  # beyond the LLC: one is many pages
    assert placements_held(fresh, 1) == 1
    assert placements_held(named, 4) == 1  # a file maps the same pages however often it is opened
    # too large to hold them all at once: one, as a released placement's pages come back
    import nearlocal.regions.memory as memory

    monkeypatch.setattr(memory, "memory_available", lambda: 4 * sum(fresh.spans) - 1)
    assert placements_held(fresh, 4) == 1


def test_one_process_measures_each_placement_on_its_own_pages(inventory):
    resolved = _resolved(inventory, Case("load", "dram", "wb", "64KiB"))
    settings = WorkerSettings(StoppingRule(budget_s=0.03, min_samples=5), inventory.tsc_hz, False,
                              clock=measure_clock(), inventory=inventory, placements=3)
    row, raw, ns, placement = measure(resolved, settings)
    assert sorted(set(placement.tolist())) == [0, 1, 2] and len(placement) == len(ns) == len(raw)
    assert row["placements"] == 3 and row["n_samples"] == len(ns)
    facts = row["info"]["placements"]
    assert [f["placement"] for f in facts] == [0, 1, 2]
    for fact in facts:  # each placement's median is its own samples'
        assert fact["median_ns"] == pytest.approx(float(np.median(ns[placement == fact["placement"]])))
        assert fact["cpu"] is None or fact["cpu"] >= 0
    assert np.isnan(row["placement_spread"])  # under 4 draws: not told


def test_the_report_marks_a_case_whose_placements_disagree(tmp_path):
    from nearlocal.report.tables import build_report
    from tests.report_fixtures import make_run, row

    mixed, calm = row("nt-store", size=16384), row("load", size=4096)
    mixed.update(placements=16, placement_spread=0.25)
    calm.update(placements=16, placement_spread=0.02)
    report = build_report([load(make_run(tmp_path, [mixed, calm]))])
    outcomes = {r[0]: r[1] for r in report.section("failures").table.rows}
    assert set(outcomes) == {"nt-store: 1 placements disagree"}
    assert outcomes["nt-store: 1 placements disagree"].startswith("16KiB; placement medians spread 25–25%")


def test_runs_stored_before_placements_load_with_one_a_process(tmp_path):
    from nearlocal.store.writer import Store

    store = Store.create(tmp_path, {"suite": "old"})
    ns = np.arange(6, dtype=np.float64) + 100
    store.add_case({"case_id": "a", "status": "ok", "processes": 3}, ns, ns,
                   np.array([0, 0, 1, 1, 2, 2], np.int32))
    run = load(store.finish())
    run.samples = run.samples.drop(columns="placement")  # as an older run's samples.parquet
    path = run.path / "samples.parquet"
    run.samples.to_parquet(path, index=False)
    old = load(run.path)
    assert old.samples["placement"].tolist() == [0, 0, 1, 1, 2, 2]


def test_pytest_bench_and_run_draw_the_same_placements_by_default(tmp_path):
    """Both front ends at their defaults: every row stands on the same number of placements."""
    assert main(["run", "--method", "load", "--region", "dram", "--size", "4KiB", "--budget",
                 "0.02", "--processes", "2", "--quiet", "--out", str(tmp_path / "run")]) == 0
    (run_row,) = load("latest", tmp_path / "run").cases.to_dict("records")
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
         "nearlocal.bench.test_cpu", "-k", "load-dram-wb-4KiB", "--nearlocal-processes", "2",
         "--benchmark-max-time", "0.02", "--benchmark-json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (bench,) = [b for b in json.loads(out.read_text())["benchmarks"]
                if b["name"].endswith("[load-dram-wb-4KiB]")]
    assert run_row["placements"] == bench["extra_info"]["placements"] == 2 * DEFAULT_PLACEMENTS


def test_placement_facts_read_the_mapping_that_holds_each_buffer():
    """One smaps read for every buffer: a mapping kept off huge pages reads 0, an address no
    mapping holds reads None, an array with no host address (a GPU's) is left out."""
    import mmap

    from nearlocal.engine.stability.placement import HUGE, _huge_shares, describe_placement

    buf = mmap.mmap(-1, 4 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    small = np.frombuffer(buf, np.uint8)
    small[:] = 1
    facts = describe_placement({"region": small, "peer": small[HUGE:], "gpu": object()})
    assert facts["region_huge_share"] == facts["peer_huge_share"] == 0.0
    assert facts["peer_offset"] == (small.ctypes.data + HUGE) % HUGE
    assert not any(key.startswith("gpu") for key in facts)
    assert _huge_shares([0]) == {0: None}  # page 0 is never mapped
    del small, facts
    buf.close()
