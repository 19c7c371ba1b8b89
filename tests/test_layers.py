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
name (`_x`) crosses a package, in nearlocal/ or scripts/ (one package of its own): imported, read
off another package's module or object, or a base class's private hook overridden."""

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
              '    return lazy_import("nearlocal.store.reader")\n')
    assert imported_by(source, "nearlocal.core.example") == {
        "nearlocal.lazy", "nearlocal.lazy.lazy_import", "nearlocal.cpu.methods",
        "nearlocal.engine.plan", "nearlocal.store.reader"}


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


SCRIPTS = ROOT.parent / "scripts"


def package_of(module: str) -> str:
    """The unit a private name stays in: nearlocal's (unit_of), or scripts/, a package of its own."""
    return "scripts" if module.split(".")[0] == "scripts" else unit_of(module)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bindings(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Each name the module's imports bind -> the dotted name it stands for."""
    package = module if is_package else module.rsplit(".", 1)[0]
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _defined(node: ast.AST) -> set[str]:
    """The private names `node` defines: functions, classes, assigned names and attributes
    (`self._x = ...`), names its imports bind."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(sub.name)
        elif isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
                names |= {t.attr for t in ast.walk(target) if isinstance(t, ast.Attribute)}
        elif isinstance(sub, ast.Import | ast.ImportFrom):
            names |= {a.asname or a.name.split(".")[0] for a in sub.names}
    return {name for name in names if is_private(name)}


def _private_uses(tree: ast.AST) -> list[tuple[ast.AST, ast.expr, str]]:
    """(node, object, name) for each `object._name`, and each getattr / setattr / hasattr /
    delattr of a private name given as a string."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            uses.append((node, node.value, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and is_private(node.args[1].value):
            uses.append((node, node.args[0], node.args[1].value))
    return uses


def private_crossings(sources: dict[str, str]) -> list[str]:
    """Private names (`_x`, dunders aside) used across packages in `sources` (module -> text):
    1. `from nearlocal.X.y import _name` from another package;
    2. `mod._name` where `mod` is bound to a module of another package;
    3. in a class with an ancestor from another package (resolved through the imports), a
       private member of that ancestor used (`self._x`) or overridden (`def _x`): its hooks;
    4. any other `obj._name` (or getattr(obj, "_name")) where `_name` is defined in no module of
       the user's package but in one of another's: the object can only be that package's.
    A private name of a library outside these sources (os._exit, a namedtuple's _replace) is not
    this rule's: it crosses no package of ours."""
    trees = {module: ast.parse(text) for module, text in sources.items()}
    bound = {module: _bindings(tree, module, module in {m.rsplit(".", 1)[0] for m in trees})
             for module, tree in trees.items()}
    owners: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for name in _defined(tree):
            owners.setdefault(name, set()).add(package_of(module))
    classes = {f"{module}.{node.name}": node for module, tree in trees.items()
               for node in tree.body if isinstance(node, ast.ClassDef)}

    def resolve(module: str, base: ast.expr) -> str | None:
        if isinstance(base, ast.Name):
            target = f"{module}.{base.id}" if f"{module}.{base.id}" in classes \
                else bound[module].get(base.id)
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            target = f"{bound[module].get(base.value.id)}.{base.attr}"
        else:
            return None
        return target if target in classes else None

    def ancestors(name: str, met: frozenset[str] = frozenset()) -> list[str]:
        parents = []
        for base in classes[name].bases:
            parent = resolve(name.rsplit(".", 1)[0], base)
            if parent is not None and parent not in met:
                parents += [parent, *ancestors(parent, met | {parent})]
        return parents

    found: list[tuple[str, int, str]] = []  # (module, line, what)
    seen: set[int] = set()  # uses reported through a class's ancestry
    for name, node in classes.items():
        module = name.rsplit(".", 1)[0]
        foreign = {}
        for parent in ancestors(name):
            if package_of(parent) != package_of(module):
                foreign |= {member: parent for member in _defined(classes[parent])}
        for sub in node.body:
            for member in _defined(sub) & set(foreign) if isinstance(
                    sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | ast.AnnAssign) else ():
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef) and sub.name != member:
                    continue  # a method's own locals
                found.append((module, sub.lineno, f"overrides {foreign[member]}.{member}"))
        for use, obj, attr in _private_uses(node):
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls") and attr in foreign:
                found.append((module, use.lineno, f"uses {foreign[attr]}.{attr}"))
                seen.add(id(use))
    for module, tree in trees.items():
        here = package_of(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                    and node.module in trees and package_of(node.module) != here:
                found += [(module, node.lineno, f"imports {node.module}.{alias.name}")
                          for alias in node.names if is_private(alias.name)]
        for use, obj, attr in _private_uses(tree):
            if id(use) in seen:
                continue
            target = ast.unparse(obj)
            target = bound[module].get(target, target)
            if target in trees:  # a module of ours: whose package it is decides
                if package_of(target) != here:
                    found.append((module, use.lineno, f"uses {target}.{attr}"))
            elif owners.get(attr) and here not in owners[attr]:
                found.append((module, use.lineno, f"uses {ast.unparse(obj)}.{attr}, private to "
                             + ", ".join(sorted(owners[attr]))))
    return [f"{module}:{line} {text}" for module, line, text in sorted(found)]


@cache
def checked_sources() -> dict[str, str]:
    """nearlocal's modules and scripts/' (scripts.NAME)."""
    return {module_name(path): path.read_text()
            for path in sorted(ROOT.rglob("*.py")) + sorted(SCRIPTS.rglob("*.py"))}


def test_no_private_name_crosses_a_package():
    """What two packages share is public in the lower one: a private name used from another
    package (imported, read off its module or object, or a base class's hook overridden) is an
    interface nobody declared. scripts/ counts as one package: it uses nearlocal's public names."""
    crossing = private_crossings(checked_sources())
    assert len(crossing) == 0, "\n".join(crossing)


BAD = {
    "nearlocal.regions.host": "_CACHE = {}\n"
                              "def _fill(region): ...\n"
                              "class Region:\n"
                              "    def _hook(self): ...\n"
                              "    def open(self):\n"
                              "        self._handle = 1\n",
    "nearlocal.regions.interleave": "from nearlocal.regions import host\n"
                                    "from nearlocal.regions.host import _fill\n"
                                    "host._CACHE.clear()\n",  # within its package: fine
    "nearlocal.gpu.regions": "from nearlocal.regions import host\n"
                             "from nearlocal.regions.host import Region, _fill, fill\n"
                             "import nearlocal.regions.host as h\n"
                             "host._CACHE.clear()\n"
                             "h._fill(None)\n"
                             "class GpuRegion(Region):\n"
                             "    def _hook(self):\n"
                             "        return self._handle\n"
                             "    def _own(self):\n"
                             "        return self._own_state\n"
                             "def close(region):\n"
                             "    os._exit(getattr(region, '_handle'))\n",
    "scripts.check": "from nearlocal.gpu import regions\n"
                     "def look(region):\n"
                     "    return region._handle, region._unknown, regions.__name__\n",
}


def test_the_private_name_check_fails_on_a_bad_example():
    """Every form of crossing the check knows, fed to it in a tiny tree of its own; a package's
    use of its own private names, a dunder and a library's private name (os._exit) pass."""
    assert private_crossings(BAD) == [
        "nearlocal.gpu.regions:2 imports nearlocal.regions.host._fill",
        "nearlocal.gpu.regions:4 uses nearlocal.regions.host._CACHE",
        "nearlocal.gpu.regions:5 uses nearlocal.regions.host._fill",
        "nearlocal.gpu.regions:7 overrides nearlocal.regions.host.Region._hook",
        "nearlocal.gpu.regions:8 uses nearlocal.regions.host.Region._handle",
        "nearlocal.gpu.regions:12 uses region._handle, private to regions",
        "scripts.check:3 uses region._handle, private to regions"]


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
# (or `kernels/` package).
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
        if found and not in_kernels_module(module):
            outside[module] = found
    assert not outside, f"compiled code outside a kernels module: {outside}"


def test_the_kernels_rule_catches_a_compiled_function_elsewhere():
    source = ("from numba import njit, cuda\n@njit(cache=True)\ndef a(x):\n    return x\n"
              "@cuda.jit\ndef b(x):\n    pass\nc = numba.njit(nogil=True)(a)\n"
              "def plain(x):\n    return x\n")
    assert sorted(compiled_functions(source)) == ["a", "a", "b"]
    assert not in_kernels_module("nearlocal.rpc.slots")
    assert in_kernels_module("nearlocal.rack.kernels") and in_kernels_module("nearlocal.kernels.cpu")
    assert in_kernels_module("nearlocal.rpc.kernels.slots")


# One spin-wait with a deadline (kernels/spin.py's spin_until): a loop that pauses and reads the
# clock in its own body (not only in its condition: that is a delay until a time, as the replay's
# movers wait for a request's arrival) is one more. There is none (the record store's reader
# once kept its own; its wait now goes through spin_until):
SPIN_LOOPS_ELSEWHERE: set[tuple[str, str]] = set()
CLOCK_READS = {"tsc_end", "tsc_begin", "tsc_begin_nodrain", "deadline_passed"}


def _calls_of_loop(loop: ast.While | ast.For) -> set[str]:
    """The functions a loop's body calls itself, not through a loop nested in it."""
    names, stack = set(), [*loop.body, *loop.orelse]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.While, ast.For, ast.FunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            target = node.func
            names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
        stack.extend(ast.iter_child_nodes(node))
    return names


def spin_loops(source: str) -> set[str]:
    """The functions of `source` holding a spin-wait with a deadline of their own."""
    found = set()
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef):
            for loop in ast.walk(function):
                if isinstance(loop, (ast.While, ast.For)):
                    calls = _calls_of_loop(loop)
                    if "pause" in calls and calls & CLOCK_READS:
                        found.add(function.name)
    return found


def test_one_spin_wait_with_a_deadline():
    found = {(module_name(path), name) for path in ROOT.rglob("*.py")
             for name in spin_loops(path.read_text())}
    assert found - {("nearlocal.kernels.spin", "spin_until")} == SPIN_LOOPS_ELSEWHERE


def test_the_spin_rule_catches_a_retry_loop_and_spares_a_delay():
    retry = ("def submit(push, portal, desc, timeout):\n"  # dsa's submit before spin_until
             "    while push(portal, desc) != 0:\n"
             "        if retries == 0:\n            start = tsc_end()\n"
             "        retries += 1\n"
             "        if (retries & 1023) == 0 and tsc_end() - start > timeout:\n"
             "            return GAVE_UP\n"
             "        pause()\n")
    delay = ("def serve(n, arrivals):\n    while True:\n        due = arrivals[0]\n"
             "        while tsc_end() < due:\n            pause()\n        t0 = tsc_begin()\n")
    assert spin_loops(retry) == {"submit"}
    assert spin_loops(delay) == set()
