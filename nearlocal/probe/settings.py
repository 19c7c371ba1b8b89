"""The box's own settings that move every figure: the CPU frequency governor and its limits,
turbo / boost, SMT and thread siblings, transparent huge pages, automatic NUMA balancing, the
idle states (C-states) enabled, isolated CPUs and the kernel command line's flags for them.

A VM hides most of these (a guest has no cpufreq); bare metal brings them, and a stock server's
defaults (powersave, turbo, deep C-states) make bandwidth and latency figures read low and
spread. `probe_settings` reads them through `SysRoot`; anything the kernel does not expose is
None ("not exposed"), never an error. This module only reads (the probe's inventory holds what
it read): describing and judging them is box stability's (engine/stability/settings.py).
nearlocal never changes a setting itself (docs/running.md, "Prepare a box").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nearlocal.probe.hugepages import THP_DIR, selected_mode
from nearlocal.sysroot import SysRoot, parse_cpulist

NOT_EXPOSED = "not exposed"
CPU_DIR = "/sys/devices/system/cpu"
# Flags of /proc/cmdline that decide what the settings are (the rest is not recorded)
CMDLINE_FLAGS = (
    "mitigations", "isolcpus", "nohz_full", "nohz", "rcu_nocbs", "irqaffinity", "nosmt",
    "intel_idle.max_cstate", "processor.max_cstate", "idle", "intel_pstate", "amd_pstate",
    "cpufreq.default_governor", "transparent_hugepage", "default_hugepagesz", "hugepagesz",
    "hugepages", "numa_balancing",
)


@dataclass(frozen=True)
class IdleState:
    name: str
    latency_us: int | None
    disabled: bool


@dataclass(frozen=True)
class CpuSettings:
    """One CPU's frequency policy and idle states (None: not exposed on this box)."""

    cpu: int
    governor: str | None = None
    driver: str | None = None
    min_khz: int | None = None
    max_khz: int | None = None
    cur_khz: int | None = None
    hw_max_khz: int | None = None  # cpuinfo_max_freq: what the part can reach
    siblings: list[int] = field(default_factory=list)  # topology/thread_siblings_list
    idle: list[IdleState] = field(default_factory=list)


@dataclass(frozen=True)
class BoxSettings:
    cpus: list[CpuSettings] = field(default_factory=list)  # every online CPU
    boost: bool | None = None  # turbo / boost on; None: not exposed
    boost_source: str | None = None  # the file it was read from
    pstate: dict[str, str] = field(default_factory=dict)  # intel_pstate / amd_pstate: status
    smt_active: bool | None = None
    smt_control: str | None = None  # on, off, forceoff, notsupported, notimplemented
    thp_enabled: str | None = None  # the bracketed value of transparent_hugepage/enabled
    thp_defrag: str | None = None
    numa_balancing: int | None = None  # /proc/sys/kernel/numa_balancing (0 off, 1 on, 2 tiering)
    idle_driver: str | None = None
    isolated: list[int] | None = None
    nohz_full: list[int] | None = None
    cmdline: dict[str, str] = field(default_factory=dict)  # the relevant flags only

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cpulist_text(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8" (the kernel's cpulist format; parse_cpulist reads it)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def _cpus(root: SysRoot, path: str) -> list[int] | None:
    text = root.read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


def _cpu_settings(root: SysRoot, cpu: int) -> CpuSettings:
    base = f"{CPU_DIR}/cpu{cpu}"
    freq = f"{base}/cpufreq"
    idle = []
    for entry in root.listdir(f"{base}/cpuidle"):
        if entry.startswith("state"):
            where = f"{base}/cpuidle/{entry}"
            idle.append((int(entry[5:]) if entry[5:].isdigit() else 0, IdleState(
                name=root.read(f"{where}/name") or entry,
                latency_us=root.read_int(f"{where}/latency", base=10),
                disabled=bool(root.read_int(f"{where}/disable", 0, base=10)))))
    return CpuSettings(
        cpu=cpu, governor=root.read(f"{freq}/scaling_governor"),
        driver=root.read(f"{freq}/scaling_driver"),
        min_khz=root.read_int(f"{freq}/scaling_min_freq", base=10),
        max_khz=root.read_int(f"{freq}/scaling_max_freq", base=10),
        cur_khz=root.read_int(f"{freq}/scaling_cur_freq", base=10),
        hw_max_khz=root.read_int(f"{freq}/cpuinfo_max_freq", base=10),
        siblings=_cpus(root, f"{base}/topology/thread_siblings_list") or [],
        idle=[state for _, state in sorted(idle, key=lambda pair: pair[0])])


def _boost(root: SysRoot) -> tuple[bool | None, str | None]:
    """Turbo / boost: the global cpufreq switch (acpi-cpufreq, amd-pstate), intel_pstate's
    no_turbo (inverted), else a policy's own boost file (newer amd-pstate); None: not exposed."""
    for path, inverted in ((f"{CPU_DIR}/cpufreq/boost", False),
                           (f"{CPU_DIR}/intel_pstate/no_turbo", True)):
        value = root.read_int(path, base=10)
        if value is not None:
            return (value == 0) if inverted else (value != 0), path
    for policy in root.listdir(f"{CPU_DIR}/cpufreq"):
        value = root.read_int(f"{CPU_DIR}/cpufreq/{policy}/boost", base=10)
        if policy.startswith("policy") and value is not None:
            return value != 0, f"{CPU_DIR}/cpufreq/{policy}/boost"
    return None, None


def _cmdline(text: str | None) -> dict[str, str]:
    """The relevant flags of the kernel command line (before a `--`: the rest is init's);
    a flag given twice (hugepagesz=, hugepages=) keeps every value, comma-joined."""
    flags: dict[str, str] = {}
    for token in (text or "").split():
        if token == "--":
            break
        key, _, value = token.partition("=")
        if key in CMDLINE_FLAGS:
            flags[key] = f"{flags[key]},{value}" if key in flags else value
    return flags


def probe_settings(root: SysRoot) -> BoxSettings:
    online = _cpus(root, f"{CPU_DIR}/online")
    if not online:
        online = sorted(int(name[3:]) for name in root.listdir(CPU_DIR)
                        if name.startswith("cpu") and name[3:].isdigit())
    cpus = [_cpu_settings(root, cpu) for cpu in online]
    boost, source = _boost(root)
    pstate = {name: status for name in ("intel_pstate", "amd_pstate")
              if (status := root.read(f"{CPU_DIR}/{name}/status")) is not None}
    active = root.read_int(f"{CPU_DIR}/smt/active", base=10)
    return BoxSettings(
        cpus=cpus, boost=boost, boost_source=source, pstate=pstate,
        smt_active=None if active is None else active != 0,
        smt_control=root.read(f"{CPU_DIR}/smt/control"),
        thp_enabled=selected_mode(root.read(f"{THP_DIR}/enabled")),
        thp_defrag=selected_mode(root.read(f"{THP_DIR}/defrag")),
        numa_balancing=root.read_int("/proc/sys/kernel/numa_balancing", base=10),
        idle_driver=root.read(f"{CPU_DIR}/cpuidle/current_driver"),
        isolated=_cpus(root, f"{CPU_DIR}/isolated"),
        nohz_full=_cpus(root, f"{CPU_DIR}/nohz_full"),
        cmdline=_cmdline(root.read("/proc/cmdline")))
