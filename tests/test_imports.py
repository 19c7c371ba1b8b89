"""No import cycles in the package: every `import` / `from ... import` of a nearlocal module,
at module level and inside functions alike (a lazy import is still a dependency), resolved to the
module it loads, forms no circle."""

from __future__ import annotations

import ast
from pathlib import Path

import nearlocal

PACKAGE = Path(nearlocal.__file__).parent

# Edges left in files that another change owns (issue 18's plan stage rewrites both ends); the
# lead removes each entry once that change has merged. An entry whose edge is gone fails the test.
ALLOWED_EDGES: set[tuple[str, str]] = set()


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["nearlocal", *path.relative_to(PACKAGE).with_suffix("").parts]
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Nodes under `if TYPE_CHECKING:`: imported for annotations only, never at run time."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for statement in node.body for n in ast.walk(statement))
    return skip


def import_edges() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, over nearlocal's own modules."""
    modules = _module_names()

    def resolve(name: str) -> str | None:  # `a.b.func` -> the module a.b
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per dot
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.split(".")[0] == "nearlocal" else None
                if found and found != module:
                    edges.setdefault(module, {}).setdefault(found, node.lineno)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges.get(node, {}):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_walker_sees_function_level_and_relative_imports():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]
    edges = import_edges()
    assert "nearlocal.report.tables" in edges["nearlocal.report.commands"]  # inside _report()
    assert "nearlocal.regions.base" in edges["nearlocal.regions"]


def test_no_import_cycle_in_the_package():
    edges = import_edges()
    stale = [edge for edge in ALLOWED_EDGES if edge[1] not in edges.get(edge[0], {})]
    assert not stale, f"allowed edges no longer imported, remove them from ALLOWED_EDGES: {stale}"
    for module, target in ALLOWED_EDGES:
        del edges[module][target]
    found = cycles(edges)
    lines = [f"{' <-> '.join(c)}: " + ", ".join(f"{a}:{edges[a][b]} -> {b}" for a in c
                                                 for b in edges.get(a, {}) if b in c)
             for c in found]
    assert not found, "import cycles:\n" + "\n".join(lines)
