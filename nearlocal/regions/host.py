"""Host memory providers: anonymous DRAM, a NUMA node (CXL in system-ram mode), device-dax, files
and POSIX shared memory. Only these touch mmap/mbind; everything else sees MappedRegion."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory, pat
from nearlocal.probe.dax import find_dax
from nearlocal.regions.base import (
    CREATED_XATTR,
    MappedRegion,
    RegionKind,
    RegionSpec,
    hidden_names,
    maker_of,
    owner_link_name,
    register_region_kind,
)
from nearlocal.regions.mapping import _dax_arg, map_region
from nearlocal.sysroot import SysRoot
from nearlocal.units import format_size

T = TypeVar("T")

MAP_HUGETLB = 0x40000
MAP_HUGE_SHIFT = 26
MPOL_BIND = 2
MPOL_MF_STRICT = 1
MPOL_MF_MOVE = 2
SYS_MBIND = 237  # x86-64
HUGE_2M = 2 * 1024 * 1024
_libc = ctypes.CDLL(None, use_errno=True)


MEMORY_HEADROOM = 0.9  # a region may take at most this share of the memory available now


def _meminfo(absolute: str) -> dict[str, int]:
    """A meminfo file (/proc/meminfo or a node's) as bytes per field; {} when unreadable."""
    fields = {}
    for line in (SysRoot.default().read(absolute, "") or "").splitlines():
        match = re.search(r"(\w+(?:\(\w+\))?):\s+(\d+)\s*kB", line)
        if match:
            fields[match.group(1)] = int(match.group(2)) * 1024
    return fields


def memory_available() -> int | None:
    return _meminfo("/proc/meminfo").get("MemAvailable")


def _round_up(value: int, align: int) -> int:
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


def _free_hugetlb_bytes() -> int | None:
    free = SysRoot.default().read_int("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
    return None if free is None else free * HUGE_2M


def _dram_capacity(spec: RegionSpec) -> tuple[int, str] | None:
    """What a new anonymous region can take now: free 2 MiB pages, or the node's free memory,
    or MemAvailable (less headroom: nearlocal fills every page it maps)."""
    options = dram_options(spec)
    if options["pages"] == "2M":  # this process's idle mappings are its own to reuse
        free = _free_hugetlb_bytes()
        return (free + _IDLE.idle_bytes(hugetlb=True), "the 2 MiB hugetlb pool") \
            if free is not None else None
    available = memory_available()
    if available is not None:
        available += _IDLE.idle_bytes(hugetlb=False)
    where = "memory (MemAvailable less 10%)"
    node = options["node"]
    if node is not None:
        fields = _meminfo(f"/sys/devices/system/node/node{node}/meminfo")
        if "MemFree" in fields:
            node_free = fields["MemFree"] + fields.get("FilePages", 0)
            available = node_free if available is None else min(available, node_free)
            where = f"NUMA node {node} (free and page-cache memory, less 10%)"
    return None if available is None else (int(available * MEMORY_HEADROOM), where)


class _IdleMappings:
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
            room = _free_hugetlb_bytes()
        else:
            available = memory_available()
            room = None if available is None else available * MEMORY_HEADROOM
        if room is not None and length <= room:
            return
        for key in [key for key in self.free if bool(key[1] & MAP_HUGETLB) == hugetlb]:
            for buf in self.free.pop(key):
                with contextlib.suppress(BufferError):
                    buf.close()


_IDLE = _IdleMappings()


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


def _open_dram(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    options = dram_options(spec)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    length = max(size, 1)
    if options["pages"] == "2M":
        flags |= MAP_HUGETLB | (21 << MAP_HUGE_SHIFT)
        length = _round_up(length, HUGE_2M)
    reusable = options["pages"] != "thp" and options["node"] is None
    buf = _IDLE.take(length, flags) if reusable else None
    if buf is None:
        _IDLE.make_room(length, flags)
        buf = mmap.mmap(-1, length, flags=flags)
        advise_pages(buf, options["pages"])
        if reusable:
            populate(buf)
    if options["node"] is not None:
        mbind_buffer(buf, length, options["node"])
    region = map_region(spec, attr, buf, size, True,
                     {"pages": options["pages"], "node": options["node"], "owned": True,
                      "memtype": "write-back (anonymous RAM)"},
                     release=_IDLE.releaser(length, flags) if reusable else None)
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
        buf = mmap.mmap(fd, _round_up(max(size, 1), align), flags=mmap.MAP_SHARED, prot=prot,
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


def _held_by_a_run(path: Path) -> bool:
    """True when a live nearlocal process created this file and still uses it: it holds a shared
    flock on it until it removes it (what tells it from a user's file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # also drops the lock it may have taken
    return False




def _maker() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def left_by_a_dead_run(path: Path) -> bool:
    """True for a file nearlocal created (its xattr or owner link says so) whose maker, on this
    host, is dead and holds no lock: a SIGKILLed run's leftover, not a user's file, so it may be
    replaced."""
    maker = maker_of(path)
    if maker is None or not maker[0] or _held_by_a_run(path):
        return False
    try:
        os.kill(maker[1], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False  # its maker is alive (a pid reused is alive too: left alone)


def clear_dead_leftovers(path: Path) -> None:
    """Remove what killed runs left for this name: the file at it with its owner link, and the
    hidden names of files they never published (each holds its memory on a tmpfs). A user's file
    (no record of nearlocal making it) and a live run's are left alone."""
    if left_by_a_dead_run(path):
        path.unlink(missing_ok=True)
    for hidden in hidden_names(path):
        if left_by_a_dead_run(hidden):
            hidden.unlink(missing_ok=True)


def _file_creates(spec: RegionSpec) -> Path:
    return _file_path(spec)


def in_use_reason(path: Path, spec: RegionSpec) -> str | None:
    """Why a file another live run created (and removes when done) cannot be this case's."""
    if not _held_by_a_run(path):
        return None
    return (f"{path} is in use by another running nearlocal process (it created the file and "
            f"removes it when done): give another name than {spec.text!r}, or wait")


def user_owned_file(path: Path) -> bool:
    """A file that is there and not a dead run's leftover is the user's (a dangling link too)."""
    return os.path.lexists(path) and not left_by_a_dead_run(path)


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


def _publish(temp: Path, path: Path) -> None:
    """Give the new file its name without replacing anything that appeared there meanwhile (a
    user's file, a link, another run's region): a hard link fails where a rename would replace."""
    try:
        os.link(temp, path, follow_symlinks=False)
    except FileExistsError:
        raise UsageError(f"{path} appeared while nearlocal was creating it (another run, or "
                         "someone's file): it was left alone; give another name") from None


def _reserve(fd: int, length: int, path: Path) -> None:
    """Allocate the file's blocks now: on a full file system (a 2 MiB tmpfs, /dev/shm filled by
    someone else since the capacity check) the first touch of a sparse mapping is a SIGBUS that
    kills the process; reserving first makes it an ENOSPC here, reported as one line."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there: sparse, as before
            os.ftruncate(fd, length)
            return
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.ENOMEM):
            raise UsageError(f"no room for {format_size(length)} in {path.parent} to create "
                             f"{path.name}: {exc.strerror}; choose a smaller size or free "
                             "space there") from None
        raise


def create_file(path: Path, prepare: Callable[[int], T],
                discard: Callable[[T], None] = lambda prepared: None) -> tuple[int, T, Callable[[], None]]:
    """Create a new file at `path` as nearlocal's own (file:, shm: and storage: regions): made
    under its owner link (O_EXCL, no link followed; the name says which process on which host
    made it, so the file is never without that record, whatever the file system keeps), marked
    as a live run's (a shared flock held until it is removed; the creation xattr where the file
    system keeps one), `prepare(fd)`d (filled, mapped), then published with a hard link that
    never replaces what appeared meanwhile (`discard(prepared)` if that fails). The owner link
    stays while the file does: a SIGKILL at any point leaves only what `clear_dead_leftovers`
    knows as a dead run's. Returns (fd, what prepare returned, remove): remove() unlinks only the
    file made here (whatever has the name now is left alone), then its owner link, and closes fd."""
    temp = owner_link_name(path)
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # held until removed: marks the file as a live run's
        with contextlib.suppress(OSError):  # a file system without user xattrs: the link says it
            os.setxattr(fd, CREATED_XATTR, _maker().encode())
        identity = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        prepared = prepare(fd)
        try:
            _publish(temp, path)
        except BaseException:
            discard(prepared)
            raise
    except BaseException:
        os.close(fd)
        temp.unlink(missing_ok=True)  # never published: nothing of it is left
        raise

    def remove() -> None:
        try:
            for name in (path, temp):  # the name first: a file without its owner link is a user's
                with contextlib.suppress(OSError):
                    found = os.lstat(name)
                    if (found.st_dev, found.st_ino) == identity:
                        name.unlink()
        finally:
            os.close(fd)

    return fd, prepared, remove


def _reserve_and_map(fd: int, length: int, path: Path) -> mmap.mmap:
    _reserve(fd, length, path)
    return mmap.mmap(fd, length, flags=mmap.MAP_SHARED)


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
    _, buf, remove = create_file(path, lambda fd: _reserve_and_map(fd, length, path),
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
    name="dram", syntax="dram[:2M|thp][,node=N]", family="host", attrs=frozenset({"wb"}),
    summary="private anonymous local memory (optionally huge pages, optionally bound to a node)",
    validate=_validate_dram, unavailable=_dram_unavailable, open=_open_dram,
    instances=lambda inventory: ["dram", "dram:thp", "dram:2M"], capacity=_dram_capacity,
    pool_class="local", fresh_pages=True,
))
register_region_kind(RegionKind(
    name="numa", syntax="numa:N", family="host", attrs=frozenset({"wb"}),
    summary="anonymous memory bound to NUMA node N (a CPU-less node is CXL in system-ram mode)",
    validate=_validate_dram, unavailable=_dram_unavailable, open=_open_dram,
    instances=lambda inventory: [f"numa:{n.node}" for n in inventory.numa if n.mem_total_bytes],
    capacity=_dram_capacity, pool_class=_numa_pool_class, markers=("cxl",), fresh_pages=True,
))
def _devdax_attr_unavailable(spec: RegionSpec, attr: str) -> str | None:
    from nearlocal.regions.devices import devdax_attr_unavailable

    return devdax_attr_unavailable(spec, attr)


register_region_kind(RegionKind(
    name="devdax", syntax="devdax:/dev/daxX.Y[@offset[,size]]", family="host",
    attrs=frozenset({"wb", "uc", "wc"}), attr_unavailable=_devdax_attr_unavailable,
    summary="a device-dax pool mapped shared (Beluga's way); written only with --allow-write",
    validate=_validate_devdax, unavailable=_devdax_unavailable, open=_open_devdax,
    user_owned=lambda spec: True, capacity=_devdax_capacity,
    instances=lambda inventory: [f"devdax:{d.dev_path}" for d in inventory.dax if d.mode == "devdax"],
    pool_class="devdax", shared_mapping=True, markers=("cxl",),
))
register_region_kind(RegionKind(
    name="file", syntax="file:PATH", family="host", attrs=frozenset({"wb"}),
    summary="a file mapped shared (fsdax, tmpfs, hugetlbfs); created and removed if new",
    validate=_validate_file, unavailable=_file_unavailable, open=_open_file,
    user_owned=_file_user_owned, instances=lambda inventory: [], capacity=_file_capacity,
    creates=_file_creates, pool_class="shared", shared_mapping=True,
))
register_region_kind(RegionKind(
    name="shm", syntax="shm:NAME", family="host", attrs=frozenset({"wb"}),
    summary="POSIX shared memory /dev/shm/NAME, shared between processes",
    validate=_validate_file, unavailable=_file_unavailable, open=_open_file,
    user_owned=_file_user_owned, instances=lambda inventory: ["shm:nearlocal"],
    capacity=_file_capacity, creates=_file_creates, pool_class="shared", shared_mapping=True,
))
