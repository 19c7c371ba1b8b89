"""The packages form layers (docs/architecture.md): each imports only from its own layer and the
layers below it, so the import graph between packages has no cycle. Every import counts, those
inside functions (lazy) too; only `if TYPE_CHECKING:` blocks are left out. A module named in a
string is a load by name and counts as an import of it (`importlib.import_module("x")`,
`lazy_import("x")`, a registry's list of modules). An entry point of pyproject.toml's groups is a
module plugged into a registry (nearlocal/plugins.py loads it; the registry names none): it must
sit from the registry's layer up to the method families', since whatever it imports is loaded
wherever the registry is used; the upper groups (hops, report sections, commands) are loaded only
by the layer that uses them, so their modules may sit up to that layer. A family's face (FACES:
`nearlocal/<family>/serving.py`, `report_section.py`, `commands.py`) is a module of the family
that sits in an upper layer, so that the family's hop, section and command live in the family:
it is a unit of its own, nothing imports it, and only its entry-point group loads it. No private
name (`_x`) is imported across packages."""

from __future__ import annotations

import ast
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nearlocal"

# Lowest first. A top-level module is its own unit, named by its file.
LAYERS: list[tuple[str, set[str]]] = [
    ("utilities", {"__init__", "errors", "units", "params", "lazy", "sysroot", "safeio",
                   "terminal", "reporters", "plugins", "subcommands"}),  # __init__: the version;
    # plugins: the groups' loader; subcommands: the registry of commands
    ("kernels", {"kernels"}),  # compiled code: the probe measures with it too
    ("probe", {"probe"}),
    ("regions", {"regions"}),
    ("core", {"core"}),  # methods, cases, patterns, suites, what a sample is
    ("families", {"cpu", "dsa", "gpu", "rpc", "storage", "workloads", "rack", "rdma",
                  "availability"}),
    ("store", {"store"}),
    ("engine", {"engine"}),
    ("judging", {"gate", "whatif", "acceptance", "report"}),  # acceptance uses whatif, report both
    ("front ends", {"frontends", "bench", "__main__"}),  # bench: the pytest front end
]
LAYER_OF = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}
LAYER_NAMED = {name: rank for rank, (name, _) in enumerate(LAYERS)}
# A family's faces: module name -> the layer it sits in (the layer whose registry it fills, which
# it may import). The family's other modules may not import it (an upward import).
FACES = {"serving": "judging", "report_section": "judging", "commands": "front ends"}
FAMILIES = LAYERS[LAYER_NAMED["families"]][1]
LAYER_OF |= {f"{family}.{face}": LAYER_NAMED[layer] for family in FAMILIES
             for face, layer in FACES.items()}


def unit_of(module: str) -> str:
    """A top-level package or module; a family's face (`nearlocal.rack.report_section`) is its own
    unit, `rack.report_section`, in the face's layer."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] in FAMILIES and parts[2] in FACES:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def all_modules() -> frozenset[str]:
    return frozenset(module_name(path) for path in ROOT.rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def imported(path: Path) -> set[str]:
    """Every nearlocal module `path` imports, lazily or not, outside `if TYPE_CHECKING:`."""
    return imported_by(path.read_text(), module_name(path), path.name == "__init__.py")


def imported_by(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every nearlocal module `source` (the text of `module`) imports or names in a string."""
    tree = ast.parse(source)
    hidden = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
              and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    hidden |= _docstrings(tree)
    package = module if is_package else module.rsplit(".", 1)[0]
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
        elif isinstance(node, ast.Constant) and node.value in all_modules():
            found.add(node.value)  # loaded by name: import_module, lazy_import, a registry's list
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


def test_a_module_named_in_a_string_is_an_import_of_it():
    """A load by name is an import the `import` statements do not show: core naming a module of
    the engine in a list, or loading one with import_module / lazy_import, is an upward load."""
    source = ('import importlib\n'
              'from nearlocal.lazy import lazy_import\n'
              'MODULES = ["nearlocal.cpu.methods"]\n'
              'def load():\n'
              '    """Named here, in a docstring only: nearlocal.report.tables"""\n'
              '    importlib.import_module("nearlocal.engine.plan")\n'
              '    return lazy_import("nearlocal.store.runs")\n')
    assert imported_by(source, "nearlocal.core.example") == {
        "nearlocal.lazy", "nearlocal.lazy.lazy_import", "nearlocal.cpu.methods",
        "nearlocal.engine.plan", "nearlocal.store.runs"}


# The entry-point groups of nearlocal/plugins.py: (the layer of the registry that loads the group,
# the highest layer a module plugged into it may sit in). The registry names no module; the
# plugged-in module imports the registry (an edge the tests above count), and everything it
# imports is loaded wherever the registry is used (a store's load, a worker), so it may sit no
# higher than the method families.
ENTRY_POINT_GROUPS = {"nearlocal.region_kinds": ("regions", "families"),
                      "nearlocal.methods": ("core", "families"),
                      # the upper groups: loaded only where their registry is used
                      "nearlocal.serving_hops": ("judging", "judging"),  # whatif/paths.py
                      "nearlocal.report_sections": ("judging", "judging"),  # report/registry.py
                      "nearlocal.commands": ("utilities", "front ends")}  # nearlocal/subcommands.py


def entry_point_problems(tables: dict[str, dict[str, str]]) -> list[str]:
    """What breaks the rule above in pyproject.toml's `[project.entry-points]` tables."""
    problems = []
    for group, entries in tables.items():
        if not group.startswith("nearlocal"):
            continue  # another tool's group (pytest11): loaded by that tool, from outside
        if group not in ENTRY_POINT_GROUPS:
            problems.append(f"group {group}: no rule here (ENTRY_POINT_GROUPS)")
            continue
        lowest, highest = (LAYER_NAMED[name] for name in ENTRY_POINT_GROUPS[group])
        for name, value in entries.items():
            module = value.partition(":")[0].strip()
            if module not in all_modules():
                problems.append(f"{group}: {name} = {module}: no such module")
            elif not lowest <= LAYER_OF[unit_of(module)] <= highest:
                problems.append(f"{group}: {name} = {module} ({LAYERS[LAYER_OF[unit_of(module)]][0]})"
                                f" is outside {' .. '.join(ENTRY_POINT_GROUPS[group])}")
    return problems


def test_entry_points_plug_in_no_module_above_the_families():
    from nearlocal import plugins

    assert set(plugins.GROUPS) == set(ENTRY_POINT_GROUPS)
    pyproject = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    tables = pyproject["project"]["entry-points"]
    assert entry_point_problems(tables) == []
    assert entry_point_problems({"nearlocal.methods": {"99-pool": "nearlocal.engine.plan"}}) == [
        "nearlocal.methods: 99-pool = nearlocal.engine.plan (engine) is outside core .. families"]


def private_imports(source: str, module: str) -> list[str]:
    """`from nearlocal.X.y import _name` in `source` (the text of `module`) where X is another
    package: a name kept private to its package, used from outside it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.startswith("nearlocal.") and unit_of(node.module) != unit_of(module):
            found += [f"{module} imports {node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_crosses_a_package():
    """What two packages share is public in the lower one: a private name imported from another
    package is an interface nobody declared."""
    crossing = [line for path in sorted(ROOT.rglob("*.py"))
                for line in private_imports(path.read_text(), module_name(path))]
    assert crossing == [], "\n".join(crossing)
    assert private_imports("from nearlocal.regions.host import _fill, fill\n",
                           "nearlocal.gpu.regions") == [
        "nearlocal.gpu.regions imports nearlocal.regions.host._fill"]
    assert private_imports("from nearlocal.regions.host import _fill\n",
                           "nearlocal.regions.interleave") == []  # within its package


def face_imports(source: str, module: str) -> list[str]:
    """Imports of a family's face in `source`: a face is loaded by its entry-point group only."""
    return [f"{module} imports {name}" for name in sorted(imported_by(source, module))
            if unit_of(name).count(".") and unit_of(name) != unit_of(module)]


def test_a_face_is_loaded_by_its_group_only():
    """Nothing imports rack's report section, say: the report finds it by its entry point, so the
    family could drop it, or a plugin add its own, with no edit to the report."""
    found = [line for path in sorted(ROOT.rglob("*.py"))
             for line in face_imports(path.read_text(), module_name(path))]
    assert found == [], "\n".join(found)
    assert face_imports("from nearlocal.rack.report_section import section_rack\n",
                        "nearlocal.report.tables") == [
        "nearlocal.report.tables imports nearlocal.rack.report_section",
        "nearlocal.report.tables imports nearlocal.rack.report_section.section_rack"]


def test_a_family_may_not_import_its_own_face():
    """rack.methods importing rack.report_section is an upward import (families -> judging): the
    face is the family's, its layer is the report's."""
    source, module = "from nearlocal.rack import report_section\n", "nearlocal.rack.methods"
    targets = {unit_of(name) for name in imported_by(source, module)} - {unit_of(module)}
    assert targets == {"rack.report_section"}
    assert LAYER_OF["rack.report_section"] > LAYER_OF[unit_of(module)]
    assert unit_of("nearlocal.report.sections.summary") == "report"


# Compiled code lives in a kernels module (docs/architecture.md, kernels): nearlocal/kernels/
# (code several packages use, and what the probe measures with), or its family's `kernels.py`
# (or `kernels/` package). Modules still holding compiled code elsewhere, each to be moved:
COMPILED_NOT_YET_IN_KERNELS = {
    "nearlocal.dsa.intrinsics", "nearlocal.dsa.portal", "nearlocal.dsa.softqueue",
    "nearlocal.rpc.records", "nearlocal.rpc.slots", "nearlocal.rpc.sync",
}
COMPILERS = {"njit", "jit", "intrinsic", "vectorize", "guvectorize", "cfunc", "overload",
             "overload_method", "stencil"}


def compiled_functions(source: str) -> list[str]:
    """The functions `source` compiles with numba (numba.njit, cuda.jit, intrinsic, ...),
    decorated or wrapped (`njit(...)(f)`)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name in COMPILERS:
                    names.append(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Call):
            inner = node.func.func
            name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
            if name in COMPILERS:
                names.append(ast.unparse(node.args[0]) if node.args else "?")
    return names


def in_kernels_module(module: str) -> bool:
    return "kernels" in module.split(".")[1:]


def test_compiled_code_lives_in_kernels_modules():
    outside = {}
    for path in ROOT.rglob("*.py"):
        module = module_name(path)
        found = compiled_functions(path.read_text())
        if found and not in_kernels_module(module) and module not in COMPILED_NOT_YET_IN_KERNELS:
            outside[module] = found
    assert not outside, f"compiled code outside a kernels module: {outside}"
    moved = {m for m in COMPILED_NOT_YET_IN_KERNELS
             if not compiled_functions((ROOT.parent / (m.replace('.', '/') + '.py')).read_text())}
    assert not moved, f"no compiled code left: drop from COMPILED_NOT_YET_IN_KERNELS {moved}"


def test_the_kernels_rule_catches_a_compiled_function_elsewhere():
    source = ("from numba import njit, cuda\n@njit(cache=True)\ndef a(x):\n    return x\n"
              "@cuda.jit\ndef b(x):\n    pass\nc = numba.njit(nogil=True)(a)\n"
              "def plain(x):\n    return x\n")
    assert sorted(compiled_functions(source)) == ["a", "a", "b"]
    assert not in_kernels_module("nearlocal.rpc.slots")
    assert in_kernels_module("nearlocal.rack.kernels") and in_kernels_module("nearlocal.kernels.cpu")
