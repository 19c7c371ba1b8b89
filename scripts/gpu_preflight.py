"""The GPU check's first step: install the wheels the device image lacks, when a folder of them
was carried (offline, from what scripts/gpu_wheels.sh filled; optional: nothing the GPU path
imports needs them), and import everything the later steps import, printing each version, so
that a missing or broken package is one line here instead of a traceback in every later step.

Required is only what the GPU path imports (REQUIRED: `nearlocal run`, probe, the GPU sessions,
the tests and the bench step); scipy is not (numba imports it only when present, and only
`nearlocal compare` uses it). The optional ones (OPTIONAL: torch for one comparison, and the
rest) are located and their versions read from their metadata, never imported: importing torch
alone can take most of this step's cap.

Imports nothing of nearlocal. Only wheels of distributions the image does not already have are
installed, into --target (which scripts/gpu_check.sh puts on PYTHONPATH): nothing of the image
is shadowed or changed. Exit 0 when every required module imports; 3 when only the CUDA stack
(cupy) is missing (the probe then says "no GPU" and why); else 1. `--gate PROBE_JSON` answers
instead whether the GPU steps can run at all (a GPU, and the CUDA module compiled), in one line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

# (module, why): what the GPU path imports, each imported here; the versions of all are printed
REQUIRED = (("numpy", "everything"), ("numba", "CPU kernels, imported by every CLI path"),
            ("pandas", "results store"), ("pyarrow", "results store"), ("rich", "console"),
            ("cupy", "the GPU methods"), ("pytest", "the tests step"),
            ("pytest_benchmark", "the bench step"))
# (module, distribution, why): located, never imported
OPTIONAL = (("torch", "torch", "the 64 MiB copy_ comparison"),
            ("cuda.bindings", "cuda-bindings", "cuda-memcpy-batch api=bindings"),
            ("pynvml", "nvidia-ml-py", "PCIe / NVLink fields of the probe, the HBM peak fallback"),
            ("scipy", "scipy", "nearlocal compare only"),
            ("matplotlib", "matplotlib", "nearlocal report plots"))


def _one_line(exc: BaseException, limit: int = 240) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def wheel_distribution(path: Path) -> str:
    """The normalised distribution name of a wheel file (PEP 427: name-version-...whl)."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_wheels(folder: Path, installed=_installed) -> list[Path]:
    """The wheels in `folder` whose distribution this Python does not have yet."""
    return [w for w in sorted(folder.glob("*.whl")) if not installed(wheel_distribution(w))]


def install(wheels: list[Path], target: Path) -> list[str]:
    """Offline install into `target`: pip (--no-index --no-deps), or unzipping when this Python
    has no pip (a wheel is a zip laid out as site-packages). Lines saying what was done."""
    if not wheels:
        return []
    target.mkdir(parents=True, exist_ok=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if pip.returncode == 0:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--no-warn-script-location", "--quiet",
             "--target", str(target), *map(str, wheels)], capture_output=True, text=True)
        if result.returncode != 0:
            tail = " ".join(result.stderr.split())[-300:]
            return [f"FAILED pip install --no-index of {len(wheels)} wheels: {tail}"]
        return [f"installed {w.name} (pip, offline) into {target}" for w in wheels]
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return [f"installed {w.name} (unzipped: no pip here) into {target}" for w in wheels]


def _version(module) -> str:
    """__version__, else the version of the distribution that installed the module (rich,
    cuda.bindings)."""
    version = getattr(module, "__version__", None)
    if version is None:
        top = module.__name__.split(".")[0]
        names = importlib.metadata.packages_distributions().get(top, [])
        if module.__name__ == "cuda.bindings":
            names = ["cuda-bindings", *names]
        versions = [importlib.metadata.version(n) for n in names if _installed(n)]
        version = versions[0] if versions else "?"
    return str(version)


def locate(module: str, distribution: str) -> str | None:
    """'<version> (<folder>)' of an installed module without importing it, or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    version = importlib.metadata.version(distribution) if _installed(distribution) else "?"
    where = Path(spec.origin).parent if spec.origin else (
        next(iter(spec.submodule_search_locations or ["?"])))
    return f"{version} ({where})"


def check_imports() -> tuple[bool, list[str]]:
    ok, lines = True, [f"python {sys.version.split()[0]} ({sys.executable})"]
    for name, why in REQUIRED:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken native library
            lines.append(f"MISSING {name} ({why}): {_one_line(exc)}")
            ok = False
            continue
        where = Path(getattr(module, "__file__", "") or "?").parent
        lines.append(f"{name} {_version(module)} ({where})")
    for name, distribution, why in OPTIONAL:
        found = locate(name, distribution)
        lines.append(f"{name} {found}, located, not imported ({why})" if found else
                     f"absent (optional) {name} ({why})")
    return ok, lines


def cuda_headers_line() -> str:
    """Where cupy would find the CUDA runtime headers (information only: nearlocal's kernels
    compile without them; cupy's own elementwise kernels need them)."""
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        return f"cudart headers (cuda.pathfinder): {found or 'not found'}"
    except Exception as exc:
        return f"cudart headers: cuda.pathfinder cannot say ({_one_line(exc, 120)})"


GPU_MODULES = ("cupy",)  # missing only this: the probe says "no GPU" itself


def gpu_gate(probe_json: Path) -> tuple[bool, str]:
    """From `nearlocal probe --json`: may the GPU steps run? (yes, what there is) or (no, the
    one-line reason: no GPU, or the CUDA module does not compile)."""
    try:
        gpu = json.loads(probe_json.read_text())["inventory"]["gpu"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return False, f"the probe wrote no usable {probe_json.name} ({_one_line(exc, 160)})"
    devices = gpu.get("devices") or []
    if not devices:
        return False, gpu.get("reason") or "no GPU"
    if gpu.get("nvrtc"):
        return False, gpu["nvrtc"]
    names = ", ".join(f"{d.get('index')}: {d.get('name')}" for d in devices)
    return True, (f"{len(devices)} GPU(s) ({names}); cupy {gpu.get('cupy_version')}, NVRTC "
                  f"{gpu.get('nvrtc_version')}, the CUDA module compiled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder of wheels to install from, offline")
    parser.add_argument("--target", type=Path, help="where to install them (on PYTHONPATH)")
    parser.add_argument("--gate", type=Path, metavar="PROBE_JSON",
                        help="only say whether the GPU steps can run (exit 0) or why not (exit 1)")
    args = parser.parse_args(argv)
    if args.gate is not None:
        ok, line = gpu_gate(args.gate)
        print(("GPU steps run: " if ok else "GPU steps skipped: ") + line)
        return 0 if ok else 1
    lines: list[str] = []
    if args.wheels is not None:
        if args.target is None:
            parser.error("--wheels needs --target")
        if not args.wheels.is_dir():
            lines.append(f"no wheel folder {args.wheels}: none needed (the GPU path needs "
                         "nothing beyond the image; scripts/gpu_wheels.sh adds optional ones)")
        else:
            todo = missing_wheels(args.wheels)
            lines += install(todo, args.target) or [f"{args.wheels}: nothing to install"]
            if str(args.target) not in sys.path:
                sys.path.insert(0, str(args.target))
            importlib.invalidate_caches()
    _, import_lines = check_imports()
    lines += [*import_lines, cuda_headers_line()]
    failed = [line for line in lines if line.startswith(("FAILED", "MISSING"))]
    gpu_only = all(line.split()[1] in GPU_MODULES for line in failed
                   if line.startswith("MISSING")) and not any(
        line.startswith("FAILED") for line in failed)
    if not failed:
        lines.append("preflight: ok")
    elif gpu_only:
        lines.append("preflight: no CUDA stack (the probe says why); everything else imports")
    else:
        lines.append(f"preflight: FAILED ({len(failed)} problem(s) above)")
    print("\n".join(lines))
    return 0 if not failed else 3 if gpu_only else 1


if __name__ == "__main__":
    sys.exit(main())
