"""Shared test setup."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _plain_environment_for_children(monkeypatch):
    """What every process a test starts inherits. pytest-xdist (scripts/test.sh runs two
    workers) marks each worker's environment (PYTEST_XDIST_WORKER): pytest-benchmark then
    disables itself in the pytest sessions the tests start, as under xdist; they get none of it.
    Those sessions leave hypothesis' plugin out (~1 s each where it is installed; no test of
    theirs uses it)."""
    for name in [name for name in os.environ if name.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_ADDOPTS",
                       f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:hypothesispytest".strip())


@pytest.fixture
def fake_cupy(monkeypatch):
    """The simulated GPU (tests/gpu_fakecupy.py) as the `cupy` every import gets."""
    import sys

    from tests.gpu_fakecupy import make_fake_cupy

    cp = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return cp
