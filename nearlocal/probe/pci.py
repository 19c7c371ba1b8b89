"""PCI memory BARs a `pcibar:` region can map: a device's `resource` table in sysfs, and the
`resourceN` / `resourceN_wc` files the kernel offers for mmap (uncached-minus / write-combining).
Probe lists memory-controller class devices only (ivshmem, CXL type-3): nearlocal maps a BAR
only when the user names it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

BASE = "/sys/bus/pci/devices"
IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
BAR_COUNT = 6  # resource lines 0-5 are the BARs (6 is the expansion ROM, then bridge windows)
MEMORY_CLASS = 0x05  # PCI base class "memory controller" (ivshmem: 0x0500, CXL type-3: 0x0502)
ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


@dataclass
class PciBar:
    index: int
    start: int
    size: int
    memory: bool  # a memory BAR (not I/O ports, not unassigned)
    prefetchable: bool
    uc_file: bool  # resourceN is there (what pcibar maps for uc)
    wc_file: bool  # resourceN_wc is there (the kernel offers it for prefetchable memory BARs)


@dataclass
class PciDevice:
    address: str  # DDDD:BB:DD.F
    vendor: str | None
    device: str | None
    class_code: int | None
    bars: list[PciBar] = field(default_factory=list)


def normal_address(text: str) -> str | None:
    """`00:0b.0` or `0000:00:0B.0` -> `0000:00:0b.0`; None when it is not a PCI address."""
    match = ADDRESS.fullmatch(text.strip())
    if not match:
        return None
    domain, bus, slot, function = match.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{slot.lower()}.{function}"


def read_bars(root: SysRoot, address: str) -> list[PciBar] | None:
    """The device's six BARs from its `resource` table; None when the device is not there."""
    path = f"{BASE}/{address}"
    text = root.read(f"{path}/resource")
    if text is None:
        return None
    bars = []
    for index, line in enumerate(text.splitlines()[:BAR_COUNT]):
        try:
            start, end, flags = (int(word, 16) for word in line.split()[:3])
        except ValueError:
            continue
        size = end - start + 1 if end > start else 0
        bars.append(PciBar(index, start, size, bool(flags & IORESOURCE_MEM) and size > 0,
                           bool(flags & IORESOURCE_PREFETCH),
                           root.exists(f"{path}/resource{index}"),
                           root.exists(f"{path}/resource{index}_wc")))
    return bars


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs lists it: what both the BAR list and the links (links.py) pick
    their devices from, read in one walk of /sys/bus/pci/devices."""

    address: str
    vendor: str | None  # "0x10de"
    device: str | None
    class_code: int | None


def pci_functions(root: SysRoot) -> list[PciFunction]:
    """Every PCI function with its vendor, device and class, in sysfs's order."""
    return [PciFunction(address, root.read(f"{BASE}/{address}/vendor"),
                        root.read(f"{BASE}/{address}/device"),
                        root.read_int(f"{BASE}/{address}/class"))
            for address in root.listdir(BASE)]


def probe_pci_memory(root: SysRoot, functions: list[PciFunction] | None = None) -> list[PciDevice]:
    """Memory-controller devices with at least one memory BAR (what `pcibar:` can measure);
    `functions`: the box's PCI functions when already read (pci_functions)."""
    found = []
    for function in pci_functions(root) if functions is None else functions:
        if function.class_code is None or function.class_code >> 16 != MEMORY_CLASS:
            continue
        bars = [bar for bar in read_bars(root, function.address) or [] if bar.memory]
        if bars:
            found.append(PciDevice(function.address, function.vendor, function.device,
                                   function.class_code, bars))
    return found
