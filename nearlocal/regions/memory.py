"""What a host region does with its memory, whatever its kind: bind it to a NUMA node (mbind),
advise and fault its pages, fill it, and read how much memory is free (meminfo). Kept apart from
the kinds (host.py), so that other providers (interleave, gpu, rpc's shared pool) bind and fill
the same way."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re

import numpy as np

from nearlocal.sysroot import SysRoot

MAP_HUGETLB = 0x40000
MAP_HUGE_SHIFT = 26
MPOL_BIND = 2
MPOL_MF_STRICT = 1
MPOL_MF_MOVE = 2
SYS_MBIND = 237  # x86-64
HUGE_2M = 2 * 1024 * 1024
_libc = ctypes.CDLL(None, use_errno=True)


MEMORY_HEADROOM = 0.9  # a region may take at most this share of the memory available now


def meminfo(absolute: str) -> dict[str, int]:
    """A meminfo file (/proc/meminfo or a node's) as bytes per field; {} when unreadable."""
    fields = {}
    for line in (SysRoot.default().read(absolute, "") or "").splitlines():
        match = re.search(r"(\w+(?:\(\w+\))?):\s+(\d+)\s*kB", line)
        if match:
            fields[match.group(1)] = int(match.group(2)) * 1024
    return fields


def memory_available() -> int | None:
    return meminfo("/proc/meminfo").get("MemAvailable")


def round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


# The non-zero pattern nearlocal fills memory it owns with (GPU memory too: gpu/regions.py)
FILL_BLOCK = (np.arange(1 << 20, dtype=np.uint64) * 0x9E3779B1 >> 13).astype(np.uint8) | 1


def fill_owned(array: np.ndarray) -> None:
    """Fault in memory nearlocal owns with a non-zero pattern (an untouched page reads the zero page)."""
    block = FILL_BLOCK.size
    for start in range(0, array.size, block):
        chunk = array[start:start + block]
        chunk[:] = FILL_BLOCK[:chunk.size]


def mbind_buffer(buf: mmap.mmap, length: int, node: int) -> None:
    """Bind the first `length` bytes of a mapping to one NUMA node (mbind_range)."""
    mbind_range(ctypes.addressof(ctypes.c_char.from_buffer(buf)), length, node)


def mbind_range(address: int, length: int, node: int) -> None:
    """Bind [address, address + length) to one NUMA node, moving pages already touched."""
    mask = (ctypes.c_ulong * 16)()
    mask[node // 64] = 1 << (node % 64)
    rc = _libc.syscall(SYS_MBIND, ctypes.c_void_p(address), ctypes.c_ulong(length), MPOL_BIND,
                       mask, ctypes.c_ulong(16 * 64 + 1), MPOL_MF_STRICT | MPOL_MF_MOVE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mbind to node {node} failed: {os.strerror(err)}")


def free_hugetlb_bytes() -> int | None:
    free = SysRoot.default().read_int("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    return None if free is None else free * HUGE_2M


MADV_POPULATE_WRITE = 23  # Linux 5.14+; the mmap module does not name it


def advise_pages(buf: mmap.mmap, pages: str) -> None:
    """Ask for the page size a row says, before any page is faulted: `thp` asks for huge pages,
    `4K` refuses them (MADV_NOHUGEPAGE), since THP `always` (Debian's default) would otherwise
    back a plain region with whatever the kernel gives; hugetlb (`2M`) needs no advice."""
    if pages == "thp":
        buf.madvise(mmap.MADV_HUGEPAGE)
    elif pages == "4K":
        # a kernel built without THP refuses the advice (EINVAL): its pages are 4 KiB anyway
        with contextlib.suppress(OSError):
            buf.madvise(mmap.MADV_NOHUGEPAGE)


def populate(buf: mmap.mmap) -> None:
    """Fault a fresh mapping in with one call (half the time of a fault per page on a VM), after
    its advice; a kernel older than 5.14 leaves it to the fill that follows."""
    with contextlib.suppress(OSError):
        buf.madvise(MADV_POPULATE_WRITE)

