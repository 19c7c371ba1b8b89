"""Patterns: what a case moves, as a fragment table of (src offset, dst offset, length).

A pattern is named by text so cases stay plain, hashable data: `16KiB` (one contiguous piece),
`1024x160B` (1024 pieces of 160 B scattered in the region, packed locally), `1024x160B@4KiB`
(explicit stride in the region). Other modules add pattern kinds by prefix with
`register_pattern_kind` (e.g. `kv:` from the KV-cache layouts).

Shapes are bounded before anything is allocated: at most MAX_FRAGMENTS pieces, and no offset
past MAX_SPAN bytes (so `99999999999x99999999999B` is a one-line error, not a MemoryError).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.units import format_size, parse_size

np = lazy_import("numpy")

LINE = 64
MAX_FRAGMENTS = 1 << 22  # pieces in one pattern (a 96 MiB fragment table)
MAX_SPAN = 1 << 46  # bytes a pattern may reach into a region (64 TiB): int64-safe everywhere


@dataclass(frozen=True)
class Pattern:
    """A materialised pattern. `frags` columns: offset in src, offset in dst, length (bytes)."""

    text: str
    frags: np.ndarray = field(compare=False, repr=False)
    axes: dict = field(default_factory=dict, compare=False)  # extra columns for reports

    @property
    def total_bytes(self) -> int:
        return int(self.frags[:, 2].sum())

    @property
    def count(self) -> int:
        return int(self.frags.shape[0])

    @property
    def src_span(self) -> int:
        return int((self.frags[:, 0] + self.frags[:, 2]).max(initial=0))

    @property
    def dst_span(self) -> int:
        return int((self.frags[:, 1] + self.frags[:, 2]).max(initial=0))

    @property
    def fragment_bytes(self) -> int:
        """The typical (median) fragment length."""
        return int(np.median(self.frags[:, 2])) if self.count else 0

    def swapped(self) -> Pattern:
        """The same pieces in the other direction (scatter instead of gather)."""
        return Pattern(self.text, self.frags[:, [1, 0, 2]].copy(), dict(self.axes))


PatternParser = Callable[[str], Pattern]
_KINDS: dict[str, tuple[PatternParser, str]] = {}
_SHAPE = re.compile(r"^([0-9]+)x([^@]+)(?:@(.+))?$", re.IGNORECASE)


def register_pattern_kind(prefix: str, parser: PatternParser, help_text: str) -> None:
    """Declare a pattern kind `PREFIX:...` once; its parser gets the whole text."""
    _KINDS[prefix] = (parser, help_text)


def pattern_kinds_help() -> list[str]:
    """Each registered pattern kind's syntax (load the method modules first: they declare them)."""
    return [help_text for _, help_text in _KINDS.values()]


def _check_span(span: int, text: str) -> None:
    if span > MAX_SPAN:
        raise UsageError(f"pattern {text} reaches {span} bytes, beyond {MAX_SPAN >> 40} TiB: "
                         "lower the size, count or stride")


def contiguous(nbytes: int, label: str | None = None) -> Pattern:
    _check_span(nbytes, label or format_size(nbytes))
    return Pattern(format_size(nbytes), np.array([[0, 0, nbytes]], dtype=np.int64))


def shape(count: int, size: int, stride: int | None = None) -> Pattern:
    """COUNT pieces of SIZE; in the region every piece starts on its own stride, locally packed."""
    stride = stride or 2 * ((size + LINE - 1) // LINE) * LINE
    if stride < size:
        raise UsageError(f"pattern stride {stride} is smaller than the piece size {size}")
    shown = f"{count}x{format_size(size)}"
    if count > MAX_FRAGMENTS:
        raise UsageError(f"pattern {shown} has {count} pieces, beyond {MAX_FRAGMENTS}: "
                         "lower the count")
    _check_span((count - 1) * stride + size, shown)
    index = np.arange(count, dtype=np.int64)
    frags = np.stack([index * stride, index * size, np.full(count, size, np.int64)], axis=1)
    text = f"{count}x{format_size(size)}" + (f"@{format_size(stride)}" if stride else "")
    return Pattern(text, frags, {"fragment_count": count, "fragment_bytes": size})


def parse_pattern(text: str) -> Pattern:
    text = str(text).strip()
    prefix, sep, _ = text.partition(":")
    if sep and prefix in _KINDS:
        return _KINDS[prefix][0](text)
    match = _SHAPE.match(text)
    if match:
        if len(match.group(1)) > 18:
            raise UsageError(f"malformed pattern {text!r}: the count is beyond "
                             f"{MAX_FRAGMENTS} pieces")
        count = int(match.group(1))
        if count <= 0:
            raise UsageError(f"malformed pattern {text!r}: the count must be positive")
        size = parse_size(match.group(2))
        stride = parse_size(match.group(3)) if match.group(3) else None
        pattern = shape(count, size, stride)
        return Pattern(text, pattern.frags, pattern.axes)
    try:
        nbytes = parse_size(text)
    except UsageError:
        kinds = "; ".join(pattern_kinds_help()) or "none"
        raise UsageError(
            f"malformed size or pattern {text!r}: use a size (64, 16KiB, 1GiB), "
            f"COUNTxSIZE[@STRIDE] (1024x160B) or a pattern kind ({kinds})"
        ) from None
    return contiguous(nbytes, repr(text))
