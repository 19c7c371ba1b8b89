"""CXL memory devices, decoders and regions (Documentation/ABI/testing/sysfs-bus-cxl)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

BASE = "/sys/bus/cxl/devices"


@dataclass
class CxlMemdev:
    name: str
    ram_bytes: int
    pmem_bytes: int
    serial: str | None
    numa_node: int | None


@dataclass
class CxlDecoder:
    name: str
    start: int | None
    size: int
    interleave_ways: int | None
    interleave_granularity: int | None
    target_type: str | None
    mode: str | None


@dataclass
class CxlRegion:
    name: str
    start: int | None
    size: int
    interleave_ways: int | None
    interleave_granularity: int | None
    mode: str | None
    targets: list[str] = field(default_factory=list)


@dataclass
class CxlInfo:
    present: bool
    memdevs: list[CxlMemdev]
    decoders: list[CxlDecoder]
    regions: list[CxlRegion]


def probe_cxl(root: SysRoot) -> CxlInfo:
    if not root.exists(BASE):
        return CxlInfo(False, [], [], [])
    memdevs, decoders, regions = [], [], []
    for name in root.listdir(BASE):
        path = f"{BASE}/{name}"
        if re.fullmatch(r"mem\d+", name):
            node = root.read_int(f"{path}/numa_node", base=10)
            memdevs.append(CxlMemdev(
                name=name,
                ram_bytes=root.read_int(f"{path}/ram/size", 0) or 0,
                pmem_bytes=root.read_int(f"{path}/pmem/size", 0) or 0,
                serial=root.read(f"{path}/serial"),
                numa_node=node if node is not None and node >= 0 else None,
            ))
        elif re.fullmatch(r"decoder\d+\.\d+", name):
            decoders.append(CxlDecoder(
                name=name,
                start=root.read_int(f"{path}/start"),
                size=root.read_int(f"{path}/size", 0) or 0,
                interleave_ways=root.read_int(f"{path}/interleave_ways", base=10),
                interleave_granularity=root.read_int(f"{path}/interleave_granularity", base=10),
                target_type=root.read(f"{path}/target_type"),
                mode=root.read(f"{path}/mode"),
            ))
        elif re.fullmatch(r"region\d+", name):
            ways = root.read_int(f"{path}/interleave_ways", base=10)
            targets = [root.read(f"{path}/target{i}") or "" for i in range(ways or 0)]
            regions.append(CxlRegion(
                name=name,
                start=root.read_int(f"{path}/resource"),
                size=root.read_int(f"{path}/size", 0) or 0,
                interleave_ways=ways,
                interleave_granularity=root.read_int(f"{path}/interleave_granularity", base=10),
                mode=root.read(f"{path}/mode"),
                targets=[t for t in targets if t],
            ))
    return CxlInfo(True, memdevs, decoders, regions)
