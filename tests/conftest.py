"""Shared test setup. GPU kernels run under numba-cuda's simulator unless a real GPU run is asked
for (NEARLOCAL_REAL_GPU=1, used by scripts on a GPU box); this must be set before numba.cuda loads."""

import os

if os.environ.get("NEARLOCAL_REAL_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
