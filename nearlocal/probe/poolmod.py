"""The nearlocal_pool kernel module (kmod/nearlocal_pool): whether it is built, loaded, and bound
to which physical range, and the exact commands when it is not. The module maps a pool's range
uncached, write-combining or write-back with the PAT type the kernel tracks (what /dev/mem cannot
give a range device-dax holds write-back); `ncmem:` regions and uc/wc on `devdax:` go through it.
nearlocal never builds or loads it: the operator does (docs/memory-types.md)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from nearlocal.sysroot import SysRoot

MODULE = "nearlocal_pool"
DEVICE = "/dev/nearlocal-pool0"
SYSFS = "/sys/class/misc/nearlocal-pool0"
VERSION = "0.1"  # kmod/nearlocal_pool/dkms.conf's PACKAGE_VERSION
# The mmap offset windows the module maps each type through (nearlocal_pool.c: WINDOW_SHIFT 46)
WINDOW_SHIFT = 46
WINDOWS: dict[str, int] = {"wb": 0, "uc": 1 << WINDOW_SHIFT, "wc": 2 << WINDOW_SHIFT}


def source_dir() -> Path | None:
    """kmod/nearlocal_pool in the checkout nearlocal runs from (absent from a wheel)."""
    here = Path(__file__).resolve().parents[2] / "kmod" / MODULE
    return here if (here / f"{MODULE}.c").exists() else None


@dataclass
class PoolModule:
    source: str | None = None  # the module's source directory
    built: str | None = None  # the .ko found (source tree, or installed under /lib/modules)
    loaded: bool = False
    device: str | None = None  # /dev/nearlocal-pool0 when present
    start: int | None = None  # the bound range (module parameters), when loaded
    size: int | None = None
    mappings: int | None = None  # live mappings of the range
    commands: list[str] = field(default_factory=list)  # what the operator runs next, in order
    # the module's last line in the kernel log when it is not loaded: why an insmod refused
    refusal: str | None = None

    @property
    def usable(self) -> bool:
        return self.loaded and self.device is not None and bool(self.size)

    def covers(self, start: int, size: int) -> bool:
        """The bound range holds [start, start + size)."""
        return (self.usable and self.start is not None and self.size is not None
                and self.start <= start and start + size <= self.start + self.size)

    def reason(self) -> str | None:
        """Why nothing can be mapped through the module now, with the commands; None: it can."""
        if self.usable:
            return None
        what = ("is loaded but " + DEVICE + " is absent" if self.loaded else
                f"is not loaded: its last insmod was refused ({self.refusal})" if self.refusal else
                "is built but not loaded" if self.built else "is not built")
        return f"the {MODULE} kernel module {what}: " + "; ".join(self.commands)


def _installed(root: SysRoot, release: str) -> str | None:
    for where in ("extra", "updates/dkms", "updates"):
        path = f"/lib/modules/{release}/{where}/{MODULE}.ko"
        for name in (path, path + ".xz", path + ".zst"):
            if root.exists(name):
                return name
    return None


def kernel_log(root: SysRoot) -> list[str]:
    """The kernel log's messages, oldest first ([] where it cannot be read: not root). /dev/kmsg
    gives one record per read and EAGAIN at its end when opened non-blocking; a fake root's is
    a text file of the same records."""
    if not root.is_real():
        text = root.read("/dev/kmsg") or ""
        return [line.partition(";")[2] for line in text.splitlines()]
    records = []
    with contextlib.suppress(OSError):
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True:
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record overwritten while reading; go on
                    continue
                if not record:
                    break
                records.append(record.decode("utf-8", "replace").partition(";")[2].split("\n")[0])
        finally:
            os.close(fd)
    return records


def last_refusal(root: SysRoot) -> str | None:
    """The module's last refusal in the kernel log ("nearlocal_pool: ... refused"), the one line
    an insmod that failed left (an errno alone says EBUSY, not which driver holds the range)."""
    said = [line for line in kernel_log(root) if line.startswith(f"{MODULE}: ")]
    last = said[-1] if said else ""
    return last if "refused" in last or "must be" in last else None  # not a later load's line


def probe_pool_module(root: SysRoot, dax: list | None = None) -> PoolModule:
    """The module's state; `dax`: the probe's device-dax devices, to name a range in the load
    command (else a placeholder the operator fills)."""
    source = source_dir()
    release = os.uname().release if root.is_real() else "fake"
    built = _installed(root, release)
    if built is None and source is not None and (source / f"{MODULE}.ko").exists():
        built = str(source / f"{MODULE}.ko")
    found = PoolModule(source=str(source) if source else None, built=built,
                       loaded=root.exists(f"/sys/module/{MODULE}"))
    if found.loaded:
        found.start = root.read_int(f"{SYSFS}/start")
        found.size = root.read_int(f"{SYSFS}/size")
        found.mappings = root.read_int(f"{SYSFS}/mappings", base=10)
        found.device = DEVICE if root.exists(DEVICE) else None
    else:
        found.refusal = last_refusal(root)
    found.commands = _commands(found, dax or [])
    return found


def _commands(found: PoolModule, dax: list) -> list[str]:
    if found.usable:
        return []
    src = found.source or "kmod/nearlocal_pool (in nearlocal's source tree)"
    steps = []
    if found.built is None:
        steps.append(f"build it: make -C {src} (needs the running kernel's headers: "
                     "apt-get install linux-headers-$(uname -r); or with DKMS: dkms add "
                     f"{src} && dkms install {MODULE}/{VERSION})")
    pool = next((d for d in dax if getattr(d, "resource", None) is not None), None)
    if pool is not None:
        steps.append(f"free the range from device-dax: echo {pool.name} > "
                     "/sys/bus/dax/drivers/device_dax/unbind (on an nvdimm namespace: ndctl "
                     "disable-namespace NAMESPACE; docs/memory-types.md)")
        range_args = f"start={pool.resource:#x} size={pool.size:#x}"
    else:
        range_args = ("start=0xSTART size=0xSIZE (a device-dax range: "
                      "/sys/bus/dax/devices/daxX.Y/resource and size, as root)")
    ko = found.built if found.built and found.built.endswith(".ko") and "/lib/modules/" not in found.built \
        else None
    steps.append(f"load it: insmod {ko} {range_args}" if ko else
                 f"load it: modprobe {MODULE} {range_args}" if found.built else
                 f"load it: insmod {src}/{MODULE}.ko {range_args}")
    if found.loaded and found.device is None:
        steps = [f"{DEVICE} is missing: check dmesg for {MODULE}'s line and udev"]
    return steps
