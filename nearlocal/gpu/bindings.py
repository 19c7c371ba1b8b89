"""The CUDA driver entry point nearlocal calls through ctypes: cuMemcpyBatchAsync, asked for by
version so it works with any libcuda.so.1 that has it and needs no CUDA header or cuda-bindings."""

from __future__ import annotations

import ctypes

BATCH_MIN_VERSION = 12080  # CUDA 12.8: the first with cudaMemcpyBatchAsync / its driver ABI


class DriverAttrs(ctypes.Structure):
    """CUmemcpyAttributes (cuda.h, CUDA >= 12.8): access order, two CUmemLocation hints, flags."""

    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHintType", ctypes.c_int),
                ("srcLocHintId", ctypes.c_int), ("dstLocHintType", ctypes.c_int),
                ("dstLocHintId", ctypes.c_int), ("flags", ctypes.c_uint)]


SRC_ACCESS_ORDER_STREAM, SRC_ACCESS_ORDER_ANY = 1, 3


def driver_memcpy_batch():
    """cuMemcpyBatchAsync of the driver (libcuda.so.1, the CUDA 12.8 ABI, asked for by version
    through cuGetProcAddress), or (None, why not). Called straight through ctypes with arrays
    built once, its cost per call is the driver's; cuda-bindings converts its Python lists on
    every call (~0.3-1 ms for 1,024 copies), which would sit inside every e2e sample."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
    except (OSError, AttributeError) as exc:
        return None, f"libcuda.so.1 has no cuGetProcAddress_v2 ({exc})"
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    get.restype = ctypes.c_int
    pfn, status = ctypes.c_void_p(), ctypes.c_int()
    rc = get(b"cuMemcpyBatchAsync", ctypes.byref(pfn), BATCH_MIN_VERSION, 0, ctypes.byref(status))
    if rc != 0 or not pfn.value:
        return None, f"cuGetProcAddress(cuMemcpyBatchAsync, 12080) failed ({rc}, {status.value})"
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p, ctypes.c_void_p)
    return proto(pfn.value), None
