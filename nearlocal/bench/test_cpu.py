"""The chosen suite's CPU access methods (load, store, nt-store, clflush-load, ...) under pytest-benchmark."""

from nearlocal.bench.benchmarks import run_benchmark


def test_cpu(benchmark, nearlocal_case, nearlocal_host):
    run_benchmark(benchmark, nearlocal_case, nearlocal_host)
