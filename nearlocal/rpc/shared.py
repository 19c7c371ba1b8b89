"""Memory that another process can map too: the region under test itself when it is a shared
mapping (shm:, file:, devdax:), else a memfd bound to the region's NUMA node (dram and numa:N are
private anonymous mappings, which a second process cannot see)."""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field

from nearlocal.lazy import lazy_import
from nearlocal.regions import MappedRegion, parse_region, region_kind

np = lazy_import("numpy")


@dataclass
class SharedMemory:
    """`array` is shared; `handle` tells another process how to map the same bytes."""

    array: np.ndarray
    handle: dict
    info: dict = field(default_factory=dict)
    _buf: mmap.mmap | None = None
    _fd: int | None = None

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        if self._buf is not None:
            with contextlib.suppress(BufferError):  # a view still alive: unmapped when collected
                self._buf.close()
            self._buf = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_shared(region: MappedRegion) -> bool:
    return "path" in region.info or "device" in region.info


def share(region: MappedRegion, nbytes: int) -> SharedMemory:
    """The first nbytes of the region, or a node-bound memfd standing in for a private region."""
    if nbytes > region.array.size:
        raise ValueError(f"need {nbytes} bytes, the region maps {region.array.size}")
    if is_shared(region):
        handle = {"region": region.spec.text, "size": int(region.array.size), "attr": region.attr}
        return SharedMemory(region.array[:nbytes], handle, {"shared_by": "region"})
    from nearlocal.regions.memory import mbind_buffer  # the provider's own node binding

    fd = os.memfd_create("nearlocal-shared", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        buf = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        node = region.info.get("node")
        if node is not None:
            mbind_buffer(buf, nbytes, int(node))
    except BaseException:
        os.close(fd)
        raise
    array = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    array[:] = 0  # fault the pages in here, under the node policy
    handle = {"memfd": f"/proc/{os.getpid()}/fd/{fd}", "size": nbytes}
    info = {"shared_by": f"memfd bound to node {node}" if node is not None else "memfd"}
    return SharedMemory(array, handle, info, buf, fd)


def attach(handle: dict, nbytes: int) -> tuple[np.ndarray, object]:
    """Map what `share` handed out, from another process; returns (array, closer)."""
    if "memfd" in handle:
        fd = os.open(handle["memfd"], os.O_RDWR)
        try:
            buf = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=np.uint8, count=nbytes), buf
    spec = parse_region(handle["region"])
    region = region_kind(spec).open(spec, handle["size"], handle["attr"], True)
    return region.array[:nbytes], region
