"""Statistics are right; the store round-trips runs and never overwrites one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nearlocal.core.sampling import (
    StoppingRule,
    median_ci,
    median_rank_bounds,
    relative_half_width,
    summarize,
)
from nearlocal.errors import UsageError
from nearlocal.store import Store, list_runs, load
from nearlocal.units import format_size, parse_duration, parse_size


def test_summary_statistics_match_numpy():
    rng = np.random.default_rng(1)
    ns = rng.lognormal(6, 0.3, 5001)
    row = summarize(ns, bytes_moved=4096)
    assert row["n_samples"] == 5001
    assert row["median_ns"] == pytest.approx(np.median(ns))
    assert row["mean_ns"] == pytest.approx(ns.mean())
    assert row["p99_ns"] == pytest.approx(np.percentile(ns, 99))
    assert row["p10_ns"] == pytest.approx(np.percentile(ns, 10))
    assert row["min_ns"] == ns.min() and row["max_ns"] == ns.max()
    assert row["stddev_ns"] == pytest.approx(ns.std(ddof=1))
    assert row["mad_ns"] == pytest.approx(np.median(np.abs(ns - np.median(ns))))
    assert row["gbps"] == pytest.approx(4096 / np.median(ns))
    assert row["ci_low_ns"] <= row["median_ns"] <= row["ci_high_ns"]


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(400):
        low, high = median_ci(np.sort(rng.exponential(1.0, 101)))
        hits += low <= np.log(2) <= high
    assert 0.91 <= hits / 400 <= 0.99


def test_median_ranks_are_scipys_binomial_quantiles():
    from scipy import stats

    for n in [*range(6, 400), 1001, 4096, 10_000, 65_537]:
        for confidence in (0.9, 0.95, 0.99):
            tail = (1 - confidence) / 2
            assert median_rank_bounds(n, confidence) == (int(stats.binom.ppf(tail, n, 0.5)),
                                                         int(stats.binom.isf(tail, n, 0.5)))


def test_the_stopping_rule_imports_no_scipy():
    """Every worker process asks the rule after each batch: an import there is timed budget."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; from nearlocal.core.sampling import StoppingRule, summarize; "
            "StoppingRule().done(np.arange(1.0, 200.0), 0.0); summarize(np.arange(1.0, 99.0), 64); "
            "print('scipy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_stopping_rule():
    rule = StoppingRule(budget_s=1.0, target_rel_ci=0.01, min_samples=30)
    assert not rule.converged(np.full(10, 5.0))
    assert rule.converged(np.full(100, 5.0))
    noisy = np.random.default_rng(3).exponential(1.0, 100)
    assert relative_half_width(noisy) > 0.01 and not rule.done(noisy, 0.1)
    assert rule.done(noisy, 1.5)
    assert rule.batch_size(1e-3, have=0) == 50
    assert rule.batch_size(1e-9, have=9990) == 10


def test_units():
    assert parse_size("16KiB") == 16384 and parse_size("1GiB") == 1 << 30
    assert parse_size("64") == 64 and parse_size("4k") == 4096 and parse_size("2MB") == 2_000_000
    for bad in ("12XB", "-4", "0", "", "1.5B"):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert format_size(16384) == "16KiB" and format_size(160) == "160B"
    assert parse_duration("500ms") == 0.5 and parse_duration("3us") == pytest.approx(3e-6)


def test_store_round_trip_and_no_overwrite(tmp_path):
    store = Store.create(tmp_path, {"suite": "test"}, run_id="r1")
    raw = np.arange(5, dtype=float)
    store.add_case({"case_id": "a", "method": "load", "status": "ok", "median_ns": 2.0}, raw, raw * 2)
    store.add_case({"case_id": "b", "method": "store", "status": "skipped", "reason": "why"})
    store.finish(ended="now")
    run = load("r1", tmp_path)
    assert run.meta["complete"] and run.meta["suite"] == "test" and run.meta["n_cases"] == 2
    assert list(run.cases["case_id"]) == ["a", "b"]
    assert run.cases.set_index("case_id").loc["b", "reason"] == "why"
    np.testing.assert_array_equal(run.samples_of("a"), raw * 2)
    assert list(run.samples["rep"]) == [0, 1, 2, 3, 4]
    assert not (tmp_path / "r1" / "partial").exists()
    assert list_runs(tmp_path) == [tmp_path / "r1"]
    with pytest.raises(UsageError, match="never overwritten"):
        Store.create(tmp_path, {}, run_id="r1")
    assert load(None, tmp_path).run_id == "r1"
    assert load(tmp_path / "r1").run_id == "r1"


def test_an_unfinished_run_keeps_its_cases_on_disk(tmp_path):
    store = Store.create(tmp_path, {}, run_id="r2")
    store.add_case({"case_id": "a", "status": "ok"}, np.ones(3), np.ones(3))
    assert len(list((tmp_path / "r2" / "partial").glob("*.json"))) == 1
    run = load("r2", tmp_path)  # a killed run reads back from partial/, marked incomplete
    assert not run.complete and "partial" in run.incomplete
    assert list(run.cases["case_id"]) == ["a"] and list(run.samples_of("a")) == [1.0, 1.0, 1.0]
    assert load(None, tmp_path).run_id == "r2"  # the latest, even killed
    with pytest.raises(UsageError, match=r"incomplete.*--allow-incomplete"):
        run.require_complete("a baseline")
    run.require_complete("a baseline", allow_incomplete=True)


def test_reading_a_run_imports_no_method_or_region_module_unless_a_row_lacks_a_fact(tmp_path):
    """A current run's rows carry every fact (pool_class, measures, effective_params): load()
    imports none of the registries' modules. A row stored before a fact existed gets it from
    the registry as it is now, which is loaded for that."""
    import subprocess
    import sys
    from pathlib import Path

    from nearlocal import plugins
    from tests.report_fixtures import make_run, row

    current = row("chase")
    current.update(pool_class="local", peer_pool_class="local", measures="operation",
                   effective_params='{"drain": "before"}', source_reaches_memory=True)
    old = row("chase")  # no pool_class, measures, effective_params: derived at load
    code = ("import sys\n"
            "from nearlocal.store import load\n"
            "run = load(sys.argv[1])\n"
            "print(','.join(run.cases['measures']), run.cases['pool_class'][0])\n"
            "print(' '.join(m for m in sys.modules if m.startswith('nearlocal.')))\n")
    modules = {m for group in plugins.GROUPS for m in plugins.own_modules(group)}
    root = Path(__file__).resolve().parent.parent
    for rows, loads in (([current], False), ([old], True)):
        path = make_run(tmp_path / str(loads), rows)
        done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=root, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        derived, imported = done.stdout.splitlines()
        assert derived == "operation local"
        assert bool(modules & set(imported.split())) is loads


def test_a_run_stored_with_the_old_family_column_reads_it_as_marker(tmp_path):
    """Issue 59: the method's pytest marker was stored as `family`; a run stored before (the
    fixture stores), or an old bench JSON's rows beside new ones, reads it as `marker`."""
    fixture = load(Path(__file__).parent / "fixtures" / "runs" / "vm-quick-copies")
    assert "family" not in fixture.cases and set(fixture.cases["marker"]) == {"cpu"}
    store = Store.create(tmp_path, {"suite": "test"}, run_id="old")
    store.add_case({"case_id": "a", "method": "load", "status": "ok", "family": "cpu"})
    store.add_case({"case_id": "b", "method": "load", "status": "ok", "marker": "dsa"})
    store.finish(ended="now")
    cases = load("old", tmp_path).cases
    assert "family" not in cases and list(cases["marker"]) == ["cpu", "dsa"]
