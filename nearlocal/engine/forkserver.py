"""Preloaded by the runner's worker fork server, once per run: what each worker process would
otherwise import and initialize again (numpy, numba's CPU target, the built-in method modules,
the timer kernel (loaded, not calibrated: the run's clock is calibrated once, in the
parent) and the host probes' chase kernels, ~1.5 s on the 2-vCPU VM), so a pass's fresh
worker (and the run's host prober) is forked ready in ~0.1 s. Nothing here keeps memory mapped
(the 4 KiB ring that loads the chase kernels is unmapped), starts a thread, or touches CUDA or
MPI: a forked child must be able to do all of those itself. Plugins (NEARLOCAL_PLUGINS) load in
the child, from the environment the runner hands it (worker.Origin)."""

from __future__ import annotations

import contextlib
import importlib

from nearlocal.engine.children import ignore_interrupts

ignore_interrupts()  # launched with SIGINT held (children.py): Ctrl-C is the runner's

from nearlocal.plugins import METHOD_GROUP, own_modules  # noqa: E402

for _module in own_modules(METHOD_GROUP):  # nearlocal's own: a third party's loads in the child
    with contextlib.suppress(Exception):  # the worker imports it again and reports the error
        importlib.import_module(_module)

with contextlib.suppress(Exception):
    from nearlocal.kernels.timer import empty_intervals

    empty_intervals(16)  # numba's CPU target and the timer kernel, loaded from numba's cache

with contextlib.suppress(Exception):
    from nearlocal.engine.stability.hostprobe import load_kernels

    load_kernels()  # the chase kernels the host probes walk (engine/stability/hostprobe.py)
