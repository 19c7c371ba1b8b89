"""`pytest bench/ --benchmark-...`: one pytest-benchmark test per case of a nearlocal suite.

Tests are generated from the same registry and suites as `nearlocal run` (ids such as
`test_cpu[nt-store-dram-wb-16KiB]`), marked cpu / gpu / dsa / cxl / nvlink, and skipped with the
probe's reason when they cannot run here. Times are measured inside the compiled kernels
(see nearlocal/bench.py).

A session measures every case in this one process, so `--benchmark-compare-fail` sees one draw
of page placement and co-tenants per session: on a busy 2-vCPU VM medians of unchanged code moved
by up to 3x between sessions, and no percentage that still catches a 1.3x slowdown held there
(README, "CI and acceptance"). More rounds do not narrow a spread that lies between processes;
`nearlocal compare` on runs with several worker processes per case is the gate for such a box.
"""

from __future__ import annotations

import pytest

from nearlocal import bench
from nearlocal.errors import UsageError

_HOST = pytest.StashKey[bench.BenchHost]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nearlocal")
    group.addoption("--nearlocal-suite", default="quick",
                    help="the nearlocal suite whose cases become tests (default quick)")
    group.addoption("--nearlocal-ci", type=float, default=1.0,
                    help="stop a case when its median's 95%% CI half-width is within this %% "
                         "(default 1); --benchmark-max-time is the per-case budget")
    group.addoption("--nearlocal-allow-write", action="store_true",
                    help="allow writing to devdax: regions and existing files")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in bench.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        bench.check_suite(config.getoption("nearlocal_suite"))
    except UsageError as exc:
        raise pytest.UsageError(f"--nearlocal-suite: {exc}") from None
    ci = config.getoption("nearlocal_ci")
    if not 0 < ci < 100:
        raise pytest.UsageError(f"--nearlocal-ci: a percentage between 0 and 100, got {ci:g}")


def _host(config: pytest.Config) -> bench.BenchHost:
    if _HOST not in config.stash:
        from nearlocal.hwprobe import probe

        config.stash[_HOST] = bench.BenchHost(
            probe(), allow_write=config.getoption("nearlocal_allow_write"),
            target_rel_ci=config.getoption("nearlocal_ci") / 100)
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
