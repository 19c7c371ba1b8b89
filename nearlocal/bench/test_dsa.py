"""The chosen suite's Intel DSA methods (dsa-memmove, dsa-batch) under pytest-benchmark."""

from nearlocal.bench.benchmarks import run_benchmark


def test_dsa(benchmark, nearlocal_case, nearlocal_host):
    run_benchmark(benchmark, nearlocal_case, nearlocal_host)
