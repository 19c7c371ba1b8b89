"""CUDA GPUs, when a CUDA stack (cupy) is importable; otherwise the reason there are none.

Per GPU: name, memory, compute capability, copy engines, PCIe generation and width (current and
maximum, from NVML); per pair: peer access (CUDA) and NVLink links (NVML). NVML
(nvidia-ml-py) is optional: without it the PCIe / NVLink fields stay empty and `nvml` says why.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class GpuDevice:
    index: int
    name: str
    memory_bytes: int
    compute_capability: str
    pci_bus_id: str = ""
    multiprocessors: int = 0
    copy_engines: int = 0  # asyncEngineCount
    can_map_host_memory: bool = False
    pageable_memory_access: bool = False  # HMM / ATS: kernels may touch pageable host memory
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    nvlink_active: int = 0  # active NVLink links, to GPUs or to NVSwitches
    nvswitch_links: int = 0


@dataclass
class GpuInfo:
    devices: list[GpuDevice] = field(default_factory=list)
    reason: str | None = None
    driver_version: int | None = None
    runtime_version: int | None = None
    cupy_version: str | None = None
    nvml: str | None = None  # None when NVML answered, else why not
    nvrtc_version: str | None = None  # the run-time compiler the kernels are built with
    nvrtc: str | None = None  # None when NVRTC loads and the kernels compile, else why not
    peer_access: list[list[bool]] = field(default_factory=list)  # [i][j]: i can access j
    nvlink_links: list[list[int]] = field(default_factory=list)  # direct GPU-GPU links per pair

    def can_access_peer(self, i: int, j: int) -> bool:
        try:
            return bool(self.peer_access[i][j])
        except IndexError:
            return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _norm_bus_id(bus_id: str) -> str:
    """'00000000:1B:00.0' and '0000:1b:00.0' name the same device."""
    domain, _, rest = _text(bus_id).strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else domain


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line (cupy's import errors span several)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def probe_gpu() -> GpuInfo:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return GpuInfo(reason=f"no GPU: cupy is not importable ({_one_line(exc)})")
    try:
        runtime = cupy.cuda.runtime
        count = runtime.getDeviceCount()
        devices = []
        for index in range(count):
            props = runtime.getDeviceProperties(index)
            try:
                bus_id = _text(runtime.deviceGetPCIBusId(index))
            except Exception:
                bus_id = ""
            devices.append(GpuDevice(
                index=index,
                name=_text(props["name"]),
                memory_bytes=int(props["totalGlobalMem"]),
                compute_capability=f"{props['major']}.{props['minor']}",
                pci_bus_id=bus_id,
                multiprocessors=int(props.get("multiProcessorCount", 0)),
                copy_engines=int(props.get("asyncEngineCount", 0)),
                can_map_host_memory=bool(props.get("canMapHostMemory", 0)),
                pageable_memory_access=bool(props.get("pageableMemoryAccess", 0)),
            ))
        info = GpuInfo(
            devices=devices,
            driver_version=runtime.driverGetVersion(),
            runtime_version=runtime.runtimeGetVersion(),
            cupy_version=cupy.__version__,
            peer_access=[[i != j and bool(runtime.deviceCanAccessPeer(i, j))
                          for j in range(count)] for i in range(count)],
        )
        if not devices:
            info.reason = "no GPU: the CUDA runtime reports 0 devices"
    except Exception as exc:
        return GpuInfo(reason=f"no GPU: CUDA runtime unusable ({_one_line(exc)})")
    info.nvml = _probe_nvml(info)
    _probe_nvrtc(cupy, info)
    if info.nvrtc is None and info.devices:
        _probe_compile(cupy, info)
    return info


def _probe_nvrtc(cupy, info: GpuInfo) -> None:
    """NVRTC compiles the fragment kernels and the blocking kernel every device clock uses: say
    in one line when cupy cannot load it."""
    nvrtc = getattr(cupy.cuda, "nvrtc", None)
    if nvrtc is None:  # this cupy does not expose its binding: a compile error names the cause
        return
    try:
        major, minor = nvrtc.getVersion()
        info.nvrtc_version = f"{major}.{minor}"
    except Exception as exc:
        info.nvrtc = (f"NVRTC is not usable through cupy ({_one_line(exc)}): GPU kernels cannot be "
                      "compiled; install the NVRTC library of cupy's CUDA (nvidia-cuda-nvrtc)")


def _probe_compile(cupy, info: GpuInfo) -> None:
    """Compile nearlocal's CUDA module once (NVRTC through cupy.RawModule, on GPU 0): a library
    that loads may still not compile (cupy finding no CUDA headers, say), and then every GPU case
    is skipped with this one line instead of failing row by row. The module stays compiled for
    this process (kernels.compiled)."""
    try:
        from nearlocal.gpu import kernels

        kernels.compiled(cupy)
    except Exception as exc:
        text = _one_line(exc, 300)
        hint = ("; cupy needs the CUDA runtime headers of its CUDA (cuda_runtime.h: the CUDA "
                "toolkit, or the nvidia-cuda-runtime wheel, or CUDA_PATH)"
                if "header" in text.lower() else "")
        info.nvrtc = f"the GPU kernels do not compile through cupy / NVRTC ({text}){hint}"


def _probe_nvml(info: GpuInfo) -> str | None:
    """Fill PCIe and NVLink fields from NVML; return why not when NVML is unusable."""
    try:
        import pynvml
    except Exception as exc:
        return f"nvidia-ml-py is not importable ({type(exc).__name__})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"nvmlInit failed ({exc})"
    try:
        by_bus = {_norm_bus_id(d.pci_bus_id): d.index for d in info.devices if d.pci_bus_id}
        count = len(info.devices)
        info.nvlink_links = [[0] * count for _ in range(count)]
        max_links = getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)
        for device in info.devices:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(device.pci_bus_id.encode()
                                                             if device.pci_bus_id else b"")
            except Exception:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
            for attr, call in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                               ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                               ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                               ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
                with contextlib.suppress(Exception):
                    setattr(device, attr, int(getattr(pynvml, call)(handle)))
            for link in range(max_links):
                try:
                    if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        continue
                except Exception:
                    continue  # no such link (or no NVLink at all)
                device.nvlink_active += 1
                try:
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link)
                    peer = by_bus.get(_norm_bus_id(_text(remote.busId)))
                except Exception:
                    peer = None
                if peer is not None:
                    info.nvlink_links[device.index][peer] += 1
                else:
                    device.nvswitch_links += 1  # the far end is not one of our GPUs
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
