"""The packages form layers (docs/architecture.md): each imports only from its own layer and the
layers below it, so the import graph between packages has no cycle. Every import counts, those
inside functions (lazy) too; only `if TYPE_CHECKING:` blocks are left out."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nearlocal"

# Lowest first. A top-level module is its own unit, named by its file.
LAYERS: list[tuple[str, set[str]]] = [
    ("utilities", {"__init__", "errors", "units", "params", "lazy", "sysroot", "safeio",
                   "terminal", "plugins"}),  # __init__: the version; plugins: the groups' loader
    ("kernels", {"kernels"}),  # compiled code: the probe measures with it too
    ("probe", {"probe"}),
    ("regions", {"regions"}),
    ("core", {"core"}),  # methods, cases, patterns, suites, what a sample is
    ("families", {"cpu", "dsa", "gpu", "rpc", "storage", "workloads", "rack", "rdma",
                  "availability"}),
    ("store", {"store"}),
    ("engine", {"engine"}),
    ("judging", {"gate", "whatif", "report"}),  # report and accept use whatif
    ("front ends", {"frontends", "bench", "__main__"}),  # bench: the pytest front end
]
LAYER_OF = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every nearlocal module `path` imports, lazily or not, outside `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    hidden = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
              and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m == "nearlocal" or m.startswith("nearlocal.")}


@cache
def package_edges() -> dict[tuple[str, str], str]:
    """(importing unit, imported unit) -> one module that does it."""
    edges = {}
    for path in sorted(ROOT.rglob("*.py")):
        source = unit_of(module_name(path))
        for module in imported(path):
            target = unit_of(module) if module != "nearlocal" else "__init__"
            if target != source and target in LAYER_OF:
                edges.setdefault((source, target), module_name(path))
    return edges


def test_every_package_has_a_layer():
    units = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir()
                                                   if (p / "__init__.py").exists()}
    assert units - set(LAYER_OF) == set()


def test_no_package_imports_one_above_it():
    upward = [f"{by} ({LAYERS[LAYER_OF[a]][0]}) imports {b} ({LAYERS[LAYER_OF[b]][0]})"
              for (a, b), by in package_edges().items() if LAYER_OF[b] > LAYER_OF[a]]
    assert upward == [], "\n".join(upward)


@pytest.mark.parametrize("unit", sorted(LAYER_OF))
def test_no_cycle_through(unit):
    """Depth-first from `unit`: no import path leads back to it (lazy imports included)."""
    edges = package_edges()
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    seen, stack = set(), [(unit, (unit,))]
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            assert nxt != unit, "import cycle: " + " -> ".join([*path, nxt])
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, (*path, nxt)))
