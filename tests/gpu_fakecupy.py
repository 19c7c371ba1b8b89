"""A test double for the slice of cupy the GPU sessions use, so their plumbing (pointers, tables,
checks, both clocks, the layer-stream pass) runs on a CPU box: "device memory" is host memory,
copies are memmove, events read the host clock, the CUDA C kernels run on the CPU through the g++
shim of tests/gpu_cpushim.py (each thread of a launch in turn).
It only ever lives in tests; nothing it produces is a measurement."""

from __future__ import annotations

import ctypes
import time
import types

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


def _device(array) -> FakeDeviceArray:
    return np.ascontiguousarray(array).view(FakeDeviceArray)


class _Device:
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


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int):
        super().__init__(f"status {status}")
        self.status = status


class _Runtime:
    CUDARuntimeError = CUDARuntimeError

    def __init__(self):
        self.device_count = 1
        self.host_allocs: dict[int, np.ndarray] = {}
        self.registered: dict[int, int] = {}
        self.calls: dict[str, int] = {}
        self.fail_register = False

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

    # what hwprobe.gpu.probe_gpu asks
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
        return pointer

    def freeHost(self, pointer) -> None:
        del self.host_allocs[pointer]

    def hostRegister(self, pointer, size, flags) -> None:
        if self.fail_register:
            raise CUDARuntimeError(1)
        self.registered[pointer] = size

    def hostUnregister(self, pointer) -> None:
        del self.registered[pointer]

    def pointerGetAttributes(self, pointer):
        known = pointer in self.registered or pointer in self.host_allocs
        return types.SimpleNamespace(type=1 if known else 0, devicePointer=pointer if known else 0)


class _RawModule:
    """cupy.RawModule over the CPU shim: get_function(name)(grid, block, args) runs the kernel.
    `compile_error` (class attribute): the exception the first get_function raises, as cupy's
    compile does when NVRTC fails or finds no CUDA headers."""

    compile_error: Exception | None = None

    def __init__(self, code: str, options=()):
        self.code = code

    def get_function(self, name: str):
        from tests import gpu_cpushim

        if self.compile_error is not None:
            raise self.compile_error

        def launch(grid, block, args, shared_mem=0):
            if name == "nl_spin":  # the blocking kernel: "waited" what it was asked to
                ctypes.c_uint64.from_address(int(args[1])).value = int(args[0])
                return
            gpu_cpushim.launch(name, int(grid[0]), int(block[0]), args)

        return launch


class _PinnedMemory(bytearray):
    """cupy.cuda.alloc_pinned_memory's answer: a buffer with a `.ptr`."""

    @property
    def ptr(self) -> int:
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))


def make_fake_cupy() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.uint8, cp.uint32, cp.uint64, cp.int64 = np.uint8, np.uint32, np.uint64, np.int64
    cp.empty = lambda n, dtype=np.uint8: _device(np.empty(n, dtype))
    cp.zeros = lambda n, dtype=np.uint8: _device(np.zeros(n, dtype))
    cp.arange = np.arange
    cp.asarray = lambda a: _device(np.array(a))
    cp.asnumpy = lambda a: np.array(a).view(np.ndarray)
    runtime = _Runtime()
    cp.RawModule = type("RawModule", (_RawModule,), {})  # compile_error per fake module
    cp.cuda = types.SimpleNamespace(
        Device=_Device, Stream=_Stream, Event=_Event, runtime=runtime,
        nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),
        get_elapsed_time=lambda a, b: (b.t - a.t) / 1e6,
        alloc_pinned_memory=_PinnedMemory,
    )
    return cp
