"""How a method runs on several threads (issue 14), as plain data the threaded kernels are built
from (kernels.parallel, with numba, when a run needs them). A method declares its form once,
where it registers itself (`cpu.threads.threaded(method, form)`, which keeps the registry of
forms by method): this layer knows no method, only the form it is handed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadForm:
    """How a method runs on several threads. `reads`: its pass returns an xor to keep live.
    `warm`: one untimed load pass over the thread's share of src runs first (the method's warm
    state, as its single-thread kernel has it). `timed`: what one thread's interval contains.
    `body`: a function of no arguments returning the pass, `pass(src, dst, frags)` compiled
    nogil-safe (numba njit): called only when a run needs the kernel, so declaring a form
    imports no numba."""

    reads: bool
    warm: bool
    timed: str
    body: Callable[[], Callable]
