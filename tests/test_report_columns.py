"""The report reads columns only: rows say what their region and peer are to the pool question
(`pool_class`, `peer_pool_class`) and what their figure is (`measures`); the report's code
names methods and region kinds only in its section specs."""

from __future__ import annotations

import ast
from pathlib import Path

import nearlocal
from nearlocal.core.cases import Case
from nearlocal.core.methods import METHODS, load_methods
from nearlocal.core.rows import row_facts
from nearlocal.regions.base import REGION_KINDS
from nearlocal.store import load
from tests.report_fixtures import make_run, row

REPORT = Path(nearlocal.__file__).parent / "report"


def test_row_facts_state_the_peer_class_and_what_the_figure_measures():
    chase = row_facts(Case(method="chase", region="dram", pattern="16KiB", access="read"))
    assert chase["measures"] == "operation" and chase["peer_pool_class"] == "local"
    copy = row_facts(Case(method="load", region="numa:1", pattern="16KiB", access="read"),
                    frozenset({1}))
    assert copy["measures"] == "transfer" and copy["pool_class"] == "cxl-node"


def test_rows_stored_without_the_columns_derive_them_at_load(tmp_path):
    rows = [row("chase", "dram"), row("rpc-roundtrip", "shm:rpc", pattern="rpc:128x64B",
                                      size=8192, fragments=128, access="write"),
            row("load", "dram", peer="gpu:0"), row("gone-method", "dram")]
    cases = load(make_run(tmp_path, rows)).cases.set_index("method")
    assert dict(cases["measures"]) == {"chase": "operation", "rpc-roundtrip": "operation",
                                       "load": "transfer", "gone-method": "transfer"}
    assert cases.loc["load", "peer_pool_class"] == "gpu"
    assert cases.loc["chase", "peer_pool_class"] == "local"


# The modules whose data quote the papers' (and MLC's) figures: the section specs. Only there, in
# their module-level constants (the spec data: "B9 compares cuda-memcpy with gather-kernel"), may a
# method or region kind be named; their functions read those constants and the rows' columns.
# A family's own section (nearlocal/<family>/report_section.py: rack's, rdma's) is a section spec
# too, named from nearlocal/.
SECTION_SPECS = {"sections/beluga.py", "sections/swiftcache.py", "sections/summary.py",
                 "sections/latency.py", "../rack/report_section.py", "../rdma/report_section.py"}
# Names outside the section specs, each with why (none: acceptance, whose spec language defaults to
# local DRAM, moved out to nearlocal/acceptance/).
ALLOWED: dict[str, set[str]] = {}


def _named_constants(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are not docstrings, dict keys, subscripts or the key a `.get()`
    looks up (those index stored records, e.g. an inventory's "numa" list)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Dict):
            skip.update(id(k) for k in node.keys if k is not None)
        if isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args:
            skip.add(id(node.args[0]))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in skip]


def _spec_data(tree: ast.Module) -> set[int]:
    """The constants of a module's top-level assignments: its spec data."""
    return {id(n) for statement in tree.body if isinstance(statement, ast.Assign | ast.AnnAssign)
            for n in ast.walk(statement)}


def test_the_report_names_methods_and_region_kinds_only_in_section_specs():
    load_methods()
    import nearlocal.gpu.regions  # noqa: F401 (declares the gpu / pinned / registered kinds)

    methods, kinds = set(METHODS), set(REGION_KINDS)
    assert {"load", "chase", "cuda-memcpy"} <= methods and {"dram", "numa", "gpu"} <= kinds
    found, quoted = [], set()
    faces = sorted(REPORT.parent.glob("*/report_section.py"))
    assert faces  # rack's and rdma's
    for path in [*sorted(REPORT.rglob("*.py")), *faces]:
        name = path.relative_to(REPORT).as_posix() if path.is_relative_to(REPORT) \
            else f"../{path.relative_to(REPORT.parent).as_posix()}"
        tree = ast.parse(path.read_text())
        spec = _spec_data(tree) if name in SECTION_SPECS else set()
        for node in _named_constants(tree):
            value = node.value
            named = value in methods or value in kinds \
                or any(value.startswith(f"{kind}:") for kind in kinds)
            if named and id(node) in spec:
                quoted.add(value)
            elif named and value not in ALLOWED.get(name, set()):
                found.append(f"report/{name}:{node.lineno}: {value!r}")
    assert not found, "method / region kind names outside the section specs:\n" + \
        "\n".join(found)
    assert {"cuda-memcpy", "gather-kernel", "chase", "dram"} <= quoted  # the specs are seen
