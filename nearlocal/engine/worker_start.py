"""How long a new worker process may take to say it is ready: adaptive to how slowly this box
starts Python and imports (a TCG guest takes about 50 s), or fixed by the environment."""

from __future__ import annotations

import math
import time

from nearlocal.errors import UsageError

WORKER_START_MIN_S = 120.0  # the least a worker start is given, however fast this process started
WORKER_START_FACTOR = 10.0  # ... else this many times what this process's own start-up took
WORKER_START_ENV = "NEARLOCAL_WORKER_START_S"  # seconds: a fixed deadline instead


def own_startup_s() -> float | None:
    """Seconds since this process started (what its interpreter start and imports took, read
    when the first worker is started): a worker does the same imports, so a slow box (a TCG
    guest: about 50 s) is given a deadline in proportion. None where /proc does not tell."""
    import os

    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError):
        return None


def worker_start_deadline(startup_s: float | None, last_start_s: float | None = None) -> tuple[float, str]:
    """(seconds, why): how long a new worker may take to say it is ready. The environment's
    NEARLOCAL_WORKER_START_S when set; else max(120 s, 10 x this process's start-up, 10 x the
    last worker's start): adaptive, so a slow machine is not a failed run."""
    import os

    text = os.environ.get(WORKER_START_ENV, "").strip()
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{WORKER_START_ENV}={text!r} is not a positive number of seconds")
        return value, f"{WORKER_START_ENV}={text}"
    candidates = [(WORKER_START_MIN_S, f"the minimum of {WORKER_START_MIN_S:g} s")]
    if startup_s is not None:
        candidates.append((WORKER_START_FACTOR * startup_s, f"{WORKER_START_FACTOR:g} x this "
                           f"process's own start-up of {startup_s:.1f} s"))
    if last_start_s is not None:
        candidates.append((WORKER_START_FACTOR * last_start_s, f"{WORKER_START_FACTOR:g} x the "
                           f"previous worker's start of {last_start_s:.1f} s"))
    return max(candidates)


class WorkerStartError(RuntimeError):
    """The worker died or missed its start deadline: the cases left fail with this reason."""
