"""Parsing and formatting of sizes and durations as users type them."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from nearlocal.errors import UsageError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
MAX_SIZE = 2**62  # beyond any machine's memory; also keeps every size inside an int64
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s)?\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from `64`, `16KiB`, `1GiB`, `4k`. The convention, stated in `run --help` too:
    KiB/MiB/GiB and k/M/G alone are binary (as users mean `4k`), KB/MB/GB are decimal."""
    if isinstance(text, int):
        if text <= 0:
            raise UsageError(f"size must be a positive number of bytes, got {text}")
        if text > MAX_SIZE:
            raise UsageError(f"size {text} is larger than any memory (at most {MAX_SIZE} bytes)")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise UsageError(
            f"malformed size {text!r}: use a positive number with an optional unit "
            "(B, KiB, MiB, GiB, KB, MB, GB), e.g. 64, 16KiB, 1GiB; KiB/MiB/GiB and k/M/G are "
            "binary (4k = 4096 B), KB/MB/GB decimal (4KB = 4000 B)"
        )
    number, unit = match.groups()
    unit_key = unit.lower()
    if unit_key in ("k", "m", "g", "t"):
        unit_key += "ib"
    if unit_key not in _SIZE_UNITS:
        raise UsageError(
            f"malformed size {text!r}: unknown unit {unit!r} (valid: B, KiB, MiB, GiB, k, M, G "
            "binary; KB, MB, GB decimal)"
        )
    value = Fraction(number) * _SIZE_UNITS[unit_key]  # exact: 1e23 bytes is not a float's 1e23
    if value <= 0 or value.denominator != 1:
        raise UsageError(f"malformed size {text!r}: must be a positive whole number of bytes")
    if value > MAX_SIZE:
        raise UsageError(f"size {text!r} is larger than any memory (at most {MAX_SIZE} bytes)")
    return int(value)


def non_negative_int(text: str) -> int:
    """An argparse type for counts and seeds: 0, 1, 2, ... (a negative seed or count is refused)."""
    import argparse

    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """`16KiB`, `64MiB`, `160B`: exact binary units when they divide evenly."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"


def size_spelled_once(value: str | int) -> str:
    """A plain size in the runner's spelling (16384, "16384", "16 KiB" -> "16KiB"), so one
    contiguous transfer has one case id however it was asked for; any other text (a fragment
    pattern, or a malformed size that validation names) as given, stripped. A number that is no
    size (0, negative) is an error."""
    if isinstance(value, int):
        return format_size(parse_size(value))
    try:
        return format_size(parse_size(value))
    except UsageError:
        return value.strip()


def parse_duration(text: str | float) -> float:
    """Seconds from `0.5`, `500ms`, `3us`."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _TIME_RE.match(str(text))
        if not match:
            raise UsageError(f"malformed duration {text!r}: use e.g. 0.5, 500ms, 3us, 2s")
        number, unit = match.groups()
        seconds = float(number) * _TIME_UNITS[unit or "s"]
    if seconds <= 0:
        raise UsageError(f"duration must be positive, got {text!r}")
    return seconds


MAX_BUDGET_S = 3600.0  # a per-case budget past an hour is a typo (1e20 s), not a plan


def parse_budget(text: str | float, what: str = "--budget") -> float:
    """A per-case time budget: a positive duration of at most MAX_BUDGET_S."""
    seconds = parse_duration(text)
    if not seconds <= MAX_BUDGET_S:
        raise UsageError(f"{what} {text!r} is more than {MAX_BUDGET_S:g} s (1 hour) per case")
    return seconds


def format_number(value: object, digits: int = 4) -> str:
    """A number as a person reads it, for printers only (JSON and run.json keep the full value):
    a float to `digits` significant digits (MPI's ping-pong 1499.9999999929514 us -> 1500), whole
    from 10**digits up (no exponent); a number spelled as text (a stored param) likewise when it
    spells more digits than that ("1.10" stays); an int or anything else as it is."""
    if isinstance(value, str):
        mantissa = re.sub(r"[eE].*", "", value.strip()).lstrip("+-").replace(".", "").lstrip("0")
        try:
            number = float(value)
        except ValueError:
            return value
        if len(mantissa) <= digits or not mantissa.isdigit():
            return value
        value = number
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def format_ns(ns: float) -> str:
    """A latency with a unit that keeps 3-4 significant digits."""
    if ns != ns:  # NaN
        return "-"
    if ns < 1e3:
        return f"{ns:.1f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"
