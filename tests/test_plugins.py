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


# A third party's distribution, as pip would install it: its modules and a *.dist-info naming
# them in nearlocal's entry-point groups. Nothing of nearlocal is edited or told about it.
DEMO_REGIONS = (Path(__file__).parent / "plugin_region.py").read_text().replace(
    '"scratch"', '"demoscratch"')  # tests/plugin_region.py's kind, renamed: a distribution's own
DEMO_METHODS = '''
from dataclasses import replace

from nearlocal.core.cases import Case
from nearlocal.core.methods import get_method, register_method
from nearlocal.core.suites import Suite, register_suite

register_method(replace(get_method("load"), name="demo-load", suites=(), pool_roles=frozenset(),
                        summary="load, as an installed plugin's method"))
register_suite(Suite("demo", "an installed plugin's suite",
                     [lambda: [Case("demo-load", "demoscratch", "wb", "4KiB")]]))
'''

# Its upper-layer modules: each imports the layer whose registry it fills, and is loaded only there
# (the report, whatif, the command line), never by a worker.
DEMO_SECTION = '''
from nearlocal.report.document import Section
from nearlocal.report.registry import register_frames_section


def section_demo(runs, frames):
    section = Section("demo", "Demo — an installed plugin's section", "Rows of demo-load.")
    count = sum(int((df["method"] == "demo-load").sum()) for df in frames)
    section.notes.append(f"demo-load rows: {count}")
    return section


register_frames_section("demo", 9001, section_demo)
'''
DEMO_HOPS = '''
from nearlocal.whatif.paths import LOCAL, Hop, ServingPath, register_hop, register_serving_path

register_hop(Hop("demo-link", "a plugin's link -> host DRAM", frozenset({"cpu"}),
                 frozenset({"demo"}), LOCAL))
register_serving_path(ServingPath("demo-path", "KV over a plugin's link",
                                  (("demo-link", "host->gpu"),)))
'''
DEMO_COMMAND = '''
from nearlocal.subcommands import RunMode, register_command, register_run_mode


def _hello(args):
    from nearlocal.core.methods import load_methods

    print(f"demo says hello to {args.name}; demo-load declared: {'demo-load' in load_methods()}")
    return 0


def register(subparsers):
    parser = subparsers.add_parser("demo-hello", help="an installed plugin's command")
    parser.add_argument("name")
    parser.set_defaults(func=_hello)


register_command("demo-hello", register)


# another way `nearlocal run` runs, as rack's MPI job is one: active when its launcher says so;
# a selection holding demo-load outside it is bad input
def _active():
    import os

    return os.environ.get("NEARLOCAL_DEMO_LAUNCHER") == "1"


def _run(args):
    print(f"demo mode runs suite {args.suite}, methods {args.method}")
    return 0


def _refuse(cases, inventory):
    import os

    from nearlocal.errors import UsageError

    if "DEMO_STRICT" in os.environ and any(case.method == "demo-load" for case in cases):
        raise UsageError("demo-load runs only under the demo launcher (NEARLOCAL_DEMO_LAUNCHER=1)")


register_run_mode(RunMode("demo-mode", _active, _run, _refuse))
'''
DEMO_MODULES = {"regions": DEMO_REGIONS, "methods": DEMO_METHODS, "section": DEMO_SECTION,
                "hops": DEMO_HOPS, "command": DEMO_COMMAND}
DEMO_GROUPS = {"region_kinds": "regions", "methods": "methods", "report_sections": "section",
               "serving_hops": "hops", "commands": "command"}


def _demo_distribution(root: Path) -> Path:
    root.mkdir()
    for name, text in DEMO_MODULES.items():
        (root / f"nearlocal_demo_{name}.py").write_text(text)
    info = root / "nearlocal_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nearlocal-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[nearlocal.{group}]\ndemo = nearlocal_demo_{module}\n\n"
        for group, module in DEMO_GROUPS.items()))
    return root


def _nearlocal(args: list[str], plugin_path: Path, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plugin_path), **env_vars}
    env.pop("NEARLOCAL_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "nearlocal", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_an_installed_distribution_adds_a_method_a_region_kind_and_a_suite(tmp_path):
    """Its entry points are all it takes: probe lists its region and method, `run --help` its
    suite, and a run of its suite measures its method on its region in a worker process."""
    import json

    path = _demo_distribution(tmp_path / "site")
    probed = _nearlocal(["probe", "--json"], path)
    assert probed.returncode == 0, probed.stderr
    listed = json.loads(probed.stdout)
    assert {"region": "demoscratch", "mappable": True, "reason": ""} in listed["regions"]
    assert any(row["method"] == "demo-load" and row["region"] == "demoscratch" and row["runnable"]
               for row in listed["availability"])
    helped = _nearlocal(["run", "--help"], path)
    words = " ".join(helped.stdout.split())  # argparse wraps the help
    assert helped.returncode == 0 and "demo = an installed plugin's suite" in words
    assert "demo-load" in words and "demoscratch" in words
    ran = _nearlocal(["run", "--suite", "demo", "--budget", "0.02", "--processes", "1", "--quiet",
                      "--out", str(tmp_path / "store")], path)
    assert ran.returncode == 0, ran.stderr
    from nearlocal.store import load

    (row,) = load("latest", tmp_path / "store").cases.to_dict("records")
    assert (row["method"], row["region"], row["status"]) == ("demo-load", "demoscratch", "ok")


def test_an_installed_distribution_adds_a_command_a_report_section_and_a_serving_hop(tmp_path):
    """The same distribution's upper-layer modules: `--help` lists its command and the command
    runs; `run` runs in its run mode under its launcher and refuses what needs the mode outside
    it; the report renders its section; whatif's paths hold its path and hop. Nothing of
    nearlocal names them."""
    import json

    from tests.report_fixtures import make_run, row

    path = _demo_distribution(tmp_path / "site")
    helped = _nearlocal(["--help"], path)
    assert helped.returncode == 0 and "demo-hello" in helped.stdout
    assert "an installed plugin's command" in " ".join(helped.stdout.split())
    said = _nearlocal(["demo-hello", "world"], path)
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == "demo says hello to world; demo-load declared: True"
    make_run(tmp_path / "store", [row("load", "dram"), row("load", "numa:1")])
    report = _nearlocal(["report", "--out", str(tmp_path / "store"), "--markdown",
                         str(tmp_path / "report.md"), "--quiet"], path)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report.md").read_text()
    assert "Demo — an installed plugin's section" in text and "demo-load rows: 0" in text
    launched = _nearlocal(["run", "--suite", "demo", "--method", "demo-load"], path,
                          NEARLOCAL_DEMO_LAUNCHER="1")  # its run mode: nothing measured here
    assert launched.returncode == 0, launched.stderr
    assert launched.stdout.strip() == "demo mode runs suite demo, methods ['demo-load']"
    refused = _nearlocal(["run", "--suite", "demo", "--budget", "0.02", "--out",
                          str(tmp_path / "refused")], path, DEMO_STRICT="1")
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "demo-load runs only under the demo launcher (NEARLOCAL_DEMO_LAUNCHER=1)"), refused.stderr
    asked = _nearlocal(["whatif", "--out", str(tmp_path / "store"), "--reference", "h100-sxm",
                        "--json"], path)
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    (demo,) = [p for p in answer["paths"] if p["path"] == "demo-path"]
    assert "demo-link" in json.dumps(demo)


def test_an_installed_plugin_that_does_not_load_is_one_line_naming_it(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    (root / "nearlocal_broken.py").write_text("raise RuntimeError('broken at import')\n")
    info = root / "nearlocal_broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nearlocal-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[nearlocal.methods]\nbroken = nearlocal_broken\n")
    done = _nearlocal(["run", "--method", "load", "--size", "4KiB", "--out", str(tmp_path / "s")],
                      root)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert ("nearlocal.methods: entry point 'broken' of nearlocal-broken did not load: "
            "RuntimeError: broken at import") in done.stderr
    assert not (tmp_path / "s").exists()
