"""Record the kernel trees nearlocal's probes read (what `tests/fixtures/` holds from a QEMU
guest): attribute files of /sys/bus/{cxl,dax,nd} devices and their drivers (as links), NUMA
nodes, memory-controller PCI devices (resource table; resourceN files as empty markers), the
PAT list, /proc/cpuinfo, /proc/iomem. Standard library only: it runs in a slow guest.

    python3 scripts/record_trees.py OUT_DIR [--map-bar DDDD:BB:DD.F N uc|wc]

--map-bar keeps that BAR mapped (resourceN or resourceN_wc) while the PAT list is read, so the
recorded list shows the type the kernel gave it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

MAX_BYTES = 64 * 1024
SKIP = re.compile(r"uevent|modalias|power|subsystem|firmware_node|remove|rescan|reset|config|rom"
                  r"|label|delete|create_.*|commit|.*_add|.*_remove|.*new_id|bind|unbind|msi_.*")


def _copy_file(source: Path, target: Path) -> None:
    try:
        if not os.access(source, os.R_OK):
            return
        with open(source, "rb") as f:
            data = f.read(MAX_BYTES)
    except OSError:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _copy_dir(source: Path, target: Path, depth: int) -> None:
    """The attribute files of a sysfs device directory (and its subdirectories to `depth`);
    `driver` as a link to a directory of the driver's name, like the kernel's."""
    try:
        names = sorted(os.listdir(source))
    except OSError:
        return
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = source / name
        if SKIP.fullmatch(name):
            continue
        if name == "driver" and path.is_symlink():
            driver = os.path.basename(os.readlink(path))
            (target / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(f"drivers/{driver}", target / "driver")
            continue
        if path.is_symlink():
            continue  # other links (ports, targets) would pull in the whole tree
        if path.is_dir():
            if depth > 0:
                _copy_dir(path, target / name, depth - 1)
        elif re.fullmatch(r"resource\d+(_wc)?", name):
            (target / name).touch()  # present: that is all probes ask of it
        else:
            _copy_file(path, target / name)


def record(out: Path) -> None:
    for bus in ("cxl", "dax", "nd"):
        base = Path(f"/sys/bus/{bus}/devices")
        for name in sorted(os.listdir(base)) if base.is_dir() else []:
            _copy_dir(base / name, out / base.relative_to("/") / name, depth=1)
    nodes = Path("/sys/devices/system/node")
    for name in sorted(os.listdir(nodes)):
        if re.fullmatch(r"node\d+", name):
            for item in ("cpulist", "meminfo", "distance"):
                _copy_file(nodes / name / item, out / nodes.relative_to("/") / name / item)
    cpu = Path("/sys/devices/system/cpu")
    _copy_file(cpu / "online", out / cpu.relative_to("/") / "online")
    _copy_file(cpu / "cpu0" / "tsc_freq_khz", out / cpu.relative_to("/") / "cpu0" / "tsc_freq_khz")
    for name in sorted(os.listdir("/dev")):
        if re.fullmatch(r"dax\d+\.\d+", name):  # the device nodes probes look for: markers
            (out / "dev").mkdir(parents=True, exist_ok=True)
            (out / "dev" / name).touch()
    _copy_dir(cpu / "cpu0" / "cache", out / cpu.relative_to("/") / "cpu0" / "cache", depth=1)
    pci = Path("/sys/bus/pci/devices")
    for name in sorted(os.listdir(pci)):
        class_code = (pci / name / "class").read_text().strip()
        if class_code.startswith("0x05"):
            target = out / pci.relative_to("/") / name
            for item in ("class", "vendor", "device", "resource"):
                _copy_file(pci / name / item, target / item)
            for entry in os.listdir(pci / name):
                if re.fullmatch(r"resource\d+(_wc)?", entry):
                    (target / entry).touch()
    for absolute in ("/sys/kernel/debug/x86/pat_memtype_list", "/proc/cpuinfo", "/proc/iomem",
                     "/proc/meminfo", "/sys/kernel/mm/transparent_hugepage/enabled"):
        _copy_file(Path(absolute), out / absolute.lstrip("/"))
    hugepages = Path("/sys/kernel/mm/hugepages")
    if hugepages.is_dir():
        _copy_dir(hugepages, out / hugepages.relative_to("/"), depth=1)


if __name__ == "__main__":
    import mmap

    target = Path(sys.argv[1])
    shutil.rmtree(target, ignore_errors=True)
    held = None
    if sys.argv[2:3] == ["--map-bar"]:
        address, bar, attr = sys.argv[3:6]
        name = f"/sys/bus/pci/devices/{address}/resource{bar}" + ("_wc" if attr == "wc" else "")
        with open(name, "rb") as f:
            held = mmap.mmap(f.fileno(), mmap.PAGESIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    record(target)
    if held is not None:
        held.close()
