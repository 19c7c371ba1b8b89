"""What a command line selects, shared by every command that measures (`run`, the MPI job):
the cases (a suite narrowed or crossed by --method / --region / ...), the run settings, and the
JSON rows `--json` writes. Kept out of cli.py so that what cli starts never imports cli back."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from dataclasses import replace

from nearlocal.errors import UsageError, naming


def items(option: str, texts: list[str] | None, unique: bool = True) -> list[str]:
    """Values of a repeatable option, each of which may be a comma list: `--method a,b --method
    c` = a, b, c (duplicates dropped, order kept). An empty item (`--size ,`) is an error."""
    items: list[str] = []
    for text in texts or []:
        parts = [part.strip() for part in str(text).split(",")]
        if not all(parts):
            raise UsageError(f"{option} {text!r} has an empty item: give one or more values "
                             "separated by commas")
        items += parts
    return list(dict.fromkeys(items)) if unique else items


def _rejoin(parts: list[str], starts_new, glue) -> list[str]:
    """Undo a comma split inside one value: a part that cannot start a value continues the
    previous one (`devdax:/dev/dax0.0@1GiB,64MiB` stays one region)."""
    joined: list[str] = []
    for part in parts:
        if joined and not starts_new(part):
            joined[-1] = glue(joined[-1]) + part
        else:
            joined.append(part)
    return list(dict.fromkeys(joined))


def region_list(option: str, texts: list[str] | None) -> list[str]:
    """Region specs from repeated options and comma lists. A region's own options use commas too
    (`dram:2M,node=0`, `devdax:/dev/dax0.0@1GiB,64MiB`): a part that does not begin with a region
    kind belongs to the region before it; `dram,node=0` is read as `dram:node=0`."""
    from nearlocal.regions import REGION_KINDS, load_providers

    load_providers()

    def starts_new(part: str) -> bool:
        return part.partition(":")[0] in REGION_KINDS

    def glue(previous: str) -> str:
        inner = previous  # registered:dram -> dram: the options belong to the innermost region
        while True:
            _, sep, arg = inner.partition(":")
            if sep and arg.partition(":")[0] in REGION_KINDS:
                inner = arg
                continue
            return previous + ("," if sep else ":")

    return _rejoin(items(option, texts, unique=False), starts_new, glue)


def pattern_list(texts: list[str] | None) -> list[str]:
    """Patterns from repeated options and comma lists; a part that does not begin a pattern (a
    size, COUNTxSIZE or a `kind:` prefix) belongs to the pattern before it."""
    import re

    def starts_new(part: str) -> bool:
        return bool(re.match(r"\d|[A-Za-z][\w.-]*:", part))

    return _rejoin(items("--pattern", texts, unique=False), starts_new, lambda previous: previous + ",")


def selected_cases(args: argparse.Namespace, inventory=None):
    """The cases the command line selects: the suite's (built for `inventory`, the run's probed
    box), narrowed or crossed by --method / --region / --attr / --size / --pattern / --peer.

    The selectors given replace those axes of each suite case; every axis not given keeps that
    case's own value (pattern, peer, access, parameters). A suite declares which patterns and
    parameters each method runs with (rpc-* methods an rpc: ring, rack-aggregate its slice), so
    `--suite rack --region shm:NAME` is the rack suite aimed at that pool, not every method
    crossed with every pattern of the suite. Without --attr a selection is wb (the uc / wc grid
    is quick's, on dram). A method named by --method that the suite lacks is crossed with the
    suite's regions and patterns."""
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import get_method
    from nearlocal.core.suites import get_suite, suite_cases
    from nearlocal.units import format_size, parse_size

    cases = suite_cases(args.suite, inventory)
    params = parse_params(args.param or [])
    methods = items("--method", args.method)
    regions = region_list("--region", args.region)
    attrs = items("--attr", args.attr)
    sizes = [format_size(parse_size(text)) for text in items("--size", args.size)]
    given = pattern_list(args.pattern)
    from nearlocal.core.patterns import parse_pattern

    for text in given:  # a kv: pattern's model or selection error says it came from --pattern
        with naming(f"--pattern {text}"):
            parse_pattern(text)
    patterns = list(dict.fromkeys([*sizes, *given]))
    peers = region_list("--peer", args.peer)
    if not (methods or regions or attrs or patterns or peers):
        return list(dict.fromkeys(  # --param overrides the suite's value; equal cases merge
            replace(case, params=tuple({**case.param_dict, **params}.items()))
            for case in cases)) if params else cases
    for name in methods:
        get_method(name)
    templates = [case for case in cases if not methods or case.method in methods]
    in_suite = {case.method for case in cases}
    templates += [Case(m, r, "wb", p) for m in methods if m not in in_suite
                  for r in dict.fromkeys(c.region for c in cases)
                  for p in dict.fromkeys(c.pattern for c in cases)]
    pool = get_suite(args.suite).pool_region

    def aimed(case: Case) -> list[str]:  # --region moves a suite's pool cases only, where it has one
        return regions if regions and (not pool or case.region == pool) else [case.region]

    return list(dict.fromkeys(
        Case(t.method, r, a, p, peer=peer, access=t.access,
             params=tuple({**t.param_dict, **params}.items()), suite=args.suite)
        for t in templates
        for r, a, p, peer in itertools.product(aimed(t), attrs or ["wb"],
                                               patterns or [t.pattern], peers or [t.peer])))


def parse_params(texts: list[str]) -> dict[str, str]:
    params = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"malformed --param {text!r}: use KEY=VALUE, e.g. qd=16")
        params[key.strip()] = value.strip()
    return params


def case_records(cases, columns: list[str] | None = None) -> list[dict]:
    """Case rows as plain records (what `run --json` and `show --json` give); `params` (stored
    as JSON text) becomes an object."""
    frame = cases[columns] if columns else cases
    from nearlocal.params import BadParams, decode_params

    records = json.loads(frame.to_json(orient="records"))
    for record in records:
        if isinstance(record.get("params"), str):
            with contextlib.suppress(BadParams):  # a damaged value is shown as it was stored
                record["params"] = decode_params(record["params"])
    return records


def json_records(cases, columns: list[str] | None = None) -> str:
    """Case rows as a JSON array (reporters.json_text of `case_records`)."""
    from nearlocal.reporters import json_text

    return json_text(case_records(cases, columns))


def run_settings(args: argparse.Namespace):
    """`run`'s --budget, --ci, --processes, --placements, --threads, --cpus, --allow-write and
    --for-gate, checked once."""
    from nearlocal.engine.plan import RunSettings

    return RunSettings.from_options(args.budget, args.ci, args.processes, args.threads,
                                    args.cpus, args.allow_write,
                                    for_gate=getattr(args, "for_gate", None) is not None,
                                    placements=args.placements)
