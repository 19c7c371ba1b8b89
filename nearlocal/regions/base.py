"""Regions: where bytes live. One registry entry per kind, each declared once with what it needs.

A region spec is text (`dram`, `dram:thp`, `dram:2M`, `dram:node=1`, `numa:1`,
`devdax:/dev/dax0.0@2GiB,1GiB`, `file:/mnt/pmem/x`, `shm:kvpool`); the kind is the part before the
first colon. Providers map memory and report the attributes they can really produce; the runner
never branches on the kind.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nearlocal.errors import UsageError
from nearlocal.lazy import lazy_import
from nearlocal.plugins import declare

np = lazy_import("numpy")

if TYPE_CHECKING:
    from nearlocal.probe import HostInventory

ATTRIBUTES: dict[str, str] = {
    "wb": "cacheable (write-back)",
    "uc": "uncacheable",
    "wc": "write-combining",
}

# Why no provider here can produce an attribute, when none does (probe prints it).
ATTRIBUTE_GAPS: dict[str, str] = {
    "uc": (
        "no provider on this box can map uncacheable memory: that needs the nearlocal_pool "
        "kernel module bound to a pool's range (ncmem:/dev/nearlocal-pool0, or devdax:... with "
        "uc; `nearlocal probe` gives its build and load commands), a PCI BAR named as "
        "pcibar:ADDRESS/N, or a range /dev/mem may map (phys:... with uc)"
    ),
    "wc": (
        "no provider on this box can map write-combining memory: that needs the nearlocal_pool "
        "kernel module bound to a pool's range (ncmem:/dev/nearlocal-pool0, or devdax:... with "
        "wc; `nearlocal probe` gives its build and load commands) or a prefetchable PCI BAR "
        "named as pcibar:ADDRESS/N (its resourceN_wc file); nearlocal never maps a BAR it was "
        "not given, and /dev/mem cannot map write-combining"
    ),
}


@dataclass(frozen=True)
class RegionSpec:
    text: str
    kind: str
    arg: str  # the part after "kind:", may be empty


@dataclass
class MappedRegion:
    """A mapping the kernels can use as a uint8 array; `info` is recorded with the case."""

    spec: RegionSpec
    attr: str
    array: np.ndarray
    writable: bool
    info: dict = field(default_factory=dict)
    _close: Callable[[], None] | None = None
    # a physical range mapped by page frame number (remap_pfn_range: VM_IO | VM_PFNMAP, a PCI
    # BAR, /dev/mem, the nearlocal_pool module), which has no pages to pin: what registers it
    # with a device (cudaHostRegister) must register it as I/O memory
    io_memory: bool = False

    def close(self) -> None:
        if self._close is not None:
            closer, self._close = self._close, None
            closer()


@dataclass(frozen=True)
class RegionKind:
    name: str
    syntax: str
    summary: str
    space: str  # whose memory: "host", "gpu", "storage"; which methods can use it
    attrs: frozenset[str]
    validate: Callable[[RegionSpec, HostInventory], None]  # UsageError for bad input
    unavailable: Callable[[RegionSpec, HostInventory], str | None]  # why it cannot run here
    open: Callable[[RegionSpec, int, str, bool], MappedRegion]  # (spec, size, attr, allow_write)
    user_owned: Callable[[RegionSpec], bool] = lambda spec: False  # writes need --allow-write
    instances: Callable[[HostInventory], list[str]] | None = None  # specs probe lists for this box
    # (bytes a region of this spec can take now, what holds them: free memory, a device's size
    # past the offset); None: not limited here, e.g. an existing file the open itself checks
    capacity: Callable[[RegionSpec], tuple[int, str] | None] | None = None
    # the file open() creates (and removes on close) for this spec, e.g. /dev/shm/NAME; None: none
    creates: Callable[[RegionSpec], Path] | None = None
    # why this region cannot be written at all (a read-only file system); None: it can
    read_only: Callable[[RegionSpec], str | None] | None = None
    # why this box cannot give an attribute the kind offers (a BAR with no resourceN_wc, a kernel
    # that refuses /dev/mem); None: it can
    attr_unavailable: Callable[[RegionSpec, str], str | None] | None = None
    # what the region is to the pool question (a POOL_CLASSES key): a name, or for a kind whose
    # answer depends on the box (numa:N), a function of the spec and the CPU-less nodes
    pool_class: str | Callable[[RegionSpec, frozenset[int]], str] = "other"
    # other processes (and hosts) map it as it is, by its name: a file or a device. rpc.shared
    # and the MPI job share it without a copy; a private kind (dram, numa:N) is shared through
    # a memfd copy
    shared_mapping: bool = False
    # every open maps memory the kernel picks afresh and nothing names (anonymous RAM): several
    # opens held at once in one process are several page placements (engine/worker.py draws
    # them); a named file or device maps the same pages however often it is opened
    fresh_pages: bool = False
    # pytest markers its cases carry in `pytest bench/` ("cxl": a pool's cases, `-m cxl`)
    markers: tuple[str, ...] = ()


# How pool-like a region is, most pool-like first (a class's rank is its position): rows carry
# their region's class (`pool_class`), so suites, reports, compare and accept never read a
# region's name to decide what it is.
POOL_CLASSES: dict[str, str] = {
    "devdax": "CXL pool (device-dax)",
    "cxl-node": "CPU-less NUMA node (CXL in system-ram mode)",
    "numa-node": "NUMA node",
    "shared": "shared mapping",
    "other": "other region",
    "local": "local DRAM",
    "gpu": "GPU memory",
}


def pool_class_of(region: str | RegionSpec, cpuless_nodes: frozenset[int] = frozenset()) -> str:
    """The POOL_CLASSES key of a region (its text, or its spec already parsed); `cpuless_nodes`
    from the run's inventory. Text that no longer parses (an old store, a removed kind) is
    "other"."""
    try:
        spec = region if isinstance(region, RegionSpec) else parse_region(region)
    except (UsageError, ValueError):  # what parse_region says of text it cannot read
        return "other"
    if spec.kind not in REGION_KINDS:
        return "other"
    declared = REGION_KINDS[spec.kind].pool_class
    return declared(spec, cpuless_nodes) if callable(declared) else declared


def gpu_device(region: object, pool_class: object) -> int | None:
    """The device a region of the GPU pool class names (`gpu:K`: device K, the index the GPU
    probe and the links use); None for a region of any other class or one naming no index."""
    if pool_class != "gpu":
        return None
    _, _, arg = str(region).partition(":")
    return int(arg) if arg.isdigit() else None


REGION_KINDS: dict[str, RegionKind] = {}


def load_providers() -> None:
    """Import every module that declares region kinds once: the entry-point group
    plugins.REGION_GROUP (nearlocal's own in its pyproject.toml, a third party's in its own
    distribution) and NEARLOCAL_PLUGINS, so base names none of them (nearlocal.plugins)."""
    from nearlocal.plugins import REGION_GROUP, load_group

    load_group(REGION_GROUP)


def register_region_kind(kind: RegionKind) -> RegionKind:
    return declare(REGION_KINDS, kind.name, kind, "region kind")


def parse_region(text: str) -> RegionSpec:
    load_providers()
    text = str(text).strip()
    kind, _, arg = text.partition(":")
    if kind not in REGION_KINDS:
        valid = ", ".join(k.syntax for k in REGION_KINDS.values())
        raise UsageError(f"unknown region {text!r}: valid regions are {valid}")
    return RegionSpec(text, kind, arg)


def region_kind(spec: RegionSpec) -> RegionKind:
    """The kind of a parsed spec; its provider is loaded here too (a worker gets specs already
    parsed: the plan's resolved case)."""
    load_providers()
    return REGION_KINDS[spec.kind]


def files_to_create(specs: Iterable[RegionSpec]) -> list[Path]:
    """The files opening these regions (a case's region and peer) will create (they do not exist
    now): what the runner removes if the worker dies (SIGBUS on a full tmpfs, a timeout) before
    it could."""
    found = []
    for spec in specs:
        kind = region_kind(spec)
        path = kind.creates(spec) if kind.creates else None
        if path is not None and not os.path.lexists(path):
            found.append(Path(path))
    return found


CREATED_XATTR = "user.nearlocal.created"  # "<hostname>:<pid>" of the process that made the file
# The hidden name a file nearlocal creates is made under and keeps while in use (a second link to
# it): `.<name>.nearlocal-<pid>-<host tag>-<nonce>`. It names its maker from the file's first
# moment, on every file system (tmpfs before Linux 6.6, ramfs, NFS keep no user xattrs).
OWNER_LINK = re.compile(r"\.nearlocal-(\d+)-([0-9a-f]{6})-[0-9a-f]{5}$")


def host_tag() -> str:
    """This host in an owner link's name: a short hash of its node name."""
    return hashlib.sha1(os.uname().nodename.encode()).hexdigest()[:6]


def owner_link_name(path: Path, pid: int | None = None) -> Path:
    """Where a new file for `path` is made (O_EXCL) and kept linked while its maker uses it."""
    return path.with_name(f".{path.name}.nearlocal-{os.getpid() if pid is None else pid}-"
                          f"{host_tag()}-{secrets.token_hex(3)[:5]}")


def hidden_names(path: Path) -> list[Path]:
    """The owner links and temporary names nearlocal made for `path` (its own or a dead run's)."""
    return list(path.parent.glob(f".{glob.escape(path.name)}.nearlocal-*"))


def maker_of(path: Path) -> tuple[bool, int] | None:
    """(made on this host, pid) of the nearlocal process that made the regular file at `path`:
    its creation xattr, else its own name when it is an owner link, else an owner link to the
    same file beside it. None: no record of nearlocal making it (a user's file)."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    try:
        host, _, pid = os.getxattr(path, CREATED_XATTR, follow_symlinks=False).decode() \
            .rpartition(":")
        if pid.isdigit():
            return host == os.uname().nodename, int(pid)
    except (OSError, UnicodeDecodeError):
        pass
    for link in [path, *hidden_names(path)]:
        named = OWNER_LINK.search(link.name)
        if named is None:
            continue
        try:
            linked = os.lstat(link)
        except OSError:
            continue
        if (linked.st_dev, linked.st_ino) == (found.st_dev, found.st_ino):
            return named[2] == host_tag(), int(named[1])
    return None


def made_by_nearlocal(path: Path) -> bool:
    """The file carries a record of nearlocal making it (a file the user made meanwhile does not)."""
    return maker_of(path) is not None


def remove_leftovers(paths: list[Path]) -> None:
    """Remove what a dead worker created at these paths (and its hidden names, which carry a
    suffix of nearlocal's), unless a live process holds it (another run made it since:
    nearlocal's files carry a shared flock). A file at the path itself goes only if it carries
    a record of nearlocal making it: one the user put there meanwhile is never removed."""
    for path in paths:
        temps = hidden_names(path)
        for found in [path, *temps]:
            if not found.is_file() or found.is_symlink() or _locked(found):
                continue
            if found in temps or made_by_nearlocal(found):
                found.unlink(missing_ok=True)


def _locked(path: Path) -> bool:
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def capacity_problem(spec: RegionSpec, size: int) -> str | None:
    """Why a region of this size must not be created (more than the free memory or the file
    system's free space can hold: filling /dev/shm or RAM ends with the OOM killer), or None."""
    kind = region_kind(spec)
    found = kind.capacity(spec) if kind.capacity else None
    if found is not None and size > found[0]:
        from nearlocal.units import format_size

        return (f"{spec.text} cannot hold {format_size(size)}: {found[1]} has "
                f"{format_size(found[0])} free; choose a smaller size")
    return None


def check_capacity(spec: RegionSpec, size: int) -> None:
    """capacity_problem as a UsageError: the last check before a region is created."""
    problem = capacity_problem(spec, size)
    if problem:
        raise UsageError(problem)


def attribute_unavailable(spec: RegionSpec, attr: str) -> str | None:
    kind = region_kind(spec)
    if attr not in ATTRIBUTES:
        raise UsageError(f"unknown attribute {attr!r}: valid attributes are {', '.join(ATTRIBUTES)}")
    if attr in kind.attrs:
        return kind.attr_unavailable(spec, attr) if kind.attr_unavailable else None
    return ATTRIBUTE_GAPS.get(attr, f"region kind {kind.name} cannot produce attribute {attr}")
