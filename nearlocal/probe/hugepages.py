"""hugetlb pools and transparent huge page mode."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nearlocal.sysroot import SysRoot

THP_DIR = "/sys/kernel/mm/transparent_hugepage"


def selected_mode(text: str | None) -> str | None:
    """The bracketed value of a sysfs choice file (`always [madvise] never` -> madvise)."""
    selected = re.search(r"\[([\w+]+)\]", text or "")
    return selected.group(1) if selected else None


@dataclass
class HugePagePool:
    page_bytes: int
    total: int
    free: int


@dataclass
class HugePages:
    pools: list[HugePagePool]
    thp_mode: str | None

    def pool(self, page_bytes: int) -> HugePagePool | None:
        return next((p for p in self.pools if p.page_bytes == page_bytes), None)


def probe_hugepages(root: SysRoot) -> HugePages:
    base = "/sys/kernel/mm/hugepages"
    pools = []
    for entry in root.listdir(base):
        match = re.fullmatch(r"hugepages-(\d+)kB", entry)
        if match:
            pools.append(HugePagePool(
                page_bytes=int(match.group(1)) * 1024,
                total=root.read_int(f"{base}/{entry}/nr_hugepages", 0, base=10) or 0,
                free=root.read_int(f"{base}/{entry}/free_hugepages", 0, base=10) or 0,
            ))
    return HugePages(sorted(pools, key=lambda p: p.page_bytes),
                     selected_mode(root.read(f"{THP_DIR}/enabled")))
