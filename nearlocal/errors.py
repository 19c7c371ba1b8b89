"""Errors the command line turns into one line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class UsageError(Exception):
    """Bad input from the user: a one-line message naming the problem and what is valid."""


class Unavailable(Exception):
    """What the box refuses only once a case's region or session is opened (the driver refusing
    a cudaHostRegister of I/O memory): the case is a skipped row with this one-line reason, the
    refusing layer's own words in it, never a failed row and never a measurement."""


@contextlib.contextmanager
def naming(subject: str) -> Iterator[None]:
    """A UsageError raised inside names `subject` (the option or file the bad value came from)
    first, unless it already does: `--pattern kv:x:...: unknown model 'x'`."""
    try:
        yield
    except UsageError as exc:
        text = str(exc)
        if subject in text:
            raise
        raise type(exc)(f"{subject}: {text}") from None


def error_line(exc: BaseException, limit: int = 160) -> str:
    """An exception's own text as one line (its first, cut at `limit`): what a message that
    skips or refuses something keeps of the cause."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
