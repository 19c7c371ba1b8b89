"""A plugin (loaded through NEARLOCAL_PLUGINS) whose method really crashes the worker: the runner
must record the case as failed with the signal and carry on. Test-only; never shipped."""

from __future__ import annotations

import ctypes

from nearlocal.core.methods import Method, register_method


class _Crash:
    clock = "none"

    def __init__(self) -> None:
        self.info: dict = {}

    def sample(self, n):
        ctypes.string_at(0)  # SIGSEGV: a real invalid read, like a vanished dax mapping

    def close(self) -> None:
        pass


register_method(Method(
    cacheable=False,
    name="crash-segv", marker="cpu", summary="test only: dereferences NULL", accesses=("read",),
    state="-", open_session=lambda ctx: _Crash(),
))
