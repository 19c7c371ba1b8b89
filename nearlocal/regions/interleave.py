"""`interleave:T0,T1,...`: 2 MiB software interleave across NUMA nodes or device-dax devices
(Beluga B12: "2 MB software interleaving across devices (+33.2% serving throughput)").

Chunk i of the region (bytes [i * 2 MiB, (i + 1) * 2 MiB)) lives on target i mod k, at offset
(i div k) * 2 MiB of it. Targets are all NUMA node numbers (`interleave:0,1`: one anonymous
mapping, each chunk mbind-ed to its node before first touch, placement read back with
move_pages) or all device-dax paths (`interleave:/dev/dax0.0,/dev/dax1.0`: each chunk a shared
MAP_FIXED mapping of its device inside one reserved range; read-only unless --allow-write).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory
from nearlocal.regions.base import MappedRegion, RegionKind, RegionSpec, register_region_kind
from nearlocal.regions.memory import mbind_range

CHUNK = 2 * 1024 * 1024
PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
SYS_MOVE_PAGES = 279  # x86-64
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def targets(spec: RegionSpec) -> tuple[str, list]:
    """('node', [0, 1]) or ('devdax', ['/dev/dax0.0', ...]); UsageError for anything else."""
    parts = [p.strip() for p in spec.arg.split(",") if p.strip()]
    if not parts:
        raise UsageError("interleave needs targets: interleave:0,1 (NUMA nodes) or "
                         "interleave:/dev/dax0.0,/dev/dax1.0 (device-dax devices)")
    if all(re.fullmatch(r"\d+", p) for p in parts):
        kind, values = "node", [int(p) for p in parts]
    elif all(p.startswith("/") for p in parts):
        kind, values = "devdax", parts
        offset = next((p for p in parts if "@" in p), None)
        if offset:
            raise UsageError(f"interleave target {offset!r} in {spec.text!r} has an @offset, "
                             "which interleave does not take: name whole devices "
                             "(interleave:/dev/dax0.0,/dev/dax1.0)")
    else:
        raise UsageError(f"interleave targets in {spec.text!r} must be all NUMA node numbers or "
                         "all device-dax paths")
    if len(set(values)) != len(values):
        raise UsageError(f"interleave target named twice in {spec.text!r}")
    return kind, values


def chunk_map(size: int, count: int) -> list[tuple[int, int, int]]:
    """(region offset, target index, offset in that target) of every 2 MiB chunk."""
    chunks = (size + CHUNK - 1) // CHUNK
    return [(i * CHUNK, i % count, (i // count) * CHUNK) for i in range(chunks)]


def _dax_spec(path: str) -> RegionSpec:
    return RegionSpec(f"devdax:{path}", "devdax", path)


def _validate(spec: RegionSpec, inventory: HostInventory) -> None:
    from nearlocal.regions import host

    kind, values = targets(spec)
    if kind == "node":
        nodes = [n.node for n in inventory.numa]
        for node in values:
            if node not in nodes:
                raise UsageError(f"NUMA node {node} does not exist in {spec.text!r}: this box "
                                 f"has nodes {', '.join(map(str, nodes)) or 'none'}")
    else:
        for path in values:
            host._validate_devdax(_dax_spec(path), inventory)


def _unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    from nearlocal.regions import host

    kind, values = targets(spec)
    if kind == "node":
        memory = {n.node: n.mem_total_bytes for n in inventory.numa}
        empty = [v for v in values if not memory.get(v)]
        return f"NUMA node {empty[0]} has no memory" if empty else None
    for path in values:
        reason = host._devdax_unavailable(_dax_spec(path), inventory)
        if reason:
            return reason
    return None


def _capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """What a node interleave can take now: chunks go round-robin, so each of the k nodes holds
    about 1/k of it; k times the least free node (free and page-cache memory, as for numa:N),
    at most MemAvailable, both less 10%. None for device-dax targets (sized when opened) or when
    no node's meminfo can be read."""
    from nearlocal.regions import memory

    kind, values = targets(spec)
    if kind != "node":
        return None
    free = {}
    for node in values:
        fields = memory.meminfo(f"/sys/devices/system/node/node{node}/meminfo")
        if "MemFree" not in fields:
            return None
        free[node] = fields["MemFree"] + fields.get("FilePages", 0)
    least = min(values, key=lambda node: (free[node], node))
    chunks = int(free[least] * memory.MEMORY_HEADROOM) // CHUNK  # whole chunks on that node
    capacity = chunks * CHUNK * len(values)
    where = (f"NUMA nodes {','.join(map(str, values))} (each holds 1/{len(values)} of the "
             f"chunks; node {least} has the least free and page-cache memory, less 10%)")
    available = memory.memory_available()
    if available is not None and available * memory.MEMORY_HEADROOM < capacity:
        capacity, where = int(available * memory.MEMORY_HEADROOM), "memory (MemAvailable less 10%)"
    return capacity, where


def _mmap(address: int | None, length: int, prot: int, flags: int, fd: int = -1,
          offset: int = 0) -> int:
    result = _libc.mmap(address, length, prot, flags, fd, offset)
    if result in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {length} bytes failed: {os.strerror(err)}")
    return int(result)


def _reserve(length: int) -> tuple[int, int, int]:
    """An address range of `length` bytes aligned to 2 MiB: (aligned start, raw start, raw len)."""
    raw_length = length + CHUNK
    raw = _mmap(None, raw_length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
    return (raw + CHUNK - 1) // CHUNK * CHUNK, raw, raw_length


def _array(address: int, size: int, writable: bool) -> np.ndarray:
    array = np.ctypeslib.as_array((ctypes.c_uint8 * max(size, 1)).from_address(address))[:size]
    if not writable:
        array.flags.writeable = False
    return array


def page_nodes(addresses: list[int]) -> list[int]:
    """The node each (touched) page is on, by move_pages(2) with no target nodes: a query."""
    count = len(addresses)
    pages = (ctypes.c_void_p * count)(*addresses)
    status = (ctypes.c_int * count)()
    rc = _libc.syscall(SYS_MOVE_PAGES, 0, ctypes.c_ulong(count), pages, None, status, 0)
    if rc != 0:
        return [-1] * count
    return list(status)


def map_nodes(nodes: list[int], size: int, bind=None) -> tuple[int, Callable[[], object]]:
    """Anonymous memory with chunk i bound to nodes[i % k]; returns (address, unmap)."""
    bind = bind or mbind_range
    length = max(1, (size + CHUNK - 1) // CHUNK) * CHUNK
    start, raw, raw_length = _reserve(length)
    try:
        _mmap(start, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)
        for offset, target, _ in chunk_map(length, len(nodes)):
            bind(start + offset, CHUNK, nodes[target])
    except BaseException:
        _libc.munmap(raw, raw_length)
        raise
    return start, lambda: _libc.munmap(raw, raw_length)


def map_files(paths: list[str], size: int, writable: bool,
              base_offsets: list[int] | None = None) -> tuple[int, Callable[[], object]]:
    """Chunk i = a shared mapping of paths[i % k] at base + (i div k) * 2 MiB, all inside one
    reserved range; returns (address, unmap)."""
    length = max(1, (size + CHUNK - 1) // CHUNK) * CHUNK
    base_offsets = base_offsets or [0] * len(paths)
    start, raw, raw_length = _reserve(length)
    prot = PROT_READ | (PROT_WRITE if writable else 0)
    fds = []
    try:
        fds = [os.open(p, os.O_RDWR if writable else os.O_RDONLY) for p in paths]
        for offset, target, target_offset in chunk_map(length, len(paths)):
            _mmap(start + offset, CHUNK, prot, MAP_SHARED | MAP_FIXED, fds[target],
                  base_offsets[target] + target_offset)
    except BaseException:
        _libc.munmap(raw, raw_length)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return start, lambda: _libc.munmap(raw, raw_length)


def _open(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    from nearlocal.regions.memory import fill_owned

    kind, values = targets(spec)
    info: dict = {"interleave": values, "chunk_bytes": CHUNK, "owned": kind == "node"}
    if kind == "node":
        address, unmap = map_nodes(values, size)
        array = _array(address, size, True)
        fill_owned(array)
        chunks = chunk_map(size, len(values))
        found = page_nodes([address + offset for offset, _, _ in chunks])
        expected = [values[target] for _, target, _ in chunks]
        placed = sum(a == b for a, b in zip(found, expected, strict=True))
        info.update(pages="4K", memtype="write-back (anonymous RAM)",
                    chunks_on_expected_node=f"{placed}/{len(chunks)}")
        writable = True
    else:
        address, unmap = map_files(values, size, allow_write)
        array = _array(address, size, allow_write)
        info.update(pages="2M", align=CHUNK)
        writable = allow_write

    def close() -> None:
        nonlocal array
        array = None
        unmap()

    return MappedRegion(spec, attr, array, writable, info, close)


def _instances(inventory: HostInventory) -> list[str]:
    nodes = [str(n.node) for n in inventory.numa if n.mem_total_bytes]
    daxes = [d.dev_path for d in inventory.dax if d.mode == "devdax"]
    out = [f"interleave:{','.join(nodes)}"] if len(nodes) > 1 else []
    return out + ([f"interleave:{','.join(daxes)}"] if len(daxes) > 1 else [])


register_region_kind(RegionKind(
    name="interleave", syntax="interleave:N,M,...|/dev/daxX.Y,...", space="host",
    attrs=frozenset({"wb"}),
    summary="2 MiB chunks striped across NUMA nodes or device-dax devices (software interleave)",
    validate=_validate, unavailable=_unavailable, open=_open,
    user_owned=lambda spec: targets(spec)[0] == "devdax", instances=_instances,
    capacity=_capacity,
))
