"""Issue 40: a pip-only box may have no CUDA runtime headers, and cupy 14 then refuses every
compile of its own (RawModule, elementwise kernels: "Failed to find CUDA headers"), although
nearlocal's kernel source includes no header. Against a cupy double that raises exactly there
(tests/gpu_fakecupy.py, headers=False), with the real NVRTC where the nvidia-cuda-nvrtc wheel is
installed: the probe compiles the module, and every kind of GPU session opens its regions, checks
its bytes and gives samples. Nothing here is a measurement; the kernels run on the CPU shim."""

import shutil
import sys
import types

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.sampling import StoppingRule
from nearlocal.engine.worker import WorkerSettings, measure
from nearlocal.gpu.suites import MAPPED_HOST, SERVING_PATTERNS
from tests.gpu_fakecupy import libnvrtc, make_fake_cupy

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the kernels' CUDA C")
SETTINGS = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9, False)
SMALL = (("threads", "8"),)


@pytest.fixture
def headerless(monkeypatch):
    """cupy without CUDA headers; NVRTC real when installed (else the recording stand-in)."""
    cp = make_fake_cupy(headers=False, nvrtc="auto")
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return cp


def test_the_double_fails_where_cupy_14_fails(headerless):
    """cupy's own compile paths raise (the fake is faithful), so what passes below does not
    go through them."""
    from nearlocal.kernels.cuda import KERNEL_SOURCE

    with pytest.raises(RuntimeError, match="Failed to find CUDA headers"):
        headerless.RawModule(code=KERNEL_SOURCE).get_function("nl_copy")
    with pytest.raises(RuntimeError, match="Failed to find CUDA headers"):
        headerless.arange(10)
    with pytest.raises(RuntimeError, match="Failed to find CUDA headers"):
        headerless.zeros(8, dtype=headerless.uint32) % 3
    with pytest.raises(RuntimeError, match="Failed to find CUDA headers"):
        headerless.empty(8).fill(7)
    headerless.empty(8).fill(0)  # a memset: no kernel


def test_the_probe_compiles_the_module_without_headers(headerless):
    from nearlocal.probe.gpu import probe_gpu

    info = probe_gpu()
    assert info.devices and info.nvrtc is None, info.nvrtc
    assert info.kernel_image.startswith("cubin (")  # sm_90 is in every NVRTC 12/13's list
    options = headerless.cuda.nvrtc.options[-1]
    assert "--gpu-architecture=sm_90" in options
    assert not any(o.startswith(("-I", "--include-path")) for o in options)  # no header search
    image = headerless.cuda.function.Module.loaded[-1]
    if libnvrtc() is not None:
        assert image.startswith(b"\x7fELF")  # a real cubin, loaded as it came from NVRTC


def _pathfinder(monkeypatch, headers: str | None) -> list[str]:
    """cuda.pathfinder as the probe imports it, finding the cudart headers at `headers` (None:
    not found); returns the libraries asked for."""
    asked: list[str] = []

    def find_nvidia_header_directory(library: str) -> str | None:
        asked.append(library)
        return headers

    cuda = types.ModuleType("cuda")  # no __path__: `import cuda.bindings` fails as when absent
    pathfinder = types.ModuleType("cuda.pathfinder")
    pathfinder.find_nvidia_header_directory = find_nvidia_header_directory
    cuda.pathfinder = pathfinder
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", pathfinder)
    return asked


@pytest.mark.parametrize("headers", [None, "/opt/cuda/include"])
def test_the_probe_says_headers_are_missing_exactly_when_pathfinder_finds_none(
        headerless, monkeypatch, headers):
    """The headers line is a note, not a failure: the kernels compile either way (no nvrtc
    reason), the line is there exactly when cuda.pathfinder finds no cudart headers, and it
    names the cudart extra of cupy's CUDA (13 here). cupy's own "Failed to find CUDA headers"
    error is nowhere in what the probe says: nearlocal never compiles through cupy."""
    from nearlocal.probe.gpu import probe_gpu

    asked = _pathfinder(monkeypatch, headers)
    info = probe_gpu()
    assert info.devices and info.nvrtc is None and info.kernel_image.startswith("cubin (")
    assert asked == ["cudart"]
    lines = [line for line in info.missing if line.startswith("CUDA runtime headers")]
    if headers is None:
        assert lines == ["CUDA runtime headers (nearlocal's kernels compile without them; cupy's "
                         "own kernels need them): pip install 'cuda-toolkit[cudart]==13.*'"]
    else:
        assert lines == []
    said = [info.reason or "", info.nvrtc or "", info.kernel_image or "", *info.missing]
    assert not any("Failed to find CUDA headers" in text for text in said), said


@needs_gxx
@pytest.mark.parametrize(("method", "region", "access", "params"), [
    ("cuda-memcpy", "pinned", "read", ()),
    ("cuda-memcpy-async", "gpu:1", "read", ()),  # a gpu:K region: filled from the host
    ("cuda-memcpy-2d", "registered:dram", "write", ()),
    ("gather-kernel", "pinned", "read", SMALL),
    ("gather-kernel", "pinned", "read", (*SMALL, ("timing", "e2e"))),
    ("scatter-kernel", "registered:dram", "write", SMALL),
    ("zero-copy-kernel", "pinned", "read", SMALL),
    ("zero-copy-kernel", "pinned", "write", SMALL),
    ("peer-kernel", "gpu:1", "write", SMALL),
    ("layer-stream", "gpu:1", "read", (("layers", "3"), ("compute_us", "5"), ("copy", "kernel"),
                                       *SMALL)),
])
def test_gpu_sessions_run_without_headers(headerless, method, region, access, params):
    row, _raw, ns, _placement = measure(Case(method, region, "wb", "3x40B", peer="gpu:0", access=access,
                                 params=params), SETTINGS, 0.0)
    assert row["n_samples"] == len(ns) >= 1 and np.all(ns >= 0)
    assert headerless.cuda.function.Module.loaded  # the kernels came from NVRTC directly


def test_a_compile_that_fails_is_every_gpu_case_skip_reason(monkeypatch, tmp_path):
    """NVRTC loads but cannot compile: the probe compiles once, and every GPU case is skipped
    with that one line, with the pip command of a working NVRTC."""
    from nearlocal.frontends.cli import main
    from nearlocal.probe.gpu import probe_gpu
    from nearlocal.store import load

    cp = make_fake_cupy()
    cp.cuda.nvrtc.compile_error = RuntimeError("NVRTC_ERROR_COMPILATION (6)\nsee the log")
    monkeypatch.setitem(sys.modules, "cupy", cp)
    info = probe_gpu()
    assert info.devices and "\n" not in info.nvrtc
    assert info.nvrtc.startswith("the GPU kernels do not compile with NVRTC 13.0 (RuntimeError: "
                                 "NVRTC could not compile nearlocal's kernels")
    assert "pip install 'cuda-toolkit[nvrtc]==13.*'" in info.nvrtc
    assert main(["run", "--suite", "gpu", "--budget", "0.01", "--out", str(tmp_path),
                 "--quiet"]) == 0
    cases = load(None, tmp_path).cases
    assert len(cases) > 10 and (cases["status"] == "skipped").all()
    assert (cases["reason"] == info.nvrtc).all()


@needs_gxx
def test_the_gpu_suite_runs_through_the_cli_without_headers(tmp_path):
    """`nearlocal run --suite gpu` in its own processes (the CLI, the forkserver, the worker),
    with the headerless double installed as the `cupy` package: every case is a row, ok, or
    skipped with a reason that is not about compiling (here: cuda-bindings absent)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    package = tmp_path / "fake" / "cupy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import sys\n"
        "from tests.gpu_fakecupy import make_fake_cupy\n"
        "sys.modules['cupy'] = make_fake_cupy(headers=False, nvrtc='auto')\n")
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{tmp_path / 'fake'}"}
    result = subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", "run", "--suite", "gpu",
                             "--processes", "1", "--budget", "0.01", "--out",
                             str(tmp_path / "r"), "--json", str(out), "--quiet"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) > 50 and {r["status"] for r in rows} <= {"ok", "skipped"}
    ok = {r["method"] for r in rows if r["status"] == "ok"}
    assert {"gather-kernel", "scatter-kernel", "zero-copy-kernel", "cuda-memcpy-async"} <= ok
    # serving's shapes (qwen2.5-32b's blocks, a 64 MiB layer) open their regions and move their
    # bytes on both mapped host regions
    for method in ("gather-kernel", "scatter-kernel", "cuda-memcpy-async"):
        done = {(r["region"], r["pattern"]) for r in rows if r["method"] == method
                and r["status"] == "ok"}
        assert {(m, p) for m in MAPPED_HOST for p in SERVING_PATTERNS} <= done, method
    for row in rows:
        assert row["status"] == "ok" or "compile" not in (row.get("reason") or ""), row
