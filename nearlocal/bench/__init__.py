"""The pytest front end, installed with the package: `pytest --pyargs nearlocal.bench` measures a
suite's cases as pytest-benchmark tests on any box nearlocal is installed on, no checkout needed.

plugin.py registers through the `pytest11` entry point (options, markers, parametrization; inert
in a session that collects no nearlocal test), benchmarks.py measures, and test_*.py are the
tests pytest collects. The repo's bench/ imports them: the example a user copies.
"""

# Markers every generated test may carry, registered by the plugin in every session.
MARKERS = {
    "cpu": "runs CPU access methods",
    "gpu": "needs a CUDA GPU",
    "dsa": "needs an Intel DSA work queue",
    "cxl": "needs a CXL memory node or device-dax",
    "nvlink": "needs two GPUs with peer access",
    "storage": "reads or writes a file on a disk (file-read, file-write)",
}
DEFAULT_PROCESSES = 8  # --nearlocal-processes 1: in this process
