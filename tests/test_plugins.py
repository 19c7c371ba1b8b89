"""The registries find their modules through entry-point groups (nearlocal/plugins.py): nearlocal's
own from the pyproject.toml beside the package (a checkout, an editable install whose metadata is
stale) or from an installed wheel's metadata; NEARLOCAL_PLUGINS is read once for both registries."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from nearlocal import plugins

ROOT = Path(__file__).resolve().parent.parent


def test_the_source_trees_table_is_what_the_registries_load():
    """In a checkout the table comes from its pyproject.toml (the venv's metadata may be another
    tree's or older): every module it lists exists, in the order of the names' ranks."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for group in plugins.GROUPS:
        listed = plugins.own_modules(group)
        assert listed == [table[group][name] for name in sorted(table[group])]
        assert listed and all(importlib.util.find_spec(module) for module in listed)
    assert plugins.own_modules(plugins.METHOD_GROUP)[0] == "nearlocal.cpu.methods"


def test_an_installed_wheel_reads_its_own_table_from_its_metadata(tmp_path, monkeypatch):
    """No pyproject.toml beside the package (a wheel ships none): the distribution's metadata."""
    info = tmp_path / "nearlocal-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nearlocal\nVersion: 9.9\n")
    (info / "entry_points.txt").write_text("[nearlocal.methods]\n20-b = x.b\n10-a = x.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "PYPROJECT", tmp_path / "pyproject.toml")
    assert plugins.own_modules(plugins.METHOD_GROUP) == ["x.a", "x.b"]
    assert plugins.own_modules(plugins.REGION_GROUP) == []


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_a_plugins_region_kind_exists_before_any_method_is_looked_up():
    """NEARLOCAL_PLUGINS is read by both registries: a region lookup alone loads the plugin, and
    the built-in methods still come first (the plugin loads after every group)."""
    done = _python("import sys\n"
                   "from nearlocal.regions import parse_region\n"
                   "from nearlocal.core.methods import METHODS, load_methods\n"
                   "print(parse_region('scratch').kind)\n"
                   "print(list(load_methods())[0], list(METHODS)[-1])\n",
                   NEARLOCAL_PLUGINS="tests.plugin_region,tests.plugin_method")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["scratch", "load", "unwarmed-load"]
