"""Device-dax instances (/sys/bus/dax/devices): Beluga maps its pool through one of these."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nearlocal.sysroot import SysRoot

BASE = "/sys/bus/dax/devices"


@dataclass
class DaxDevice:
    name: str
    size: int
    align: int | None
    target_node: int | None
    numa_node: int | None
    mode: str  # "devdax" (device_dax driver), "system-ram" (kmem), or "unbound"
    resource: int | None  # physical start address, when the kernel shows it
    dev_path: str
    dev_present: bool


def _mode(root: SysRoot, name: str) -> str:
    try:
        driver = os.path.basename(os.readlink(root.path(f"{BASE}/{name}/driver")))
    except OSError:
        return "unbound"
    return {"device_dax": "devdax", "kmem": "system-ram"}.get(driver, driver)


def probe_dax(root: SysRoot) -> list[DaxDevice]:
    devices = []
    for name in root.listdir(BASE):
        if not re.fullmatch(r"dax\d+\.\d+", name):
            continue
        path = f"{BASE}/{name}"
        dev_path = f"/dev/{name}"
        devices.append(DaxDevice(
            name=name,
            size=root.read_int(f"{path}/size", 0) or 0,
            align=root.read_int(f"{path}/align"),
            target_node=root.read_int(f"{path}/target_node", base=10),
            numa_node=root.read_int(f"{path}/numa_node", base=10),
            mode=_mode(root, name),
            resource=root.read_int(f"{path}/resource"),
            dev_path=dev_path,
            dev_present=root.exists(dev_path),
        ))
    return devices


def find_dax(devices: list[DaxDevice], dev_path: str) -> DaxDevice | None:
    name = os.path.basename(dev_path)
    return next((d for d in devices if d.name == name), None)
