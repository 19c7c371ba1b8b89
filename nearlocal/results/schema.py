"""The column contract between the runner, the store and every report (schema version 2).

Version 2 added `processes` to cases (how many worker processes a row's samples come from) and
`process` to samples (which of them took each sample); version-1 runs load with process 0."""

SCHEMA_VERSION = 2

# Columns every row of cases.parquet has; statistics are NaN for skipped / failed rows.
CASE_COLUMNS = [
    "case_id", "suite", "method", "family", "region", "region_kind", "attr", "pattern", "peer",
    "access", "params", "state", "status", "reason", "size_bytes", "fragment_count",
    "fragment_bytes", "bytes_moved", "n_samples", "converged", "min_ns", "median_ns", "mean_ns",
    "p10_ns", "p90_ns", "p99_ns", "max_ns", "stddev_ns", "mad_ns", "ci_low_ns", "ci_high_ns",
    "gbps", "clock", "timer_overhead_ns", "clock_resolution_ns", "elapsed_s", "info", "processes",
]
SAMPLE_COLUMNS = ["case_id", "rep", "raw", "ns", "process"]

# The subset `nearlocal run --json PATH` writes.
JSON_COLUMNS = [
    "case_id", "method", "access", "region", "attr", "pattern", "peer", "params", "size_bytes",
    "fragment_count", "status", "reason", "median_ns", "p99_ns", "gbps", "n_samples", "converged",
]
