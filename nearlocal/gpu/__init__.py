"""GPU paths (Beluga B9-B11, B13-B14; SwiftCache S2-S3): CUDA C kernels (compiled by NVRTC,
called directly so no CUDA header is needed, and loaded from the image) that move a whole
fragment table in one launch, the CUDA runtime's copy APIs for comparison, zero-copy access to
mapped host memory and NVLink peer copies.

Nothing here imports cupy or compiles a kernel at import time: `kernels` holds the CUDA C source
and its numpy host side (work split, references; tested on any machine, the source also by nvcc
and by g++ through a CPU shim), `regions` and the sessions (`session`, `copy_sessions`,
`kernel_sessions`, `layerstream`) import cupy only inside a worker that runs a GPU case; `methods`
registers the methods, `needs` says why one cannot run here, `bindings` calls the driver through
ctypes. numba-cuda is not used.
"""
