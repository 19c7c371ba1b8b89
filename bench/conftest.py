"""`pytest bench/ --benchmark-...`: one pytest-benchmark test per case of a nearlocal suite.

Tests are generated from the same registry and suites as `nearlocal run` (ids such as
`test_cpu[nt-store-dram-wb-16KiB]`), marked cpu / gpu / dsa / cxl / nvlink, and skipped with the
probe's reason when they cannot run here. Times are measured inside the compiled kernels
(see nearlocal/frontends/bench.py).

A session measures every case in this one process, so `--benchmark-compare-fail` sees one draw
of page placement and co-tenants per session: on a busy 2-vCPU VM medians of unchanged code moved
by up to 3x between sessions, and no percentage that still catches a 1.3x slowdown held there
(README, "CI and acceptance"). More rounds do not narrow a spread that lies between processes;
`nearlocal compare` on runs with several worker processes per case is the gate for such a box.

`--nearlocal-save` stores the session as a run of kind `bench`; `--nearlocal-baseline RUN` judges
it against a stored run with compare's own model (one process per case: the whole-run model,
whose run-to-run noise is estimated across the cases) and fails the session with pytest's summary
line and the list of slower cases, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nearlocal.core.methods import load_methods
from nearlocal.errors import UsageError
from nearlocal.frontends import bench

if TYPE_CHECKING:
    pass

_HOST = pytest.StashKey[bench.BenchHost]()
_BASE = pytest.StashKey["RunData"]()
_VERDICT = pytest.StashKey[tuple]()  # (comparison, stored run or None)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nearlocal")
    group.addoption("--nearlocal-suite", default="quick",
                    help="the nearlocal suite whose cases become tests (default quick)")
    group.addoption("--nearlocal-ci", type=float, default=1.0,
                    help="stop a case when its median's 95%% CI half-width is within this %% "
                         "(default 1); --benchmark-max-time is the per-case budget")
    group.addoption("--nearlocal-processes", type=int, default=bench.DEFAULT_PROCESSES,
                    help="worker processes each case is measured in, sharing its budget "
                         f"(default {bench.DEFAULT_PROCESSES}; 1: in this process): a process "
                         "draws page placement once, so one process is one draw of it")
    group.addoption("--nearlocal-allow-write", action="store_true",
                    help="allow writing to devdax: regions and existing files")
    group.addoption("--nearlocal-out", default="results",
                    help="the nearlocal store --nearlocal-save writes to and --nearlocal-baseline "
                         "reads (default ./results)")
    group.addoption("--nearlocal-save", action="store_true",
                    help="store the session as a run of kind `bench` (nearlocal runs / show / "
                         "compare read it; `latest:bench` is the latest such)")
    group.addoption("--nearlocal-baseline", metavar="RUN",
                    help="judge the session against this stored run (e.g. latest:bench, a run id) "
                         "with nearlocal compare's model; a slower case fails the session")
    from nearlocal.gate.modes import DEFAULT_MODE, MODES, modes_help

    group.addoption("--nearlocal-mode", choices=tuple(MODES), default=DEFAULT_MODE,
                    help="with --nearlocal-baseline: the gate's question: "
                         + modes_help().replace("%", "%%"))
    group.addoption("--nearlocal-threshold", default="5%",
                    help="with --nearlocal-baseline: smallest change that counts (default 5%%)")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in bench.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        load_methods()  # a plugin that does not load (NEARLOCAL_PLUGINS) says so, as itself
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        bench.check_suite(config.getoption("nearlocal_suite"))
    except UsageError as exc:
        raise pytest.UsageError(f"--nearlocal-suite: {exc}") from None
    ci = config.getoption("nearlocal_ci")
    if not 0 < ci < 100:
        raise pytest.UsageError(f"--nearlocal-ci: a percentage between 0 and 100, got {ci:g}")
    if config.getoption("nearlocal_baseline"):  # before anything is measured
        from nearlocal.gate.commands import parse_percent
        from nearlocal.store.runs import load

        try:
            config.stash[_BASE] = load(config.getoption("nearlocal_baseline"),
                                       Path(config.getoption("nearlocal_out")))
            threshold = parse_percent(config.getoption("nearlocal_threshold"))
            if not 0 < threshold < 10:
                raise UsageError(f"a positive percentage below 1000%, got {threshold:.1%}")
        except UsageError as exc:
            raise pytest.UsageError(f"--nearlocal-baseline: {exc}") from None


def _host(config: pytest.Config) -> bench.BenchHost:
    if _HOST not in config.stash:
        from nearlocal.probe import probe

        config.stash[_HOST] = bench.BenchHost(
            probe(), allow_write=config.getoption("nearlocal_allow_write"),
            target_rel_ci=config.getoption("nearlocal_ci") / 100,
            processes=config.getoption("nearlocal_processes"))
    return config.stash[_HOST]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nearlocal_case" in metafunc.fixturenames:
        family = metafunc.function.__name__.removeprefix("test_")
        metafunc.parametrize("nearlocal_case", bench.suite_params(
            metafunc.config.getoption("nearlocal_suite"), family, _host(metafunc.config)))


@pytest.fixture(scope="session")
def nearlocal_host(request: pytest.FixtureRequest) -> bench.BenchHost:
    return _host(request.config)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["nearlocal"] = bench.machine_info(_host(config))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """--nearlocal-save stores the session; --nearlocal-baseline judges it (a slower case makes
    the exit status 1, and the terminal summary lists the slower cases: no traceback)."""
    config = session.config
    save, base = config.getoption("nearlocal_save"), config.stash.get(_BASE, None)
    host = config.stash.get(_HOST, None)
    if host is None or not host.measured or not (save or base is not None):
        return
    from nearlocal.gate.commands import parse_percent

    root, suite = Path(config.getoption("nearlocal_out")), config.getoption("nearlocal_suite")
    try:
        if base is None:
            config.stash[_VERDICT] = (None, bench.store_session(host, root, suite))
            return
        config.stash[_VERDICT] = bench.judge_session(
            host, base, root, suite, save, parse_percent(config.getoption("nearlocal_threshold")),
            0.01, config.getoption("nearlocal_mode"))
    except UsageError as exc:
        config.stash[_VERDICT] = (str(exc), None)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    comparison = config.stash[_VERDICT][0]
    if comparison.regressions and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _VERDICT not in config.stash:
        return
    comparison, stored = config.stash[_VERDICT]
    write = terminalreporter.write_line
    if isinstance(comparison, str):
        terminalreporter.section("nearlocal", sep="=", red=True)
        write(f"nearlocal: error: {comparison}")
        return
    if comparison is not None:
        slower = comparison.regressions
        terminalreporter.section(f"nearlocal gate: {comparison.candidate} against "
                                 f"{comparison.base}", sep="=", red=bool(slower), green=not slower)
        write(comparison.head_line())
        for case in slower:
            write(f"SLOWER {case.case_id}: {case.ratio:.3f}x [{case.ci_low:.3f}, "
                  f"{case.ci_high:.3f}] ({case.base_median_ns:.1f} -> {case.cand_median_ns:.1f} ns)")
        write(comparison.summary())
        if slower:  # pytest's summary line counts them
            terminalreporter.stats.setdefault("slower (nearlocal gate)", []).extend(slower)
    if stored is not None:
        write(f"nearlocal: stored {stored} (kind bench)")
