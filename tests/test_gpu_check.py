"""scripts/gpu_check.py, gpu_check.sh and gpu_preflight.py on a CPU box: the same-buffer
references run against the cupy test double (bytes checked, nothing measured), the thresholds
of issue 24 are applied to given figures, the shell script's step caps fit its total, and the
preflight installs wheels offline and names what is missing in one line."""

import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu_fakecupy import make_fake_cupy

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gpu_check(monkeypatch):
    cp = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return _script("gpu_check")


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the kernels' CUDA C")


@needs_gxx
def test_gather_and_plain_copies_share_buffers_and_move_the_right_bytes(gpu_check):
    ref = gpu_check.gather_vs_plain_copy("5x3000B", reps=2)
    assert ref["bytes"] == 15000 and ref["gather"]["plan"]["pieces"] >= 5
    labels = [r["label"] for r in ref["plain"]]
    assert any("unroll 4" in label for label in labels)
    assert any("nvbandwidth" in label and "4 x 512" in label for label in labels)  # 4 fake SMs
    assert ref["best_plain"]["gbps"] == max(r["gbps"] for r in ref["plain"])


def test_plain_copy_geometries_cover_the_bytes_once_or_stride():
    from nearlocal.gpu.kernels import PLAIN_COPY_UNROLLS

    gpu_check = _script("gpu_check")
    for label, unroll, blocks, threads in gpu_check.plain_copy_geometries(64 << 20, 132):
        assert unroll in PLAIN_COPY_UNROLLS and 1 <= blocks <= 65535 and threads in (128, 512)
        if "one pass" in label:
            assert blocks * threads * unroll * 16 >= 64 << 20


@needs_gxx
def test_bare_launch_and_lone_copy_run_against_the_double(gpu_check):
    bare, times = gpu_check.bare_launch_ns("4x160B", reps=20)
    assert bare >= 0 and len(times) == 20
    raw, empty, lone_times = gpu_check.lone_memcpy_ns(4096, reps=10)
    assert raw >= 0 and empty >= 0 and len(lone_times) == 10


def _figures(gpu_check, monkeypatch, *, gather_gbps: float, plain_gbps: float,
             memcpy_few_ns: float, e2e_ns: float, bare_ns: float):
    """main() over given figures: every measurement replaced by a stand-in."""

    def row(method, pattern, access="read", **params):
        ns = {"64KiB": 6e3, "64MiB": 1.3e6, "1024x160B": 5e4, "128x20KiB": 8e4}[pattern]
        if method == "cuda-memcpy-async" and pattern == "1024x160B":
            ns = memcpy_few_ns
        if params.get("timing") == "e2e" and method == "gather-kernel":
            ns = e2e_ns
        nbytes = {"64KiB": 1 << 16, "64MiB": 64 << 20, "1024x160B": 163840,
                  "128x20KiB": 2621440}[pattern]
        return {"case": f"{method}/{pattern}/{access}/{params}", "median_ns": ns, "p99_ns": ns,
                "n": 10, "gbps": nbytes / ns, "info": {"timer_overhead_ns": 1000.0}}

    def reference(pattern, reps=30):
        plain = [{"label": "unroll 12, 132 x 512 (nvbandwidth: a block per SM)",
                  "gbps": plain_gbps, "median_ns": 1.0}, {"label": "unroll 4", "gbps": 1.0,
                                                           "median_ns": 2.0}]
        return {"pattern": pattern, "gather": {"gbps": gather_gbps, "median_ns": 1.0},
                "plain": plain, "best_plain": plain[0]}

    monkeypatch.setattr(gpu_check, "_row", row)
    monkeypatch.setattr(gpu_check, "gather_vs_plain_copy", reference)
    monkeypatch.setattr(gpu_check, "torch_pinned_copy_ns", lambda nbytes, reps=30: 1.3e6)
    monkeypatch.setattr(gpu_check, "bare_launch_ns", lambda pattern, reps=300: (bare_ns, []))
    monkeypatch.setattr(gpu_check, "lone_memcpy_ns", lambda nbytes, reps=100: (5.7e3, 1e3, []))
    monkeypatch.setattr(gpu_check, "gpu_unusable", lambda: None)


def test_thresholds_of_issue_24(gpu_check, monkeypatch, tmp_path):
    _figures(gpu_check, monkeypatch, gather_gbps=33.0, plain_gbps=35.0, memcpy_few_ns=2e6,
             e2e_ns=30e3, bare_ns=25e3)
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "PASS gather_vs_per_fragment_memcpy_1024x160B" in report and "40.0x faster" in report
    assert "PASS gather_vs_best_sm_copy_64MiB" in report and "0.94x (must be >= 0.9x)" in report
    assert "PASS gather_vs_best_sm_copy_128x20KiB" in report
    assert "PASS gather_e2e_vs_bare_launch" in report and "1.20x" in report
    assert "copy-engine ratio at 64 MiB" in report  # information, no verdict
    assert "at 64 KiB" in report and "borderline by design: no verdict" in report
    assert "prime=0" in report and "lone cudaMemcpyAsync between two events: 5.70 us raw" in report
    assert "gather_64KiB_time" not in report and "0.85" not in report

    _figures(gpu_check, monkeypatch, gather_gbps=30.0, plain_gbps=35.0, memcpy_few_ns=5e5,
             e2e_ns=40e3, bare_ns=25e3)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "FAIL gather_vs_per_fragment_memcpy_1024x160B" in report  # 10x < 20x
    assert "FAIL gather_vs_best_sm_copy_64MiB" in report  # 0.86x < 0.9x
    assert "FAIL gather_e2e_vs_bare_launch" in report  # 1.6x > 1.5x


def test_gpu_check_without_a_gpu_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=300)
    if "nothing measured" not in result.stdout:
        pytest.skip("this box has a GPU")
    assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout
    assert result.stdout.strip().count("\n") == 0


# --- gpu_check.sh -------------------------------------------------------------------------------

def test_step_caps_leave_room_in_the_total():
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    total = int(re.search(r'TOTAL_S="\$\{TOTAL_S:-(\d+)\}"', text).group(1))
    tail = int(re.search(r"^TAIL_S=(\d+)$", text, re.M).group(1))
    steps = re.search(r"^STEPS=\((.*?)\)", text, re.M | re.S).group(1).split()
    caps = {name: int(cap) for name, cap in (s.split(":") for s in steps)}
    assert sum(caps.values()) + tail <= total
    for name in caps:  # every step the script runs has a cap, and every cap a step
        assert re.search(rf"step {re.escape(name)} ", text), name
    for variable in ("CUPY_CACHE_DIR", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "NUMBA_CACHE_DIR"):
        assert f"{variable}=" in text
    assert "set -uo pipefail" in text and "bash -o pipefail -c" in text


def test_gpu_check_sh_refuses_caps_beyond_the_total(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "TOTAL_S": "100",
                                            "OUT": str(tmp_path / "out")}, timeout=60)
    assert result.returncode == 2 and "step caps add up to" in result.stderr
    assert not (tmp_path / "out").exists()


# --- gpu_preflight.py ---------------------------------------------------------------------------

def _wheel(folder: Path, name: str = "nl_tiny_pkg", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel (PEP 427 layout) with one module."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {f"{name}/__init__.py": f"__version__ = '{version}'\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_preflight_installs_only_missing_wheels_offline(tmp_path):
    preflight = _script("gpu_preflight")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny = _wheel(wheels)
    (wheels / "numpy-9.9-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert preflight.wheel_distribution(tiny) == "nl-tiny-pkg"
    assert preflight.missing_wheels(wheels) == [tiny]  # numpy is installed: left alone
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_preflight.py"),
                             "--wheels", str(wheels), "--target", str(tmp_path / "site")],
                            capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert "Traceback" not in out + result.stderr
    assert f"installed {tiny.name}" in out and (tmp_path / "site" / "nl_tiny_pkg").is_dir()
    for name in ("numba", "scipy", "pandas", "pyarrow", "pytest_benchmark"):
        assert re.search(rf"^{name} \S+ \(", out, re.M), name  # imported, with a version
    if "MISSING cupy" in out:  # a CPU box: only the CUDA stack is missing
        assert result.returncode == 3 and "preflight: no CUDA stack" in out
    else:
        assert result.returncode == 0 and re.search(r"^cupy \S+ \(", out, re.M)


def test_preflight_gate_reads_the_probe(tmp_path):
    import json

    preflight = _script("gpu_preflight")
    probe = tmp_path / "probe.json"

    def gate(gpu: dict) -> tuple[bool, str]:
        probe.write_text(json.dumps({"inventory": {"gpu": gpu}}))
        return preflight.gpu_gate(probe)

    assert gate({"devices": [], "reason": "no GPU: cupy is not importable (x)"}) == \
        (False, "no GPU: cupy is not importable (x)")
    device = {"index": 0, "name": "NVIDIA H200"}
    broken = "the GPU kernels do not compile through cupy / NVRTC (RuntimeError: Failed ...)"
    assert gate({"devices": [device], "nvrtc": broken}) == (False, broken)
    ok, line = gate({"devices": [device], "nvrtc": None, "cupy_version": "14.2.0",
                     "nvrtc_version": "13.0"})
    assert ok and "0: NVIDIA H200" in line and "compiled" in line
    assert not preflight.gpu_gate(tmp_path / "absent.json")[0]


def test_gpu_check_sh_without_a_gpu_skips_every_gpu_step_in_one_line(tmp_path):
    """The dry run on a CPU box: preflight and probe run, every GPU step is skipped with the
    probe's reason, no traceback, five files at most in $OUT, the scratch folder removed."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is importable here: the check would run for real")
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out),
           "TMPDIR": str(tmp), "PYTHON": sys.executable, "NEARLOCAL_WHEELS": str(tmp_path / "none")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env=env, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in log
    steps = (out / "steps.txt").read_text().splitlines()
    assert steps[0].startswith("=== preflight: ok") and steps[1].startswith("=== probe: ok")
    assert steps[2].startswith("GPU steps skipped: no GPU")
    skipped = [line for line in steps if ": skipped (no GPU" in line]
    assert len(skipped) == 6  # tests, check, two suites, their verdict, bench
    assert "Not run: no GPU" in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.tgz", "log.txt", "report.md",
                                                     "steps.txt"]
    assert list(tmp.iterdir()) == []  # the scratch folder (caches, TMPDIR) is gone
