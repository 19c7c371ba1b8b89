"""The pytest front end's plugin, registered by the `pytest11` entry point: `pytest --pyargs
nearlocal.bench --benchmark-...` (or `pytest bench/` in a checkout) makes one pytest-benchmark
test per case of a nearlocal suite.

Tests are generated from the same registry and suites as `nearlocal run` (ids such as
`test_cpu[nt-store-dram-wb-16KiB]`), marked cpu / gpu / dsa / cxl / nvlink, and skipped with the
probe's reason when they cannot run here. Times are measured inside the compiled kernels
(nearlocal/bench/benchmarks.py).

Installed with the package, the plugin loads in every pytest session of the environment: it adds
its options and markers and does nothing else until a test asks for `nearlocal_case` (the
method registry, the suite check and `--nearlocal-baseline` load then, once). A bad option is
pytest's one `ERROR:` line and exit 4, raised after collection, before anything is measured.

Each case is measured in `--nearlocal-processes` worker processes (default 8), each drawing
`--nearlocal-placements` page placements of it (as `nearlocal run` draws them).
`--nearlocal-save` stores the session as a run of kind `bench`; `--nearlocal-baseline RUN` judges
it against a stored run with compare's own model and fails the session with pytest's summary
line and the list of slower cases, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nearlocal.bench import DEFAULT_PROCESSES, MARKERS
from nearlocal.core.sampling import DEFAULT_PLACEMENTS, PLACEMENTS_HELP
from nearlocal.errors import UsageError

if TYPE_CHECKING:
    from nearlocal.bench.benchmarks import BenchHost

_HOST = pytest.StashKey["BenchHost"]()
_BASE = pytest.StashKey["RunData"]()
_VERDICT = pytest.StashKey[tuple]()  # (comparison, stored run or None)
_ACTIVE = pytest.StashKey[str]()  # "" once a test asked for a case, else what was wrong


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nearlocal")
    group.addoption("--nearlocal-suite", default="quick",
                    help="the nearlocal suite whose cases become tests (default quick)")
    group.addoption("--nearlocal-ci", type=float, default=1.0,
                    help="stop a case when its median's 95%% CI half-width is within this %% "
                         "(default 1); --benchmark-max-time is the per-case budget")
    group.addoption("--nearlocal-processes", type=int, default=DEFAULT_PROCESSES,
                    help="worker processes each case is measured in, sharing its budget "
                         f"(default {DEFAULT_PROCESSES}; 1: in this process), each drawing "
                         "--nearlocal-placements page placements of it")
    group.addoption("--nearlocal-placements", type=int, default=DEFAULT_PLACEMENTS,
                    help=PLACEMENTS_HELP.replace("%", "%%"))
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
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def _activate(config: pytest.Config) -> str:
    """Once, when the first test asks for a case: load the registry and check the options; what
    was wrong ("" when nothing), raised by pytest_collection_modifyitems as pytest's own usage
    error (raised here, in parametrization, it would read as a collection error's traceback)."""
    if _ACTIVE not in config.stash:
        try:
            _check_options(config)
            config.stash[_ACTIVE] = ""
        except UsageError as exc:
            config.stash[_ACTIVE] = str(exc)
    return config.stash[_ACTIVE]


def _check_options(config: pytest.Config) -> None:
    from nearlocal.bench.benchmarks import check_suite
    from nearlocal.core.methods import load_methods

    load_methods()  # a plugin that does not load (NEARLOCAL_PLUGINS) says so, as itself
    try:
        check_suite(config.getoption("nearlocal_suite"))
    except UsageError as exc:
        raise UsageError(f"--nearlocal-suite: {exc}") from None
    from nearlocal.engine.plan import check_placements, check_processes

    check_processes(config.getoption("nearlocal_processes"), "--nearlocal-processes")
    check_placements(config.getoption("nearlocal_placements"), "--nearlocal-placements")
    ci = config.getoption("nearlocal_ci")
    if not 0 < ci < 100:
        raise UsageError(f"--nearlocal-ci: a percentage between 0 and 100, got {ci:g}")
    if config.getoption("nearlocal_baseline"):  # before anything is measured
        from nearlocal.gate.commands import parse_percent
        from nearlocal.store.reader import load

        try:
            config.stash[_BASE] = load(config.getoption("nearlocal_baseline"),
                                       Path(config.getoption("nearlocal_out")))
            threshold = parse_percent(config.getoption("nearlocal_threshold"))
            if not 0 < threshold < 10:
                raise UsageError(f"a positive percentage below 1000%, got {threshold:.1%}")
        except UsageError as exc:
            raise UsageError(f"--nearlocal-baseline: {exc}") from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(_ACTIVE, ""):
        raise pytest.UsageError(config.stash[_ACTIVE])
    ours = [item for item in items if "nearlocal_case" in getattr(item, "fixturenames", ())]
    if ours and config.pluginmanager.hasplugin("benchmark"):
        _time_with_the_kernels(config, ours)


def _time_with_the_kernels(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-benchmark's public API only: its `benchmark` marker names each generated test's
    timer, the kernel-fed clock (benchmarks.KERNEL_CLOCK), over what a marker already there
    says (pytest-benchmark reads the closest one alone, so its other settings are kept in
    ours); max_time and min_rounds, which set the case's stopping rule, are read as
    pytest-benchmark reads them (the marker's, else --benchmark-max-time / -min-rounds)."""
    from nearlocal.bench.benchmarks import KERNEL_CLOCK

    host = _host(config)
    for item in items:
        marker = item.get_closest_marker("benchmark")
        kwargs = {**(marker.kwargs if marker else {}), "timer": KERNEL_CLOCK}
        item.add_marker(pytest.mark.benchmark(**kwargs), append=False)
        host.limits[item.nodeid] = (
            float(kwargs.get("max_time", config.getoption("benchmark_max_time"))),
            int(kwargs.get("min_rounds", config.getoption("benchmark_min_rounds"))))


def _host(config: pytest.Config) -> BenchHost:
    if _HOST not in config.stash:
        from nearlocal.bench.benchmarks import BenchHost
        from nearlocal.engine.plan import settle_llc
        from nearlocal.probe import probe

        inventory = probe()
        if config.getoption("nearlocal_save") or config.getoption("nearlocal_baseline"):
            # a session stored or judged: cache classes held for this box, as `run` holds them
            inventory = settle_llc(inventory, Path(config.getoption("nearlocal_out")))
        config.stash[_HOST] = BenchHost(
            inventory, allow_write=config.getoption("nearlocal_allow_write"),
            target_rel_ci=config.getoption("nearlocal_ci") / 100,
            processes=config.getoption("nearlocal_processes"),
            placements=config.getoption("nearlocal_placements"))
    return config.stash[_HOST]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nearlocal_case" not in metafunc.fixturenames:
        return
    if _activate(metafunc.config):  # raised after collection; no case is generated
        metafunc.parametrize("nearlocal_case", [])
        return
    from nearlocal.bench.benchmarks import suite_params

    marker = metafunc.function.__name__.removeprefix("test_")
    metafunc.parametrize("nearlocal_case", suite_params(
        metafunc.config.getoption("nearlocal_suite"), marker, _host(metafunc.config)))


@pytest.fixture(scope="session")
def nearlocal_host(request: pytest.FixtureRequest) -> BenchHost:
    return _host(request.config)


@pytest.hookimpl(optionalhook=True)  # pytest-benchmark's hook: absent under -p no:benchmark
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    if config.stash.get(_ACTIVE, None) != "":  # a session with no nearlocal test: not ours
        return
    from nearlocal.bench.benchmarks import machine_info as nearlocal_info

    machine_info["nearlocal"] = nearlocal_info(_host(config))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """--nearlocal-save stores the session; --nearlocal-baseline judges it (a slower case makes
    the exit status 1, and the terminal summary lists the slower cases: no traceback)."""
    config = session.config
    save, base = config.getoption("nearlocal_save"), config.stash.get(_BASE, None)
    host = config.stash.get(_HOST, None)
    if host is None or not host.measured or not (save or base is not None):
        return
    from nearlocal.bench.benchmarks import judge_session, store_session
    from nearlocal.gate.commands import parse_percent

    root, suite = Path(config.getoption("nearlocal_out")), config.getoption("nearlocal_suite")
    try:
        if base is None:
            config.stash[_VERDICT] = (None, store_session(host, root, suite))
            return
        config.stash[_VERDICT] = judge_session(
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
