"""The idle-mapping cache: anonymous mappings closed dram regions left, kept for the next region
of the same length and flags in this process (host.py's dram kind opens and closes them)."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable

from nearlocal.regions.memory import MAP_HUGETLB, MEMORY_HEADROOM, free_hugetlb_bytes, memory_available


class IdleMappings:
    """Anonymous mappings a closed dram region left, kept for the next region of the same length
    and flags in this process (a pass opens each size once per method): a page fault costs ~8 us
    on a VM, and a quick-suite pass faulted in ~2.7 GiB. Each process draws its pages afresh;
    the cases of one pass share them. At most LIMIT bytes are kept; a region too large for that
    is unmapped on close, as before."""

    LIMIT = 256 << 20

    def __init__(self) -> None:
        self.free: dict[tuple[int, int], list[mmap.mmap]] = {}

    @property
    def held(self) -> int:
        return sum(length * len(bufs) for (length, _), bufs in self.free.items())

    def idle_bytes(self, hugetlb: bool) -> int:
        """Bytes idle in hugetlb mappings (the 2 MiB pool's) or in ordinary ones (MemAvailable's)."""
        return sum(length * len(bufs) for (length, flags), bufs in self.free.items()
                   if bool(flags & MAP_HUGETLB) == hugetlb)

    def take(self, length: int, flags: int) -> mmap.mmap | None:
        found = self.free.get((length, flags))
        return found.pop() if found else None

    def releaser(self, length: int, flags: int) -> Callable[[mmap.mmap], None] | None:
        """What a region's close calls to hand its mapping back (None: unmap it)."""
        if length > self.LIMIT:
            return None

        def give_back(buf: mmap.mmap) -> None:
            if self.held + length > self.LIMIT:
                with contextlib.suppress(BufferError):
                    buf.close()
                return
            self.free.setdefault((length, flags), []).append(buf)

        return give_back

    def make_room(self, length: int, flags: int) -> None:
        """Unmap the idle mappings of the new one's kind (hugetlb or ordinary) when it would not
        fit beside them in what that kind has free now: the free 2 MiB pages, or MemAvailable
        less headroom (the capacity check counts them as this process's to give back)."""
        hugetlb = bool(flags & MAP_HUGETLB)
        if not self.idle_bytes(hugetlb):
            return
        if hugetlb:
            room = free_hugetlb_bytes()
        else:
            available = memory_available()
            room = None if available is None else available * MEMORY_HEADROOM
        if room is not None and length <= room:
            return
        for key in [key for key in self.free if bool(key[1] & MAP_HUGETLB) == hugetlb]:
            for buf in self.free.pop(key):
                with contextlib.suppress(BufferError):
                    buf.close()


IDLE = IdleMappings()
