"""One configurable root for every /sys, /proc and /dev read, so tests can fake the kernel's trees.

Set `NEARLOCAL_SYSROOT=/path/to/fake` or pass `root=` to a probe; every probe reads through
`SysRoot`, never through absolute paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SysRoot:
    root: Path = Path("/")

    @classmethod
    def default(cls) -> SysRoot:
        return cls(Path(os.environ.get("NEARLOCAL_SYSROOT", "/")))

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def exists(self, absolute: str) -> bool:
        return self.path(absolute).exists()

    def read(self, absolute: str, default: str | None = None) -> str | None:
        try:
            return self.path(absolute).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return default

    def read_int(self, absolute: str, default: int | None = None, base: int = 0) -> int | None:
        text = self.read(absolute)
        if text is None:
            return default
        try:
            return int(text.split()[0], base)
        except (ValueError, IndexError):
            return default

    def listdir(self, absolute: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def is_real(self) -> bool:
        """True when reading the live system (device files may be opened)."""
        return self.root == Path("/")


def parse_cpulist(text: str | None) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            if int(hi) - int(lo) >= 1 << 16:  # no kernel lists that many: not a CPU list
                raise ValueError(f"CPU range {part!r} is larger than any machine")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus
