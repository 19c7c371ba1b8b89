"""The chosen suite's GPU methods (cudaMemcpy variants, copy kernels, NVLink peers) under pytest-benchmark."""

from nearlocal.bench.benchmarks import run_benchmark


def test_gpu(benchmark, nearlocal_case, nearlocal_host):
    run_benchmark(benchmark, nearlocal_case, nearlocal_host)
