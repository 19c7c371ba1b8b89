"""A test double that runs nearlocal's CUDA C fragment kernels (nearlocal.kernels.cuda.KERNEL_SOURCE)
on the CPU: g++ compiles the same source with threadIdx / blockIdx / blockDim / gridDim as globals
and atomicAdd as a plain add, and `launch` calls the kernel once per (block, thread), one after
another. Sound for these kernels because no thread reads what another writes and none waits on
another. It proves where bytes land (head / words / tail split, piece walk, grid stride) without
a GPU; it measures nothing. `None` from `shim()` when g++ is absent (tests skip)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from nearlocal.kernels.cuda import KERNEL_SOURCE

_PRELUDE = r"""
#include <cstdint>
struct nl_dim { unsigned x, y, z; };
static nl_dim threadIdx, blockIdx, blockDim, gridDim;
static inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  unsigned long long old = *a; *a = old + v; return old;
}
"""

_LAUNCHER = r"""
extern "C" void shim_launch(int kernel, unsigned blocks, unsigned threads, nl_u64 a, nl_u64 b,
                            nl_u64 pieces, nl_i64 count, int width, int group) {
  gridDim.x = blocks; blockDim.x = threads;
  for (unsigned bx = 0; bx < blocks; bx++)
    for (unsigned tx = 0; tx < threads; tx++) {
      blockIdx.x = bx; threadIdx.x = tx;
      if (kernel == 0) nl_copy(a, b, pieces, count, width, group);
      else if (kernel == 1) nl_sum(a, b, pieces, count, width, group);
      else if (kernel == 2) nl_fill(a, (unsigned)b, pieces, count, width, group);
      else if (kernel == 3) nl_plain_copy4(a, b, count);
      else nl_plain_copy12(a, b, count);
    }
}
"""
KERNEL_IDS = {"nl_copy": 0, "nl_sum": 1, "nl_fill": 2, "nl_plain_copy4": 3, "nl_plain_copy12": 4}
# -Werror at every level g++ optimises at: -O3 is where maybe-uninitialized shows (issue 24)
WARNING_FLAGS = ("-Wall", "-Wno-unknown-pragmas", "-Werror")


def shim_source() -> str:
    return _PRELUDE + KERNEL_SOURCE + _LAUNCHER


@functools.cache
def shim() -> ctypes.CDLL | None:
    compiler = shutil.which("g++")
    if compiler is None:
        return None
    source = shim_source()
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    lib = Path(tempfile.gettempdir()) / f"nearlocal-gpu-cpushim-{digest}.so"
    if not lib.exists():
        with tempfile.TemporaryDirectory() as tmp:
            cpp = Path(tmp) / "shim.cpp"
            cpp.write_text(source)
            out = Path(tmp) / "shim.so"
            subprocess.run([compiler, "-std=c++17", "-O1", "-fno-strict-aliasing", "-shared",
                            "-fPIC", *WARNING_FLAGS, "-o", str(out), str(cpp)], check=True)
            shutil.move(str(out), lib)
    dll = ctypes.CDLL(str(lib))
    dll.shim_launch.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint64,
                                ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int,
                                ctypes.c_int]
    dll.shim_launch.restype = None
    return dll


def launch(name: str, blocks: int, threads: int, args: tuple) -> None:
    """Run kernel `name` over a (blocks x threads) grid with the argument tuple cupy would get."""
    if name.startswith("nl_plain_copy"):  # (dst, src, nbytes)
        args = (args[0], args[1], 0, args[2], 0, 0)
    a, b, pieces, count, width, group = (int(x) for x in args)
    shim().shim_launch(KERNEL_IDS[name], blocks, threads, a, b, pieces, count, width, group)


def ptr(array: np.ndarray) -> int:
    return int(array.ctypes.data)
