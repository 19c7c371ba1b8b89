"""Shared test setup."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _plain_environment_for_children(monkeypatch):
    """pytest-xdist (scripts/test.sh runs two workers) marks each worker's environment
    (PYTEST_XDIST_WORKER), and every process a test starts inherits it: pytest-benchmark then
    disables itself in the pytest sessions the tests start, as under xdist. They get none of it."""
    for name in [name for name in os.environ if name.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
