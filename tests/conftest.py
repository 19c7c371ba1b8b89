"""Shared test setup."""

from __future__ import annotations

import os

import pytest

try:  # tests assert behaviour, never timing: no example is failed for taking long on a busy box
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("nearlocal", deadline=None)
    _hypothesis_settings.load_profile("nearlocal")
except ImportError:  # the test extra brings it; a test that needs it says so
    pass


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


@pytest.fixture
def batch_driver(monkeypatch):
    """cuMemcpyBatchAsync stood in for by a copy that reads the pointer arrays as the driver
    would (the simulated GPU's memory is host memory)."""
    import ctypes

    import numpy as np

    from nearlocal.gpu import copy_sessions

    def driver(dsts, srcs, sizes, count, attrs, idx, num_attrs, fail, stream):
        read = lambda p: np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(p))  # noqa: E731
        for d, s, n in zip(read(dsts), read(srcs), read(sizes), strict=True):
            ctypes.memmove(int(d), int(s), int(n))
        return 0

    monkeypatch.setattr(copy_sessions, "driver_memcpy_batch", lambda: (driver, None))
