"""CUDA GPUs, when a CUDA stack (cupy) is importable; otherwise the reason there are none."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuDevice:
    index: int
    name: str
    memory_bytes: int
    compute_capability: str


@dataclass
class GpuInfo:
    devices: list[GpuDevice] = field(default_factory=list)
    reason: str | None = None
    driver_version: int | None = None
    runtime_version: int | None = None


def probe_gpu() -> GpuInfo:
    try:
        import cupy  # noqa: PLC0415 - optional extra
    except Exception as exc:  # ImportError, or a broken CUDA install
        return GpuInfo(reason=f"no GPU: cupy is not importable ({type(exc).__name__}: {exc})")
    try:
        runtime = cupy.cuda.runtime
        count = runtime.getDeviceCount()
        devices = []
        for index in range(count):
            props = runtime.getDeviceProperties(index)
            name = props["name"]
            devices.append(GpuDevice(
                index=index,
                name=name.decode() if isinstance(name, bytes) else str(name),
                memory_bytes=int(props["totalGlobalMem"]),
                compute_capability=f"{props['major']}.{props['minor']}",
            ))
        info = GpuInfo(
            devices=devices,
            driver_version=runtime.driverGetVersion(),
            runtime_version=runtime.runtimeGetVersion(),
        )
        if not devices:
            info.reason = "no GPU: the CUDA runtime reports 0 devices"
        return info
    except Exception as exc:
        return GpuInfo(reason=f"no GPU: CUDA runtime unusable ({type(exc).__name__}: {exc})")
