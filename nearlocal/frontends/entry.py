"""The `nearlocal` command. A Ctrl-C that lands while the command line's modules load is one
line and exit 130 too, not a KeyboardInterrupt traceback (cli.main handles every later one).
Once the command has its exit code, Ctrl-C is ignored: the interpreter's shutdown (~0.3 s after
a report, numba's and matplotlib's) would otherwise end it silently by the signal, after the
work was done and said."""

from __future__ import annotations

import signal
import sys


def forget_caught_interrupts() -> None:
    """A KeyboardInterrupt that ended a string exec (dataclasses and numba build functions so)
    marks the interpreter as ended by Ctrl-C even when nearlocal caught it: under `python -m`,
    CPython then kills itself with SIGINT at exit (exit -2, after our one line and our exit
    code). Each string exec starts by clearing that mark (pythonrun.c's run_eval_code_obj), and
    this one ends without an interrupt: SIGINT is ignored by now."""
    exec("None", {})


def _swallowed_interrupt(kind: type) -> int | None:
    return signal.SIGINT if issubclass(kind, KeyboardInterrupt) else None


def main() -> int:
    try:  # a Ctrl-C that an import's lock callback swallows while the command loads is resent
        from nearlocal.engine.children import resend_swallowed

        sys.unraisablehook = resend_swallowed(sys.unraisablehook, _swallowed_interrupt)
        from nearlocal.frontends.cli import main as command_line

        code = command_line()
    except KeyboardInterrupt:
        print("nearlocal: interrupted", file=sys.stderr)
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    forget_caught_interrupts()
    return code
