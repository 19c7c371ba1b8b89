"""The column contract between the runner, the store and every report.

`SCHEMA_VERSION` is the stamp a run's run.json carries (`schema_version`). It was last raised to 3;
the columns added since did not raise it, and loading never looks at it: `load()` goes by the
columns a run has, filling or deriving those it lacks, so a run stored by any earlier version
still loads.

Version 2 added `processes` to cases (how many worker processes a row's samples come from) and
`process` to samples (which of them took each sample); version-1 runs load with process 0.
Version 3 added `pool_class` (the region's POOL_CLASSES key, declared by its region kind) and
`effective_params` (JSON: the method's defaults with the case's params over them); older runs
derive both at load (core/rows.py: `pool_class_column`, `effective_params_text`).

Added since, still stamped 3 (each absent from older rows): `peer_pool_class` (the peer's
POOL_CLASSES key) and `measures` (Method.measures: "transfer" or "operation"), derived at load
(`pool_class_column`, `measures_column`); `reaches_memory` (the case's accesses reach memory: the
method is not cacheable, the region is not write-back, or its span fills the LLC or exceeds it),
which compare takes as reaching memory where it is absent; `llc_resident` (cacheable and
write-back, its span over the core's L2 and below the LLC's size: the host's LLC state moves it),
taken as not where absent; `sample_steps` (how many steps of the run's clock one sample spans: its
median less the timer overhead, over the step; NaN for other clocks and older rows); `wall_s`
(what measuring the case cost the tool, its processes' wall time from request to reply: mapping
regions, laying rings, warm-up and trials; NaN in older rows); `placements` (the page placements
a row's samples were taken on, over all its processes: engine/worker.py) and `placement_spread`
(the robust SD of their log medians), with `placement` in samples (which placement took each
sample, numbered across the case's processes): older runs load with one placement a process
(placement = process) and NaN spread; `source_reaches_memory` (what the case reads came from
memory: the method's loads are not cacheable, a read's region is not write-back, or the span fills
the LLC; nt-copy's small rows reach memory by their stores, not by their loads), derived at load
(`source_reaches_memory_column`: reaches_memory where the method's loads are as cacheable as its
stores, else taken as not)."""


SCHEMA_VERSION = 3

# Columns every row of cases.parquet has; statistics are NaN for skipped / failed rows.
CASE_COLUMNS = [
    "case_id", "suite", "method", "marker", "region", "region_kind", "attr", "pattern", "peer",
    "access", "params", "state", "status", "reason", "size_bytes", "fragment_count",
    "fragment_bytes", "bytes_moved", "n_samples", "converged", "min_ns", "median_ns", "mean_ns",
    "p10_ns", "p90_ns", "p99_ns", "max_ns", "stddev_ns", "mad_ns", "ci_low_ns", "ci_high_ns",
    "gbps", "clock", "timer_overhead_ns", "clock_resolution_ns", "elapsed_s", "info", "processes",
    "ops_per_sample", "pool_class", "effective_params", "peer_pool_class", "measures",
    "reaches_memory", "llc_resident", "sample_steps", "wall_s", "placements", "placement_spread",
    "source_reaches_memory",
]
SAMPLE_COLUMNS = ["case_id", "rep", "raw", "ns", "process", "placement"]

# Case columns once stored under another name: old -> now (issue 59: `family` held the method's
# pytest marker, Method.marker). load() reads a run stored before, or rows imported from an old
# bench JSON, as if written now.
RENAMED_CASE_COLUMNS = {"family": "marker"}


def with_current_names(cases):
    """`cases` (a DataFrame) with each old column under its name now; where both are there (an
    import's rows) the old one fills the new one's gaps."""
    for old, new in RENAMED_CASE_COLUMNS.items():
        if old in cases:
            values = cases.pop(old)
            cases[new] = values if new not in cases else cases[new].where(cases[new].notna(), values)
    return cases

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


# ---------------------------------------------------------------- what is read back from disk
# run.json, a case row, a baseline record: checked once, where they are loaded, so that a damaged
# file is one line ("field inventory.numa[0].cpus is a str, expected a list") and never a
# TypeError in a report. Scalars may be null (a field not known); objects and lists may not.


class Kind:
    """A scalar field: what it must be (`expected`, said in the message) and the test."""

    def __init__(self, expected: str, test, plural: str):
        self.expected, self.test, self.plural = expected, test, plural


class Map:
    """An object whose keys are names (any) and whose values all have one shape."""

    def __init__(self, value: object):
        self.value = value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


TEXT = Kind("a string", lambda v: isinstance(v, str), "strings")
INTEGER = Kind("an integer (64-bit)", _is_int, "integers")
NUMBER = Kind("a number", lambda v: _is_int(v) or isinstance(v, float), "numbers")
BOOL = Kind("true or false", lambda v: isinstance(v, bool), "booleans")
ANY = Kind("anything", lambda v: True, "values")

INVENTORY_FIELDS = {
    "hostname": TEXT, "kernel": TEXT, "host_id": TEXT, "tsc_hz": NUMBER, "tsc_source": TEXT,
    "cpu": {"model": TEXT, "vendor": TEXT, "logical_cpus": INTEGER, "flags": Map(BOOL),
            "caches": [{"level": INTEGER, "kind": TEXT, "size_bytes": INTEGER}],
            "online_cpus": [INTEGER]},
    "numa": [{"node": INTEGER, "cpus": [INTEGER], "mem_total_bytes": NUMBER,
              "distances": [INTEGER]}],
    "cxl": {"present": BOOL, "memdevs": [ANY], "decoders": [ANY], "regions": [ANY]},
    "dax": [{"name": TEXT, "size": INTEGER, "mode": TEXT}],
    "dsa": {"module_loaded": BOOL, "devices": [{"name": TEXT}]},
    "hugepages": {"pools": [{"page_bytes": INTEGER, "total": INTEGER, "free": INTEGER}],
                  "thp_mode": TEXT},
    "gpu": {"devices": [{"index": INTEGER, "name": TEXT}], "reason": TEXT},
}
RUN_META_FIELDS = {
    "run_id": TEXT, "suite": TEXT, "started": TEXT, "ended": TEXT, "host_id": TEXT,
    "complete": BOOL, "interrupted": BOOL, "n_cases": INTEGER, "schema_version": INTEGER,
    "processes": INTEGER, "pool": TEXT, "command": [TEXT], "source": TEXT,
    **dict.fromkeys(("nearlocal_version", "numba_version", "llvmlite_version", "numpy_version",
                     "python_version", "pytest_benchmark_version", "imported_from", "samples"),
                    TEXT),
    "settings": {"budget_s": NUMBER, "target_rel_ci": NUMBER, "min_samples": INTEGER,
                 "max_samples": INTEGER, "allow_write": BOOL},
    "machine_info": Map(ANY), "commit_info": Map(ANY),
    "inventory": INVENTORY_FIELDS,
    # `nearlocal accept`'s verdicts on the run, one entry per spec and pool (acceptance/verdicts.py)
    "acceptance": [{"spec": TEXT, "spec_sha256": TEXT, "title": TEXT, "pool": TEXT, "peer": TEXT,
                    "judged": TEXT, "verdicts": [{
                        "requirement": TEXT, "case": TEXT, "metric": TEXT, "kind": TEXT,
                        "bound": NUMBER, "reference": TEXT, "derived": BOOL, "measured": NUMBER,
                        "margin": NUMBER, "passed": BOOL, "reason": TEXT, "seconds": NUMBER,
                        "derived_from": [TEXT]}]}],
}
TEXT_COLUMNS = ("case_id", "suite", "method", "marker", "region", "region_kind", "attr", "pattern",
                "peer", "access", "params", "state", "status", "reason", "clock")
COUNT_COLUMNS = ("size_bytes", "fragment_count", "fragment_bytes", "bytes_moved", "n_samples",
                 "processes", "placements")
NUMBER_COLUMNS = tuple(c for c in CASE_COLUMNS
                       if c.endswith("_ns") or c in ("gbps", "elapsed_s", "wall_s", "placement_spread"))
CASE_ROW_FIELDS = {**dict.fromkeys(TEXT_COLUMNS, TEXT), **dict.fromkeys(COUNT_COLUMNS, INTEGER),
                   **dict.fromkeys(NUMBER_COLUMNS, NUMBER), "converged": BOOL, "info": ANY}
BASELINE_FIELDS = {"run": TEXT, "host_id": TEXT, "hostname": TEXT, "set": TEXT,
                   "history": [TEXT], "meta": {"inventory": INVENTORY_FIELDS}}


def _kind_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value),
                                                                          type(value).__name__)


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, dict | list) else ""
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{_kind_name(value)}{f' {text}' if text else ''}"


def _expected(shape: object) -> str:
    if isinstance(shape, Kind):
        return shape.expected
    if isinstance(shape, list):
        return f"a list of {shape[0].plural}" if isinstance(shape[0], Kind) else \
            "a list of objects"
    return "an object"


def shape_problem(value: object, shape: object, where: str = "") -> str | None:
    """The first place where `value` does not have `shape`, as "field X is Y, expected Z", or
    None. Iterative (a damaged file may nest deep); unknown keys are allowed (newer versions)."""
    stack = [(value, shape, where)]
    while stack:
        item, want, path = stack.pop()
        name = f"field {path} is" if path else "the file holds"
        if isinstance(want, Kind):
            if item is not None and not want.test(item):
                return f"{name} {_shown(item)}, expected {want.expected}"
        elif isinstance(want, list):
            if not isinstance(item, list):
                return f"{name} {_shown(item)}, expected {_expected(want)}"
            stack.extend((child, want[0], f"{path}[{i}]") for i, child in
                         reversed(list(enumerate(item))))
        elif isinstance(want, Map):
            if not isinstance(item, dict):
                return f"{name} {_shown(item)}, expected an object"
            stack.extend((child, want.value, f"{path}.{key}" if path else str(key))
                         for key, child in item.items())
        else:  # dict: an object with known fields
            if not isinstance(item, dict):
                return f"{name} {_shown(item)}, expected an object"
            stack.extend((item[key], sub, f"{path}.{key}" if path else key)
                         for key, sub in reversed(list(want.items())) if key in item)
    return None


def frame_problem(frame, file: str) -> str | None:
    """A cases.parquet / samples.parquet column whose values are not what the reports read: text
    columns text, counts and statistics numbers (a column of nulls is fine)."""
    import pandas as pd

    wanted = {**dict.fromkeys((*TEXT_COLUMNS, *RENAMED_CASE_COLUMNS), "text"),
              **dict.fromkeys(COUNT_COLUMNS, "numbers"),
              **dict.fromkeys(NUMBER_COLUMNS, "numbers"), "rep": "numbers", "raw": "numbers",
              "ns": "numbers", "process": "numbers"}
    for column, kind in wanted.items():
        if column not in frame:
            continue
        values = frame[column]
        if kind == "numbers":
            if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
                continue
            bad = next((v for v in values if v is not None and not (
                isinstance(v, int | float) and not isinstance(v, bool))), None)
        else:
            bad = next((v for v in values if v is not None and not isinstance(v, str)
                        and not (isinstance(v, float) and v != v)), None)
        if bad is not None:
            return f"{file} column {column} holds {_shown(bad)}, expected {kind}"
    return None
