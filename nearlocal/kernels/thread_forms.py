"""The methods with a multi-thread form (issue 14), as plain data: registering a method asks this
without compiling anything (kernels.parallel builds the threaded kernels from it, with numba,
when a run needs them). A method declares its form once, where it registers itself
(`cpu.threads.threaded(method, form)`); the built-in CPU methods' forms are listed here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadForm:
    """How a method runs on several threads. `reads`: its pass returns an xor to keep live.
    `warm`: one untimed load pass over the thread's share of src runs first (the method's warm
    state, as its single-thread kernel has it). `timed`: what one thread's interval contains.
    `body`: the pass, `body(src, dst, frags)` compiled nogil-safe (numba njit); None: the
    built-in pass of the method's name (kernels.cpu.PASSES)."""

    reads: bool
    warm: bool
    timed: str
    body: Callable | None = None


THREAD_FORMS: dict[str, ThreadForm] = {
    "load": ThreadForm(True, True, "64-byte vector loads of the thread's share, warm"),
    "store": ThreadForm(False, False, "64-byte vector stores to the thread's share, then mfence"),
    "nt-store": ThreadForm(False, False, "nontemporal stores to the thread's share, then sfence"),
    "nt-copy": ThreadForm(False, True, "loads (warm) and nontemporal stores of the thread's "
                                       "share, then sfence"),
    "memcpy": ThreadForm(False, True, "libc memcpy of the thread's share (source warm), then "
                                      "mfence"),
}


def register_thread_form(method: str, form: ThreadForm) -> None:
    """A method's multi-thread form, declared once (a second, different one is a bug)."""
    if THREAD_FORMS.get(method, form) != form:
        raise ValueError(f"method {method!r} already has a thread form")
    THREAD_FORMS[method] = form
