"""`pytest bench/` under pytest-benchmark (run with pytester in a subprocess), and `nearlocal import`
of the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.fft
import pandas.core.arrays.arrow.extension_types  # noqa: F401
import pytest
import scipy.stats  # noqa: F401

from nearlocal.core.methods import load_methods
from nearlocal.frontends.cli import main
from nearlocal.frontends.importer import import_benchmarks
from nearlocal.store import load

pytest_plugins = ["pytester"]
# The method registry is loaded here, before pytester snapshots sys.modules (what a test imports
# is dropped after it: numpy's extensions, scipy.stats' through compare, cannot load twice, and
# the registry would keep methods of modules gone), and before a test names a plugin that only its
# pytester subprocess can import (NEARLOCAL_PLUGINS): load() in this process must not import it.
load_methods()
# pandas' pyarrow extension types are imported above, before pytester snapshots sys.modules: a
# re-import after the snapshot is restored would register them twice and fail.

BENCH = Path(__file__).resolve().parent.parent / "bench"

# A test double registered only inside the pytester subprocess: its session "measures" 1, 2 and
# 4 us in turn whatever the wall clock says, so the recorded rounds show whose clock was used.
FAKE_METHOD = '''
import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import Method, register_method
from nearlocal.core.suites import Suite, register_suite

CYCLE = np.array([1000.0, 2000.0, 4000.0])


class CycleSession:
    clock = "fake"

    def __init__(self, ctx):
        self.info = {"double": True}
        self.done = 0

    def sample(self, n):
        ns = CYCLE[(self.done + np.arange(n)) % 3]
        self.done += n
        return ns.copy(), ns

    def close(self):
        pass


register_method(Method(name="fake-cycle", marker="cpu", summary="test double", accesses=("read",),
                       state="-", cacheable=False, open_session=CycleSession))
register_suite(Suite("fake", "one test-double case",
                     [lambda: [Case("fake-cycle", "dram", "wb", "4KiB")]]))
'''


@pytest.fixture
def bench_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_cpu=(BENCH / "test_cpu.py").read_text())
    return pytester


def test_rounds_are_the_times_the_kernel_measured(bench_dir, monkeypatch, tmp_path):
    bench_dir.makepyfile(fake_nearlocal_method=FAKE_METHOD)
    monkeypatch.setenv("NEARLOCAL_PLUGINS", "fake_nearlocal_method")
    result = bench_dir.runpytest_subprocess(
        "--nearlocal-suite", "fake", "--benchmark-json", "out.json", "--benchmark-save-data",
        "--benchmark-max-time", "0.05", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    data = json.loads((bench_dir.path / "out.json").read_text())
    bench = data["benchmarks"][0]
    assert bench["name"] == "test_cpu[fake-cycle-dram-wb-4KiB]"
    assert bench["options"]["timer"] == "nearlocal.bench.benchmarks.KernelClock"
    rounds = np.asarray(bench["stats"]["data"]) * 1e9
    assert set(np.round(rounds)) == {1000.0, 2000.0, 4000.0}
    assert bench["stats"]["median"] == pytest.approx(2e-6, rel=1e-9)
    assert bench["stats"]["min"] == pytest.approx(1e-6, rel=1e-9)
    extra = bench["extra_info"]
    assert extra["n_samples"] == bench["stats"]["rounds"] == rounds.size
    assert extra["method"] == "fake-cycle" and extra["bytes_moved"] == 4096
    assert extra["gbps"] == pytest.approx(4096 / 2000)
    assert extra["converged"] is True and extra["clock"] == "fake"
    assert extra["host_id"] == data["machine_info"]["nearlocal"]["host_id"]

    # the JSON becomes a run in the store, samples and all
    run_path, count, foreign = import_benchmarks(bench_dir.path / "out.json", tmp_path)
    assert (count, foreign) == (1, [])
    run = load(run_path)
    row = run.cases.iloc[0]
    assert row["case_id"] == "fake-cycle/dram/wb/4KiB" and row["status"] == "ok"
    assert row["median_ns"] == pytest.approx(2000.0)
    assert len(run.samples_of("fake-cycle/dram/wb/4KiB")) == rounds.size
    assert run.meta["host_id"] == extra["host_id"] and run.meta["source"] == "pytest-benchmark"
    assert main(["compare", str(run_path), str(run_path), "--out", str(tmp_path)]) == 0


def test_a_benchmark_marker_keeps_its_settings_and_the_kernels_clock(bench_dir, monkeypatch):
    """The kernel clock is each test's timer through pytest-benchmark's public `benchmark`
    marker: a marker already there (a module's pytestmark) keeps its other settings, and its
    max_time is the case's budget, as pytest-benchmark reads it."""
    bench_dir.makepyfile(fake_nearlocal_method=FAKE_METHOD)
    bench_dir.makepyfile(test_cpu="import pytest\n"
                         "pytestmark = pytest.mark.benchmark(max_time=0.03, group='mine')\n"
                         + (BENCH / "test_cpu.py").read_text())
    monkeypatch.setenv("NEARLOCAL_PLUGINS", "fake_nearlocal_method")
    result = bench_dir.runpytest_subprocess(
        "--nearlocal-suite", "fake", "--benchmark-json", "out.json", "--benchmark-max-time", "5",
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    bench = json.loads((bench_dir.path / "out.json").read_text())["benchmarks"][0]
    assert bench["options"]["timer"] == "nearlocal.bench.benchmarks.KernelClock"
    assert bench["options"]["max_time"] == pytest.approx(0.03) and bench["group"] == "mine"
    assert bench["stats"]["median"] == pytest.approx(2e-6, rel=1e-9)


def test_the_stopping_rule_is_pytest_benchmarks_limits_for_the_test():
    from types import SimpleNamespace

    from nearlocal.bench.benchmarks import BenchHost, stopping_rule
    from nearlocal.core.sampling import StoppingRule

    host = BenchHost(None, target_rel_ci=0.02, limits={"t.py::test_cpu[x]": (0.03, 5000)})
    rule = stopping_rule(SimpleNamespace(fullname="t.py::test_cpu[x]"), host)
    assert (rule.budget_s, rule.min_samples, rule.target_rel_ci) == (0.03, 5000, 0.02)
    other = stopping_rule(SimpleNamespace(fullname="elsewhere"), host)
    assert (other.budget_s, other.min_samples) == (StoppingRule().budget_s,
                                                   StoppingRule().min_samples)


def test_real_kernel_case_and_a_skipped_case(bench_dir, tmp_path, capsys):
    result = bench_dir.runpytest_subprocess(
        "test_cpu.py::test_cpu[load-dram-wb-4KiB]", "test_cpu.py::test_cpu[load-dram-uc-4KiB]",
        "-m", "cpu", "--benchmark-json", "out.json", "--benchmark-max-time", "0.02", "-rs",
        "--benchmark-autosave", "--benchmark-storage", "saved", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*uncacheable*"])
    bench = json.loads((bench_dir.path / "out.json").read_text())["benchmarks"][0]
    extra = bench["extra_info"]
    assert bench["stats"]["median"] * 1e9 == pytest.approx(extra["median_ns"], rel=1e-9)
    assert extra["bytes_moved"] == 4096 and extra["clock"] == "tsc"
    assert extra["region"] == "dram" and extra["attr"] == "wb"
    assert len(bench["stats"]["data"]) == bench["stats"]["rounds"]

    # autosaved without --benchmark-save-data: statistics only; compare says it has no samples
    (saved,) = (bench_dir.path / "saved").glob("*/0001_*.json")
    assert "data" not in json.loads(saved.read_text())["benchmarks"][0]["stats"]
    run_path, _, _ = import_benchmarks(saved, tmp_path)
    run = load(run_path)
    assert run.samples.empty and run.cases.iloc[0]["n_samples"] == bench["stats"]["rounds"]
    assert run.cases.iloc[0]["p90_ns"] == pytest.approx(extra["p90_ns"])  # kept from extra_info
    capsys.readouterr()  # drop pytester's own output
    assert main(["compare", str(run_path), str(run_path), "--out", str(tmp_path),
                 "--format", "json"]) == 0
    case = json.loads(capsys.readouterr().out)["cases"][0]
    assert case["verdict"] == "ambiguous" and "no raw samples" in case["note"]


def test_unknown_suite_is_a_usage_error(bench_dir):
    result = bench_dir.runpytest_subprocess("--nearlocal-suite", "nope", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nearlocal-suite: unknown suite 'nope'*"])
    result = bench_dir.runpytest_subprocess("--nearlocal-ci", "0", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nearlocal-ci: a percentage between 0 and 100*"])


def test_plugin_is_inert_in_a_session_with_no_nearlocal_test(pytester, monkeypatch):
    """Installed by the pytest11 entry point, the plugin loads in every session of the venv: one
    with no nearlocal test loads no registry and judges no option (a plugin that cannot load,
    a suite that does not exist), and its markers are there."""
    pytester.makepyfile(test_other="import pytest\n\n@pytest.mark.cpu\ndef test_x():\n    pass\n")
    monkeypatch.setenv("NEARLOCAL_PLUGINS", "no_such_module_anywhere")
    result = pytester.runpytest_subprocess("--nearlocal-suite", "nope", "--strict-markers",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "unknown suite" not in output and "no_such_module" not in output and "Warning" not in output


def test_installed_tests_collect_by_package_name(pytester):
    """`pytest --pyargs nearlocal.bench` collects the installed tests from any directory."""
    result = pytester.runpytest_subprocess("--pyargs", "nearlocal.bench", "--collect-only", "-q",
                                           "-m", "cpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert "test_cpu.py::test_cpu[load-dram-wb-4KiB]" in result.stdout.lines


def test_import_refuses_files_that_are_not_from_bench(tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"benchmarks": [{"name": "test_x",
                                                                     "stats": {}}]}))
    assert main(["import", str(tmp_path / "other.json"), "--out", str(tmp_path)]) == 2
    assert "no nearlocal benchmarks" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert main(["import", str(tmp_path / "bad.json"), "--out", str(tmp_path)]) == 2
    assert "is not a JSON file" in capsys.readouterr().err


def test_import_of_malformed_entries_is_a_usage_error_and_stores_nothing(tmp_path, capsys):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"benchmarks": [1, {"name": "test_cpu[x]", "stats": {"median": None},
                                                   "extra_info": {"case_id": "x"}}]}))
    out = tmp_path / "store"
    assert main(["import", str(path), "--out", str(out)]) == 2
    assert "test_cpu[x] has malformed stats" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
