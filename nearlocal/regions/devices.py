"""Uncached and write-combining memory for real: a PCI memory BAR (`pcibar:`, the kernel's
resourceN / resourceN_wc files), a physical range through /dev/mem with O_SYNC (`phys:`), and a
pool's range through the nearlocal_pool kernel module (`ncmem:`, and uc / wc on `devdax:`).
Each mapping's memory type is read back from the x86 PAT list; a type other than the one asked
fails the case, both named. Nothing here is mapped unless the user names it; writes need --allow-write."""

from __future__ import annotations

import errno
import gzip
import mmap
import os
import re

from nearlocal.errors import UsageError
from nearlocal.probe import HostInventory, pat
from nearlocal.probe.dax import probe_dax
from nearlocal.probe.pci import BASE as PCI_BASE
from nearlocal.probe.pci import normal_address, read_bars
from nearlocal.probe.poolmod import MODULE, WINDOWS, PoolModule, probe_pool_module
from nearlocal.regions.base import MappedRegion, RegionKind, RegionSpec, register_region_kind
from nearlocal.regions.mapping import _dax_arg, map_region
from nearlocal.sysroot import SysRoot
from nearlocal.units import format_size, parse_size

PAGE = mmap.PAGESIZE
DEV_MEM = "/dev/mem"


def _window(text: str, spec: RegionSpec) -> tuple[int, int | None]:
    """`@offset[,size]` after a region's name -> (offset, size or None)."""
    offset_text, _, size_text = text.partition(",")
    try:
        offset = parse_size(offset_text) if offset_text and offset_text != "0" else 0
        size = parse_size(size_text) if size_text else None
    except UsageError as exc:
        raise UsageError(f"{exc} (in {spec.text!r})") from None
    if offset % PAGE:
        raise UsageError(f"offset {offset} in {spec.text!r} is not a multiple of the page size {PAGE}")
    return offset, size


def _readback(spec: RegionSpec, attr: str, start: int, size: int, what: str) -> str:
    """The PAT type the kernel gave [start, start + size) now that it is mapped; UsageError (a
    failed row) when it is not the asked attribute."""
    found = pat.memtype(SysRoot.default(), start, size)
    problem = pat.disagreement(attr, found, what)
    if problem:
        raise UsageError(problem)
    return found


def _map(path: str, size: int, offset: int, allow_write: bool, flags: int = 0,
         why_refused=None) -> mmap.mmap:
    fd = os.open(path, (os.O_RDWR if allow_write else os.O_RDONLY) | flags)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if allow_write else 0)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot, offset=offset)
    except OSError as exc:
        reason = why_refused(exc) if why_refused else None
        raise UsageError(reason or f"mapping {path} failed: {exc.strerror}") from None
    finally:
        os.close(fd)


def _region(spec: RegionSpec, attr: str, buf: mmap.mmap, size: int, writable: bool,
            info: dict) -> MappedRegion:
    """Every mapping here is a physical range mapped by frame number (io_memory)."""
    region = map_region(spec, attr, buf, size, writable, {**info, "owned": False})
    region.io_memory = True
    return region


# --- pcibar:DDDD:BB:DD.F/N[@offset[,size]] -------------------------------------------------

def _pcibar_arg(spec: RegionSpec) -> tuple[str, int, int, int | None]:
    name, _, window = spec.arg.partition("@")
    device, slash, bar = name.rpartition("/")
    address = normal_address(device) if slash else None
    if address is None or not re.fullmatch(r"\d", bar):
        raise UsageError(f"malformed PCI BAR {spec.text!r}: use pcibar:DDDD:BB:DD.F/N with N the "
                         "BAR number 0-5, e.g. pcibar:0000:00:0b.0/2")
    offset, size = _window(window, spec)
    return address, int(bar), offset, size


def _bar(spec: RegionSpec):
    address, index, offset, size = _pcibar_arg(spec)
    bars = read_bars(SysRoot.default(), address)
    if bars is None:
        raise UsageError(f"PCI device {address} does not exist (no {PCI_BASE}/{address}/resource; "
                         f"from {spec.text!r})")
    bar = next((b for b in bars if b.index == index), None)
    if bar is None or not bar.memory:
        kind = "unassigned" if bar is None or bar.size == 0 else "an I/O port BAR"
        memory = ", ".join(str(b.index) for b in bars if b.memory) or "none"
        raise UsageError(f"BAR {index} of {address} is {kind}, not memory: pcibar maps memory "
                         f"BARs only (this device's memory BARs: {memory})")
    if offset >= bar.size or (size is not None and offset + size > bar.size):
        raise UsageError(f"the window in {spec.text!r} goes past the end of BAR {index} "
                         f"({format_size(bar.size)})")
    return address, bar, offset, size


def _validate_pcibar(spec: RegionSpec, inventory: HostInventory) -> None:
    _bar(spec)


def _pcibar_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    if SysRoot.default().is_real() and os.geteuid() != 0:
        return "mapping a PCI BAR through sysfs needs root"
    return None


def _pcibar_attr_unavailable(spec: RegionSpec, attr: str) -> str | None:
    address, bar, _, _ = _bar(spec)
    if attr == "wc" and not bar.wc_file:
        return (f"BAR {bar.index} of {address} is not prefetchable: the kernel offers no "
                f"resource{bar.index}_wc, so it cannot be mapped write-combining (uc can)")
    if attr == "uc" and not bar.uc_file:
        return f"the kernel offers no resource{bar.index} file to map BAR {bar.index} of {address}"
    return None


def _open_pcibar(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    address, bar, offset, window = _bar(spec)
    room = (window if window is not None else bar.size - offset)
    if size > room:
        raise UsageError(f"the case needs {format_size(size)} but {spec.text!r} has "
                         f"{format_size(room)}")
    name = f"resource{bar.index}" + ("_wc" if attr == "wc" else "")
    path = str(SysRoot.default().path(f"{PCI_BASE}/{address}/{name}"))
    length = min(room, -(-max(size, 1) // PAGE) * PAGE)
    buf = _map(path, length, offset, allow_write)
    try:
        memtype = _readback(spec, attr, bar.start + offset, length, f"{address} BAR {bar.index}")
    except BaseException:
        buf.close()
        raise
    return _region(spec, attr, buf, size, allow_write, {
        "device": address, "bar": bar.index, "file": name, "physical": hex(bar.start + offset),
        "prefetchable": bar.prefetchable, "memtype": memtype})


# --- /dev/mem: phys:0xSTART,SIZE and uc on devdax ------------------------------------------

def _kernel_config(root: SysRoot) -> dict[str, str]:
    """The running kernel's build options (CONFIG_X=y), from /boot or /proc/config.gz; {}."""
    text = root.read(f"/boot/config-{os.uname().release}")
    if text is None:
        try:
            text = gzip.decompress(root.path("/proc/config.gz").read_bytes()).decode()
        except (OSError, EOFError, gzip.BadGzipFile):
            return {}
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("CONFIG_"))


def _system_ram(root: SysRoot) -> list[tuple[int, int]]:
    ranges = []
    for line in (root.read("/proc/iomem", "") or "").splitlines():
        match = re.match(r"\s*([0-9a-f]+)-([0-9a-f]+) : System RAM", line)
        if match:
            ranges.append((int(match.group(1), 16), int(match.group(2), 16) + 1))
    return ranges


def devmem_refusal(start: int, size: int, held_by_driver: bool) -> str | None:
    """Why the kernel will not let /dev/mem map [start, start + size), as far as it can be told
    before trying (CONFIG_STRICT_DEVMEM refuses System RAM; CONFIG_IO_STRICT_DEVMEM refuses what
    a driver holds unless booted with iomem=relaxed); None: it may."""
    root = SysRoot.default()
    if not root.exists(DEV_MEM):
        return f"{DEV_MEM} is absent (CONFIG_DEVMEM off, or a container without it)"
    if root.is_real() and os.geteuid() != 0:
        return f"mapping {DEV_MEM} needs root"
    config = _kernel_config(root)
    if config.get("CONFIG_STRICT_DEVMEM") == "y" and any(
            lo < start + size and start < hi for lo, hi in _system_ram(root)):
        return (f"[{start:#x}, {start + size:#x}) is System RAM and the kernel is built with "
                f"CONFIG_STRICT_DEVMEM: {DEV_MEM} never maps RAM there")
    relaxed = "iomem=relaxed" in (root.read("/proc/cmdline", "") or "").split()
    if held_by_driver and config.get("CONFIG_IO_STRICT_DEVMEM") == "y" and not relaxed:
        return (f"a driver holds [{start:#x}, {start + size:#x}) and the kernel is built with "
                f"CONFIG_IO_STRICT_DEVMEM: {DEV_MEM} maps it only after booting with iomem=relaxed")
    return None


def _devmem_error(start: int, size: int):
    def why(exc: OSError) -> str:
        if exc.errno == errno.EPERM:
            return (f"the kernel refused {DEV_MEM} at [{start:#x}, {start + size:#x}): "
                    "CONFIG_STRICT_DEVMEM / CONFIG_IO_STRICT_DEVMEM (RAM, or a range a driver "
                    "holds without iomem=relaxed), or kernel lockdown")
        if exc.errno in (errno.EINVAL, errno.EAGAIN):  # mmap_mem: EAGAIN when PAT refuses
            found = pat.memtype(SysRoot.default(), start, size)
            return (f"the kernel refused an uncached {DEV_MEM} mapping of [{start:#x}, "
                    f"{start + size:#x}): x86 PAT already tracks the range as {found} (a "
                    "device-dax range is held write-back), and PAT allows no uncached alias "
                    "of a write-back range")
        return f"mapping {DEV_MEM} at {start:#x} failed: {exc.strerror}"
    return why


def open_devmem(spec: RegionSpec, start: int, size: int, attr: str, allow_write: bool,
                info: dict) -> MappedRegion:
    """[start, start + size) through /dev/mem: O_SYNC for uc (the kernel maps uncached-minus),
    plain for wb; the type read back from the PAT list."""
    length = -(-max(size, 1) // PAGE) * PAGE
    buf = _map(str(SysRoot.default().path(DEV_MEM)), length, start, allow_write,
               os.O_SYNC if attr == "uc" else 0, _devmem_error(start, length))
    try:
        memtype = _readback(spec, attr, start, length, f"{DEV_MEM} at {start:#x}")
    except BaseException:
        buf.close()
        raise
    return _region(spec, attr, buf, size, allow_write,
                   {**info, "physical": hex(start), "via": DEV_MEM, "memtype": memtype})


def _phys_arg(spec: RegionSpec) -> tuple[int, int]:
    start_text, _, size_text = spec.arg.partition(",")
    try:
        start = int(start_text, 16) if start_text.lower().startswith("0x") else None
    except ValueError:
        start = None
    if start is None or not size_text:
        raise UsageError(f"malformed physical range {spec.text!r}: use phys:0xSTART,SIZE "
                         "(e.g. phys:0x240000000,1GiB)")
    if start % PAGE:
        raise UsageError(f"physical start {start:#x} in {spec.text!r} is not page aligned")
    try:
        size = parse_size(size_text)
    except UsageError as exc:
        raise UsageError(f"{exc} (in {spec.text!r})") from None
    return start, size


def _open_phys(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    start, window = _phys_arg(spec)
    if size > window:
        raise UsageError(f"the case needs {format_size(size)} but {spec.text!r} names only "
                         f"{format_size(window)}")
    return open_devmem(spec, start, size, attr, allow_write, {})


def _phys_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    start, size = _phys_arg(spec)
    return devmem_refusal(start, size, held_by_driver=False)


def pool_module() -> PoolModule:
    return probe_pool_module(SysRoot.default(), probe_dax(SysRoot.default()))


def _dax_range(spec: RegionSpec) -> tuple[int | None, int]:
    """(physical start of the window a devdax spec names, its length or a page): the device's
    resource (root only) plus the spec's offset."""
    path, offset, window = _dax_arg(spec)
    start = SysRoot.default().read_int(f"/sys/bus/dax/devices/{os.path.basename(path)}/resource")
    return (None if start is None else start + offset), window or PAGE


def devdax_attr_unavailable(spec: RegionSpec, attr: str) -> str | None:
    """uc and wc on device-dax go through the nearlocal_pool module bound to the device's range
    (device-dax maps only write-back, and x86 PAT refuses /dev/mem an uncached alias of the range
    it holds write-back); without it the row is skipped with the commands that build and load it."""
    if attr == "wb":
        return None
    path = _dax_arg(spec)[0]
    start, length = _dax_range(spec)
    module = pool_module()
    if start is not None and module.covers(start, length):
        return None
    if not module.usable:
        return (f"{attr} on device-dax needs the {MODULE} module (device-dax maps only "
                f"write-back; x86 PAT refuses {DEV_MEM} an uncached or write-combining alias of it): "
                f"{module.reason()}")
    if start is None:
        return (f"{attr} on {path} needs its physical address (/sys/bus/dax/devices/"
                f"{os.path.basename(path)}/resource, root only) to find it in the {MODULE} "
                "module's range")
    return (f"{attr} on {path} goes through the {MODULE} module, which is bound to "
            f"[{module.start:#x}, {module.start + module.size:#x}), not to this device's "
            f"[{start:#x}, {start + length:#x}): reload it with this device's range")


def open_devdax_through_module(spec: RegionSpec, size: int, attr: str,
                               allow_write: bool) -> MappedRegion:
    """A devdax spec's window mapped through the module bound to the device's range."""
    path, offset, _ = _dax_arg(spec)
    start, length = _dax_range(spec)
    module = pool_module()
    if start is None or not module.covers(start, max(size, length)):
        raise UsageError(devdax_attr_unavailable(spec, attr) or
                         f"the {MODULE} module's range does not hold {spec.text!r}")
    return _open_module(spec, module, start - module.start, size, attr, allow_write,
                        {"device": path, "offset": offset})


# --- ncmem:/dev/nearlocal-pool0[@offset[,size]]: the nearlocal_pool module's range --------------

def _ncmem_arg(spec: RegionSpec) -> tuple[str, int, int | None]:
    path, _, window = spec.arg.partition("@")
    if not re.fullmatch(r"/dev/nearlocal-pool\d+", path):
        raise UsageError(f"malformed ncmem region {spec.text!r}: use "
                         "ncmem:/dev/nearlocal-pool0[@offset[,size]]")
    offset, size = _window(window, spec)  # a size of 0 is malformed (parse_size)
    return path, offset, size


def _loaded_module(spec: RegionSpec) -> PoolModule:
    """The module behind an ncmem spec, its range checked; UsageError (one line) when the
    device is missing, the window goes past the range, or the range overlaps System RAM."""
    path, offset, size = _ncmem_arg(spec)
    module = pool_module()
    if not module.usable or not SysRoot.default().exists(path):
        raise UsageError(f"{path} does not exist (from {spec.text!r}): "
                         + (module.reason() or f"the {MODULE} module's device is {module.device}"))
    if offset + (size or 0) > module.size or offset >= module.size:
        raise UsageError(f"the window in {spec.text!r} goes past the end of the {MODULE} "
                         f"module's range ({format_size(module.size)} at {module.start:#x})")
    ram = [(lo, hi) for lo, hi in _system_ram(SysRoot.default())
           if lo < module.start + module.size and module.start < hi]
    if ram:
        raise UsageError(f"the {MODULE} module's range [{module.start:#x}, "
                         f"{module.start + module.size:#x}) overlaps System RAM at "
                         f"[{ram[0][0]:#x}, {ram[0][1]:#x}): refused")
    return module


def _module_error(module: PoolModule, start: int, length: int, attr: str):
    def why(exc: OSError) -> str:
        where = f"[{start:#x}, {start + length:#x})"
        if exc.errno == errno.ENXIO:
            return f"{where} is beyond the {MODULE} module's range ({format_size(module.size)})"
        if exc.errno in (errno.EINVAL, errno.EAGAIN):  # remap_pfn_range's PAT refusal is EINVAL
            found = pat.memtype(SysRoot.default(), start, length)
            tracked = pat.disagreement(attr, found, where) and not found.startswith("write-back (no")
            if exc.errno == errno.EAGAIN or tracked:
                return (f"x86 PAT refused {attr} for {where}: the range is tracked as {found} "
                        f"by another mapping (one type per range: unmap it first)")
        if exc.errno == errno.EINVAL:
            return (f"the {MODULE} module refused to map {where} as {attr} (a type it does not "
                    "know, or a mapping that is not shared)")
        if exc.errno in (errno.EPERM, errno.EACCES):
            return f"mapping through the {MODULE} module needs root (CAP_SYS_RAWIO)"
        return f"mapping {where} through the {MODULE} module failed: {exc.strerror}"
    return why


def _open_module(spec: RegionSpec, module: PoolModule, offset: int, size: int, attr: str,
                 allow_write: bool, info: dict) -> MappedRegion:
    """[offset, offset + size) of the module's range, mapped as `attr` through its window; the
    type read back from the PAT list."""
    if attr not in WINDOWS:
        raise UsageError(f"the {MODULE} module maps {', '.join(WINDOWS)}, not {attr!r}")
    length = -(-max(size, 1) // PAGE) * PAGE
    start = module.start + offset
    if offset + length > module.size:
        raise UsageError(f"the case needs {format_size(size)} at offset {offset} but the "
                         f"{MODULE} module's range has {format_size(module.size)}")
    path = str(SysRoot.default().path(module.device or ""))
    why = _module_error(module, start, length, attr)
    try:  # the open's own refusal (CAP_SYS_RAWIO, a device gone) as one line too
        os.close(os.open(path, os.O_RDWR if allow_write else os.O_RDONLY))
    except OSError as exc:
        raise UsageError(f"opening {module.device}: {why(exc)}") from None
    buf = _map(path, length, WINDOWS[attr] + offset, allow_write, why_refused=why)
    try:
        memtype = _readback(spec, attr, start, length, f"{module.device} at {start:#x}")
    except BaseException:
        buf.close()
        raise
    return _region(spec, attr, buf, size, allow_write,
                   {**info, "physical": hex(start), "via": module.device, "memtype": memtype})


def _validate_ncmem(spec: RegionSpec, inventory: HostInventory) -> None:
    _loaded_module(spec)


def _ncmem_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    if SysRoot.default().is_real() and os.geteuid() != 0:
        return f"mapping through the {MODULE} module needs root (CAP_SYS_RAWIO)"
    return None


def _open_ncmem(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    module = _loaded_module(spec)
    _, offset, window = _ncmem_arg(spec)
    room = window if window is not None else module.size - offset
    if size > room:
        raise UsageError(f"the case needs {format_size(size)} but {spec.text!r} has "
                         f"{format_size(room)}")
    return _open_module(spec, module, offset, size, attr, allow_write, {"offset": offset})


def _ncmem_instances(inventory: HostInventory) -> list[str]:
    module = getattr(inventory, "pool_module", None)
    return [f"ncmem:{module.device}"] if module is not None and module.usable else []


register_region_kind(RegionKind(
    name="pcibar", syntax="pcibar:DDDD:BB:DD.F/N[@offset[,size]]", space="host",
    attrs=frozenset({"uc", "wc"}),
    summary="a PCI memory BAR, mapped through sysfs resourceN (uc) or resourceN_wc (wc); "
            "only when named; written only with --allow-write",
    validate=_validate_pcibar, unavailable=_pcibar_unavailable, open=_open_pcibar,
    user_owned=lambda spec: True, instances=lambda inventory: [],
    attr_unavailable=_pcibar_attr_unavailable,
))
register_region_kind(RegionKind(
    name="phys", syntax="phys:0xSTART,SIZE", space="host", attrs=frozenset({"wb", "uc"}),
    summary="a physical range through /dev/mem (uc with O_SYNC) where the kernel permits it; "
            "only when named; written only with --allow-write",
    validate=lambda spec, inventory: _phys_arg(spec) and None, unavailable=_phys_unavailable,
    open=_open_phys, user_owned=lambda spec: True, instances=lambda inventory: [],
))
register_region_kind(RegionKind(
    name="ncmem", syntax="ncmem:/dev/nearlocal-pool0[@offset[,size]]", space="host",
    attrs=frozenset({"wb", "uc", "wc"}),
    summary="a pool's physical range through the nearlocal_pool kernel module (kmod/), mapped "
            "wb, uc or wc with the PAT type the kernel tracks; written only with --allow-write",
    validate=_validate_ncmem, unavailable=_ncmem_unavailable, open=_open_ncmem,
    user_owned=lambda spec: True, instances=_ncmem_instances,
    pool_class="devdax", shared_mapping=True, markers=("cxl",),
))
