"""Where a mapped region's pages landed, as far as this process can see: what a fast and a slow
placement of one case may differ by. Read after a placement's samples (never inside them):
the CPU the process ran on, each buffer's virtual offset within a 2 MiB page (the alignment
between source and destination), the share of it backed by huge pages (THP may back a plain
anonymous mapping), and where the page frames are readable (root: /proc/self/pagemap) how much
of it is physically contiguous. In a VM the frames are the guest's: the host's backing of them,
which may decide a placement, is not visible from here."""

from __future__ import annotations

import itertools
import os
import struct

PAGE = 4096
HUGE = 2 << 20
FRAMES_READ = 512  # pages of a buffer whose frames are read (from its start): enough for a share
_PFN_MASK = (1 << 55) - 1
_PRESENT = 1 << 63


def running_cpu() -> int | None:
    """The CPU this thread runs on now (field 39 of /proc/thread-self/stat), None if unreadable."""
    try:
        with open("/proc/thread-self/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _huge_shares(addresses: list[int]) -> dict[int, float | None]:
    """Per address: the share of the mapping holding it that huge pages back (smaps'
    AnonHugePages and the hugetlb fields over its Rss), from one read of smaps; None where smaps
    is unreadable or no mapping holds the address."""
    fields: dict[int, dict[str, int]] = {}
    try:
        with open("/proc/self/smaps") as smaps:
            holding: list[int] = []  # the addresses the mapping being read holds
            for line in smaps:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    start, _, end = head.partition("-")
                    low, high = int(start, 16), int(end, 16)
                    holding = [a for a in addresses if low <= a < high]
                    for address in holding:
                        fields[address] = {}
                elif holding and head.endswith(":"):
                    parts = line.split()
                    if len(parts) >= 3 and parts[1].isdigit():
                        for address in holding:
                            fields[address][head[:-1]] = int(parts[1])
    except (OSError, ValueError):
        return dict.fromkeys(addresses)

    def share(found: dict[str, int]) -> float:
        huge = (found.get("AnonHugePages", 0) + found.get("ShmemPmdMapped", 0)
                + found.get("Shared_Hugetlb", 0) + found.get("Private_Hugetlb", 0))
        return min(1.0, huge / found["Rss"]) if found.get("Rss") else 0.0

    return {address: share(fields[address]) if address in fields else None
            for address in addresses}


def _contiguous_share(address: int, nbytes: int) -> float | None:
    """Share of the first FRAMES_READ pages whose frame follows the previous page's; None where
    the frames read as 0 (no CAP_SYS_ADMIN) or pagemap is unreadable."""
    first, count = address // PAGE, min(FRAMES_READ, max(1, nbytes // PAGE))
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            data = pagemap.read(count * 8)
    except OSError:
        return None
    entries = struct.unpack(f"<{len(data) // 8}Q", data)
    frames = [entry & _PFN_MASK for entry in entries if entry & _PRESENT]
    if len(frames) < 2 or not any(frames):
        return None
    follows = sum(b == a + 1 for a, b in itertools.pairwise(frames))
    return follows / (len(frames) - 1)


def describe_placement(buffers: dict[str, object]) -> dict:
    """What this process can see of one placement: `buffers` maps a name (region, peer) to a
    host array (numpy); arrays without a host address (a GPU's) are left out."""
    facts: dict = {"cpu": running_cpu()}
    found = {}
    for name, array in buffers.items():
        address = getattr(getattr(array, "ctypes", None), "data", None)
        nbytes = int(getattr(array, "nbytes", 0) or 0)
        if isinstance(address, int) and nbytes:
            found[name] = (address, nbytes)
    shares = _huge_shares([address for address, _ in found.values()])
    for name, (address, nbytes) in found.items():
        facts[f"{name}_offset"] = address % HUGE
        facts[f"{name}_huge_share"] = shares[address]
        facts[f"{name}_contiguous"] = _contiguous_share(address, nbytes)
    facts["pid"] = os.getpid()
    return facts
