"""Where the registries find the modules that fill them, without naming any: entry-point groups.

A module that declares region kinds is listed in the group `nearlocal.region_kinds`; one that
declares methods (and the suites, pattern kinds and parts of other suites that go with them) in
`nearlocal.methods`. nearlocal's own families are listed in its pyproject.toml
(`[project.entry-points."nearlocal.methods"]`), a third party's in its own distribution's, so a
registry (regions/base.py, core/methods.py) loads "every module of its group" and names no
family: a load by name from a lower layer would make one import cycle of the packages.

A group's modules load in the order of their entry points' names, nearlocal's own first (an
installer may sort a table, so nearlocal's names start with their rank: `10-cpu`, `11-chase`).
The value names a module: importing it registers what it declares.

nearlocal's own table is read from the pyproject.toml beside the package when there is one (a
source tree: a checkout run with `python -m nearlocal`, or one installed editable whose metadata
was written before the table last changed), else from the installed distribution's metadata
(a wheel, where no pyproject.toml is shipped). The source tree's file is the truth for the code
beside it; metadata is a copy made at install time and may be stale or another tree's.

The upper groups (hops, report sections, commands) are loaded by the layer that uses them
(whatif, report, the command line), never by a worker: their modules may import that layer.

NEARLOCAL_PLUGINS (comma-separated module names) adds modules without a distribution. It is read
here once, for every registry: such a module may declare anything (a region kind, a method, a
suite, a section...), so it is imported after the region and method groups whichever registry
asks first, and the built-in entries keep their order. A third-party module that does not load
is bad input: one line.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TypeVar

Entry = TypeVar("Entry")


def declare(registry: dict[str, Entry], name: str, entry: Entry, what: str) -> Entry:
    """Every registry's one rule: an entry is declared once, by its name; a name declared twice
    (two plugins, or one and nearlocal) is a bug of the second, named."""
    if name in registry:
        raise ValueError(f"{what} {name!r} declared twice")
    registry[name] = entry
    return entry

REGION_GROUP = "nearlocal.region_kinds"  # modules that declare region kinds (regions/base.py)
METHOD_GROUP = "nearlocal.methods"  # modules that declare methods, suites, pattern kinds
# The upper layers' registries, whose modules may import the layer that loads them (a family's
# face: nearlocal/<family>/report_section.py ...; docs/architecture.md "What a family brings"):
HOP_GROUP = "nearlocal.serving_hops"  # hops and serving paths (whatif/paths.py)
SECTION_GROUP = "nearlocal.report_sections"  # the report's sections (report/registry.py)
COMMAND_GROUP = "nearlocal.commands"  # subcommands (nearlocal/subcommands.py)
LOW_GROUPS = (REGION_GROUP, METHOD_GROUP)  # lowest layer first: the order they load in
GROUPS = (*LOW_GROUPS, HOP_GROUP, SECTION_GROUP, COMMAND_GROUP)  # every group, lowest first
PLUGINS_ENV = "NEARLOCAL_PLUGINS"
DISTRIBUTION = "nearlocal"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

_loaded: set[str] = set()  # the groups loaded in this process, and PLUGINS_ENV once it was read


def own_modules(group: str) -> list[str]:
    """nearlocal's own modules in `group`, in the order of their entry points' names."""
    table = _source_tree_table()
    if table is not None:
        named = table.get(group, {})
    else:
        from importlib import metadata

        try:
            dist = metadata.distribution(DISTRIBUTION)
        except metadata.PackageNotFoundError:
            return []
        named = {entry.name: entry.module for entry in dist.entry_points if entry.group == group}
    return [named[name].partition(":")[0].strip() for name in sorted(named)]


def _source_tree_table() -> dict[str, dict[str, str]] | None:
    """The entry-point tables of the pyproject.toml beside the package; None where there is
    none (an installed wheel) or it is not nearlocal's."""
    import tomllib

    try:
        project = tomllib.loads(PYPROJECT.read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != DISTRIBUTION:
        return None
    return project.get("entry-points", {})


def installed_entry_points(group: str) -> list:
    """`group`'s entry points declared by other installed distributions (nearlocal's own come
    from own_modules, whose copy in the metadata may be stale)."""
    from importlib import metadata

    found = [entry for entry in metadata.entry_points(group=group)
             if entry.dist is None or _normalized(entry.dist.name) != DISTRIBUTION]
    return sorted(found, key=lambda entry: (entry.name, entry.value))


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def env_plugins() -> list[str]:
    """The modules NEARLOCAL_PLUGINS names, in its order."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_group(group: str) -> None:
    """Import every module of `group` once: nearlocal's own, then third parties'; then the
    NEARLOCAL_PLUGINS modules, if they were not loaded yet."""
    _load_group_only(group)
    load_env_plugins()


def _load_group_only(group: str) -> None:
    if group in _loaded:
        return
    _loaded.add(group)
    for module in own_modules(group):
        importlib.import_module(module)
    for entry in installed_entry_points(group):
        dist = entry.dist.name if entry.dist is not None else "?"
        _import_plugin(entry.module, f"{group}: entry point {entry.name!r} of {dist}")


def load_env_plugins() -> None:
    """The NEARLOCAL_PLUGINS modules, read once a process, imported after every group."""
    if PLUGINS_ENV in _loaded:
        return
    _loaded.add(PLUGINS_ENV)
    names = env_plugins()
    if names:  # the groups a worker loads too: an upper group loads only where it is used
        for group in LOW_GROUPS:
            _load_group_only(group)
    for name in names:
        _import_plugin(name, f"{PLUGINS_ENV}: plugin {name!r}")


def _import_plugin(module: str, what: str) -> None:
    """A third party's module. One that cannot be imported, or fails as it registers (a method
    declared twice...), is bad input: one line naming it (UsageError, exit 2)."""
    from nearlocal.errors import UsageError

    try:
        importlib.import_module(module)
    except Exception as exc:  # the plugin's own code: whatever it raises
        raise UsageError(f"{what} did not load: {type(exc).__name__}: {exc}") from exc
