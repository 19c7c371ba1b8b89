"""`nearlocal import FILE.json`: a pytest-benchmark JSON file (from `pytest bench/`) becomes a run
in the store, so compare, accept and the reports work whichever front end produced the data.

Each benchmark's extra_info carries the case row written by nearlocal/frontends/bench.py. Raw samples are
the file's round times (--benchmark-json always writes them; --benchmark-save / --benchmark-autosave
only with --benchmark-save-data); otherwise only the summary statistics pytest-benchmark keeps
(min, median, mean, max, stddev) are imported.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from nearlocal import safeio
from nearlocal.core.sampling import summarize
from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.reporters import add_json_option, command_formats, emit
from nearlocal.store.reader import cases_frame
from nearlocal.store.schema import CASE_COLUMNS, CASE_ROW_FIELDS, RUN_META_FIELDS, shape_problem
from nearlocal.store.writer import Store
from nearlocal.subcommands import register_command

np = lazy_import("numpy")
pa = lazy_import("pyarrow")

# Row fields the bench plugin adds to extra_info that are not columns of cases.parquet.
_NOT_COLUMNS = ("host_id", "rel_ci_half_width")


def read_benchmark_json(path: Path) -> dict:
    raw = safeio.read_input(path, "benchmark file")  # a regular file, bounded in size
    try:
        data = safeio.parse_nested(json.loads, raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:  # binary, not JSON, nested too deep
        raise UsageError(f"{path} is not a JSON file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise UsageError(f"{path} is not a pytest-benchmark JSON file (no 'benchmarks' list): "
                         "write one with `pytest bench/ --benchmark-json FILE.json`")
    return data


def benchmark_row(bench: dict) -> tuple[dict, np.ndarray | None, np.ndarray | None]:
    """One pytest-benchmark entry -> (case row, raw, ns); raw is NaN: the clock's own units are not
    in the file, only seconds."""
    extra = bench.get("extra_info") or {}
    stats = bench.get("stats") or {}
    row = {k: v for k, v in extra.items() if k in CASE_COLUMNS}
    others = {k: v for k, v in extra.items() if k not in CASE_COLUMNS and k not in _NOT_COLUMNS}
    if others:  # kept, in the row's info (a column of its own could clash with another entry's)
        info = row.get("info") if isinstance(row.get("info"), dict) else {}
        row["info"] = {**info, "extra_info": others}
    row.update(status="ok", reason="")
    bytes_moved = int(extra.get("bytes_moved") or 0)
    data = stats.get("data")
    if data:
        ns = np.asarray(data, dtype=np.float64) * 1e9
        row.update(summarize(ns, bytes_moved))
        return row, np.full(ns.size, math.nan), ns
    median = float(stats.get("median", math.nan)) * 1e9
    # percentiles and the CI the bench plugin computed from the same rounds stay (extra_info);
    # only what neither extra_info nor pytest-benchmark's statistics hold is unknown
    row.update({column: math.nan for column in CASE_COLUMNS if column.endswith("_ns")
                and column != "timer_overhead_ns" and row.get(column) is None})
    row.update(
        n_samples=int(stats.get("rounds", 0)), median_ns=median,
        min_ns=float(stats.get("min", math.nan)) * 1e9, max_ns=float(stats.get("max", math.nan)) * 1e9,
        mean_ns=float(stats.get("mean", math.nan)) * 1e9,
        stddev_ns=float(stats.get("stddev", math.nan)) * 1e9,
        gbps=bytes_moved / median if median > 0 else math.nan,
    )
    return row, None, None


_STAT_FIELDS = ("rounds", "min", "max", "mean", "median", "stddev")
_TEXT_FIELDS = ("case_id", "method", "region", "attr", "pattern", "peer", "access", "suite",
                "host_id")
_COUNT_FIELDS = ("size_bytes", "fragment_count", "fragment_bytes", "bytes_moved", "n_samples",
                 "processes")
_NUMBER_FIELDS = (*(c for c in CASE_COLUMNS if c.endswith("_ns")), "gbps", "elapsed_s")


def _kind_problem(value: object, integer: bool) -> str | None:
    """What is wrong with a count (integer) or a statistic (number) field; None when fine."""
    if value is None:
        return None
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        return "an integer"
    if not integer and (isinstance(value, bool) or not isinstance(value, int | float)):
        return "a number"
    return None


def _check_entry(path: Path, bench: dict) -> None:
    """A nearlocal entry's shape, before anything is stored: one line naming the bad field."""
    extra = bench["extra_info"]
    name = extra["case_id"] if isinstance(extra["case_id"], str) else bench.get("name")
    for field in _TEXT_FIELDS:
        if field in extra and extra[field] is not None and not isinstance(extra[field], str):
            raise UsageError(f"{path}: benchmark {name!r}: extra_info.{field} must be a string, "
                             f"got {type(extra[field]).__name__} {extra[field]!r:.40}")
    if not extra["case_id"]:
        raise UsageError(f"{path}: benchmark {bench.get('name')!r} has an empty extra_info.case_id")
    for fields, integer in ((_COUNT_FIELDS, True), (_NUMBER_FIELDS, False)):
        for field in fields:
            wanted = _kind_problem(extra.get(field), integer)
            if wanted:
                raise UsageError(f"{path}: benchmark {name!r}: extra_info.{field} must be "
                                 f"{wanted}, got {type(extra[field]).__name__} {extra[field]!r:.40}")
    stats = bench.get("stats")
    if stats is not None and not isinstance(stats, dict):
        raise UsageError(f"{path}: benchmark {name!r}: stats must be an object, got "
                         f"{type(stats).__name__} {stats!r:.40}")
    data = (stats or {}).get("data")
    if data is not None and not isinstance(data, list):
        raise UsageError(f"{path}: benchmark {name!r}: stats.data must be a list of round times")
    bad = next((t for t in data or [] if isinstance(t, bool) or not isinstance(t, int | float)
                or not 0 <= t < math.inf), None)
    if bad is not None:
        raise UsageError(f"{path}: benchmark {name!r}: stats.data holds {bad!r}, not a round time "
                         "in seconds (a finite number >= 0)")
    for field in _STAT_FIELDS:  # what benchmark_row converts when there are no raw rounds
        value = (stats or {}).get(field)
        integer = field == "rounds"
        if value is not None and (_kind_problem(value, integer) or not 0 <= value < math.inf
                                  or (integer and value >= 2**63)):
            raise UsageError(f"{path}: benchmark {name!r}: stats.{field} is {value!r:.40}, "
                             f"expected {'a count' if integer else 'a time in seconds'} "
                             "(a finite number >= 0)")
    for field in (*_COUNT_FIELDS, *_NUMBER_FIELDS):  # what Parquet's int64 / float64 can hold
        value = extra.get(field)
        if value is not None and not (abs(value) < 2**63 and math.isfinite(value)):
            raise UsageError(f"{path}: benchmark {name!r}: extra_info.{field} is {value!r:.40}, "
                             "expected a finite number (64-bit)")


def _text(value: object) -> str | None:
    """A free-text field of the file (a version, a date): kept as text whatever its type."""
    return None if value is None else str(value)


def _started(stamp: object) -> str | None:
    """pytest-benchmark's ISO time (microseconds, `+00:00`) in the format every run's `started`
    has (`%Y-%m-%dT%H:%M:%S%z`); as given when it does not parse."""
    import datetime

    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if when.tzinfo is None:  # pytest-benchmark writes UTC
        when = when.replace(tzinfo=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S%z")


def import_benchmarks(path: Path, root: Path) -> tuple[Path, int, list[str]]:
    """Store the file's nearlocal benchmarks as a run under `root`; returns (run path, number
    imported, names of benchmarks that did not come from bench/ and were left out)."""
    data = read_benchmark_json(path)
    ours, foreign = [], []
    for bench in data["benchmarks"]:
        if not isinstance(bench, dict):
            foreign.append(repr(bench)[:40])
        elif isinstance(bench.get("extra_info"), dict) and "case_id" in bench["extra_info"]:
            _check_entry(path, bench)
            ours.append(bench)
        else:
            foreign.append(str(bench.get("fullname") or bench.get("name")))
    if not ours:
        raise UsageError(f"{path} holds no nearlocal benchmarks ({len(foreign)} without "
                         "extra_info.case_id): write it with `pytest bench/ --benchmark-json FILE`")
    for key in ("machine_info", "commit_info"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise UsageError(f"{path}: {key} must be an object, got {type(data[key]).__name__} "
                             f"{data[key]!r:.40}")
    machine = dict(data.get("machine_info") or {})
    ours_info = machine.pop("nearlocal", {})
    ours_info = ours_info if isinstance(ours_info, dict) else {}
    host_ids = {b["extra_info"].get("host_id") for b in ours} - {None}
    if len(host_ids) > 1:
        raise UsageError(f"{path} mixes benchmarks from several hosts ({', '.join(sorted(host_ids))})")
    suites = sorted({str(b["extra_info"].get("suite", "")) for b in ours} - {""})
    meta = {
        "kind": "import", "source": "pytest-benchmark", "imported_from": str(Path(path).resolve()),
        "pytest_benchmark_version": _text(data.get("version")),
        "started": _started(data.get("datetime")),
        "suite": ",".join(suites), "nearlocal_version": _text(ours_info.get("nearlocal_version")),
        "host_id": _text(ours_info.get("host_id")) or next(iter(host_ids), None),
        "inventory": ours_info.get("inventory") or {}, "machine_info": machine,
        "commit_info": data.get("commit_info") or {},
        "samples": "raw round times" if all((b.get("stats") or {}).get("data") for b in ours)
        else "summary statistics only (save with --benchmark-save-data for raw samples)",
    }
    problem = shape_problem(meta, RUN_META_FIELDS)  # what load() would refuse is never stored
    if problem:
        raise UsageError(f"{path}: machine_info.nearlocal: {problem}")
    converted = []
    for bench in ours:  # all converted before the store is touched: a bad entry leaves no run
        try:
            converted.append(benchmark_row(bench))
        except (TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{path}: benchmark {bench.get('name') or bench['extra_info']['case_id']}"
                             f" has malformed stats ({exc})") from None
        problem = shape_problem(converted[-1][0], CASE_ROW_FIELDS)
        if problem:
            raise UsageError(f"{path}: benchmark {bench['extra_info']['case_id']!r}: "
                             f"extra_info {problem}")
    try:  # what finish() will write, built now: a row Parquet cannot hold stores nothing
        pa.Table.from_pandas(cases_frame([row for row, _, _ in converted]), preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"{path}: the benchmarks cannot be stored: "
                         f"{str(exc).splitlines()[0][:160]}") from None
    store = Store.create(Path(root), meta)
    for row, raw, ns in converted:
        store.add_case(row, raw, ns)
    run = store.finish(ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), interrupted=False)
    return run, len(ours), foreign


def _print_import(imported: dict) -> None:
    from nearlocal.terminal import console

    foreign = imported["left_out"]
    if foreign:
        console.print(f"left out {len(foreign)} benchmarks not written by bench/: "
                      + ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else ""))
    console.print(f"imported {imported['cases']} cases from {imported['file']}")
    console.print(f"stored {imported['run']}")


IMPORT_FORMATS = command_formats("import", _print_import)


def _import(args) -> int:
    run, count, foreign = import_benchmarks(Path(args.file), Path(args.out))
    emit(IMPORT_FORMATS, {"file": args.file, "run": str(run), "cases": count,
                          "left_out": foreign}, args)
    return 0


def register(sub) -> None:
    parser = sub.add_parser("import", help="store a pytest-benchmark JSON file (pytest bench/) as a run")
    parser.add_argument("file", help="the file written by `pytest bench/ --benchmark-json FILE`")
    parser.add_argument("--out", default="results", help="the store's root (default ./results)")
    add_json_option(parser)
    parser.set_defaults(func=_import)


register_command("import", register)
