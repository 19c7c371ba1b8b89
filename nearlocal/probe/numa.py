"""NUMA nodes; a node with memory and no CPUs is how a CXL expander in system-ram mode shows up."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nearlocal.sysroot import SysRoot, parse_cpulist


@dataclass
class NumaNode:
    node: int
    cpus: list[int]
    mem_total_bytes: int
    distances: list[int]

    @property
    def cpuless(self) -> bool:
        return not self.cpus and self.mem_total_bytes > 0

    @property
    def likely_cxl(self) -> bool:
        return self.cpuless


def probe_numa(root: SysRoot) -> list[NumaNode]:
    base = "/sys/devices/system/node"
    nodes = []
    for entry in root.listdir(base):
        match = re.fullmatch(r"node(\d+)", entry)
        if not match:
            continue
        meminfo = root.read(f"{base}/{entry}/meminfo", "") or ""
        total = re.search(r"MemTotal:\s+(\d+)\s*kB", meminfo)
        nodes.append(NumaNode(
            node=int(match.group(1)),
            cpus=parse_cpulist(root.read(f"{base}/{entry}/cpulist")),
            mem_total_bytes=int(total.group(1)) * 1024 if total else 0,
            distances=[int(d) for d in (root.read(f"{base}/{entry}/distance", "") or "").split()],
        ))
    return sorted(nodes, key=lambda n: n.node)
