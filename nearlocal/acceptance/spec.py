"""An acceptance spec: a TOML list of requirements on a run (`nearlocal accept SPEC.toml [RUN]`).

    pool = "numa:1"            # optional: the region under test, named once ({pool} below)
    peer = "dram"              # optional: the other side of its transfers ({peer} below)
    [run]                      # optional: how the cases are measured when no RUN is given
    budget = "0.5"             # per-case time budget; ci = 1.0 (percent) as in `nearlocal run`
    processes = 5              # worker processes per case (default as in `nearlocal run --for-gate`)
    placements = 2             # page placements each process draws (default as in `nearlocal run`)
    [defaults]                 # optional: case fields every requirement starts from
    region = "{pool}"
    [[requirement]]
    name = "pool read at 64 KiB is near-local (Beluga B11)"
    case = { method = "load", size = "64KiB" }
    metric = "median_ns"       # median_ns (default), p10_ns, p90_ns, p99_ns, min_ns, mean_ns, max_ns, gbps
    max_ratio_to = { region = "dram", ratio = 1.25 }

A requirement may bound a figure derived from the run's rows instead of a case's (docs/whatif.md):

    [[requirement]]
    name = "qwen2.5-32b, 16K tokens: reload per turn over the pool <= 200 ms"
    whatif = { path = "cxl-pool", model = "qwen2.5-32b", context = "16k", tp = 1 }
    metric = "reload_ns"       # reload_ns (default), pipelined_ns, requests_per_s, gbps
    max = "200ms"
    cases = [{ method = "gather-kernel", region = "registered:{pool}", peer = "gpu:0" }]

`whatif` takes the request's keys of `nearlocal whatif` (model, context, cached, tp, layout,
block_tokens, dtype, batch, gpus_per_link, layer_compute_us, prefill_tokens_per_s) and `path` (a
serving path). Its figure comes from this box's rows only (no reference box): a path with a hop
the run did not measure fails as not measured, naming the hop; a verdict names the rows its
figure came from. `cases` (optional): cases `accept` measures for it when it measures.
With `qps` (and optionally requests, contexts, links, link_sharing, seed, ttft_target) the
figure is one under load (whatif.load: a seeded Poisson stream over the path, prefilled at
prefill_tokens_per_s per GPU when given): metric ttft_p50_ns, ttft_p90_ns, ttft_p99_ns, or
capacity_qps (with ttft_target), e.g. "P99 TTFT <= 2 s at 4 QPS over the pool":

    whatif = { path = "cxl-pool", qps = 4, prefill_tokens_per_s = 40000 }
    metric = "ttft_p99_ns"
    max = "2s"

A case names method, region, attr, size or pattern, peer, access, params. A requirement has one
bound: `max` / `min` (a duration such as "3us" or a number in the metric's unit), `min_gbps` /
`max_gbps`, or `max_ratio_to` / `min_ratio_to`: another case, written as the fields that differ
from this one, plus `ratio` (default 1). A requirement whose case (or reference) was not measured
fails with the reason. Exit 0 all pass, 1 any fails, 2 a malformed spec (with its line).

`{pool}` and `{peer}` in a region or peer (`registered:{pool}`) stand for the spec's `pool` and
`peer`; a spec without `pool` has its [defaults] region as the pool. `accept SPEC --region R
--peer P` aims the spec at other memory without editing it. A pool that this box does not have
is bad input (exit 2, naming what `probe` lists), not a failed requirement.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from nearlocal import safeio
from nearlocal.core.cases import Case
from nearlocal.core.sampling import MAX_PLACEMENTS
from nearlocal.errors import UsageError
from nearlocal.units import parse_budget, parse_duration
from nearlocal.whatif import Request

TIME_METRICS = ("median_ns", "p10_ns", "p90_ns", "p99_ns", "min_ns", "mean_ns", "max_ns")
METRICS = (*TIME_METRICS, "gbps")
# a derived requirement's figures (whatif.PathFigures' fields): durations, a rate, a bandwidth
DERIVED_METRICS = {"reload_ns": "time", "pipelined_ns": "time", "requests_per_s": "rate",
                   "gbps": "gbps"}
# and under load (whatif.load, `whatif = { ..., qps = 4 }`): TTFT percentiles, the capacity
LOAD_METRICS = {"ttft_p50_ns": "time", "ttft_p90_ns": "time", "ttft_p99_ns": "time",
                "capacity_qps": "rate"}
DERIVED_METRICS.update(LOAD_METRICS)
LOAD_KEYS = ("qps", "requests", "contexts", "links", "link_sharing", "seed", "ttft_target")
WHATIF_KEYS = ("path", "model", "context", "cached", "tp", "layout", "block_tokens", "dtype",
               "batch", "gpus_per_link", "layer_compute_us", "prefill_tokens_per_s", *LOAD_KEYS)
CASE_KEYS = ("method", "region", "attr", "size", "pattern", "peer", "access", "params")
BOUND_KEYS = ("max", "min", "max_gbps", "min_gbps", "max_ratio_to", "min_ratio_to")
REQUIREMENT_KEYS = ("name", "case", "whatif", "cases", "metric", *BOUND_KEYS)
TOP_KEYS = ("title", "pool", "peer", "run", "defaults", "requirement")
PLACEHOLDERS = {"{pool}": "pool", "{peer}": "peer"}  # in region / peer strings
RUN_KEYS = ("budget", "ci", "allow_write", "processes", "placements")


@dataclass(frozen=True)
class Derived:
    """A figure of `nearlocal whatif` for one request over one serving path."""

    path: str
    request: Request
    load: tuple[tuple[str, object], ...] = ()  # a load figure's options (qps, ...): whatif.load

    @property
    def id(self) -> str:
        """whatif:PATH:MODEL:CONTEXT and every other request field the spec set."""
        r = self.request
        given = {f.name: getattr(r, f.name) for f in fields(r)
                 if f.name not in ("model", "context") and getattr(r, f.name) != f.default}
        return ":".join(["whatif", self.path, r.model, str(r.context),
                         *(f"{k}={v}" for k, v in (*given.items(), *self.load))])


@dataclass(frozen=True)
class Requirement:
    index: int
    name: str
    case: Case | None  # None: a derived requirement
    metric: str
    kind: str  # "max", "min", "max_ratio", "min_ratio"
    bound: float
    reference: Case | None = None
    derived: Derived | None = None
    measure: tuple[Case, ...] = ()  # what accept measures for a derived requirement

    @property
    def is_max(self) -> bool:
        return self.kind.startswith("max")

    @property
    def subject(self) -> str:
        """What the requirement bounds: its case's id, or its derived figure's."""
        return self.derived.id if self.derived is not None else self.case.id


@dataclass(frozen=True)
class Spec:
    path: Path
    title: str
    requirements: list[Requirement]
    budget: str = "0.5"
    ci: float = 1.0
    allow_write: bool = False
    processes: int | None = None  # None: default_processes(budget), as `nearlocal run` does
    pool: str = ""  # the region under test ("" when the spec names none)
    peer: str = "dram"
    sha256: str = ""  # of the file as read: which spec a stored verdict was judged by
    placements: int | None = None  # None: DEFAULT_PLACEMENTS, as `nearlocal run` draws

    def cases(self) -> list[Case]:
        found = [c for r in self.requirements for c in (r.case, r.reference, *r.measure)
                 if c is not None]
        return list(dict.fromkeys(found))


# ---------------------------------------------------------------- parsing


class _Lines:
    """Line numbers for messages: tomllib keeps none, so find tables and keys in the text."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.requirements = [i + 1 for i, line in enumerate(self.lines)
                             if re.match(r"\s*\[\[\s*requirement\s*\]\]", line)]

    def _table(self, name: str) -> int | None:
        return next((i + 1 for i, line in enumerate(self.lines)
                     if re.match(rf"\s*\[\s*{re.escape(name)}\s*\]", line)), None)

    def key(self, start: int | None, key: str) -> int | None:
        first = start or 1
        for number in range(first, len(self.lines) + 1):
            line = self.lines[number - 1]
            if number > first and re.match(r"\s*\[", line):
                break
            if re.match(rf"\s*{re.escape(key)}\s*=", line):
                return number
        return start

    def requirement(self, index: int, key: str | None = None) -> int | None:
        start = self.requirements[index] if index < len(self.requirements) else None
        return self.key(start, key) if key else start

    def table(self, name: str, key: str | None = None) -> int | None:
        start = self._table(name)
        return self.key(start, key) if key and start else start


def _merge(base: dict, override: dict) -> dict:
    """Case fields: override wins; a size replaces an inherited pattern and the other way round."""
    if "size" in override or "pattern" in override:
        base = {k: v for k, v in base.items() if k not in ("size", "pattern")}
    return {**base, **override}


def _fail(path: Path, line: int | None, problem: str) -> UsageError:
    return UsageError(f"{path}:{line or '?'}: {problem}")


def _duration_ns(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return parse_duration(str(value)) * 1e9


def _pattern_text(value: object) -> str:
    """A size in the form the runner stores it, so a spec matches the stored case whichever way
    it spells the size; a fragment pattern as given."""
    from nearlocal.units import size_spelled_once

    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"size / pattern must be a size or a pattern string, got {value!r}")
    return size_spelled_once(value)


def _make_case(fields: dict, where: str) -> Case:
    from nearlocal.core.methods import get_method
    from nearlocal.core.patterns import parse_pattern
    from nearlocal.regions import ATTRIBUTES, parse_region

    unknown = sorted(set(fields) - set(CASE_KEYS) - {"ratio"})
    if unknown:
        raise UsageError(f"{where}: unknown case field {unknown[0]!r} (valid: {', '.join(CASE_KEYS)})")
    if "method" not in fields:
        raise UsageError(f"{where}: the case names no method")
    if "size" in fields and "pattern" in fields:
        raise UsageError(f"{where}: give size or pattern, not both")
    method = get_method(str(fields["method"]))
    pattern = _pattern_text(fields.get("pattern", fields.get("size", "16KiB")))
    parse_pattern(pattern)
    region, peer = str(fields.get("region", "dram")), str(fields.get("peer", "dram"))
    parse_region(region)
    parse_region(peer)
    attr = str(fields.get("attr", "wb"))
    if attr not in ATTRIBUTES:
        raise UsageError(f"{where}: unknown attribute {attr!r} (valid: {', '.join(ATTRIBUTES)})")
    access = str(fields.get("access", ""))
    if access and access not in method.accesses:
        raise UsageError(f"{where}: method {method.name} cannot {access}: it does "
                         f"{' / '.join(method.accesses)}")
    params = fields.get("params", {})
    if not isinstance(params, dict):
        raise UsageError(f"{where}: params must be a table, e.g. params = {{ batch = 8 }}")
    return Case(method.name, region, attr, pattern, peer=peer, access=access,
                params=tuple(params.items()), suite="accept")


def _requirement(index: int, table: dict, defaults: dict, lines: _Lines, path: Path) -> Requirement:
    if not isinstance(table, dict):
        raise _fail(path, lines.requirement(index) or lines.key(1, "requirement"),
                    f"requirement {index + 1}: must be a table ([[requirement]]), got {table!r}")
    name = str(table.get("name") or f"requirement {index + 1}")
    label = f"requirement {index + 1} ({name})"

    def fail(key: str | None, problem: str) -> UsageError:
        return _fail(path, lines.requirement(index, key), f"{label}: {problem}")

    unknown = sorted(set(table) - set(REQUIREMENT_KEYS))
    if unknown:
        raise fail(unknown[0], f"unknown key {unknown[0]!r} (valid: {', '.join(REQUIREMENT_KEYS)})")
    if "whatif" in table:
        try:
            return _derived_requirement(index, name, table, defaults)
        except UsageError as exc:
            key = next((k for k in ("whatif", "cases", "metric", *BOUND_KEYS) if k in table
                        and k in str(exc)), "whatif")
            raise fail(key, str(exc)) from None
    if "cases" in table:
        raise fail("cases", "cases = [...] goes with whatif = {...}: a case requirement "
                   "measures its own case")
    if not isinstance(table.get("case"), dict):
        raise fail("case", "needs case = { method = ..., size = ... }")
    fields = _merge(defaults, table["case"])
    try:
        case = _make_case(fields, "case")
    except UsageError as exc:
        raise fail("case", str(exc)) from None
    bounds = [key for key in BOUND_KEYS if key in table]
    if len(bounds) != 1:
        raise fail(bounds[1] if bounds else None,
                   f"needs exactly one bound of {', '.join(BOUND_KEYS)}"
                   + (f" (found {', '.join(bounds)}: split it into two requirements)" if bounds else ""))
    key = bounds[0]
    metric = str(table.get("metric", "gbps" if key.endswith("_gbps") else "median_ns"))
    if metric not in METRICS:
        raise fail("metric", f"unknown metric {metric!r} (valid: {', '.join(METRICS)})")
    if key.endswith("_gbps") and metric != "gbps":
        raise fail(key, f"{key} bounds the gbps metric, but metric is {metric}")
    value = table[key]
    reference = None
    try:
        if key.endswith("_ratio_to"):
            if not isinstance(value, dict):
                raise UsageError(f"{key} must be a table: the fields that differ from the case, "
                                 "and ratio, e.g. { region = \"dram\", ratio = 1.25 }")
            ratio = value.get("ratio", 1.0)
            if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not \
                    0 < ratio < math.inf:
                raise UsageError(f"{key}: ratio must be a positive number (finite), got {ratio!r}")
            reference = _make_case(_merge(fields, {k: v for k, v in value.items() if k != "ratio"}),
                                   key)
            if reference == case:
                raise UsageError(f"{key} names the case itself: change at least one field")
            kind, bound = key.removesuffix("_to"), float(ratio)
        elif metric == "gbps" or key.endswith("_gbps"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not \
                    0 < value < math.inf:
                raise UsageError(f"{key} must be a positive number of GB/s (finite), got {value!r}")
            kind, bound = key.removesuffix("_gbps"), float(value)
        else:
            kind, bound = key, _duration_ns(value)
            if not 0 < bound < math.inf:  # max = inf would always pass, min = nan never
                raise UsageError(f"{key} must be a positive duration (finite), got {value!r}")
    except UsageError as exc:
        raise fail(key, str(exc)) from None
    return Requirement(index, name, case, metric, kind, bound, reference)


def _request(fields: dict) -> tuple[str, Request]:
    """whatif = {...}: the serving path and the request, checked as `nearlocal whatif` checks
    them (an unknown model or a context past nearlocal kv's bounds is a bad spec)."""
    from nearlocal.whatif import SERVING_PATHS
    from nearlocal.whatif.commands import parse_tokens
    from nearlocal.whatif.serving import shape_of

    unknown = sorted(set(fields) - set(WHATIF_KEYS))
    if unknown:
        raise UsageError(f"whatif: unknown key {unknown[0]!r} (valid: {', '.join(WHATIF_KEYS)})")
    path = fields.get("path")
    if path not in SERVING_PATHS:
        raise UsageError(f"whatif: path must be one of {', '.join(SERVING_PATHS)}, got {path!r}")
    options = {k: v for k, v in fields.items() if k != "path" and k not in LOAD_KEYS}
    if "context" in options:
        options["context"] = parse_tokens(str(options["context"]))
    for key, kind in (("tp", int), ("block_tokens", int), ("gpus_per_link", int), ("batch", int),
                      ("cached", float), ("layer_compute_us", float),
                      ("prefill_tokens_per_s", float), ("model", str), ("layout", str),
                      ("dtype", str)):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, int | float if kind is float else kind)):
            raise UsageError(f"whatif: {key} must be {'a number' if kind is not str else 'text'}"
                             f"{' (whole)' if kind is int else ''}, got {value!r}")
    request = Request(**options)
    shape_of(request)  # the model, layout and context are good before anything is measured
    return str(path), request


def _derived_requirement(index: int, name: str, table: dict, defaults: dict) -> Requirement:
    if "case" in table or any(k.endswith("_ratio_to") for k in table):
        raise UsageError("whatif = {...} bounds a derived figure: no case, no ratio_to")
    if not isinstance(table["whatif"], dict):
        raise UsageError("whatif must be a table, e.g. whatif = { path = \"cxl-pool\" }")
    path, request = _request(table["whatif"])
    load = {k: v for k, v in table["whatif"].items() if k in LOAD_KEYS}
    bounds = [key for key in BOUND_KEYS if key in table]
    if len(bounds) != 1:
        raise UsageError(f"needs exactly one bound of max, min, max_gbps, min_gbps (found "
                         f"{', '.join(bounds) or 'none'})")
    key = bounds[0]
    metric = str(table.get("metric", "gbps" if key.endswith("_gbps") else "reload_ns"))
    if metric not in DERIVED_METRICS:
        raise UsageError(f"metric {metric!r} is not a derived figure (valid: "
                         f"{', '.join(DERIVED_METRICS)})")
    kind = DERIVED_METRICS[metric]
    if (metric in LOAD_METRICS) != bool(load):
        raise UsageError(f"metric {metric} needs whatif's qps" if metric in LOAD_METRICS else
                         f"whatif's {', '.join(load)} go with a load metric "
                         f"({', '.join(LOAD_METRICS)})")
    if load:
        from nearlocal.whatif.commands import parse_tokens
        from nearlocal.whatif.load import load_options

        load = load_options(load, parse_tokens)
        if metric == "capacity_qps" and "ttft_target" not in load:
            raise UsageError("metric capacity_qps needs whatif's ttft_target")
    value = table[key]
    if kind == "time":
        bound = _duration_ns(value)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"{key} must be a number of {'GB/s' if kind == 'gbps' else 'requests/s'}"
                         f", got {value!r}")
    else:
        bound = float(value)
    if key.endswith("_gbps") and kind != "gbps":
        raise UsageError(f"{key} bounds the gbps metric, but metric is {metric}")
    if not 0 < bound < math.inf:
        raise UsageError(f"{key} must be positive and finite, got {value!r}")
    measure = table.get("cases", [])
    if not isinstance(measure, list) or not all(isinstance(c, dict) for c in measure):
        raise UsageError("cases must be a list of case tables, e.g. cases = [{ method = "
                         "\"memcpy\", pattern = \"64MiB\" }]")
    cases = tuple(_make_case(_merge(defaults, c), f"cases[{i}]") for i, c in enumerate(measure))
    return Requirement(index, name, None, metric, key.removesuffix("_gbps"), bound,
                       derived=Derived(path, request, tuple(sorted(load.items()))),
                       measure=cases)


def _aim(tree: object, targets: dict[str, str]) -> object:
    """The spec's tables with {pool} / {peer} in region and peer strings replaced."""
    if isinstance(tree, dict):
        return {k: (_substitute(v, targets) if k in ("region", "peer") and isinstance(v, str)
                    else _aim(v, targets)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_aim(v, targets) for v in tree]
    return tree


def _substitute(text: str, targets: dict[str, str]) -> str:
    for placeholder, key in PLACEHOLDERS.items():
        text = text.replace(placeholder, targets[key])
    return text


def _targets(data: dict, defaults: dict, lines: _Lines, path: Path, region: str | None,
             peer: str | None) -> tuple[dict[str, str], dict]:
    """(pool and peer, [defaults]) after --region / --peer: the pool is the spec's `pool`, else
    its [defaults] region (which --region then replaces)."""
    from nearlocal.regions import parse_region

    for key in ("pool", "peer"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip()
                            or "{" in data[key]):
            raise _fail(path, lines.key(1, key), f"{key} must be a region such as \"numa:1\", "
                        f"got {data[key]!r}")
    pool = data.get("pool", "")
    if not pool and isinstance(defaults.get("region"), str) and "{" not in defaults["region"]:
        pool = defaults["region"]
        if region:
            defaults = {**defaults, "region": region}
    targets = {"pool": region or pool, "peer": peer or data.get("peer", "dram")}
    for option, value in (("--region", region), ("--peer", peer)):
        if value:
            try:
                parse_region(value)
            except UsageError as exc:
                raise UsageError(f"{option} {value}: {exc}") from None
    return targets, defaults


def parse_spec(path: Path | str, region: str | None = None, peer: str | None = None) -> Spec:
    """The spec, or UsageError naming the file, line and problem. region / peer (--region,
    --peer) replace the spec's pool and peer."""
    path = Path(path)
    try:  # bounded: a regular file of at most MAX_INPUT_BYTES, nested at most MAX_DEPTH
        raw = safeio.read_input(path, "spec")
        text = raw.decode()
        data = safeio.parse_nested(tomllib.loads, text)
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a TOML file (binary, not UTF-8 text)") from None
    except safeio.TooDeep as exc:
        raise UsageError(f"{path}: spec is {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    lines = _Lines(text)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise _fail(path, lines.key(1, unknown[0]) or lines.table(unknown[0]),
                    f"unknown top-level key {unknown[0]!r} (valid: {', '.join(TOP_KEYS)})")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - set(CASE_KEYS):
        bad = sorted(set(defaults) - set(CASE_KEYS)) if isinstance(defaults, dict) else ["defaults"]
        raise _fail(path, lines.table("defaults", bad[0]) or lines.key(1, "defaults"),
                    f"[defaults] takes case fields only ({', '.join(CASE_KEYS)}), not {bad[0]!r}")
    targets, defaults = _targets(data, defaults, lines, path, region, peer)
    defaults = _aim(defaults, targets)
    run = data.get("run", {})
    if not isinstance(run, dict) or set(run) - set(RUN_KEYS):
        bad = sorted(set(run) - set(RUN_KEYS)) if isinstance(run, dict) else ["run"]
        raise _fail(path, lines.table("run", bad[0]) or lines.key(1, "run"),
                    f"[run] takes {', '.join(RUN_KEYS)}, not {bad[0]!r}")
    key = "budget"
    try:
        budget = str(run.get("budget", "0.5"))
        parse_budget(budget, "budget")
        key = "ci"
        ci = float(run.get("ci", 1.0))
        if not 0 < ci < 100:
            raise ValueError(f"ci must be a percentage between 0 and 100, got {run['ci']!r}")
    except (UsageError, TypeError, ValueError) as exc:
        raise _fail(path, lines.table("run", key), f"[run]: {exc}") from None
    allow_write = run.get("allow_write", False)
    if not isinstance(allow_write, bool):  # bool("no") is True: only a TOML boolean says it
        raise _fail(path, lines.table("run", "allow_write"),
                    f"[run]: allow_write must be true or false (a TOML boolean), got {allow_write!r}")
    processes = run.get("processes")
    if processes is not None and (type(processes) is not int or not 1 <= processes <= 100):
        raise _fail(path, lines.table("run", "processes"),
                    f"[run]: processes must be an integer from 1 to 100, got {processes!r}")
    placements = run.get("placements")
    if placements is not None and (type(placements) is not int
                                   or not 1 <= placements <= MAX_PLACEMENTS):
        raise _fail(path, lines.table("run", "placements"), f"[run]: placements must be an "
                    f"integer from 1 to {MAX_PLACEMENTS}, got {placements!r}")
    tables = data.get("requirement")
    if not isinstance(tables, list) or not tables:
        raise _fail(path, None, "no requirements: add [[requirement]] tables")
    tables = _aim(tables, targets)
    requirements = [_requirement(i, t, defaults, lines, path) for i, t in enumerate(tables)]
    return Spec(path, str(data.get("title", path.stem)), requirements, budget, ci, allow_write,
                processes, targets["pool"], targets["peer"], hashlib.sha256(raw).hexdigest(),
                placements=placements)


# ---------------------------------------------------------------- the box it is aimed at


def check_pool(spec: Spec, inventory) -> None:
    """The spec's pool (and its peer, when it is not local DRAM) must be memory this box has:
    aiming a spec at absent memory is bad input, one line saying what `probe` lists instead."""
    from nearlocal.availability import region_instances
    from nearlocal.regions import parse_region, region_kind

    for role, text in (("pool", spec.pool), ("peer", spec.peer)):
        if not text or text == "dram":
            continue
        region = parse_region(text)
        try:
            region_kind(region).validate(region, inventory)
        except UsageError as exc:
            option = "--region" if role == "pool" else "--peer"
            raise UsageError(f"{spec.path.name}: the {role} {text} is not on this box ({exc}); "
                             f"probe lists {', '.join(region_instances(inventory))}: aim the spec "
                             f"at one with {option}") from None
