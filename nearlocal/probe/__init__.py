"""What this box has: one module per source, each returning dataclasses; `probe()` gathers them.

All sysfs/procfs reads go through `SysRoot` so tests run against fake trees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from dataclasses import dataclass, field

from nearlocal.probe.block import BlockDevice, probe_block
from nearlocal.probe.cpu import CpuInfo, probe_cpu
from nearlocal.probe.cxl import CxlInfo, probe_cxl
from nearlocal.probe.dax import DaxDevice, probe_dax
from nearlocal.probe.dsa import DsaInfo, probe_dsa
from nearlocal.probe.gpu import GpuInfo, probe_gpu
from nearlocal.probe.hugepages import HugePages, probe_hugepages
from nearlocal.probe.links import Topology, probe_topology
from nearlocal.probe.numa import NumaNode, probe_numa
from nearlocal.probe.pci import PciDevice, pci_functions, probe_pci_memory
from nearlocal.probe.poolmod import PoolModule, probe_pool_module
from nearlocal.probe.rdma import RdmaInfo, probe_rdma
from nearlocal.probe.settings import BoxSettings, probe_settings
from nearlocal.sysroot import SysRoot


@dataclass
class HostInventory:
    hostname: str
    kernel: str
    cpu: CpuInfo
    tsc_hz: float
    tsc_source: str  # "kernel" or "calibrated"
    numa: list[NumaNode]
    cxl: CxlInfo
    dax: list[DaxDevice]
    dsa: DsaInfo
    hugepages: HugePages
    gpu: GpuInfo
    block: list[BlockDevice] = field(default_factory=list)  # disks (file-read's media)
    extra: dict = field(default_factory=dict)
    pci_memory: list[PciDevice] = field(default_factory=list)  # BARs `pcibar:` can map
    rdma: RdmaInfo = field(default_factory=RdmaInfo)  # RDMA devices (the rdma-* methods)
    # governor, boost, SMT, THP, NUMA balancing, C-states, isolated CPUs (probe/settings.py)
    box_settings: BoxSettings = field(default_factory=BoxSettings)
    # the nearlocal_pool kernel module: built, loaded, bound to which range (probe/poolmod.py)
    pool_module: PoolModule = field(default_factory=PoolModule)
    # PCIe / CXL links, NUMA nodes, root ports, DDIO, GPU x adapter x NIC affinity (links.py)
    topology: Topology = field(default_factory=lambda: Topology())

    @property
    def cpuless_nodes(self) -> frozenset[int]:
        """Nodes with memory and no CPUs (how CXL in system-ram mode shows up)."""
        return frozenset(n.node for n in self.numa if n.cpuless)

    @property
    def host_id(self) -> str:
        """Identity of the hardware for comparisons: the hash of its hardware_identity."""
        data = dataclasses.asdict(self)
        data["numa"] = [{**d, "likely_cxl": n.likely_cxl}
                        for d, n in zip(data["numa"], self.numa, strict=True)]
        key = hardware_identity(data)
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["host_id"] = self.host_id
        return data


def hardware_identity(inventory: dict) -> dict:
    """What identifies the hardware, read from an inventory's dict form (a live one's, a stored
    run's, or identity_summary's; a field it lacks reads None): CPU model and count, NUMA nodes
    with their CPU count and CXL-likeness (a NumaNode property: host_id adds it), GPUs. Not
    memory sizes (a VM's balloon moves them) nor a calibrated TSC (its last digits move between
    runs). host_id is its hash."""
    cpu = inventory.get("cpu") or {}
    return {
        "cpu": cpu.get("model"),
        "logical_cpus": cpu.get("logical_cpus"),
        "numa": [(n.get("node"), len(n.get("cpus", [])), n.get("likely_cxl"))
                 for n in inventory.get("numa") or []],
        "gpus": [g.get("name") for g in (inventory.get("gpu") or {}).get("devices", [])],
    }


def identity_summary(inventory: HostInventory) -> dict:
    """The inventory cut to what identifies the hardware, in its dict form (what compare reads
    back), plus the hostname and the TSC to 10 MHz: what pytest-benchmark's machine_info may
    carry, as it warns whenever that differs (free memory and huge pages change between runs)."""
    return {
        "hostname": inventory.hostname, "host_id": inventory.host_id,
        "cpu": {"model": inventory.cpu.model, "vendor": inventory.cpu.vendor},
        "tsc_hz": round(inventory.tsc_hz, -7),
        "numa": [{"node": n.node, "cpus": list(n.cpus)} for n in inventory.numa],
        "gpu": {"devices": [{"name": g.name} for g in inventory.gpu.devices]},
    }


def probe(root: SysRoot | None = None, calibrate: bool = True, gpu: bool = True) -> HostInventory:
    root = root or SysRoot.default()
    cpu = probe_cpu(root)
    if cpu.tsc_hz_kernel:
        tsc_hz, source = cpu.tsc_hz_kernel, "kernel"
    elif calibrate:
        from nearlocal.kernels.timer import calibrate_tsc_hz

        tsc_hz, source = calibrate_tsc_hz(), "calibrated"
    else:
        tsc_hz, source = 0.0, "unknown"
    if calibrate and tsc_hz and root.is_real() and cpu.has("hypervisor"):
        from nearlocal.probe.cache import available_bytes, measured_llc

        cpu.measured_llc_bytes, cpu.llc_source = measured_llc(
            cpu.l2_bytes, cpu.cpuid_llc_bytes, tsc_hz, available_bytes(root))
    dax = probe_dax(root)
    gpus = probe_gpu(root) if gpu else GpuInfo(reason="no GPU: not probed")
    rdma = probe_rdma(root)
    functions = pci_functions(root)  # one walk of /sys/bus/pci: the BARs and the links
    return HostInventory(
        hostname=platform.node() if root.is_real() else "fake-host",
        kernel=os.uname().release if root.is_real() else "fake",
        cpu=cpu,
        tsc_hz=tsc_hz,
        tsc_source=source,
        numa=probe_numa(root),
        cxl=probe_cxl(root),
        dax=dax,
        dsa=probe_dsa(root),
        hugepages=probe_hugepages(root),
        gpu=gpus,
        block=probe_block(root),
        pci_memory=probe_pci_memory(root, functions),
        rdma=rdma,
        box_settings=probe_settings(root),
        pool_module=probe_pool_module(root, dax),
        topology=probe_topology(root, cpu, gpus, rdma, functions),
    )
