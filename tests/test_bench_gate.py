"""`pytest bench/ --nearlocal-baseline RUN`: a pytest session judged by nearlocal compare's model
(pytester subprocesses with a test-double method), and every pytest recipe in the README run
twice on unchanged code."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy.fft  # noqa: F401
import pandas.core.arrays.arrow.extension_types  # noqa: F401
import pytest
import scipy.stats  # noqa: F401

from nearlocal.core.methods import load_methods
from nearlocal.store import load

pytest_plugins = ["pytester"]
# The method registry is loaded here, before pytester snapshots sys.modules (what a test imports
# is dropped after it: numpy's extensions, scipy.stats' through compare, cannot load twice, and
# the registry would keep methods of modules gone), and before a test names a plugin that only its
# pytester subprocess can import (NEARLOCAL_PLUGINS): load() in this process must not import it.
load_methods()

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

# A test double registered only inside the pytester subprocess: ten cases whose samples sit
# around fixed levels with 1% noise, times FAKE_SCALE (a real change, as the gate sees one).
FAKE_METHOD = '''
import os

import numpy as np

from nearlocal.core.cases import Case
from nearlocal.core.methods import Method, register_method
from nearlocal.core.suites import Suite, register_suite

SIZES = ["1KiB", "2KiB", "4KiB", "8KiB", "16KiB", "32KiB", "64KiB", "128KiB", "256KiB", "512KiB"]


class LevelSession:
    clock = "fake"

    def __init__(self, ctx):
        self.info = {}
        self.level = 1000.0 * ctx.pattern.total_bytes / 1024 * float(os.environ.get("FAKE_SCALE", "1"))
        self.rng = np.random.default_rng()

    def sample(self, n):
        ns = self.level * self.rng.lognormal(0, 0.01, n)
        return ns.copy(), ns

    def close(self):
        pass


register_method(Method(name="fake-level", marker="cpu", summary="test double", accesses=("read",),
                       state="-", cacheable=False, open_session=LevelSession))
register_suite(Suite("fakegate", "ten test-double cases",
                     [lambda: [Case("fake-level", "dram", "wb", s) for s in SIZES]]))
'''


@pytest.fixture
def bench_dir(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    pytester.makepyfile(test_cpu=(BENCH / "test_cpu.py").read_text())
    pytester.makepyfile(fake_gate_method=FAKE_METHOD)
    monkeypatch.setenv("NEARLOCAL_PLUGINS", "fake_gate_method")
    return pytester


def _session(bench_dir: pytest.Pytester, *extra: str) -> pytest.RunResult:
    return bench_dir.runpytest_subprocess(
        "--nearlocal-suite", "fakegate", "--benchmark-max-time", "0.02", "-p", "no:cacheprovider",
        "--nearlocal-out", "store", *extra)


def test_a_slower_session_fails_with_the_summary_line_and_the_slower_cases(bench_dir,
                                                                           monkeypatch):
    first = _session(bench_dir, "--nearlocal-save")
    first.assert_outcomes(passed=10)
    stored = load("latest:bench", bench_dir.path / "store")
    assert stored.meta["kind"] == "bench" and len(stored.cases) == 10
    assert (stored.cases["status"] == "ok").all() and not stored.samples.empty

    same = _session(bench_dir, "--nearlocal-baseline", "latest:bench")
    assert same.ret == 0
    same.stdout.fnmatch_lines(["*nearlocal gate*", "code CI, unpaired*", "0 slower*"])

    monkeypatch.setenv("FAKE_SCALE", "1.5")
    slow = _session(bench_dir, "--nearlocal-baseline", "latest:bench", "--nearlocal-mode", "box")
    slow.stdout.fnmatch_lines(["*nearlocal gate*", "box CI: *"])
    assert slow.ret == 1
    out = slow.stdout.str()
    assert "Traceback" not in out and "PerformanceRegression" not in out
    assert len(re.findall(r"^SLOWER fake-level/dram/wb/\S+: 1\.[45]\d\dx", out, re.M)) == 10
    slow.stdout.fnmatch_lines(["*10 passed*10 slower (nearlocal gate)*"])


def test_a_missing_baseline_is_a_usage_error_before_measuring(bench_dir):
    result = _session(bench_dir, "--nearlocal-baseline", "latest:bench")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nearlocal-baseline: no runs in store*"])
    assert "passed" not in result.stdout.str()


# ---------------------------------------------------------------- the README's pytest recipes


def readme_pytest_recipes() -> list[str]:
    text = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()
            if line.strip().startswith("pytest ")]


# two cases by node id (a -k expression matched eight: nt-load, clflush-load... too), a tiny budget
SELECTION = [f"{BENCH / 'test_cpu.py'}::test_cpu[load-dram-wb-{size}]" for size in ("4KiB", "16KiB")]
QUICK = ["--benchmark-max-time", "0.01", "-q", "-p", "no:cacheprovider"]


def _shortened(command: str) -> list[list[str]]:
    """The recipe's commands, each on a two-case selection with a tiny budget."""
    steps = []
    for part in command.split("&&"):
        argv = shlex.split(part)
        if argv[0] == "pytest":
            kept, skip = [], False
            for arg in argv[1:]:
                if skip:
                    skip = False
                    continue
                if arg in ("-k", "--benchmark-max-time"):
                    skip = True
                    continue
                kept.extend(SELECTION if arg == "bench/" else [arg])
            steps.append([sys.executable, "-m", "pytest", *kept, *QUICK])
        else:
            steps.append([str(Path(sys.executable).parent / argv[0]), *argv[1:]])
    return steps


def test_the_readme_has_pytest_recipes():
    recipes = readme_pytest_recipes()
    assert any("--nearlocal-baseline" in r for r in recipes)
    assert not any("--benchmark-compare-fail" in r for r in recipes)


@pytest.mark.slow  # ten pytest sessions, each importing numba and probing the box
def test_every_readme_pytest_recipe_passes_twice_on_unchanged_code(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("NEARLOCAL_PLUGINS", None)
    for attempt in (1, 2):
        for recipe in readme_pytest_recipes():
            for argv in _shortened(recipe):
                done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True,
                                      text=True, timeout=300)
                assert done.returncode == 0, (attempt, recipe, done.stdout[-2000:],
                                              done.stderr[-2000:])
                assert "Traceback" not in done.stdout + done.stderr
