"""Host memory providers: anonymous DRAM, a NUMA node (CXL in system-ram mode), device-dax, files
and POSIX shared memory: the five kinds, each declared here (the entry point of the group
nearlocal.region_kinds). Only host regions touch mmap/mbind (memory.py); everything else sees
MappedRegion. The idle-mapping cache is mapping_cache.py, a created file's life files.py."""

from __future__ import annotations

import mmap
import os
import re
import stat
from pathlib import Path

from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory, pat
from nearlocal.probe.dax import find_dax
from nearlocal.regions import mapping_cache
from nearlocal.regions.base import MappedRegion, RegionKind, RegionSpec, register_region_kind
from nearlocal.regions.files import (
    clear_dead_leftovers,
    create_file,
    in_use_reason,
    reserve_and_map,
    user_owned_file,
)
from nearlocal.regions.mapping import _dax_arg, map_region
from nearlocal.regions.memory import (
    HUGE_2M,
    MAP_HUGE_SHIFT,
    MAP_HUGETLB,
    MEMORY_HEADROOM,
    advise_pages,
    fill_owned,
    free_hugetlb_bytes,
    mbind_buffer,
    meminfo,
    memory_available,
    populate,
    round_up,
)
from nearlocal.sysroot import SysRoot
from nearlocal.units import format_size

# --- dram and numa:N: private anonymous memory, optionally huge pages, optionally bound -------

def dram_options(spec: RegionSpec) -> dict:
    """A dram / numa:N spec's options: `pages` (4K, 2M, thp) and `node` (int or None); bad
    input -> UsageError."""
    options: dict = {"pages": "4K", "node": None}
    if spec.kind == "numa":
        options["node"] = spec.arg
    for part in filter(None, spec.arg.split(",") if spec.kind == "dram" else []):
        if part in ("2M", "hugetlb"):
            options["pages"] = "2M"
        elif part == "thp":
            options["pages"] = "thp"
        elif part.startswith("node="):
            options["node"] = part[5:]
        else:
            raise UsageError(f"unknown dram option {part!r} in {spec.text!r}: valid are 2M, thp, node=N")
    if options["node"] is not None:
        if not re.fullmatch(r"\d+", str(options["node"])):
            raise UsageError(f"malformed NUMA node in {spec.text!r}: use numa:N with N a node number")
        options["node"] = int(options["node"])
    return options


def _validate_dram(spec: RegionSpec, inventory: HostInventory) -> None:
    node = dram_options(spec)["node"]
    nodes = [n.node for n in inventory.numa]
    if node is not None and node not in nodes:
        raise UsageError(f"NUMA node {node} does not exist in {spec.text!r}: this box has nodes "
                         f"{', '.join(map(str, nodes)) or 'none'}")


def _dram_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    options = dram_options(spec)
    if options["pages"] == "2M":
        pool = inventory.hugepages.pool(HUGE_2M)
        if pool is None or pool.free == 0:
            return "no free 2 MiB hugetlb pages (echo N > /proc/sys/vm/nr_hugepages)"
    if options["pages"] == "thp" and inventory.hugepages.thp_mode == "never":
        return "transparent huge pages are disabled (mode never)"
    node = options["node"]
    if node is not None:
        match = next((n for n in inventory.numa if n.node == node), None)
        if match is None or match.mem_total_bytes == 0:
            return f"NUMA node {node} has no memory"
    return None


def _dram_capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """What a new anonymous region can take now: free 2 MiB pages, or the node's free memory,
    or MemAvailable (less headroom: nearlocal fills every page it maps)."""
    options = dram_options(spec)
    if options["pages"] == "2M":  # this process's idle mappings are its own to reuse
        free = free_hugetlb_bytes()
        return (free + mapping_cache.IDLE.idle_bytes(hugetlb=True), "the 2 MiB hugetlb pool") \
            if free is not None else None
    available = memory_available()
    if available is not None:
        available += mapping_cache.IDLE.idle_bytes(hugetlb=False)
    where = "memory (MemAvailable less 10%)"
    node = options["node"]
    if node is not None:
        fields = meminfo(f"/sys/devices/system/node/node{node}/meminfo")
        if "MemFree" in fields:
            node_free = fields["MemFree"] + fields.get("FilePages", 0)
            available = node_free if available is None else min(available, node_free)
            where = f"NUMA node {node} (free and page-cache memory, less 10%)"
    return None if available is None else (int(available * MEMORY_HEADROOM), where)


def _open_dram(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    options = dram_options(spec)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    length = max(size, 1)
    if options["pages"] == "2M":
        flags |= MAP_HUGETLB | (21 << MAP_HUGE_SHIFT)
        length = round_up(length, HUGE_2M)
    reusable = options["pages"] != "thp" and options["node"] is None
    buf = mapping_cache.IDLE.take(length, flags) if reusable else None
    if buf is None:
        mapping_cache.IDLE.make_room(length, flags)
        buf = mmap.mmap(-1, length, flags=flags)
        advise_pages(buf, options["pages"])
        if reusable:
            populate(buf)
    if options["node"] is not None:
        mbind_buffer(buf, length, options["node"])
    region = map_region(spec, attr, buf, size, True,
                     {"pages": options["pages"], "node": options["node"], "owned": True,
                      "memtype": "write-back (anonymous RAM)"},
                     release=mapping_cache.IDLE.releaser(length, flags) if reusable else None)
    fill_owned(region.array)
    return region


# --- devdax: the user's pool, mapped shared; never written unless named with --allow-write ----

def _validate_devdax(spec: RegionSpec, inventory: HostInventory) -> None:
    path, offset, _ = _dax_arg(spec)
    if not path:
        raise UsageError("devdax region needs a device path: devdax:/dev/daxX.Y[@offset[,size]]")
    name = os.path.basename(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        if _through_module(spec):  # unbound from device_dax, its range bound to nearlocal_pool
            return
        raise UsageError(f"device-dax path {path} does not exist (from {spec.text!r})") from None
    if not stat.S_ISCHR(mode) or not re.fullmatch(r"dax\d+\.\d+", name):
        raise UsageError(f"{path} is not a device-dax character device (expected /dev/daxX.Y)")
    device = find_dax(inventory.dax, path)
    if device is not None and device.align and offset % device.align:
        raise UsageError(f"offset {offset} in {spec.text!r} is not a multiple of the device "
                         f"alignment {device.align}")


def _devdax_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    path, _, _ = _dax_arg(spec)
    device = find_dax(inventory.dax, path)
    if device is None:
        return f"{path} is not listed under /sys/bus/dax/devices"
    if device.mode != "devdax" and not _through_module(spec):
        return f"{device.name} is bound to {device.mode}, not device_dax"
    return None


def _devdax_capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """The device's bytes past the offset (within the window named): mmap does not refuse a
    mapping past a device-dax's end, its first touch there is a SIGBUS."""
    path, offset, window = _dax_arg(spec)
    name = os.path.basename(path)
    size = SysRoot.default().read_int(f"/sys/bus/dax/devices/{name}/size")
    if size is None:
        return None
    room = max(0, size - offset)
    return (room if window is None else min(room, window),
            f"{name} ({format_size(size)}" + (f", from {format_size(offset)})" if offset else ")"))


def _through_module(spec: RegionSpec) -> bool:
    """The device's range is bound to the nearlocal_pool module (the operator unbound it from
    device_dax): every attribute maps through the module."""
    from nearlocal.regions.devices import devdax_attr_unavailable

    path = _dax_arg(spec)[0]
    return (not os.path.exists(path)) and devdax_attr_unavailable(spec, "uc") is None


def _open_devdax(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    path, offset, window = _dax_arg(spec)
    align_file = Path(f"/sys/bus/dax/devices/{os.path.basename(path)}/align")
    align = int(align_file.read_text().strip() or HUGE_2M) if align_file.exists() else HUGE_2M
    if window is not None and size > window:
        raise UsageError(f"the case needs {size} bytes but {spec.text!r} names only {window}")
    start = SysRoot.default().read_int(f"/sys/bus/dax/devices/{os.path.basename(path)}/resource")
    if attr != "wb" or _through_module(spec):  # device-dax maps only write-back
        from nearlocal.regions.devices import open_devdax_through_module

        return open_devdax_through_module(spec, size, attr, allow_write)
    fd = os.open(path, os.O_RDWR if allow_write else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if allow_write else 0)
        buf = mmap.mmap(fd, round_up(max(size, 1), align), flags=mmap.MAP_SHARED, prot=prot,
                        offset=offset)
    finally:
        os.close(fd)
    memtype = pat.memtype(SysRoot.default(), start + offset, size) if start is not None else \
        "unknown: the device's physical address is not shown"
    problem = pat.disagreement(attr, memtype, path)
    if problem:
        buf.close()
        raise UsageError(problem)
    return map_region(spec, attr, buf, size, allow_write,
                   {"device": path, "offset": offset, "align": align, "owned": False,
                    "memtype": memtype})


# --- file:PATH and shm:NAME: shared file mappings; created and removed by nearlocal if new ------

def _file_path(spec: RegionSpec) -> Path:
    if spec.kind == "shm":
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", spec.arg or ""):
            raise UsageError(f"malformed shared memory name in {spec.text!r}: use shm:NAME "
                             "with letters, digits, '.', '_' or '-'")
        return Path("/dev/shm") / spec.arg
    if not spec.arg:
        raise UsageError("file region needs a path: file:PATH")
    return Path(spec.arg)


SYSFS_RESOURCE = re.compile(r"resource\d+(_wc)?")


def _validate_file(spec: RegionSpec, inventory: HostInventory) -> None:
    from nearlocal.safeio import name_problem

    path = _file_path(spec)
    problem = name_problem(path)
    if problem:
        raise UsageError(f"region {spec.text[:60]!r}...: {problem}")
    real = os.path.realpath(path)
    if SYSFS_RESOURCE.fullmatch(path.name) and (str(path).startswith("/sys/")
                                                 or real.startswith("/sys/")):
        device = os.path.basename(os.path.dirname(real))
        raise UsageError(f"{path} is a PCI BAR, not a file: a file: region would record it as "
                         f"write-back; name it as pcibar:{device}/"
                         f"{path.name[8:].removesuffix('_wc')} (with attr uc or wc)")
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{path} is a dangling symbolic link (from {spec.text!r}): nearlocal "
                         "neither follows nor replaces it; name a file or a path that does not exist")
    if path.exists() and not path.is_file():
        raise UsageError(f"{path} is not a regular file (from {spec.text!r})")
    if not path.exists() and not path.parent.is_dir():
        raise UsageError(f"directory {path.parent} does not exist (from {spec.text!r})")


def _file_creates(spec: RegionSpec) -> Path:
    return _file_path(spec)


def _file_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    return in_use_reason(_file_path(spec), spec)


def _file_capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """Free space where a new file would go (tmpfs also needs the memory); None for an existing
    file (its size is checked when it is opened)."""
    path = _file_path(spec)
    if os.path.lexists(path) or not path.parent.is_dir():
        return None
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return None
    free, where = fs.f_bavail * fs.f_frsize, f"the file system of {path.parent}"
    if spec.kind == "shm":
        available = memory_available()
        if available is not None and available * MEMORY_HEADROOM < free:
            free, where = int(available * MEMORY_HEADROOM), "memory (MemAvailable less 10%)"
    return free, where


def _open_file(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    path = _file_path(spec)
    length = max(size, 1)
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{path} is a dangling symbolic link: nearlocal neither follows nor "
                         "replaces it")
    clear_dead_leftovers(path)  # its maker was killed before removing it: nearlocal's own
    if os.path.lexists(path):
        in_use = None if allow_write else in_use_reason(path, spec)
        if in_use:
            raise UsageError(in_use)
        if path.stat().st_size < length:
            raise UsageError(f"{path} holds {path.stat().st_size} bytes, the case needs {length}")
        fd = os.open(path, os.O_RDWR if allow_write else os.O_RDONLY)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if allow_write else 0)
        try:
            buf = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=prot)
        finally:
            os.close(fd)
        return map_region(spec, attr, buf, size, allow_write, {"path": str(path), "owned": False})
    _, buf, remove = create_file(path, lambda fd: reserve_and_map(fd, length, path),
                                 discard=lambda buf: buf.close())
    region = map_region(spec, attr, buf, size, True, {"path": str(path), "owned": True},
                     cleanup=remove)
    try:
        fill_owned(region.array)
    except BaseException:  # e.g. SIGTERM (SystemExit) mid-fill: the published file goes too
        region.close()
        raise
    return region


def _file_user_owned(spec: RegionSpec) -> bool:
    return user_owned_file(_file_path(spec))


def _numa_pool_class(spec: RegionSpec, cpuless_nodes: frozenset[int]) -> str:
    return "cxl-node" if spec.arg.isdigit() and int(spec.arg) in cpuless_nodes else "numa-node"


register_region_kind(RegionKind(
    name="dram", syntax="dram[:2M|thp][,node=N]", space="host", attrs=frozenset({"wb"}),
    summary="private anonymous local memory (optionally huge pages, optionally bound to a node)",
    validate=_validate_dram, unavailable=_dram_unavailable, open=_open_dram,
    instances=lambda inventory: ["dram", "dram:thp", "dram:2M"], capacity=_dram_capacity,
    pool_class="local", fresh_pages=True,
))
register_region_kind(RegionKind(
    name="numa", syntax="numa:N", space="host", attrs=frozenset({"wb"}),
    summary="anonymous memory bound to NUMA node N (a CPU-less node is CXL in system-ram mode)",
    validate=_validate_dram, unavailable=_dram_unavailable, open=_open_dram,
    instances=lambda inventory: [f"numa:{n.node}" for n in inventory.numa if n.mem_total_bytes],
    capacity=_dram_capacity, pool_class=_numa_pool_class, markers=("cxl",), fresh_pages=True,
))
def _devdax_attr_unavailable(spec: RegionSpec, attr: str) -> str | None:
    from nearlocal.regions.devices import devdax_attr_unavailable

    return devdax_attr_unavailable(spec, attr)


register_region_kind(RegionKind(
    name="devdax", syntax="devdax:/dev/daxX.Y[@offset[,size]]", space="host",
    attrs=frozenset({"wb", "uc", "wc"}), attr_unavailable=_devdax_attr_unavailable,
    summary="a device-dax pool mapped shared (Beluga's way); written only with --allow-write",
    validate=_validate_devdax, unavailable=_devdax_unavailable, open=_open_devdax,
    user_owned=lambda spec: True, capacity=_devdax_capacity,
    instances=lambda inventory: [f"devdax:{d.dev_path}" for d in inventory.dax if d.mode == "devdax"],
    pool_class="devdax", shared_mapping=True, markers=("cxl",),
))
register_region_kind(RegionKind(
    name="file", syntax="file:PATH", space="host", attrs=frozenset({"wb"}),
    summary="a file mapped shared (fsdax, tmpfs, hugetlbfs); created and removed if new",
    validate=_validate_file, unavailable=_file_unavailable, open=_open_file,
    user_owned=_file_user_owned, instances=lambda inventory: [], capacity=_file_capacity,
    creates=_file_creates, pool_class="shared", shared_mapping=True,
))
register_region_kind(RegionKind(
    name="shm", syntax="shm:NAME", space="host", attrs=frozenset({"wb"}),
    summary="POSIX shared memory /dev/shm/NAME, shared between processes",
    validate=_validate_file, unavailable=_file_unavailable, open=_open_file,
    user_owned=_file_user_owned, instances=lambda inventory: ["shm:nearlocal"],
    capacity=_file_capacity, creates=_file_creates, pool_class="shared", shared_mapping=True,
))
