"""CUDA GPUs, when a CUDA stack (cupy) is importable; otherwise the reason there are none.

Per GPU: name, memory, compute capability, copy engines, PCIe generation and width (current and
maximum, from NVML); per pair: peer access (CUDA) and NVLink links (NVML). NVML
(nvidia-ml-py) is optional: without it the PCIe / NVLink fields stay empty and `nvml` says why.

A box with a GPU whose toolchain is incomplete is told exactly what is missing and the pip
command that adds it: cupy (the `nearlocal[cuda12]` / `[cuda13]` extra, chosen by the driver),
NVRTC (which compiles the kernels), and, not gating, cuda-bindings, nvidia-ml-py and the CUDA
runtime headers (`missing`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import re
from dataclasses import dataclass, field

from nearlocal.sysroot import SysRoot

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
CUDA13_MIN_DRIVER = 580  # the first driver branch that runs CUDA 13


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
    kernel_image: str | None = None  # how the kernels were built: cubin or PTX, NVRTC options
    missing: list[str] = field(default_factory=list)  # not gating: what / why: pip command
    peer_access: list[list[bool]] = field(default_factory=list)  # [i][j]: i can access j
    nvlink_links: list[list[int]] = field(default_factory=list)  # direct GPU-GPU links per pair

    def can_access_peer(self, i: int, j: int) -> bool:
        try:
            return bool(self.peer_access[i][j])
        except IndexError:
            return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def norm_bus_id(bus_id: str | bytes) -> str:
    """'00000000:1B:00.0' and '0000:1b:00.0' name the same device (NVML and the CUDA runtime
    may answer in bytes)."""
    domain, _, rest = _text(bus_id).strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else domain


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line (cupy's import errors span several)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def nvidia_driver(root: SysRoot) -> str | None:
    """The loaded NVIDIA kernel driver's version ("580.65.06"), or None without one."""
    text = root.read(DRIVER_VERSION_FILE)
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text or "")
    if match:
        return match.group(1)
    return "unknown version" if text is not None or root.exists("/dev/nvidiactl") else None


def cuda_extra_for_driver(driver: str) -> str:
    """The pip command installing nearlocal's CUDA stack a driver of this version runs."""
    major = re.match(r"(\d+)", driver)
    cuda = 13 if major is None or int(major.group(1)) >= CUDA13_MIN_DRIVER else 12
    return f"pip install 'nearlocal[cuda{cuda}]'"


def cupy_cuda_major(cupy) -> int:
    """The CUDA major version cupy was built for (its wheel: cupy-cuda12x / cupy-cuda13x)."""
    with contextlib.suppress(Exception):
        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    for major in (13, 12):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(f"cupy-cuda{major}x")
            return major
    return 13


def nvrtc_pip(major: int) -> str:
    """The pip command adding NVRTC of CUDA `major` (cupy's own [ctk] extra holds it too)."""
    return f"pip install 'cuda-toolkit[nvrtc]=={major}.*'"


def probe_gpu(root: SysRoot | None = None) -> GpuInfo:
    root = root or SysRoot.default()
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        reason = f"no GPU: cupy is not importable ({one_line(exc)})"
        driver = nvidia_driver(root)
        if driver is not None:
            reason += (f"; an NVIDIA driver ({driver}) is loaded, so this box has a GPU: "
                       f"install the CUDA stack: {cuda_extra_for_driver(driver)}")
        return GpuInfo(reason=reason)
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
        reason = f"no GPU: CUDA runtime unusable ({one_line(exc)})"
        driver = nvidia_driver(root)
        if driver is not None:  # cupy built for a CUDA this driver does not run, say
            reason += (f"; cupy is built for CUDA {cupy_cuda_major(cupy)} and the NVIDIA driver "
                       f"is {driver}: the CUDA stack for this driver: "
                       f"{cuda_extra_for_driver(driver)}")
        return GpuInfo(reason=reason)
    info.nvml = _probe_nvml(info)
    _probe_nvrtc(cupy, info)
    if info.nvrtc is None and info.devices:
        _probe_compile(cupy, info)
    if info.devices:
        info.missing = _missing_parts(cupy_cuda_major(cupy), info)
    return info


def _missing_parts(major: int, info: GpuInfo) -> list[str]:
    """What the GPU paths can do without, each with its pip command (the `cuda12` / `cuda13`
    extras install them all)."""
    missing = []
    try:
        import cuda.bindings  # noqa: F401
    except ModuleNotFoundError:
        missing.append(f"cuda-bindings (cuda-memcpy-batch api=bindings): pip install "
                       f"'cuda-bindings=={major}.*'")
    except Exception as exc:  # installed, and broken: the cause, not only "missing"
        missing.append(f"cuda-bindings does not import ({one_line(exc)}): pip install "
                       f"--force-reinstall 'cuda-bindings=={major}.*'")
    if info.nvml and "not importable" in info.nvml:
        missing.append("nvidia-ml-py (PCIe link and NVLink fields): pip install nvidia-ml-py")
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        headers = find_nvidia_header_directory("cudart")
    except Exception:
        headers = None
    if headers is None:
        missing.append(f"CUDA runtime headers (nearlocal's kernels compile without them; cupy's "
                       f"own kernels need them): pip install 'cuda-toolkit[cudart]=={major}.*'")
    return missing


def _probe_nvrtc(cupy, info: GpuInfo) -> None:
    """NVRTC compiles the fragment kernels and the blocking kernel every device clock uses: say
    in one line when cupy cannot load it, and the pip command that adds it."""
    nvrtc = getattr(cupy.cuda, "nvrtc", None)
    if nvrtc is None:  # this cupy does not expose its binding: a compile error names the cause
        return
    try:
        major, minor = nvrtc.getVersion()
        info.nvrtc_version = f"{major}.{minor}"
    except Exception as exc:
        cuda = cupy_cuda_major(cupy)
        info.nvrtc = (f"NVRTC is not usable through cupy ({one_line(exc)}): GPU kernels cannot be "
                      f"compiled; missing: NVRTC {cuda} (libnvrtc.so.{cuda}): {nvrtc_pip(cuda)}")


def _probe_compile(cupy, info: GpuInfo) -> None:
    """Compile nearlocal's CUDA module once (NVRTC called directly, the image loaded on GPU 0):
    a library that loads may still not compile, and then every GPU case is skipped with this one
    line instead of failing row by row. The module stays compiled for this process
    (kernels.compiled)."""
    try:
        from nearlocal.kernels import cuda as kernels

        compiled = kernels.compiled(cupy)
        built = compiled.info()
        info.kernel_image = (f"{built['image']} ({built['image_bytes']} B), NVRTC "
                             f"{built['nvrtc_options']}")
    except Exception as exc:
        text = one_line(exc, 300)
        info.nvrtc = (f"the GPU kernels do not compile with NVRTC {info.nvrtc_version} ({text}); "
                      f"a newer NVRTC of cupy's CUDA: {nvrtc_pip(cupy_cuda_major(cupy))}")


# NVML's answers for a link index a GPU does not have (NVML_ERROR_INVALID_ARGUMENT) or a GPU
# without NVLink (NVML_ERROR_NOT_SUPPORTED); any other error may hide a real link
NO_SUCH_LINK = {2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED"}


def _no_such_link(exc: Exception) -> bool:
    code = getattr(exc, "value", None)
    if isinstance(code, int):
        return code in NO_SUCH_LINK
    text = str(exc).upper().replace(" ", "_")
    return any(name in text for name in NO_SUCH_LINK.values())


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
        unreadable: list[str] = []
        by_bus = {norm_bus_id(d.pci_bus_id): d.index for d in info.devices if d.pci_bus_id}
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
                except Exception as exc:
                    if not _no_such_link(exc):  # the link may be there: say so, do not drop it
                        unreadable.append(f"GPU {device.index} link {link}: {one_line(exc)}")
                    continue
                device.nvlink_active += 1
                try:
                    remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link)
                    peer = by_bus.get(norm_bus_id(remote.busId))
                except Exception:
                    peer = None
                if peer is not None:
                    info.nvlink_links[device.index][peer] += 1
                else:
                    device.nvswitch_links += 1  # the far end is not one of our GPUs
        if unreadable:
            more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
            return (f"NVML could not read NVLink state ({unreadable[0]}{more}): the NVLink "
                    "counts may be short")
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
