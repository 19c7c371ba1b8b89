"""GPU paths (Beluga B9-B11, B13-B14; SwiftCache S2-S3): numba-cuda kernels that move a whole
fragment table in one launch, the CUDA runtime's copy APIs for comparison, zero-copy access to
mapped host memory and NVLink peer copies.

Nothing here imports cupy or compiles a kernel at import time: `kernels` needs numba-cuda (its
logic is tested under the simulator, NUMBA_ENABLE_CUDASIM=1), `regions` and `methods` import
cupy only inside a worker that runs a GPU case.
"""
