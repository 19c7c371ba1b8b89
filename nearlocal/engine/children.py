"""Child processes that never turn a Ctrl-C into a traceback, and a parent that never loses one.

Ctrl-C reaches the whole process group; the runner is the one that handles it: it stops its
children and stores what was measured. The parent never ignores SIGINT, not even for a moment:
it only holds it (blocks it in its main thread) while a child starts, so a Ctrl-C meanwhile stays
pending and is raised right after. The fork server is launched inside that hold and inherits
SIGINT blocked across exec; its preload (engine/forkserver.py) ignores SIGINT before anything
else, so neither it nor a worker it forks can be interrupted. Ignoring SIGINT in the parent
around a start, as before, lost a Ctrl-C (a run then ended with exit 0): Python raises `OSError:
Signal 2 ignored due to race condition` for a signal caught just before, which multiprocessing's
own `except OSError` swallowed; and the resource tracker's start unblocks SIGINT (bpo-33613).
SIGTERM (which the front end turns into an interrupt too) is held the same way: a SIGTERM that
ended the parent between the fork server's fork and the parent's write of the new process's
pickled start-up data left that process to die of `EOFError: Ran out of input`, a traceback."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

HELD = frozenset({signal.SIGINT, signal.SIGTERM})  # the signals the front end interrupts on
# The interrupts the front end's signal handlers raised in this command that no handler of ours
# has seen yet (raising_interrupt, interrupt_seen, raise_lost_interrupt)
_RAISED: list[type[BaseException]] = []


def raising_interrupt(kind: type[BaseException]) -> BaseException:
    """A signal handler's exception, remembered until a handler of ours sees it: C code can clear
    an exception raised in Python code it called without a word (CPython's PyErr_Clear paths;
    the printed ones reach resend_swallowed), and the command then ran on to exit 0 as if never
    signalled. raise_lost_interrupt raises it again."""
    _RAISED.append(kind)
    return kind()


def interrupt_seen() -> None:
    """An interrupt reached a handler of ours (or a new command starts): nothing is lost."""
    _RAISED.clear()


def raise_lost_interrupt() -> None:
    """Raise again an interrupt that a signal handler raised and no handler of ours saw: the
    runner calls this between cases, where stopping is clean."""
    if _RAISED:
        kind = _RAISED[-1]
        _RAISED.clear()
        raise kind()


# How long a swallowed signal waits to be sent again: for the hook that sends it to return
RESEND_S = 0.05


@contextlib.contextmanager
def _interrupts_held() -> Iterator[bool]:
    """Yields whether a Ctrl-C (or SIGTERM) is already waiting; it is raised when the hold
    ends."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield bool(HELD & signal.sigpending())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_fork_server() -> None:
    """Launch multiprocessing's fork server (its preload set beforehand) with SIGINT blocked."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # first: its start unblocks SIGINT, which ends a hold
    with _interrupts_held() as waiting:
        if not waiting:  # a waiting Ctrl-C is raised as the hold ends: nothing is started
            forkserver.ensure_running()


def start_child(process) -> None:
    """process.start() with SIGINT held: a Ctrl-C meanwhile is raised once it has started."""
    with _interrupts_held():
        process.start()


def ignore_interrupts() -> None:
    """In a child: Ctrl-C is the parent's to handle (then SIGINT and SIGTERM, inherited held,
    are let go: the parent stops a worker with SIGTERM)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def resend_swallowed(previous: Callable, signal_of: Callable[[type], int | None]) -> Callable:
    """A sys.unraisablehook. The exception a signal handler raises (Ctrl-C's KeyboardInterrupt,
    a worker's SystemExit on SIGTERM) cannot leave Python code that C calls back (llvmlite's
    object-cache callbacks while numba loads a kernel, a __del__): Python printed `Exception
    ignored ...` with a traceback and went on, and the run ended with exit 0 as if never
    interrupted, or a worker went on measuring until killed. `signal_of(exception type)` names
    the signal to send the main thread again (None: not one of ours, `previous` reports it),
    from a thread of its own once this hook has returned: it is raised at the main thread's next
    Python line outside the C code (landing in a callback again, it comes back here)."""
    import _thread

    def send(main_thread: int, signum: int) -> None:
        time.sleep(RESEND_S)
        signal.pthread_kill(main_thread, signum)

    def hook(unraisable) -> None:
        kind = unraisable.exc_type
        main = threading.current_thread() is threading.main_thread()  # where handlers raise
        signum = signal_of(kind) if main and isinstance(kind, type) else None
        if signum is None:
            previous(unraisable)
            return
        while True:
            try:  # no wait for the thread's start (threading's): the hook returns at once
                _thread.start_new_thread(send, (threading.main_thread().ident, signum))
                return
            except BaseException as exc:  # a late one landed in here: send it again
                if signal_of(type(exc)) is None:
                    raise

    return hook
