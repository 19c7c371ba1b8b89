"""The effective memory type of a physical range, where the kernel exposes it: the x86 PAT
reservations in debugfs (`/sys/kernel/debug/x86/pat_memtype_list`, root and debugfs needed).
What a region's row records as `memtype`, and what a uc/wc row is checked against."""

from __future__ import annotations

import ctypes
import os
import re

from nearlocal.sysroot import SysRoot

PAT_LIST = "/sys/kernel/debug/x86/pat_memtype_list"
DEBUGFS = "/sys/kernel/debug"
_ENTRY = re.compile(r"\[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\]\s+([\w-]+)")
UNKNOWN = "unknown"
# the PAT type names (arch/x86/mm/pat/memtype.c cattr_name) that give each attribute
AGREES: dict[str, frozenset[str]] = {
    "wb": frozenset({"write-back"}),
    "uc": frozenset({"uncached-minus", "uncached"}),
    "wc": frozenset({"write-combining"}),
}


def ensure_debugfs(root: SysRoot) -> str | None:
    """Mount debugfs at /sys/kernel/debug when it is absent and this process is root (the PAT
    list lives there); None when the list is readable, else why not."""
    if root.exists(PAT_LIST):
        return None
    if not root.is_real():
        return f"{PAT_LIST} is absent (not an x86 PAT kernel, or debugfs not mounted)"
    if os.geteuid() != 0:
        return f"{PAT_LIST} is not readable: needs root (and debugfs)"
    mounted = any(line.split()[1:3] == [DEBUGFS, "debugfs"]
                  for line in (root.read("/proc/mounts", "") or "").splitlines() if line.strip())
    if not mounted and os.path.isdir(DEBUGFS):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"debugfs", DEBUGFS.encode(), b"debugfs", 0, None) != 0:
            return f"mounting debugfs at {DEBUGFS} failed: {os.strerror(ctypes.get_errno())}"
    if root.exists(PAT_LIST):
        return None
    return f"{PAT_LIST} is absent with debugfs mounted: the kernel has no x86 PAT list"


def entries(root: SysRoot) -> list[tuple[int, int, str]] | None:
    """(start, end, type) of every PAT reservation; None when the list cannot be read."""
    text = root.read(PAT_LIST)
    if text is None:
        return None
    return [(int(a, 16), int(b, 16), kind) for a, b, kind in _ENTRY.findall(text)]


def memtype(root: SysRoot, start: int, length: int) -> str:
    """The PAT type of [start, start + length), or why it is not known (`unknown: ...`)."""
    problem = ensure_debugfs(root)
    found = entries(root) if problem is None else None
    if found is None:
        return f"{UNKNOWN}: {problem or PAT_LIST + ' is not readable (needs root and debugfs)'}"
    end = start + max(length, 1)
    types = {kind for lo, hi, kind in found if lo < end and start < hi}
    if not types:
        return "write-back (no PAT reservation covers the range: the kernel's default for RAM)"
    return " + ".join(sorted(types))


def disagreement(attr: str, found: str, what: str) -> str | None:
    """Why a mapping of `what` asked as `attr` is not what the kernel gave (a failed row, both
    named), or None when the readback agrees or could not be made (recorded as unknown)."""
    if found.startswith(UNKNOWN):
        return None
    types = {part.split(" (")[0].strip() for part in found.split(" + ")}
    if types <= AGREES[attr]:
        return None
    return (f"asked {attr} ({', '.join(sorted(AGREES[attr]))}) for {what} but the kernel mapped "
            f"it {found} (read back from {PAT_LIST}); x86 PAT gives one type per range, so an "
            "earlier mapping of the same range with another type wins")
