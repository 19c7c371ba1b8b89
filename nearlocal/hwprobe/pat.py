"""The effective memory type of a physical range, where the kernel exposes it: the x86 PAT
reservations in debugfs (`/sys/kernel/debug/x86/pat_memtype_list`, root and debugfs needed)."""

from __future__ import annotations

import re

from nearlocal.sysroot import SysRoot

PAT_LIST = "/sys/kernel/debug/x86/pat_memtype_list"
_ENTRY = re.compile(r"\[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\]\s+([\w-]+)")


def memtype(root: SysRoot, start: int, length: int) -> str:
    """The PAT type of [start, start + length), or why it is not known."""
    text = root.read(PAT_LIST)
    if text is None:
        return f"unknown: {PAT_LIST} is not readable (needs root and debugfs)"
    end = start + max(length, 1)
    types = {kind for lo, hi, kind in (
        (int(a, 16), int(b, 16), kind) for a, b, kind in _ENTRY.findall(text)) if lo < end and start < hi}
    if not types:
        return "write-back (no PAT reservation covers the range: the kernel's default for RAM)"
    return " + ".join(sorted(types))
