"""CPU model, the instruction flags nearlocal's kernels need, TSC and caches."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot, parse_cpulist
from nearlocal.units import parse_size

# Flags that decide which kernels may be compiled at all (LLVM aborts on unsupported instructions).
INTERESTING_FLAGS = (
    "clflush", "clflushopt", "clwb", "movdiri", "movdir64b", "enqcmd", "waitpkg",
    "avx2", "avx512f", "sse4_1", "rdtscp", "constant_tsc", "nonstop_tsc", "tsc_known_freq",
    "hypervisor",  # a VM: cpuid's cache sizes are the host's (probe/cache.py)
)

# The LLVM target feature a flag's instructions need: numba must compile for it besides the CPU
# having it. rdtscp and the fences are inline asm, which LLVM assembles whatever the target.
LLVM_FEATURES = {
    "clflush": "sse2", "sse4_1": "sse4.1", "clflushopt": "clflushopt", "clwb": "clwb",
    "movdiri": "movdiri", "movdir64b": "movdir64b", "enqcmd": "enqcmd", "waitpkg": "waitpkg",
    "avx2": "avx2", "avx512f": "avx512f",
}
X86_64_BASELINE = frozenset({"64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2"})  # any target


def compile_target(environ: Mapping[str, str] = os.environ) -> tuple[str, list[str] | None]:
    """What numba compiles for, read as numba.core.config reads it: ("host", None) when it
    compiles for this CPU's own features (then the CPU's flags decide); else the CPU name and
    the features NUMBA_CPU_FEATURES enables (`NUMBA_CPU_NAME=generic` alone: none). A feature a
    named CPU only implies is not counted: LLVM aborts the process on an instruction its target
    lacks, so a method runs only on features named outright."""
    name = environ.get("NUMBA_CPU_NAME")
    features = environ.get("NUMBA_CPU_FEATURES")
    if features is None and str(name).lower() == "generic":
        features = ""
    if features is None:
        return "host", None
    target = f"{name or 'host'} (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)"
    return target, sorted(f.strip()[1:] for f in features.split(",") if f.strip().startswith("+"))


def emulation_note(cpu: dict) -> str:
    """Why a box's memory figures are not a real machine's, from its stored CPU facts (a probe's
    `cpu` as a dict): "" on bare metal. An emulated CPU (QEMU's TCG names itself in the model
    string) has no memory timing at all; a virtual machine's figures are the guest's."""
    model = str(cpu.get("model") or "")
    if "TCG" in model:
        return (f"measured on an emulated box ({model}): QEMU's TCG has no memory timing, so "
                "its figures show that the paths work, never how fast they are")
    if (cpu.get("flags") or {}).get("hypervisor"):
        return ("measured in a virtual machine (its CPU reports `hypervisor`): host memory "
                "figures are the guest's")
    return ""


@dataclass
class CacheLevel:
    level: int
    kind: str
    size_bytes: int
    shared_cpus: list[int] = field(default_factory=list)


@dataclass
class CpuInfo:
    model: str
    vendor: str
    logical_cpus: int
    flags: dict[str, bool]
    caches: list[CacheLevel]
    tsc_hz_kernel: float | None
    online_cpus: list[int] = field(default_factory=list)
    target: str = "host"  # what numba compiles for (compile_target)
    target_features: list[str] | None = None  # its LLVM features; None: the CPU's own
    # the LLC a process can really use when measured (a VM: probe/cache.py), and how the
    # LLC size in use was found
    measured_llc_bytes: int | None = None
    llc_source: str = "cpuid"
    # the measured readings a run's LLC rests on, its own last (engine.plan.settle_llc)
    llc_readings: list[int] = field(default_factory=list)
    # /proc/cpuinfo's "cpu family" and "model" numbers (None where it has none: some VMs, ARM)
    family: int | None = None
    model_number: int | None = None

    def has(self, flag: str) -> bool:
        return self.flags.get(flag, False)

    def compiles(self, flag: str) -> bool:
        """Whether numba's target lets LLVM select the flag's instructions (see has())."""
        feature = LLVM_FEATURES.get(flag)
        return (self.target_features is None or feature is None or feature in X86_64_BASELINE
                or feature in self.target_features)

    def usable(self, flag: str) -> bool:
        """The CPU has the flag and numba compiles for it: a kernel using it may be built."""
        return self.has(flag) and self.compiles(flag)

    def lacks(self, flags: tuple[str, ...] | list[str]) -> str | None:
        """Why kernels needing `flags` cannot run here: the CPU lacks some, or numba compiles
        for a target without them (LLVM would abort the whole process); None when they can."""
        missing = [flag for flag in flags if not self.has(flag)]
        if missing:
            return f"CPU lacks {', '.join(missing)} ({self.model})"
        uncompiled = [flag for flag in flags if not self.compiles(flag)]
        if uncompiled:
            return (f"numba compiles for {self.target} without "
                    f"{', '.join('+' + LLVM_FEATURES[flag] for flag in uncompiled)}: LLVM cannot "
                    f"select {', '.join(uncompiled)}, which the CPU has")
        return None

    @property
    def cpuid_llc_bytes(self) -> int:
        """The largest cache cpuid / sysfs reports (in a VM: the host socket's)."""
        unified = [c.size_bytes for c in self.caches if c.kind in ("Unified", "Data")]
        return max(unified, default=0)

    @property
    def llc_bytes(self) -> int:
        """The last-level cache cases are judged by (`reaches_memory`, `llc_resident`): the
        measured one where cpuid cannot be trusted, else cpuid's."""
        return self.measured_llc_bytes or self.cpuid_llc_bytes

    @property
    def l2_bytes(self) -> int:
        """The core's level-2 cache (0: unknown): what a case must outgrow to live in the LLC."""
        return max((c.size_bytes for c in self.caches
                    if c.level == 2 and c.kind in ("Unified", "Data")), default=0)


@dataclass
class _CpuinfoText:
    model: str = "unknown"
    vendor: str = "unknown"
    flags: set[str] = field(default_factory=set)
    count: int = 0
    family: int | None = None
    model_number: int | None = None


def _parse_cpuinfo(text: str) -> _CpuinfoText:
    found = _CpuinfoText()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            found.count += 1
        elif key == "model name" and found.model == "unknown":
            found.model = value
        elif key == "vendor_id" and found.vendor == "unknown":
            found.vendor = value
        elif key == "flags" and not found.flags:
            found.flags = set(value.split())
        elif key == "cpu family" and found.family is None and value.isdigit():
            found.family = int(value)
        elif key == "model" and found.model_number is None and value.isdigit():
            found.model_number = int(value)
    return found


def _caches(root: SysRoot) -> list[CacheLevel]:
    base = "/sys/devices/system/cpu/cpu0/cache"
    caches = []
    for index in root.listdir(base):
        if not index.startswith("index"):
            continue
        size_text = root.read(f"{base}/{index}/size")
        if not size_text:
            continue
        caches.append(CacheLevel(
            level=root.read_int(f"{base}/{index}/level", 0, base=10) or 0,
            kind=root.read(f"{base}/{index}/type", "Unified") or "Unified",
            size_bytes=parse_size(size_text.replace("K", "KiB").replace("M", "MiB")),
            shared_cpus=parse_cpulist(root.read(f"{base}/{index}/shared_cpu_list")),
        ))
    return caches


def probe_cpu(root: SysRoot) -> CpuInfo:
    text = _parse_cpuinfo(root.read("/proc/cpuinfo", "") or "")
    khz = root.read_int("/sys/devices/system/cpu/cpu0/tsc_freq_khz", base=10)
    target, target_features = compile_target()
    return CpuInfo(
        model=text.model,
        vendor=text.vendor,
        logical_cpus=text.count,
        flags={name: name in text.flags for name in INTERESTING_FLAGS},
        caches=_caches(root),
        tsc_hz_kernel=khz * 1e3 if khz else None,
        online_cpus=parse_cpulist(root.read("/sys/devices/system/cpu/online")),
        target=target,
        target_features=target_features,
        family=text.family,
        model_number=text.model_number,
    )
