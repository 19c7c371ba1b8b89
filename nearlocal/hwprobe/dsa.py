"""Intel DSA devices and work queues (/sys/bus/dsa/devices, /dev/dsa/wqX.Y)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

BASE = "/sys/bus/dsa/devices"


@dataclass
class DsaWorkQueue:
    name: str
    mode: str | None
    size: int | None
    priority: int | None
    type: str | None
    state: str | None
    wq_name: str | None
    dev_path: str
    dev_present: bool

    @property
    def usable(self) -> bool:
        return self.state == "enabled" and self.type == "user" and self.dev_present


@dataclass
class DsaDevice:
    name: str
    version: str | None
    max_engines: int | None
    max_transfer_size: int | None
    max_batch_size: int | None
    op_cap: str | None
    state: str | None
    work_queues: list[DsaWorkQueue] = field(default_factory=list)


@dataclass
class DsaInfo:
    module_loaded: bool
    devices: list[DsaDevice]

    @property
    def usable_wqs(self) -> list[DsaWorkQueue]:
        return [wq for dev in self.devices for wq in dev.work_queues if wq.usable]


def probe_dsa(root: SysRoot) -> DsaInfo:
    loaded = root.exists("/sys/bus/dsa") or root.exists("/sys/module/idxd")
    devices: dict[str, DsaDevice] = {}
    names = root.listdir(BASE)
    for name in names:
        if re.fullmatch(r"dsa\d+", name):
            path = f"{BASE}/{name}"
            devices[name] = DsaDevice(
                name=name,
                version=root.read(f"{path}/version"),
                max_engines=root.read_int(f"{path}/max_engines", base=10),
                max_transfer_size=root.read_int(f"{path}/max_transfer_size", base=10),
                max_batch_size=root.read_int(f"{path}/max_batch_size", base=10),
                op_cap=root.read(f"{path}/op_cap"),
                state=root.read(f"{path}/state"),
            )
    for name in names:
        match = re.fullmatch(r"wq(\d+)\.(\d+)", name)
        if not match:
            continue
        path = f"{BASE}/{name}"
        dev_path = f"/dev/dsa/{name}"
        wq = DsaWorkQueue(
            name=name,
            mode=root.read(f"{path}/mode"),
            size=root.read_int(f"{path}/size", base=10),
            priority=root.read_int(f"{path}/priority", base=10),
            type=root.read(f"{path}/type"),
            state=root.read(f"{path}/state"),
            wq_name=root.read(f"{path}/name"),
            dev_path=dev_path,
            dev_present=root.exists(dev_path),
        )
        parent = devices.get(f"dsa{match.group(1)}")
        if parent is not None:
            parent.work_queues.append(wq)
    return DsaInfo(loaded, list(devices.values()))
