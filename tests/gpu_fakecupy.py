"""A test double for the slice of cupy the GPU sessions use, so their plumbing (pointers, tables,
checks, both clocks, the layer-stream pass) runs on a CPU box: "device memory" is host memory,
copies are memmove, events read the host clock, the CUDA C kernels run on the CPU through the g++
shim of tests/gpu_cpushim.py (each thread of a launch in turn).
Kernels compile the way nearlocal compiles them on a GPU box: `cupy.cuda.nvrtc` (cupy's binding
of NVRTC) is a stand-in that records the options, or (nvrtc="real") the real NVRTC library
through ctypes (`CtypesNvrtc`: the nvidia-cuda-nvrtc wheel or a toolkit); `cupy.cuda.function.Module` loads
the image and runs each named kernel through the shim. `make_fake_cupy(headers=False)` is a box
without the CUDA runtime headers: cupy's own compile paths (RawModule, elementwise kernels such
as arange or full) raise what cupy 14's `assemble_cupy_compiler_options` raises.
It only ever lives in tests; nothing it produces is a measurement."""

from __future__ import annotations

import ctypes
import time
import types
from typing import ClassVar

import numpy as np


class _Pointer:
    def __init__(self, array: np.ndarray):
        self.ptr = int(array.ctypes.data)
        self._array = array

    def memset_async(self, value: int, size: int, stream=None) -> None:
        ctypes.memset(self.ptr, value, size)


class FakeDeviceArray(np.ndarray):
    """A numpy array that answers `.data.ptr` like a cupy array."""

    @property
    def data(self):  # type: ignore[override]
        return _Pointer(self)

    def set(self, host: np.ndarray) -> None:
        self[...] = host


class _Device:
    compute_capability = "90"  # cupy: major and minor as one string

    def __init__(self, index: int = 0):
        self.index = self.id = index

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Stream:
    _next = 1

    def __init__(self, non_blocking: bool = False):
        self.ptr = _Stream._next
        _Stream._next += 1

    def synchronize(self) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def __enter__(self):  # cupy: the current stream, which kernel launches go to
        return self

    def __exit__(self, *exc) -> None:
        pass


_Stream.null = _Stream()


class _Event:
    """Records the host clock; `done` is False so the timer believes the GPU was still spinning."""

    done = False

    def __init__(self, *args, **kwargs):
        self.t = 0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter_ns()

    def synchronize(self) -> None:
        pass


# the statuses the double raises by name, as cupy words them (cudaGetErrorName: cudaGetErrorString)
CUDA_ERRORS = {1: ("cudaErrorInvalidValue", "invalid argument"),
               801: ("cudaErrorNotSupported", "operation not supported")}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int):
        name = CUDA_ERRORS.get(status)
        super().__init__(f"{name[0]}: {name[1]}" if name else f"status {status}")
        self.status = status


class _Runtime:
    CUDARuntimeError = CUDARuntimeError

    def __init__(self):
        self.device_count = 1
        self.host_allocs: dict[int, np.ndarray] = {}
        self.registered: dict[int, int] = {}
        self.alloc_flags: dict[int, int] = {}  # host pointer -> cudaHostAlloc's flags
        self.register_flags: dict[int, int] = {}  # host pointer -> cudaHostRegister's flags
        self.calls: dict[str, int] = {}
        self.fail_register = False
        self.refuse_io_memory = False  # cudaHostRegisterIoMemory answered cudaErrorNotSupported

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def memcpy(self, dst, src, n, kind) -> None:
        self._count("memcpy")
        ctypes.memmove(dst, src, n)

    def memcpyAsync(self, dst, src, n, kind, stream) -> None:
        self._count("memcpyAsync")
        ctypes.memmove(dst, src, n)

    def memcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream) -> None:
        self._count("memcpy2DAsync")
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)

    def memcpyPeerAsync(self, dst, dst_dev, src, src_dev, n, stream) -> None:
        self._count("memcpyPeerAsync")
        ctypes.memmove(dst, src, n)

    # what probe.gpu.probe_gpu asks
    def getDeviceCount(self) -> int:
        return self.device_count

    def getDeviceProperties(self, index) -> dict:
        return {"name": b"Fake GPU", "totalGlobalMem": 1 << 30, "major": 9, "minor": 0,
                "multiProcessorCount": 4, "asyncEngineCount": 2, "canMapHostMemory": 1}

    def deviceGetPCIBusId(self, index) -> str:
        return f"0000:{index + 1:02x}:00.0"

    def driverGetVersion(self) -> int:
        return 13000

    def runtimeGetVersion(self) -> int:
        return 13000

    def deviceGetAttribute(self, attribute, device) -> int:
        return 0  # no pageable memory access (no HMM / ATS)

    def deviceCanAccessPeer(self, device, peer) -> int:
        return 1

    def deviceSynchronize(self) -> None:
        pass

    def deviceEnablePeerAccess(self, peer) -> None:
        self._count("deviceEnablePeerAccess")

    def hostAlloc(self, size, flags) -> int:
        buffer = np.zeros(size + 4096, np.uint8)
        pointer = (int(buffer.ctypes.data) + 4095) // 4096 * 4096
        self.host_allocs[pointer] = buffer
        self.alloc_flags[pointer] = flags
        return pointer

    def freeHost(self, pointer) -> None:
        del self.host_allocs[pointer]

    def hostRegister(self, pointer, size, flags) -> None:
        if self.fail_register:
            raise CUDARuntimeError(1)
        if self.refuse_io_memory and flags & 0x04:  # cudaHostRegisterIoMemory
            raise CUDARuntimeError(801)
        self.registered[pointer] = size
        self.register_flags[pointer] = flags

    def hostUnregister(self, pointer) -> None:
        del self.registered[pointer]

    def pointerGetAttributes(self, pointer):
        known = pointer in self.registered or pointer in self.host_allocs
        return types.SimpleNamespace(type=1 if known else 0, devicePointer=pointer if known else 0)


# what cupy 14 raises from assemble_cupy_compiler_options when cuda.pathfinder finds no cudart
# headers (cupy/_core/core.pyx), before NVRTC is even called
HEADERS_MISSING = ("Failed to find CUDA headers. Please install CUDA toolkit headers (e.g., pip "
                   "install cupy-cuda12x[ctk]) or specify CUDA_PATH environment variable.")


class _RawModule:
    """cupy.RawModule over the CPU shim: get_function(name)(grid, block, args) runs the kernel.
    `compile_error` (class attribute): the exception the first get_function raises, as cupy's
    compile does when NVRTC fails or finds no CUDA headers. nearlocal itself no longer compiles
    through it; it is here so tests can show cupy's own path failing."""

    compile_error: Exception | None = None

    def __init__(self, code: str, options=()):
        self.code = code

    def get_function(self, name: str):
        if self.compile_error is not None:
            raise self.compile_error
        return _shim_kernel(name)


def _shim_kernel(name: str):
    from tests import gpu_cpushim

    def launch(grid, block, args, shared_mem=0, stream=None):
        if name == "nl_spin":  # the blocking kernel: "waited" what it was asked to
            ctypes.c_uint64.from_address(int(args[1])).value = int(args[0])
            return
        gpu_cpushim.launch(name, int(grid[0]), int(block[0]), args)

    return launch


class _Module:
    """cupy.cuda.function.Module: load(image) is cuModuleLoadData, get_function(name) finds the
    kernel by name in the image (a cubin's symbol table, PTX's .entry lines, the stand-in's list)
    and runs it through the shim."""

    loaded: ClassVar[list[bytes]] = []  # every image loaded by this fake (per fake, see make_fake_cupy)

    def __init__(self):
        self.image: bytes | None = None

    def load(self, image: bytes) -> None:
        if not isinstance(image, bytes) or not image:
            raise TypeError("Module.load takes the compiled image as bytes")
        self.image = image
        self.loaded.append(image)

    def get_function(self, name: str):
        if self.image is None or name.encode() not in self.image:
            raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: no kernel {name} in the loaded image")
        return _shim_kernel(name)


class NvrtcError(RuntimeError):
    def __init__(self, status: int):
        super().__init__(f"NVRTC_ERROR ({status})")
        self.status = status


class CtypesNvrtc:
    """The real NVRTC library behind the interface of cupy's binding (cupy_backends.cuda.libs.
    nvrtc: createProgram / compileProgram / getPTX / getCUBIN / getProgramLog / destroyProgram /
    getVersion / getSupportedArchs). `options` keeps every compile's options."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.options: list[tuple[str, ...]] = []

    def _check(self, status: int) -> None:
        if status != 0:
            raise NvrtcError(status)

    def getVersion(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return major.value, minor.value

    def getSupportedArchs(self) -> tuple[int, ...]:
        count = ctypes.c_int()
        self._check(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)))
        archs = (ctypes.c_int * count.value)()
        self._check(self.lib.nvrtcGetSupportedArchs(archs))
        return tuple(archs)

    def createProgram(self, src: str, name: str, headers, include_names) -> int:
        assert not headers and not include_names
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(),
                                                0, None, None))
        return int(prog.value)

    def compileProgram(self, prog: int, options) -> None:
        self.options.append(tuple(options))
        encoded = [o.encode() for o in options]
        self._check(self.lib.nvrtcCompileProgram(ctypes.c_void_p(prog), len(encoded),
                                                 (ctypes.c_char_p * len(encoded))(*encoded)))

    def _get(self, prog: int, what: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(getattr(self.lib, f"nvrtcGet{what}Size")(ctypes.c_void_p(prog),
                                                             ctypes.byref(size)))
        out = ctypes.create_string_buffer(size.value)
        self._check(getattr(self.lib, f"nvrtcGet{what}")(ctypes.c_void_p(prog), out))
        return out.raw[:max(size.value - 1, 0)] if what != "CUBIN" else out.raw[:size.value]

    def getPTX(self, prog: int) -> bytes:
        return self._get(prog, "PTX")

    def getCUBIN(self, prog: int) -> bytes:
        return self._get(prog, "CUBIN")

    def getProgramLog(self, prog: int) -> str:
        return self._get(prog, "ProgramLog").decode(errors="replace")

    def destroyProgram(self, prog: int) -> None:
        self._check(self.lib.nvrtcDestroyProgram(ctypes.byref(ctypes.c_void_p(prog))))


class _StandInNvrtc:
    """Where no NVRTC library is installed: the same interface, an "image" naming the kernels of
    the source. `compile_error`: what compileProgram raises (an NVRTC that cannot compile)."""

    def __init__(self):
        self.options: list[tuple[str, ...]] = []
        self.compile_error: Exception | None = None
        self._programs: dict[int, str] = {}

    def getVersion(self) -> tuple[int, int]:
        return 13, 0

    def getSupportedArchs(self) -> tuple[int, ...]:
        return 75, 80, 86, 89, 90, 100, 120

    def createProgram(self, src: str, name: str, headers, include_names) -> int:
        handle = len(self._programs) + 1
        self._programs[handle] = src
        return handle

    def compileProgram(self, prog: int, options) -> None:
        self.options.append(tuple(options))
        if self.compile_error is not None:
            raise self.compile_error

    def getCUBIN(self, prog: int) -> bytes:
        import re

        names = re.findall(r"NL_GLOBAL void (\w+)\(", self._programs[prog])
        return ("stand-in cubin: " + " ".join(names)).encode()

    getPTX = getCUBIN

    def getProgramLog(self, prog: int) -> str:
        return "stand-in NVRTC: no log"

    def destroyProgram(self, prog: int) -> None:
        del self._programs[prog]


def libnvrtc() -> ctypes.CDLL | None:
    """NVRTC from the system or the nvidia-cuda-nvrtc wheel (its builtins library loaded first),
    or None."""
    import importlib.util
    from pathlib import Path

    names = ["libnvrtc.so.13", "libnvrtc.so.12"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        names += sorted(str(p) for p in Path(root).glob("*/lib/libnvrtc.so.*"))
    for name in names:
        try:
            for builtins in sorted(Path(name).parent.glob("libnvrtc-builtins.so.*")):
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)  # found by soname later
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _headers_missing(*args, **kwargs):
    raise RuntimeError(HEADERS_MISSING)


class HeaderlessDeviceArray(FakeDeviceArray):
    """A device array on a box without CUDA headers: what cupy runs as an elementwise kernel
    (arithmetic, astype, fill with a non-zero value) raises as cupy 14 does."""

    __add__ = __radd__ = __sub__ = __mul__ = __rmul__ = __mod__ = __rshift__ = __lshift__ = \
        __or__ = __and__ = __xor__ = __floordiv__ = __truediv__ = _headers_missing

    def astype(self, *args, **kwargs):
        raise RuntimeError(HEADERS_MISSING)

    def fill(self, value) -> None:
        if value != 0:  # cupy memsets a zero fill; anything else is an elementwise kernel
            raise RuntimeError(HEADERS_MISSING)
        super().fill(value)


class _PinnedMemory(bytearray):
    """cupy.cuda.alloc_pinned_memory's answer: a buffer with a `.ptr`."""

    @property
    def ptr(self) -> int:
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))


def make_fake_cupy(headers: bool = True, nvrtc: str = "stand-in") -> types.ModuleType:
    """A fresh double. `headers=False`: no CUDA runtime headers (cupy's compile paths raise).
    `nvrtc`: "stand-in" (default: a compile costs nothing), "real" (the NVRTC library, or an
    error when absent), or "auto" (the real one where installed)."""
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    kind = FakeDeviceArray if headers else HeaderlessDeviceArray

    def device(array) -> FakeDeviceArray:
        return np.ascontiguousarray(array).view(kind)

    cp.uint8, cp.uint32, cp.uint64, cp.int64 = np.uint8, np.uint32, np.uint64, np.int64
    cp.empty = lambda n, dtype=np.uint8: device(np.empty(n, dtype))
    cp.zeros = lambda n, dtype=np.uint8: device(np.zeros(n, dtype))  # cupy: a memset
    cp.arange = np.arange if headers else _headers_missing
    cp.full = (lambda n, v, dtype=np.uint8: device(np.full(n, v, dtype))) if headers else \
        _headers_missing
    cp.asarray = lambda a: device(np.array(a))
    cp.asnumpy = lambda a: np.array(a).view(np.ndarray)
    runtime = _Runtime()
    cp.RawModule = type("RawModule", (_RawModule,), {})  # compile_error per fake module
    if not headers:
        cp.RawModule.compile_error = RuntimeError(HEADERS_MISSING)
    lib = libnvrtc() if nvrtc in ("auto", "real") else None
    if nvrtc == "real" and lib is None:
        raise RuntimeError("no NVRTC library here (pip install nvidia-cuda-nvrtc)")
    module = type("Module", (_Module,), {"loaded": []})
    cp.cuda = types.SimpleNamespace(
        Device=_Device, Stream=_Stream, Event=_Event, runtime=runtime,
        nvrtc=CtypesNvrtc(lib) if lib is not None else _StandInNvrtc(),
        function=types.SimpleNamespace(Module=module),
        get_elapsed_time=lambda a, b: (b.t - a.t) / 1e6,
        alloc_pinned_memory=_PinnedMemory,
    )
    return cp
