"""Fake sysfs / procfs trees laid out as the kernel's ABI documentation describes them."""

from __future__ import annotations

import os
from pathlib import Path

FLAGS = ("fpu tsc rdtscp constant_tsc nonstop_tsc sse4_1 avx2 avx512f clflush clflushopt clwb movdiri "
         "movdir64b enqcmd waitpkg")
CPUINFO = "".join(
    f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    f"flags\t\t: {FLAGS}\n\n" for cpu in range(2))


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def link(root: Path, path: str, target: str) -> None:
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, where)


# The flags and model of the VM rig's cpu guest (QEMU -cpu Westmere,+rdtscp under TCG, recorded
# there): SSE4.2 and rdtscp, no AVX at all, no clflushopt, clwb or movdir64b.
WESTMERE_FLAGS = ("fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
                  "fxsr sse sse2 ht syscall nx rdtscp lm constant_tsc rep_good nopl xtopology cpuid "
                  "pni pclmulqdq ssse3 cx16 sse4_1 sse4_2 popcnt aes hypervisor lahf_lm pti arat")
WESTMERE_CPUINFO = "".join(
    f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: Westmere E56xx/L56xx/X56xx "
    f"(Nehalem-C)\nflags\t\t: {WESTMERE_FLAGS}\n\n" for cpu in range(2))


# The flags and model of the recorded boxes (tests/fixtures/boxes/README.md; lscpu / cpuinfo read
# there): the Intel KVM guest (family 6 model 207, Emerald Rapids class: movdir64b and movdiri, no
# enqcmd) and the AMD EPYC KVM guest (Zen 4: AVX-512, clflushopt, clwb, no movdir64b).
EMERALD_RAPIDS_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
    "sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch cpuid_fault "
    "fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm avx512f avx512dq rdseed adx smap "
    "avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves "
    "avx_vnni avx512_bf16 arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid cldemote movdiri movdir64b fsrm serialize tsxldtrk "
    "avx512_fp16 arch_capabilities")
EMERALD_RAPIDS_CPUINFO = "".join(
    f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
    f"model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: {EMERALD_RAPIDS_FLAGS}\n\n"
    for cpu in range(2))
EPYC_ZEN4_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
    "sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology "
    "nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 "
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy "
    "cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext cpuid_fault vmmcall fsgsbase "
    "tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma "
    "clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 "
    "clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid fsrm")
EPYC_ZEN4_CPUINFO = "".join(
    f"processor\t: {cpu}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
    f"model name\t: AMD EPYC\nflags\t\t: {EPYC_ZEN4_FLAGS}\n\n" for cpu in range(2))


def cxl_box(root: Path, dsa_enabled: bool = True, cpuinfo: str = CPUINFO) -> Path:
    """Two CPUs on node 0, a CPU-less 64 GiB node 1 (CXL in system-ram mode), one CXL memdev,
    decoder and region, a 16 GiB device-dax instance, one DSA device with a dedicated WQ.
    `cpuinfo`: its /proc/cpuinfo (WESTMERE_CPUINFO: a CPU lacking what kernels may use)."""
    write(root, "/proc/cpuinfo", cpuinfo)
    write(root, "/sys/devices/system/cpu/online", "0-1")
    write(root, "/sys/devices/system/cpu/cpu0/tsc_freq_khz", "2000000")
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (2, "Unified", "2048K"),
                                                 (3, "Unified", "107520K")]):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        write(root, f"{base}/level", str(level))
        write(root, f"{base}/type", kind)
        write(root, f"{base}/size", size)
        write(root, f"{base}/shared_cpu_list", "0-1")
    write(root, "/sys/devices/system/node/node0/cpulist", "0-1")
    write(root, "/sys/devices/system/node/node0/meminfo",
          "Node 0 MemTotal:       263840924 kB\nNode 0 MemFree:        200000000 kB")
    write(root, "/sys/devices/system/node/node0/distance", "10 21")
    write(root, "/sys/devices/system/node/node1/cpulist", "")
    write(root, "/sys/devices/system/node/node1/meminfo",
          "Node 1 MemTotal:       67108864 kB\nNode 1 MemFree:        67000000 kB")
    write(root, "/sys/devices/system/node/node1/distance", "21 10")

    cxl = "/sys/bus/cxl/devices"
    write(root, f"{cxl}/mem0/ram/size", "0x1000000000")
    write(root, f"{cxl}/mem0/pmem/size", "0x0")
    write(root, f"{cxl}/mem0/serial", "0x4d2")
    write(root, f"{cxl}/mem0/numa_node", "1")
    write(root, f"{cxl}/decoder0.0/start", "0x1080000000")
    write(root, f"{cxl}/decoder0.0/size", "0x1000000000")
    write(root, f"{cxl}/decoder0.0/interleave_ways", "1")
    write(root, f"{cxl}/decoder0.0/interleave_granularity", "256")
    write(root, f"{cxl}/decoder0.0/target_type", "expander")
    write(root, f"{cxl}/decoder0.0/mode", "ram")
    write(root, f"{cxl}/region0/resource", "0x1080000000")
    write(root, f"{cxl}/region0/size", "0x1000000000")
    write(root, f"{cxl}/region0/interleave_ways", "1")
    write(root, f"{cxl}/region0/interleave_granularity", "256")
    write(root, f"{cxl}/region0/mode", "ram")
    write(root, f"{cxl}/region0/target0", "decoder2.0")

    dax = "/sys/bus/dax/devices/dax0.0"
    write(root, f"{dax}/size", str(16 << 30))
    write(root, f"{dax}/align", str(2 << 20))
    write(root, f"{dax}/target_node", "1")
    write(root, f"{dax}/numa_node", "0")
    (root / "sys/bus/dax/drivers/device_dax").mkdir(parents=True, exist_ok=True)
    link(root, f"{dax}/driver", str(root / "sys/bus/dax/drivers/device_dax"))
    write(root, "/dev/dax0.0", "")

    dsa = "/sys/bus/dsa/devices"
    write(root, f"{dsa}/dsa0/version", "0x100")
    write(root, f"{dsa}/dsa0/max_engines", "4")
    write(root, f"{dsa}/dsa0/max_transfer_size", str(2 << 30))
    write(root, f"{dsa}/dsa0/max_batch_size", "1024")
    write(root, f"{dsa}/dsa0/op_cap", "0x0000000000000000 0x00000000000001ff")
    write(root, f"{dsa}/dsa0/state", "enabled")
    write(root, f"{dsa}/wq0.0/mode", "dedicated")
    write(root, f"{dsa}/wq0.0/size", "16")
    write(root, f"{dsa}/wq0.0/priority", "10")
    write(root, f"{dsa}/wq0.0/type", "user")
    write(root, f"{dsa}/wq0.0/state", "enabled" if dsa_enabled else "disabled")
    write(root, f"{dsa}/wq0.0/name", "nearlocal")
    if dsa_enabled:
        write(root, "/dev/dsa/wq0.0", "")

    write(root, "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512")
    write(root, "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "500")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    return root


def untuned_settings(root: Path, governor: str = "powersave", boost: str = "1",
                     thp: str = "always madvise [never]", cpus: int = 2) -> Path:
    """A stock server's settings on `cpus` CPUs (the kernel's ABI: cpufreq, cpuidle, smt,
    transparent_hugepage, numa_balancing, cmdline): `governor` on every CPU under acpi-cpufreq,
    the global boost switch `boost`, THP `thp`, NUMA balancing on, C6 (133 us) enabled, SMT
    on with CPUs 2k and 2k+1 siblings, CPU 1 isolated."""
    cpu = "/sys/devices/system/cpu"
    write(root, f"{cpu}/online", f"0-{cpus - 1}")
    for n in range(cpus):
        write(root, f"{cpu}/cpu{n}/cpufreq/scaling_governor", governor)
        write(root, f"{cpu}/cpu{n}/cpufreq/scaling_driver", "acpi-cpufreq")
        write(root, f"{cpu}/cpu{n}/cpufreq/scaling_min_freq", "800000")
        write(root, f"{cpu}/cpu{n}/cpufreq/scaling_max_freq", "3800000")
        write(root, f"{cpu}/cpu{n}/cpufreq/scaling_cur_freq", str(1200000 + 100000 * n))
        write(root, f"{cpu}/cpu{n}/cpufreq/cpuinfo_max_freq", "3800000")
        pair = n - n % 2
        write(root, f"{cpu}/cpu{n}/topology/thread_siblings_list", f"{pair}-{pair + 1}")
        for index, (name, latency) in enumerate([("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 133)]):
            write(root, f"{cpu}/cpu{n}/cpuidle/state{index}/name", name)
            write(root, f"{cpu}/cpu{n}/cpuidle/state{index}/latency", str(latency))
            write(root, f"{cpu}/cpu{n}/cpuidle/state{index}/disable", "0")
    write(root, f"{cpu}/cpufreq/boost", boost)
    write(root, f"{cpu}/smt/active", "1")
    write(root, f"{cpu}/smt/control", "on")
    write(root, f"{cpu}/cpuidle/current_driver", "intel_idle")
    write(root, f"{cpu}/isolated", "1")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", thp)
    write(root, "/sys/kernel/mm/transparent_hugepage/defrag", "always defer [madvise] never")
    write(root, "/proc/sys/kernel/numa_balancing", "1")
    write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 mitigations=off isolcpus=1 "
                                 "hugepagesz=1G hugepages=4 hugepagesz=2M hugepages=512 quiet -- nohz_full=9")
    return root


# An Intel Xeon of the Ice Lake-SP generation (family 6 model 106) on bare metal: DDIO's
# root-port register is documented for it (probe/links.py)
ICELAKE_SP_CPUINFO = "".join(
    f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\n"
    f"model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz\nflags\t\t: {FLAGS}\n\n"
    for cpu in range(4))
GPU_ADDRESS, CXL_ADDRESS, NIC_ADDRESS = "0000:17:00.0", "0000:81:00.0", "0000:18:00.0"
GPU_PORT, CXL_PORT, NIC_PORT = "0000:16:01.0", "0000:80:01.0", "0000:16:03.0"


def _pci_function(root: Path, bridge: str, port: str, address: str, klass: str, vendor: str,
                  trained: tuple[str, int, str, int], node: int) -> str:
    """A PCI function behind a root port, as the kernel lays it out: /sys/devices/pciDDDD:BB/
    <port>/<address>, with /sys/bus/pci/devices/<name> links to both."""
    where = f"/sys/devices/{bridge}/{port}/{address}"
    speed, width, max_speed, max_width = trained
    for name, value in (("class", klass), ("vendor", vendor), ("numa_node", str(node)),
                        ("current_link_speed", speed), ("current_link_width", str(width)),
                        ("max_link_speed", max_speed), ("max_link_width", str(max_width))):
        write(root, f"{where}/{name}", value)
    for name, target in ((address, where), (port, f"/sys/devices/{bridge}/{port}")):
        if not (root / f"sys/bus/pci/devices/{name}").is_symlink():
            link_to = os.path.relpath(root / target.lstrip("/"), root / "sys/bus/pci/devices")
            link(root, f"/sys/bus/pci/devices/{name}", link_to)
    return where


def _root_port(root: Path, bridge: str, port: str, node: int, ddio_on: bool | None) -> None:
    """An Intel root port with 4 KiB of config space: perfctrlsts_0 (0x180) 0x80 and TPHDIS
    (0x185 bit 0) clear when DDIO is on (the defaults), 0x00 and TPHDIS set when off; None: only
    the 64 bytes a non-root reader sees."""
    where = f"/sys/devices/{bridge}/{port}"
    write(root, f"{where}/vendor", "0x8086")
    write(root, f"{where}/class", "0x060400")
    write(root, f"{where}/numa_node", str(node))
    config = bytearray(64 if ddio_on is None else 4096)
    if ddio_on is not None:
        config[0x180] = 0x80 if ddio_on else 0x00
        config[0x185] = 0x00 if ddio_on else 0x01
    (root / where.lstrip("/") / "config").write_bytes(bytes(config))


def linked_box(root: Path, ddio_on: bool | None = True, cpuinfo: str = ICELAKE_SP_CPUINFO) -> Path:
    """Two sockets (node 0: CPUs 0-1, package 0; node 1: CPUs 2-3, package 1); a GPU on socket 0
    behind root port 16:01.0 whose x16 link trained at x8; an RDMA NIC (mlx5_0) on socket 0 behind
    root port 16:03.0; a CXL memory adapter (mem0) on socket 1 behind root port 80:01.0, so the
    GPU's path to it crosses sockets. `ddio_on`: the root ports' DDIO (None: their config space
    reads 64 bytes, as for a non-root reader)."""
    write(root, "/proc/cpuinfo", cpuinfo)
    write(root, "/sys/devices/system/cpu/online", "0-3")
    for node, cpus in ((0, (0, 1)), (1, (2, 3))):
        write(root, f"/sys/devices/system/node/node{node}/cpulist", f"{cpus[0]}-{cpus[1]}")
        write(root, f"/sys/devices/system/node/node{node}/meminfo",
              f"Node {node} MemTotal:       67108864 kB\nNode {node} MemFree:        60000000 kB")
        for cpu in cpus:
            write(root, f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(node))
    for bridge, port, node in (("pci0000:16", GPU_PORT, 0), ("pci0000:16", NIC_PORT, 0),
                               ("pci0000:80", CXL_PORT, 1)):
        _root_port(root, bridge, port, node, ddio_on)
    _pci_function(root, "pci0000:16", GPU_PORT, GPU_ADDRESS, "0x030200", "0x10de",
                  ("16.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 16), 0)
    nic = _pci_function(root, "pci0000:16", NIC_PORT, NIC_ADDRESS, "0x020000", "0x15b3",
                        ("16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16), 0)
    cxl = _pci_function(root, "pci0000:80", CXL_PORT, CXL_ADDRESS, "0x050210", "0x8086",
                        ("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16), 1)
    write(root, f"{cxl}/mem0/ram/size", "0x1000000000")
    write(root, f"{cxl}/mem0/numa_node", "1")
    link(root, "/sys/bus/cxl/devices/mem0",
         os.path.relpath(root / f"{cxl}/mem0".lstrip("/"), root / "sys/bus/cxl/devices"))
    write(root, f"{nic}/infiniband/mlx5_0/ports/1/state", "4: ACTIVE")
    write(root, f"{nic}/infiniband/mlx5_0/ports/1/link_layer", "Ethernet")
    link(root, "/sys/class/infiniband/mlx5_0",
         os.path.relpath(root / f"{nic}/infiniband/mlx5_0".lstrip("/"), root / "sys/class/infiniband"))
    link(root, f"{nic}/infiniband/mlx5_0/device", "../..")
    return root


def pool_module_box(root: Path, start: int = 0x1080000000, size: int = 16 << 20,
                    device: bool = True) -> Path:
    """cxl_box plus the nearlocal_pool module loaded and bound to [start, start + size): its
    sysfs attributes, and (`device`) /dev/nearlocal-pool0 as a file of `size` bytes a test maps
    (the module's type windows monkeypatched to 0: a file cannot be 128 TiB long)."""
    cxl_box(root)
    (root / "sys/module/nearlocal_pool").mkdir(parents=True, exist_ok=True)
    misc = "/sys/class/misc/nearlocal-pool0"
    write(root, f"{misc}/start", hex(start))
    write(root, f"{misc}/size", hex(size))
    write(root, f"{misc}/mappings", "0")
    if device:
        with open(root / "dev/nearlocal-pool0", "wb") as f:
            f.truncate(size)
    return root
