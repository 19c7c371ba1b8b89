"""Start-up: `nearlocal --help`, `--version` and `probe` import no heavy library they do not use
(issue 19). The heavy ones load at first use (nearlocal.lazy); nothing here times anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numba", "scipy", "pandas", "matplotlib")
# Runs the CLI in a fresh interpreter, then prints which heavy libraries sys.modules holds.
CHILD = """
import sys
from nearlocal.frontends.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
print("\\nHEAVY:" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def heavy_imports(*argv: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHILD.format(heavy=HEAVY), *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    line = [text for text in done.stderr.splitlines() if text.startswith("HEAVY:")]
    assert line, done.stderr
    return [name for name in line[-1][len("HEAVY:"):].split(",") if name]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"]])
def test_help_and_version_import_no_heavy_library(argv):
    assert heavy_imports(*argv) == []


def test_probe_imports_no_heavy_library():
    # probe lists every method x region: registering the methods compiles nothing
    assert heavy_imports("probe") == []


def test_lazy_import_loads_on_first_attribute_only():
    from nearlocal.lazy import lazy_import

    name = "json.tool"  # a stdlib module this test process has not imported
    sys.modules.pop(name, None)
    module = lazy_import(name)
    assert name not in sys.modules
    assert callable(module.main)
    assert name in sys.modules and module.main is sys.modules[name].main
