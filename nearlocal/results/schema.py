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
    "ops_per_sample",
]
SAMPLE_COLUMNS = ["case_id", "rep", "raw", "ns", "process"]

# Info keys by which rows stored before `ops_per_sample` was a column said how many operations
# one sample's ns is divided by (chase hops, RPC requests per throughput batch).
_OPS_INFO_KEYS = ("hops_per_sample", "requests_per_sample")


def ops_per_sample(stored: object, info: dict) -> int:
    """A row's operations per sample: the stored column, else what an older row's info says
    (see _OPS_INFO_KEYS), else 1 (one timed interval is one operation)."""
    try:
        if stored is not None and stored == stored:  # not None, not NaN
            return max(1, int(stored))
    except (TypeError, ValueError):
        pass
    for key in _OPS_INFO_KEYS:
        value = info.get(key)
        if isinstance(value, int | float) and value >= 1:
            return int(value)
    return 1


# What made a run (run.json's `kind`): `latest` is the latest `run`; `latest:KIND` picks another.
RUN_KINDS = ("run", "accept", "import", "bench")


def run_kind(meta: dict) -> str:
    """A run's kind; runs stored before `kind` was recorded: from their suite and source."""
    kind = meta.get("kind")
    if kind in RUN_KINDS:
        return str(kind)
    if str(meta.get("suite", "")).startswith("accept:"):
        return "accept"
    return "import" if meta.get("source") == "pytest-benchmark" else "run"


# The subset `nearlocal run --json PATH` writes.
JSON_COLUMNS = [
    "case_id", "method", "access", "region", "attr", "pattern", "peer", "params", "size_bytes",
    "fragment_count", "status", "reason", "median_ns", "p99_ns", "gbps", "n_samples", "converged",
]
