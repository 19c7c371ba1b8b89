"""Child processes that never turn a Ctrl-C into a traceback, and a parent that never loses one.

Ctrl-C reaches the whole process group; the runner is the one that handles it: it stops its
children and stores what was measured. So the fork server is launched with SIGINT ignored (an
ignored signal stays ignored across exec, so neither it, while it imports its preload, nor any
worker it forks, can be interrupted), and a child is started with SIGINT held (blocked): a
Ctrl-C that lands meanwhile stays pending and is raised in the parent right after. Swapping in
SIG_IGN around each start, as before, could drop it or make Python raise `OSError: Signal 2
ignored due to race condition`."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def _interrupts_held() -> Iterator[bool]:
    """Yields whether a Ctrl-C is already waiting; it is raised when the hold ends."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield signal.SIGINT in signal.sigpending()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_fork_server() -> None:
    """Launch multiprocessing's fork server (its preload set beforehand) with SIGINT ignored."""
    from multiprocessing import forkserver, resource_tracker

    # first, on its own: starting it unblocks SIGINT (bpo-33613), which would end the hold below
    # while SIGINT is ignored, and a Ctrl-C would be lost (the run then ended with exit 0)
    resource_tracker.ensure_running()
    with _interrupts_held() as waiting:
        if waiting:  # raised as the hold ends: nothing is started
            return
        if threading.current_thread() is not threading.main_thread():
            forkserver.ensure_running()
            return
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # held: none can arrive now
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, handler)


def start_child(process) -> None:
    """process.start() with SIGINT held: a Ctrl-C meanwhile is raised once it has started."""
    with _interrupts_held():
        process.start()


def ignore_interrupts() -> None:
    """In a child: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
