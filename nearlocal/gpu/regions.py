"""GPU region kinds: `gpu:K` (device memory of GPU K), `pinned` (cudaHostAlloc, mapped into every
GPU's address space; `--attr wc`: allocated write-combined) and `registered:<region>` (a host
region - dram, numa:N, devdax:..., file:, shm:, ncmem:... - page-locked in place with
cudaHostRegister).

`pinned` and `registered:` are host memory (space "host"), so the CPU methods run on them too;
`gpu:K` is space "gpu". Registration is checked (cudaPointerGetAttributes must call the memory
host-registered); when it fails the case fails with CUDA's reason - nothing falls back silently to
pageable copies. A range mapped by frame number (`MappedRegion.io_memory`: uc / wc / wb through
the nearlocal_pool module, a PCI BAR) is registered as I/O memory (cudaHostRegisterIoMemory);
where CUDA refuses that, the case is skipped with CUDA's own error (errors.Unavailable). cupy is
imported only when one of these regions is opened.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

import numpy as np

from nearlocal.errors import Unavailable, UsageError, error_line
from nearlocal.kernels.cuda import fill_device
from nearlocal.probe import HostInventory
from nearlocal.regions.base import (
    MappedRegion,
    RegionKind,
    RegionSpec,
    attribute_unavailable,
    parse_region,
    pool_class_of,
    region_kind,
    register_region_kind,
)
from nearlocal.regions.memory import FILL_BLOCK, fill_owned

# the flags of cudaHostAlloc and cudaHostRegister (cuda_runtime_api.h), by the names rows give them
HOST_ALLOC_FLAGS: dict[str, int] = {
    "portable": 0x01,  # cudaHostAllocPortable
    "mapped": 0x02,  # cudaHostAllocMapped
    "write-combined": 0x04,  # cudaHostAllocWriteCombined
}
HOST_REGISTER_FLAGS: dict[str, int] = {
    "portable": 0x01,  # cudaHostRegisterPortable
    "mapped": 0x02,  # cudaHostRegisterMapped
    "io-memory": 0x04,  # cudaHostRegisterIoMemory
    "read-only": 0x08,  # cudaHostRegisterReadOnly
}
MAPPED = ("portable", "mapped")  # every pinned or registered region: usable by every GPU, mapped
# what cudaHostAlloc asks for each attribute a `pinned` region offers
PINNED_ALLOC: dict[str, tuple[str, ...]] = {"wb": MAPPED, "wc": (*MAPPED, "write-combined")}
MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost
PAGE = 4096
PAD = 256  # allocations are padded so word accesses never leave them
NOT_REGISTRABLE = frozenset({"gpu", "pinned", "registered"})


@dataclass
class GpuAccess:
    """How a GPU reaches a region: a device-usable pointer, or None for pageable host memory."""

    memory: str  # "device", "pinned", "registered", "pageable"
    host_pointer: int | None  # CPU address of host memory, None for device memory
    device_pointer: int | None  # address kernels and copies use
    nbytes: int  # usable bytes from the pointer (padded)
    device: int | None = None  # owning GPU of device memory


@dataclass
class GpuRegion(MappedRegion):
    """A MappedRegion with the pointers GPU methods need (`array` is cupy for device memory)."""

    access: GpuAccess = field(default_factory=lambda: GpuAccess("pageable", None, None, 0))


def _cupy():
    import cupy

    return cupy


def gpu_access(region: MappedRegion) -> GpuAccess:
    """The GPU's view of any region: GPU regions know theirs; other host memory is pageable."""
    if isinstance(region, GpuRegion):
        return region.access
    pointer = int(region.array.ctypes.data)
    return GpuAccess("pageable", pointer, None, int(region.array.nbytes))


def flags_of(table: dict[str, int], names: tuple[str, ...]) -> tuple[int, str]:
    """(the flags' value, their names as the row states them: "portable|mapped")."""
    value = 0
    for name in names:
        value |= table[name]
    return value, "|".join(names)


def _round_up(value: int, align: int) -> int:
    return (max(value, 1) + align - 1) // align * align


def no_gpu(inventory: HostInventory) -> str | None:
    if not inventory.gpu.devices:
        return inventory.gpu.reason or "no GPU"
    return None


# --- gpu:K ------------------------------------------------------------------------------------

def _gpu_index(spec: RegionSpec) -> int:
    if not re.fullmatch(r"\d+", spec.arg or ""):
        raise UsageError(f"malformed GPU region {spec.text!r}: use gpu:K with K a device index "
                         "(gpu:0, gpu:1)")
    return int(spec.arg)


def _validate_gpu(spec: RegionSpec, inventory: HostInventory) -> None:
    _gpu_index(spec)  # existence is a skip reason, not an input error: suites name gpu:1


def _gpu_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    reason = no_gpu(inventory)
    if reason:
        return reason
    try:
        index = _gpu_index(spec)
    except UsageError as exc:
        return str(exc)
    count = len(inventory.gpu.devices)
    if index >= count:
        return f"GPU {index} does not exist: this box has {count} GPU{'s' * (count != 1)}"
    return None


def _open_gpu(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    cp = _cupy()
    index = _gpu_index(spec)
    nbytes = _round_up(size, PAD)
    with cp.cuda.Device(index):
        array = cp.empty(nbytes, dtype=cp.uint8)
        # the same non-zero pattern host regions get, so copies move real data; made on the host
        # and copied in (a cupy elementwise kernel would need the CUDA headers to compile)
        fill_device(cp, int(array.data.ptr), nbytes, FILL_BLOCK)
        cp.cuda.Device(index).synchronize()
    access = GpuAccess("device", None, int(array.data.ptr), nbytes, index)

    def close() -> None:
        nonlocal array
        array = None

    return GpuRegion(spec, attr, array, True, {"memory": "device", "gpu": index}, close,
                     access=access)


# --- pinned -----------------------------------------------------------------------------------

def _device_pointer(runtime, host_pointer: int) -> int:
    """The address kernels use for mapped host memory (equal to the host address under UVA)."""
    pointer = int(runtime.pointerGetAttributes(host_pointer).devicePointer)
    if not pointer:
        raise RuntimeError(f"host memory at {host_pointer:#x} is not mapped into the GPU's "
                           "address space (cudaPointerGetAttributes gives no device pointer)")
    return pointer


def _host_array(pointer: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pointer))


def alloc_mapped(runtime, nbytes: int, flags: tuple[str, ...] = MAPPED
                 ) -> tuple[int, int, np.ndarray]:
    """cudaHostAlloc(portable | mapped, or the HOST_ALLOC_FLAGS named) of `nbytes`: (host
    pointer, device pointer, the bytes as a numpy array). Freed again when no device pointer can
    be had; the caller frees it later with runtime.freeHost(host pointer)."""
    pointer = runtime.hostAlloc(nbytes, flags_of(HOST_ALLOC_FLAGS, flags)[0])
    try:
        device_pointer = _device_pointer(runtime, pointer)
        array = _host_array(pointer, nbytes)
    except Exception:
        runtime.freeHost(pointer)
        raise
    return pointer, device_pointer, array


# what a write-combined `pinned` region's row says of its memory type: CUDA chose it, nothing
# nearlocal mapped, so no PAT type is read back (pat.UNKNOWN's form, never a guessed type)
WC_PINNED_MEMTYPE = ("unknown: cudaHostAlloc allocated it write-combined "
                     "(cudaHostAllocWriteCombined); the driver sets its pages' type and nearlocal "
                     "reads no PAT type back for them")


def _open_pinned(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    cp = _cupy()
    runtime = cp.cuda.runtime
    nbytes = _round_up(size, PAD)
    names = PINNED_ALLOC[attr]
    pointer, device_pointer, array = alloc_mapped(runtime, nbytes, names)
    fill_owned(array)

    def close() -> None:
        runtime.freeHost(pointer)

    info = {"memory": "pinned", "host_alloc_flags": flags_of(HOST_ALLOC_FLAGS, names)[1]}
    if attr == "wc":
        info["memtype"] = WC_PINNED_MEMTYPE
    access = GpuAccess("pinned", pointer, int(device_pointer), nbytes)
    return GpuRegion(spec, attr, array[:size], True, info, close, access=access)


# --- registered:<region> ----------------------------------------------------------------------

def _inner(spec: RegionSpec) -> RegionSpec:
    if not spec.arg:
        raise UsageError("registered region needs the host region to register: registered:dram, "
                         "registered:numa:N, registered:devdax:/dev/daxX.Y")
    inner = parse_region(spec.arg)
    if inner.kind in NOT_REGISTRABLE or region_kind(inner).space != "host":
        raise UsageError(f"cannot register {inner.text!r} with cudaHostRegister: name a host "
                         "region such as dram, numa:N or devdax:/dev/daxX.Y")
    return inner


def _validate_registered(spec: RegionSpec, inventory: HostInventory) -> None:
    inner = _inner(spec)
    region_kind(inner).validate(inner, inventory)


def _registered_unavailable(spec: RegionSpec, inventory: HostInventory) -> str | None:
    reason = no_gpu(inventory)
    if reason:
        return reason
    try:
        inner = _inner(spec)
    except UsageError as exc:
        return str(exc)
    return region_kind(inner).unavailable(inner, inventory)


def _open_registered(spec: RegionSpec, size: int, attr: str, allow_write: bool) -> MappedRegion:
    cp = _cupy()
    runtime = cp.cuda.runtime
    inner_spec = _inner(spec)
    # the inner mapping is page-aligned and page-granular, so whole pages can be registered
    inner = region_kind(inner_spec).open(inner_spec, _round_up(size, PAD), attr, allow_write)
    try:
        pointer = int(inner.array.ctypes.data)
        if pointer % PAGE:
            raise RuntimeError(f"{inner_spec.text} is not page-aligned at {pointer:#x}; "
                               "cudaHostRegister needs whole pages")
        nbytes = _round_up(size, PAGE)
        names = (*MAPPED, *(("io-memory",) if inner.io_memory else ()),
                 *(() if inner.writable else ("read-only",)))
        flags, named = flags_of(HOST_REGISTER_FLAGS, names)
        try:
            runtime.hostRegister(pointer, nbytes, flags)
        except Exception as exc:
            if inner.io_memory and isinstance(exc, runtime.CUDARuntimeError):
                # whether CUDA takes I/O memory is the driver's and the platform's to say: a
                # skip, in CUDA's own words (a refused RAM registration fails the case)
                raise Unavailable(
                    f"cudaHostRegister({named}) of {inner_spec.text} ({attr}, {nbytes} bytes, "
                    f"I/O memory) refused by CUDA: {error_line(exc, 300)}") from exc
            raise RuntimeError(f"cudaHostRegister of {inner_spec.text} ({nbytes} bytes) failed: "
                               f"{exc}; not falling back to pageable copies") from exc
        try:
            attributes = runtime.pointerGetAttributes(pointer)
            if int(attributes.type) != MEMORY_TYPE_HOST:
                raise RuntimeError(f"cudaHostRegister of {inner_spec.text} returned success but "
                                   f"the memory type is {attributes.type}, not host-registered")
            device_pointer = _device_pointer(runtime, pointer)
        except Exception:
            runtime.hostUnregister(pointer)
            raise
    except Exception:
        inner.close()
        raise

    def close() -> None:
        try:
            runtime.hostUnregister(pointer)
        finally:
            inner.close()

    info = {**inner.info, "memory": "registered", "registered": inner_spec.text,
            "register_flags": named, "register_flags_value": f"{flags:#04x}"}
    access = GpuAccess("registered", pointer, device_pointer, nbytes)
    return GpuRegion(spec, attr, inner.array[:size], inner.writable, info, close, access=access)


def _gpu_instances(inventory: HostInventory) -> list[str]:
    return [f"gpu:{d.index}" for d in inventory.gpu.devices] or ["gpu:0"]


register_region_kind(RegionKind(
    name="gpu", syntax="gpu:K", space="gpu", attrs=frozenset({"wb"}),
    summary="device memory of CUDA GPU K (cupy)",
    validate=_validate_gpu, unavailable=_gpu_unavailable, open=_open_gpu,
    instances=_gpu_instances, pool_class="gpu",
))
register_region_kind(RegionKind(
    name="pinned", syntax="pinned", space="host", attrs=frozenset(PINNED_ALLOC),
    summary="page-locked host memory from cudaHostAlloc (portable, mapped for zero-copy; "
            "--attr wc: allocated write-combined, no kernel module needed)",
    validate=lambda spec, inventory: None,
    unavailable=lambda spec, inventory: no_gpu(inventory), open=_open_pinned,
    instances=lambda inventory: ["pinned"], pool_class="local",
))
register_region_kind(RegionKind(
    name="registered", syntax="registered:<host region>", space="host",
    attrs=frozenset({"wb", "uc", "wc"}),
    summary="a host region (dram, numa:N, devdax:..., ncmem:...) page-locked in place by "
            "cudaHostRegister; a uc / wc / wb mapping through the nearlocal_pool module as I/O "
            "memory (the attributes are the inner region's)",
    validate=_validate_registered, unavailable=_registered_unavailable, open=_open_registered,
    attr_unavailable=lambda spec, attr: attribute_unavailable(_inner(spec), attr),
    user_owned=lambda spec: region_kind(_inner(spec)).user_owned(_inner(spec)),
    instances=lambda inventory: ["registered:dram"],
    pool_class=lambda spec, cpuless: pool_class_of(_inner(spec).text, cpuless),
))
