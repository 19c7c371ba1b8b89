"""scripts/gpu_check.py, gpu_check.sh and gpu_preflight.py on a CPU box: the same-buffer
references run against the cupy test double (bytes checked, nothing measured), the thresholds
of issues 24 and 40 are applied to given figures (the PCIe floor from a fake sysfs tree), a check
killed mid-way keeps its rows, the suites' verdict refuses a short run, the shell script's step
caps fit its total, and the preflight requires only what the GPU path imports, installs optional
wheels offline and names what is missing in one line."""

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from nearlocal.probe.poolmod import PoolModule
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
def test_plain_copies_around_the_gather_row_move_the_right_bytes(gpu_check):
    ref = gpu_check.plain_copies("5x3000B", reps=2)  # bytes checked after each geometry
    assert ref["bytes"] == 15000 and "gather" not in ref  # the gather figure is the runner's row
    labels = [r["label"] for r in ref["plain"]]
    assert any("unroll 4" in label for label in labels)
    assert any("nvbandwidth" in label and "4 x 512" in label for label in labels)  # 4 fake SMs
    assert ref["best_plain"]["gbps"] == max(r["gbps"] for r in ref["plain"])


def test_plain_copy_geometries_cover_the_bytes_once_or_stride():
    from nearlocal.kernels.cuda import PLAIN_COPY_UNROLLS

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


@needs_gxx
def test_hbm_plain_copy_runs_against_the_double_and_says_when_the_peak_is_unknown(gpu_check):
    plain = gpu_check.hbm_plain_copy(3 * 4096 + 5, reps=2)  # bytes checked inside
    assert plain["median_ns"] >= 0 and len(plain["raw_ns"]) == 2
    assert plain["peak_gbps"] is None and "peak unknown" in plain["peak_source"]  # attributes: 0
    row = {"case": "cuda-memcpy-async/gpu:0/wb/1GiB/peer=gpu:0", "skipped": "no second buffer"}
    note = gpu_check.hbm_note(row, plain)
    assert "peak unknown" in note and "skipped: no second buffer" in note


def _figures(gpu_check, monkeypatch, *, gather_gbps: float, plain_gbps: float,
             memcpy_few_ns: float, e2e_ns: float, bare_ns: float,
             link: tuple[str, str] = ("32.0 GT/s PCIe", "16"), big_ns: float = 1.3e6):
    """main() over given figures: every measurement replaced by a stand-in."""

    def row(case) -> dict:
        method, pattern, attr, params = case.method, case.pattern, case.attr, dict(case.params)
        if case.region == "gpu:0":  # the HBM row: 1 GiB device -> device
            return {"case": case.id, "median_ns": 0.55e6, "p99_ns": 0.6e6, "n": 10,
                    "gbps": (1 << 30) / 0.55e6, "info": {}}
        ns = {"16KiB": 5e3, "64KiB": 6e3, "64MiB": big_ns, "1024x160B": 5e4,
              "128x20KiB": 8e4}[pattern]
        if method == "cuda-memcpy-async" and pattern == "1024x160B":
            ns = memcpy_few_ns
        if params.get("timing") == "e2e" and method == "gather-kernel":
            ns = e2e_ns
        if attr == "wc":  # B10's shape: the runtime's small copy slow, the kernel not
            ns = 1.2e6 if method == "cuda-memcpy" and pattern == "16KiB" else 1.5 * ns
        nbytes = {"16KiB": 1 << 14, "64KiB": 1 << 16, "64MiB": 64 << 20, "1024x160B": 163840,
                  "128x20KiB": 2621440}[pattern]
        if method == "gather-kernel" and pattern in ("64MiB", "128x20KiB") \
                and params.get("timing", "device") == "device" and "threads" not in params:
            ns = nbytes / gather_gbps
        return {"case": case.id, "median_ns": ns, "p99_ns": ns, "n": 10, "gbps": nbytes / ns,
                "info": {"timer_overhead_ns": 1000.0}}

    def measure_cases(cases, out, label, budget_s=0.25, ci_percent=1.0):
        measured.append((label, [case.id for case in cases]))
        return out / "work" / "check-results" / f"run-{label}", {c.id: row(c) for c in cases}

    def reference(pattern, reps=30):
        plain = [{"label": "unroll 12, 132 x 512 (nvbandwidth: a block per SM)",
                  "gbps": plain_gbps, "median_ns": 1.0}, {"label": "unroll 4", "gbps": 1.0,
                                                           "median_ns": 2.0}]
        return {"pattern": pattern, "plain": plain, "best_plain": plain[0]}

    measured: list = []
    monkeypatch.setattr(gpu_check, "measure_cases", measure_cases)
    monkeypatch.setattr(gpu_check, "plain_copies", reference)
    monkeypatch.setattr(gpu_check, "torch_pinned_copy_ns", lambda nbytes, reps=30: big_ns)
    monkeypatch.setattr(gpu_check, "bare_launch_ns", lambda pattern, reps=300: (bare_ns, []))
    monkeypatch.setattr(gpu_check, "lone_memcpy_ns", lambda nbytes, reps=100: (5.7e3, 1e3, []))
    monkeypatch.setattr(gpu_check, "gpu_unusable", lambda: None)
    monkeypatch.setattr(gpu_check, "probe_pool_module", lambda root: PoolModule(
        commands=["build it: make -C kmod/nearlocal_pool"]))  # the module: not built here
    monkeypatch.setattr(gpu_check, "gpu_bus_id", lambda device=0: "0000:1b:00.0")
    monkeypatch.setattr(gpu_check, "pcie_link", lambda bus, root=None: {
        "bus_id": bus, "current_link_speed": link[0], "current_link_width": link[1],
        "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16",
        "port_max_link_speed": "32.0 GT/s PCIe", "port_max_link_width": "16"})
    monkeypatch.setattr(gpu_check, "hbm_plain_copy", lambda nbytes: {
        "bytes": nbytes, "median_ns": 1.0, "gbps": 4100.0, "peak_gbps": 4800.0,
        "peak_source": "test figures"})
    return measured


def test_thresholds_of_issue_24(gpu_check, monkeypatch, tmp_path):
    measured = _figures(gpu_check, monkeypatch, gather_gbps=33.0, plain_gbps=35.0,
                        memcpy_few_ns=2e6, e2e_ns=30e3, bare_ns=25e3)
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    # every nearlocal figure comes from the runner: the table, the extras and the HBM row in
    # one run, B10's rows in one of their own (the pool module's not run: no case of it)
    (label, table), (b10_label, b10) = measured
    assert label == "gpu-check" and b10_label == "gpu-check-b10"
    assert len(table) == len(gpu_check.METHODS) * len(gpu_check.PATTERNS) + 4
    assert "cuda-memcpy-async/gpu:0/wb/1GiB/peer=gpu:0" in table
    assert len(b10) == 8 and all("/pinned/" in case for case in b10)
    assert "stored as run run-gpu-check in work/check-results" in report
    assert "PASS gather_vs_per_fragment_memcpy_1024x160B" in report and "40.0x faster" in report
    assert "PASS gather_vs_best_sm_copy_64MiB" in report and "0.94x (must be >= 0.9x)" in report
    assert "the gather-kernel row 33.0 GB/s vs the best plain SM copy" in report
    assert "PASS gather_vs_best_sm_copy_128x20KiB" in report
    assert "PASS gather_e2e_vs_bare_launch" in report and "1.20x" in report
    assert "copy-engine ratio at 64 MiB" in report  # information, no verdict
    assert "at 64 KiB" in report and "borderline by design: no verdict" in report
    assert "prime=0" in report and "lone cudaMemcpyAsync between two events: 5.70 us raw" in report
    assert "gather_64KiB_time" not in report and "0.85" not in report
    assert "PASS h2d_64MiB_above_link_floor" in report and "trained gen 5 x16" in report
    assert "HBM copy" in report and "of peak" in report  # information, no verdict
    assert "the row cuda-memcpy-async/gpu:0/wb/1GiB/peer=gpu:0: 3905 GB/s = 81% of peak" in report
    records = gpu_check.read_rows(tmp_path / "rows.jsonl")  # verdicts and figures, as decided
    checks = {r["name"]: r["ok"] for r in records if r["kind"] == "check"}
    assert checks["h2d_64MiB_above_link_floor"] and checks["gather_e2e_vs_bare_launch"]
    assert any(r["kind"] == "figure" and r["name"] == "pcie_link" for r in records)
    # B10: wc beside wb pinned, both methods at 16 and 64 KiB, the ratios, the paper's figure
    assert "PASS b10_wc_rows_measured: 8 of 8 wb / wc pinned rows measured" in report
    assert "## B10: cudaMemcpy and gather-kernel" in report and "~1.23 ms" in report
    assert "- cuda-memcpy 16KiB: wc / wb 240.00x, uc / wb n/a" in report
    assert "- gather-kernel 64KiB: wc / wb 1.50x" in report
    assert "- wc 16KiB: cuda-memcpy / gather-kernel 160.00x" in report
    assert ("- cuda-memcpy from wc at 16KiB (< 24 KB): 1.20 ms, 0.98x the paper's ~1.23 ms "
            "(from uncacheable memory)") in report
    assert "(cuda-memcpy 16KiB, cuda-memcpy 64KiB, gather-kernel 16KiB, gather-kernel 64KiB): "\
           "not run: the nearlocal_pool kernel module is not built: build it" in report
    ratios = json.loads((tmp_path / "gpu_check.json").read_text())["b10"]["ratios"]
    assert ratios["cuda-memcpy/16KiB"]["wc_over_wb"] == pytest.approx(240.0)

    _figures(gpu_check, monkeypatch, gather_gbps=30.0, plain_gbps=35.0, memcpy_few_ns=5e5,
             e2e_ns=40e3, bare_ns=25e3)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "FAIL gather_vs_per_fragment_memcpy_1024x160B" in report  # 10x < 20x
    assert "FAIL gather_vs_best_sm_copy_64MiB" in report  # 0.86x < 0.9x
    assert "FAIL gather_e2e_vs_bare_launch" in report  # 1.6x > 1.5x

    _figures(gpu_check, monkeypatch, gather_gbps=33.0, plain_gbps=35.0, memcpy_few_ns=2e6,
             e2e_ns=30e3, bare_ns=25e3, link=("32.0 GT/s PCIe", "8"), big_ns=2.6e6)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1  # 25.8 GB/s: what x8 gives
    report = (tmp_path / "report.md").read_text()
    assert "PASS h2d_64MiB_vs_torch" in report  # torch rides the same x8 link: no help there
    assert "FAIL h2d_64MiB_above_link_floor" in report and "trained gen 5 x8" in report
    assert "trained below what both ends support" in report


def test_a_row_the_runner_skipped_fails_its_verdicts_by_name(gpu_check, monkeypatch, tmp_path):
    """A table row the runner stored skipped (or failed) has no figure: each verdict that needs
    it fails saying so, the rest of the check goes on."""
    _figures(gpu_check, monkeypatch, gather_gbps=33.0, plain_gbps=35.0, memcpy_few_ns=2e6,
             e2e_ns=30e3, bare_ns=25e3)
    measure = gpu_check.measure_cases

    def with_skips(cases, out, label, budget_s=0.25, ci_percent=1.0):
        path, rows = measure(cases, out, label, budget_s, ci_percent)
        for case in cases:
            if case.method == "gather-kernel" and case.pattern in ("1024x160B", "64MiB"):
                rows[case.id] = {"case": case.id, "skipped": "no GPU kernel here"}
        return path, rows

    monkeypatch.setattr(gpu_check, "measure_cases", with_skips)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "FAIL gather_vs_per_fragment_memcpy_1024x160B: a row not measured" in report
    assert "FAIL gather_vs_best_sm_copy_64MiB: the gather-kernel row: skipped" in report
    assert "FAIL gather_e2e_vs_bare_launch: the e2e row: skipped" in report
    assert "PASS gather_vs_best_sm_copy_128x20KiB" in report and "PASS h2d_64MiB_vs_torch" in report


@needs_gxx
def test_b10_rows_against_the_double(gpu_check, tmp_path, monkeypatch):
    """The B10 rows: wb and wc pinned measured; the uc row through a (fake) loaded
    nearlocal_pool module skipped in CUDA's own words when CUDA refuses its I/O-memory
    registration; the verdict holds on the pinned rows alone. The runner's workers cannot
    import the simulated GPU set up in this process, so each case is measured here by the
    worker's own measure() (test_the_check_measures_through_the_runner runs the real runner)."""
    from nearlocal.core.sampling import StoppingRule
    from nearlocal.engine.worker import WorkerSettings, measure
    from nearlocal.errors import Unavailable
    from nearlocal.probe.poolmod import WINDOWS
    from tests.fakesys import pool_module_box, write

    start = 0x1080000000
    root = pool_module_box(tmp_path / "box", start)
    write(root, "/sys/kernel/debug/x86/pat_memtype_list",
          f"PAT: [mem 0x{start:016x}-0x{start + (16 << 20):016x}] uncached")
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(root))
    monkeypatch.setattr("nearlocal.regions.devices.WINDOWS", dict.fromkeys(WINDOWS, 0))
    settings = WorkerSettings(StoppingRule(budget_s=0.01, min_samples=3, max_samples=4), 1e9,
                              False)
    runs = []

    def in_process(cases, out, label, budget_s, ci_percent):
        runs.append((label, budget_s, ci_percent))
        rows = {}
        for case in cases:
            try:
                row = {**measure(case, settings, 0.0)[0], "status": "ok"}
            except Unavailable as exc:  # as the worker stores a case refused once opened
                row = {"status": "skipped", "reason": str(exc)}
            rows[case.id] = gpu_check.row_cell({**row, "case_id": case.id})
        return out / "run", rows

    monkeypatch.setattr(gpu_check, "measure_cases", in_process)
    sys.modules["cupy"].cuda.runtime.refuse_io_memory = True
    regions = gpu_check.b10_regions()
    assert [(r, a, why) for r, a, why in regions] == [
        ("pinned", "wb", None), ("pinned", "wc", None),
        ("registered:ncmem:/dev/nearlocal-pool0", "uc", None)]
    rows = gpu_check.b10_rows(tmp_path, regions)
    assert runs == [("gpu-check-b10", gpu_check.B10_BUDGET_S, gpu_check.B10_CI_PERCENT)]
    assert len(rows) == 12
    pinned = [r for r in rows.values() if r["region"] == "pinned"]
    assert all("median_ns" in r for r in pinned)
    assert {r["info"]["host_alloc_flags"] for r in pinned if r["attr"] == "wc"} == {
        "portable|mapped|write-combined"}
    uc = [r for r in rows.values() if r["attr"] == "uc"]
    assert all("cudaErrorNotSupported: operation not supported" in r["skipped"] for r in uc)
    lines, (ok, text), ratios = gpu_check.b10_section(rows)
    assert ok and "8 of 8" in text and "uc through the nearlocal_pool module: not measured" in text
    assert ratios["cuda-memcpy/16KiB"]["wc_over_wb"] > 0
    assert ratios["cuda-memcpy/16KiB"]["uc_over_wb"] is None
    assert any("registered:ncmem:/dev/nearlocal-pool0 | uc | cuda-memcpy | skipped" in line
               for line in lines)


def _sysfs(tmp_path, gpu: tuple[str, str, str, str], port: tuple[str, str]) -> Path:
    """/sys with one GPU behind one port: the device directory under the port's, linked from
    /sys/bus/pci/devices as the kernel lays it out."""
    port_dir = tmp_path / "sys/devices/pci0000:16/0000:16:01.0"
    gpu_dir = port_dir / "0000:1b:00.0"
    gpu_dir.mkdir(parents=True)
    for name, value in zip(("current_link_speed", "current_link_width", "max_link_speed",
                            "max_link_width"), gpu, strict=True):
        (gpu_dir / name).write_text(value + "\n")
    (port_dir / "max_link_speed").write_text(port[0] + "\n")
    (port_dir / "max_link_width").write_text(port[1] + "\n")
    devices = tmp_path / "sys/bus/pci/devices"
    devices.mkdir(parents=True)
    (devices / "0000:1b:00.0").symlink_to(os.path.relpath(gpu_dir, devices))
    return tmp_path


def test_h2d_floor_from_the_links_width_and_generation(tmp_path):
    from nearlocal.sysroot import SysRoot

    gpu_check = _script("gpu_check")
    gen5 = "32.0 GT/s PCIe"
    root = SysRoot(_sysfs(tmp_path, (gen5, "8", gen5, "16"), (gen5, "16")))
    link = gpu_check.pcie_link("0000:1b:00.0", root)
    assert link["port_max_link_width"] == "16" and link["current_link_width"] == "8"
    floor, text = gpu_check.h2d_floor(link)
    raw = 32 * 128 / 130 * 16 / 8  # gen 5 x16: 63.0 GB/s
    assert floor == pytest.approx(gpu_check.FLOOR_SHARE * raw)  # from x16, not the trained x8
    assert "trained gen 5 x8" in text and "trained below what both ends support" in text
    # a gen 4 port: the link cannot be faster, so the floor follows the port
    floor4, text4 = gpu_check.h2d_floor({**link, "current_link_speed": "16.0 GT/s PCIe",
                                         "current_link_width": "16",
                                         "port_max_link_speed": "16.0 GT/s PCIe"})
    assert floor4 == pytest.approx(floor / 2) and "trained below" not in text4
    unknown, why = gpu_check.h2d_floor({"bus_id": "0000:1b:00.0"})
    assert unknown is None and "not readable from sysfs" in why


def _simulated_gpu_path(tmp_path: Path) -> str:
    """PYTHONPATH whose `cupy` is the simulated GPU, so every process of a check imports it: the
    check itself, the runner's fork server and its workers (test-only; nothing it produces is a
    measurement)."""
    folder = tmp_path / "simulated-gpu"
    (folder / "cupy").mkdir(parents=True)
    (folder / "cupy" / "__init__.py").write_text(
        "import sys\nfrom tests.gpu_fakecupy import make_fake_cupy\n"
        "sys.modules[__name__] = make_fake_cupy()\n")
    return f"{folder}{os.pathsep}{ROOT}"


CHECK_DRIVER = """
import functools, sys
if __name__ == "__main__":  # the runner's workers import this file again, as __mp_main__
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check", {script!r})
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    gpu_check.TABLE_BUDGET_S = gpu_check.B10_BUDGET_S = 0.01  # a check of the wiring: no figures
    gpu_check.HBM_SIZE = "4MiB"
    gpu_check.plain_copies = functools.partial(gpu_check.plain_copies, reps=2)
    gpu_check.bare_launch_ns = functools.partial(gpu_check.bare_launch_ns, reps=20)
    gpu_check.lone_memcpy_ns = functools.partial(gpu_check.lone_memcpy_ns, reps=10)
{setup}
    sys.exit(gpu_check.main(sys.argv[1:]))
"""


def _check_on_the_simulated_gpu(tmp_path: Path, *args: str, setup: str = "",
                                kill_after_rows: int | None = None) -> tuple[int, str]:
    """gpu_check.py's main() in a process of its own on the simulated GPU, the real runner
    measuring (small budgets and sizes set by CHECK_DRIVER, `setup` after them): (its exit
    code, its output). `kill_after_rows`: SIGKILL its whole process group, as the step's cap
    does, once rows.jsonl holds that many rows."""
    driver = tmp_path / "driver.py"
    driver.write_text(CHECK_DRIVER.format(script=str(ROOT / "scripts" / "gpu_check.py"),
                                          setup=setup))
    log = tmp_path / "check.log"
    rows = tmp_path / "out" / "rows.jsonl"
    with log.open("w") as output:
        check = subprocess.Popen([sys.executable, str(driver), "--out", str(tmp_path / "out"),
                                  *args], stdout=output, stderr=subprocess.STDOUT,
                                 start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": _simulated_gpu_path(tmp_path)})
        try:
            while kill_after_rows is not None and check.poll() is None:
                if rows.exists() and rows.read_text().count('"kind": "row"') >= kill_after_rows:
                    os.killpg(check.pid, signal.SIGKILL)
                    break
                time.sleep(0.02)
            code = check.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(check.pid, signal.SIGKILL)  # the fork server and workers, if left
    return code, log.read_text()


@needs_gxx
def test_the_check_measures_through_the_runner(tmp_path):
    """Every nearlocal figure of the check comes from nearlocal's runner: the table, the extras
    and the HBM row are one stored run, B10's rows another, in the store under --out; each row
    is in rows.jsonl as stored, and the report names the run."""
    from nearlocal.store import load

    code, output = _check_on_the_simulated_gpu(tmp_path)
    assert code == 1 and "Traceback" not in output, output[-3000:]  # torch, sysfs: not here
    out = tmp_path / "out"
    gpu_check = _script("gpu_check")
    runs = sorted((out / "work" / "check-results").iterdir())
    assert len(runs) == 2
    table, b10 = (load(run) for run in runs)
    assert table.meta["suite"] == "gpu-check" and b10.meta["suite"] == "gpu-check-b10"
    assert len(table.cases) == len(gpu_check.METHODS) * len(gpu_check.PATTERNS) + 4
    assert len(b10.cases) == 8  # wb and wc pinned; the pool module is not loaded here
    assert set(table.cases["status"]) <= {"ok", "skipped"}
    assert table.cases.loc[table.cases["status"] == "skipped", "reason"].str.len().min() > 0
    records = gpu_check.read_rows(out / "rows.jsonl")
    logged = [r["case"] for r in records if r["kind"] == "row"]
    assert sorted(logged) == sorted([*table.cases["case_id"], *b10.cases["case_id"]])
    report = (out / "report.md").read_text()
    assert f"stored as run {runs[0].name} in work/check-results" in report
    assert "gather_vs_best_sm_copy_64MiB: the gather-kernel row" in report
    assert "HBM copy (device -> device, 4MiB" in report and "the row cuda-memcpy-async/gpu:0" \
        in report
    checks = json.loads((out / "gpu_check.json").read_text())["checks"]
    assert checks["b10_wc_rows_measured"]["ok"] and checks["gather_e2e_vs_bare_launch"]


@needs_gxx
def test_a_check_killed_mid_way_keeps_its_rows(tmp_path):
    """The check step is SIGKILLed with its runner's worker, as the step's cap kills it, after
    its fourth row: rows.jsonl holds the rows stored before, and --partial renders a report from
    them that says it was cut short (and fails)."""
    code, output = _check_on_the_simulated_gpu(tmp_path, kill_after_rows=4)
    assert code == -signal.SIGKILL, output[-3000:]
    out = tmp_path / "out"
    gpu_check = _script("gpu_check")
    rows = gpu_check.read_rows(out / "rows.jsonl")
    assert {r["kind"] for r in rows} == {"row"} and 4 <= len(rows) < 44
    assert rows[0]["case"].startswith("cuda-memcpy/pinned") and rows[0]["median_ns"] > 0
    assert not (out / "report.md").exists()
    assert gpu_check.main(["--out", str(out), "--partial"]) == 1
    report = (out / "report.md").read_text()
    assert "CUT SHORT" in report and f"{len(rows)} rows" in report
    assert json.loads((out / "gpu_check.json").read_text())["partial"] is True


def test_suites_verdict_refuses_a_short_run(tmp_path):
    gpu_check = _script("gpu_check")
    cases = ["a", "b", "c"]

    def verdict(rows):
        path = tmp_path / "suite.json"
        if rows is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(rows))
        return gpu_check.suite_verdicts([("gpu", str(path))], expected=lambda suite: cases)

    ok = {"status": "ok"}
    skipped = {"status": "skipped", "reason": "fewer than 2 GPUs (this box has 1)"}
    assert verdict([{"case_id": "a", **ok}, {"case_id": "b", **skipped},
                    {"case_id": "c", **ok}])[0]
    short, lines = verdict([{"case_id": "a", **ok}, {"case_id": "b", **ok}])
    assert not short and "1 cases missing" in "\n".join(lines) and "c" in lines[-1]
    absent, lines = verdict(None)  # killed before writing its JSON
    assert not absent and "all 3 cases missing" in lines[0]
    failed, _ = verdict([{"case_id": c, "status": "failed"} for c in cases])
    assert not failed
    unexplained, _ = verdict([{"case_id": c, "status": "skipped"} for c in cases])
    assert not unexplained


def test_suite_cases_are_what_the_verdict_expects():
    gpu_check = _script("gpu_check")
    ids = gpu_check.expected_case_ids("gpu")
    assert len(ids) == len(set(ids)) > 50 and any(i.startswith("gather-kernel") for i in ids)


def _no_cupy(tmp_path: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes `import cupy` fail as on a box without a CUDA
    stack: the no-GPU path, taken on every box (one with a GPU too)."""
    folder = tmp_path / "no-cupy"
    (folder / "cupy").mkdir(parents=True)
    (folder / "cupy" / "__init__.py").write_text(
        "raise ImportError('cupy hidden by the test: a box without a GPU')\n")
    return folder


def test_gpu_check_without_a_gpu_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": f"{_no_cupy(tmp_path)}{os.pathsep}{ROOT}"})
    assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.stdout == ("gpu_check.py: nothing measured: no GPU: ImportError: cupy hidden by "
                             "the test: a box without a GPU\n")
    assert not (tmp_path / "out" / "report.md").exists()


# --- gpu_check.sh -------------------------------------------------------------------------------

# the environment every step of the script sees, each under its scratch folder but the flags
SCRATCH_VARIABLES = ("TMPDIR", "CUPY_CACHE_DIR", "NUMBA_CACHE_DIR", "CUDA_CACHE_PATH",
                     "XDG_CACHE_HOME", "MPLCONFIGDIR", "NEARLOCAL_STORAGE")
STUB_PYTHON = """#!{python}
\"\"\"gpu_check.sh's PYTHON in these tests: records each call (its arguments, environment and
what it finds on disk) and answers as a GPU box whose steps all pass would, but whatif_check.py,
which fails (exit 5), and the preflight, which exits STUB_PREFLIGHT_RC.\"\"\"
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
out = Path(os.environ["OUT"])
storage = Path(os.environ.get("NEARLOCAL_STORAGE") or "/nonexistent")
record = {{"args": args, "cwd": os.getcwd(),
          "env": {{name: os.environ.get(name) for name in {variables!r} +
                  ("PYTHONDONTWRITEBYTECODE", "NEARLOCAL_REAL_GPU", "PYTHONPATH")}},
          "storage": [storage.stat().st_size, storage.stat().st_ino, storage.stat().st_mtime_ns]
                     if storage.exists() else None,
          "stale_outputs": sorted(p.name for p in out.glob("*") if p.is_file())}}
with open(os.environ["STUB_CALLS"], "a") as calls:
    calls.write(json.dumps(record) + "\\n")
if args[:1] == ["scripts/gpu_preflight.py"] and "--gate" in args:
    print("2 GPU(s) (stub); cupy stub, NVRTC stub: nearlocal's module compiled")
elif args[:1] == ["scripts/gpu_preflight.py"]:
    sys.exit(int(os.environ.get("STUB_PREFLIGHT_RC", "0")))
elif args[:1] == ["scripts/gpu_check.py"] and "--partial" in args:
    (out / "report.md").write_text("# stub report from rows.jsonl\\n")
elif args[:1] == ["scripts/whatif_check.py"]:
    sys.exit(5)
elif args[:3] == ["-m", "nearlocal", "probe"]:
    print("{{}}")
"""


def _run_sh_with_stub_python(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess,
                                                                   list[dict], Path]:
    """gpu_check.sh with PYTHON a stub that records each call: the script's own wiring (steps,
    caps, environment, files) runs as on a GPU box, in seconds, with nothing measured."""
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON.format(python=sys.executable, variables=SCRATCH_VARIABLES))
    stub.chmod(0o755)
    out, tmp, calls = tmp_path / "out", tmp_path / "tmp", tmp_path / "calls.jsonl"
    tmp.mkdir()
    out.mkdir()
    for stale in ("steps.txt", "report.md", "gpu_check.json", "rows.jsonl", "whatif.md"):
        (out / stale).write_text("from an earlier check\n")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(out), "TMPDIR": str(tmp),
                                 "PYTHON": str(stub), "STUB_CALLS": str(calls), **env})
    records = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return result, records, out


def _caps_total_and_tail() -> tuple[int, int]:
    """The script's own sum of its step caps and its packing-up time, as its refusal says them."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "TOTAL_S": "1"}, timeout=60)
    found = re.search(r"the step caps add up to (\d+) s, more than TOTAL_S=1 s less (\d+) s",
                      result.stderr)
    assert result.returncode == 2 and found, result.stderr
    return int(found.group(1)), int(found.group(2))


STEP_NAMES = ["preflight", "probe", "tests", "check", "replay-gpu", "suite-gpu", "whatif",
              "whatif-check", "suite-swiftcache", "suites-verdict", "bench-gpu"]


def test_gpu_check_sh_runs_every_step_under_its_cap_in_its_scratch_folder(tmp_path):
    """The GPU branch of the script, its interpreter a stub: every step runs in order under a
    cap of its own (the caps add up to the script's total), a failed step fails the check but
    not the steps after it, every step's caches and temporary files are in one scratch folder
    that is gone at the end, and the outputs of an earlier check are removed before any step."""
    caps_total, tail = _caps_total_and_tail()
    result, records, out = _run_sh_with_stub_python(tmp_path,
                                                    TOTAL_S=str(caps_total + tail + 3600))
    assert result.returncode == 1, result.stdout + result.stderr  # whatif-check failed
    log = (out / "log.txt").read_text()
    caps = dict(re.findall(r"^=== (\S+) \(timeout (\d+) s\)$", log, re.M))
    assert list(caps) == STEP_NAMES
    assert all(int(cap) > 0 for cap in caps.values()) and sum(map(int, caps.values())) == caps_total
    steps = (out / "steps.txt").read_text().splitlines()
    verdicts = [re.match(r"=== (\S+): (.*) in \d+ s$", line) for line in steps
                if line.startswith("=== ")]
    assert [(m.group(1), m.group(2)) for m in verdicts] == [
        (name, "FAILED (exit 5)" if name == "whatif-check" else "ok") for name in STEP_NAMES]
    assert "2 GPU(s) (stub)" in steps[2]  # the gate's line, after the probe
    # every earlier output removed before the first step (log.txt: this check's, being written)
    assert records[0]["stale_outputs"] == ["log.txt"]
    scratch = {Path(r["env"]["TMPDIR"]).parent for r in records}
    assert len(scratch) == 1 and scratch.pop().parent == tmp_path / "tmp"
    for record in records:
        assert record["cwd"] == str(ROOT)
        env = record["env"]
        top = Path(env["TMPDIR"]).parent
        assert all(Path(env[name]).parent == top for name in SCRATCH_VARIABLES), env
        assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["NEARLOCAL_REAL_GPU"] == "1"
        assert env["PYTHONPATH"].split(":")[:2] == [str(top / "site"), str(ROOT)]
    assert list((tmp_path / "tmp").iterdir()) == []  # the scratch folder is gone
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.tgz", "log.txt", "report.md",
                                                     "steps.txt"]


def test_gpu_check_sh_wiring_of_issue_40(tmp_path):
    """What the GPU branch of the script hands each step: the suites in one worker process
    each, their storage file made once in the scratch folder before them, a check step that
    ended without its report gets one from its rows, the verdict names each suite's JSON."""
    caps_total, tail = _caps_total_and_tail()
    _, records, out = _run_sh_with_stub_python(tmp_path, TOTAL_S=str(caps_total + tail + 3600))
    commands = [r["args"] for r in records]
    check = commands.index(["scripts/gpu_check.py", "--out", str(out)])
    assert commands[check + 1] == ["scripts/gpu_check.py", "--out", str(out), "--partial"]
    assert commands[check + 2] == ["scripts/gpu_check.py", "--out", str(out), "--replay"]
    assert (out / "report.md").read_text() == "# stub report from rows.jsonl\n"
    work = out / "work"
    suites = [(i, c) for i, c in enumerate(commands) if c[:4] == ["-m", "nearlocal", "run", "--suite"]]
    assert [c[4] for _, c in suites] == ["gpu", "swiftcache"]
    for _, command in suites:
        assert command[5:7] == ["--processes", "1"]
        assert command[command.index("--json") + 1] == str(work / f"suite-{command[4]}.json")
    storage = [records[i]["storage"] for i, _ in suites]
    assert storage[0] is not None and storage[0][0] == 64 << 20
    assert storage[0] == storage[1]  # the same file, never rewritten
    assert all(r["storage"] is None for r in records[:2])  # made after the probe, by the script
    verdict = next(c for c in commands if "--suites-only" in c)
    assert verdict == ["scripts/gpu_check.py", "--out", str(out), "--suites-only",
                       "--suite", f"gpu={work}/suite-gpu.json",
                       "--suite", f"swiftcache={work}/suite-swiftcache.json"]


def test_gpu_check_sh_a_failed_preflight_skips_every_later_step(tmp_path):
    """The preflight's own failure (exit 1, not the no-CUDA-stack 3) reaches the script through
    its pipe to tee: every step after it is skipped with that reason; and a total of
    exactly the caps and the packing-up time is accepted."""
    caps_total, tail = _caps_total_and_tail()
    result, records, out = _run_sh_with_stub_python(tmp_path, TOTAL_S=str(caps_total + tail),
                                                    STUB_PREFLIGHT_RC="1")
    assert result.returncode == 1 and "step caps add up" not in result.stderr
    steps = (out / "steps.txt").read_text().splitlines()
    assert steps[0].startswith("=== preflight: FAILED (exit 1)")
    skipped = "(the preflight failed: nearlocal cannot import what it needs (see above))"
    assert steps[1:] == [f"=== {name}: skipped {skipped}" for name in STEP_NAMES[1:]]
    assert [r["args"][:3] for r in records] == [["scripts/gpu_preflight.py", "--wheels",
                                                 str(ROOT / "wheels")]]
    assert (out / "report.md").read_text().startswith("# nearlocal GPU check\n\nNot run: the "
                                                      "preflight failed")


def test_gpu_check_sh_refuses_caps_beyond_the_total(tmp_path):
    """One second short of the caps and the packing-up time: refused before anything is made."""
    caps_total, tail = _caps_total_and_tail()
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "TOTAL_S": str(caps_total + tail - 1),
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
    for name in ("numba", "pandas", "pyarrow", "pytest_benchmark"):
        assert re.search(rf"^{name} \S+ \(", out, re.M), name  # imported, with a version
    assert not re.search(r"^(MISSING|FAILED) (scipy|torch)", out, re.M)
    if "MISSING cupy" in out:  # a CPU box: only the CUDA stack is missing
        assert result.returncode == 3 and "preflight: no CUDA stack" in out
    else:
        assert result.returncode == 0 and re.search(r"^cupy \S+ \(", out, re.M)


def test_preflight_requires_only_what_the_gpu_path_imports(tmp_path):
    """`nearlocal run --suite gpu` runs with scipy, torch and matplotlib unimportable (numba
    imports scipy only when present): none is required; every required runtime module is one
    that run imports; torch is never imported by the preflight (it is only located)."""
    preflight = _script("gpu_preflight")
    required = {name for name, _ in preflight.REQUIRED}
    assert not required & {"scipy", "torch", "matplotlib", "pynvml", "cuda.bindings"}
    code = f"""
import sys
for name in ("scipy", "torch", "matplotlib"):
    sys.modules[name] = None  # import raises ImportError
from nearlocal.frontends.cli import main
rc = main(["run", "--suite", "gpu", "--budget", "0.01", "--out", {str(tmp_path / "r")!r},
           "--quiet"])
print("RC", rc)
print("MODULES", " ".join(sorted({{m.split(".")[0] for m in sys.modules if sys.modules[m]}})))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "RC 0" in result.stdout, result.stderr[-2000:]
    imported = set(result.stdout.split("MODULES", 1)[1].split())
    runtime = required - {"cupy", "pytest", "pytest_benchmark"}  # cupy: not on a CPU box
    assert runtime <= imported, runtime - imported
    lines = preflight.check_imports()[1]
    assert any(re.match(r"(absent \(optional\) torch|torch .*located, not imported)", line)
               for line in lines)
    assert not any(line.startswith("MISSING torch") for line in lines)


def test_cuda_extras_install_what_cupy_needs_to_compile():
    """Each CUDA extra pairs cupy with NVRTC and the runtime (headers) of the same CUDA major,
    from the cuda-toolkit meta-package cupy's own [ctk] extra uses."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for major in (12, 13):
        deps = extras[f"cuda{major}"]
        assert any(d.startswith(f"cupy-cuda{major}x>=14") for d in deps)
        assert f"cuda-toolkit[cudart,nvrtc]=={major}.*" in deps
        assert any(d.startswith("cuda-bindings") for d in deps)


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
    """The dry run, as on a CPU box (cupy unimportable, on any box): preflight and probe run,
    every GPU step is skipped with the probe's reason, no traceback, four files in $OUT, the
    scratch folder removed; the default TOTAL_S holds the caps (not refused)."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out),
           "TMPDIR": str(tmp), "PYTHON": sys.executable, "NEARLOCAL_WHEELS": str(tmp_path / "none"),
           "PYTHONPATH": str(_no_cupy(tmp_path))}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env=env, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in log
    steps = (out / "steps.txt").read_text().splitlines()
    assert steps[0].startswith("=== preflight: ok") and steps[1].startswith("=== probe: ok")
    assert steps[2].startswith("GPU steps skipped: no GPU: cupy is not importable (ImportError: "
                               "cupy hidden by the test")
    skipped = [line for line in steps if ": skipped (no GPU" in line]
    assert len(skipped) == 9  # tests, check, the replay, two suites, whatif, its check, the
    # verdict, bench
    assert "Not run: no GPU" in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.tgz", "log.txt", "report.md",
                                                     "steps.txt"]
    assert list(tmp.iterdir()) == []  # the scratch folder (caches, TMPDIR) is gone


def test_suites_verdict_reads_what_nearlocal_run_writes(tmp_path, monkeypatch):
    """The verdict over a real `nearlocal run --suite gpu --json` on this box (every case skipped
    with its reason where there is no GPU): every case present, so PASS; one row dropped, FAIL."""
    from nearlocal.frontends.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)  # the same on a box that has cupy
    path = tmp_path / "gpu.json"
    assert main(["run", "--suite", "gpu", "--budget", "0.01", "--out", str(tmp_path / "r"),
                 "--quiet", "--json", str(path)]) == 0
    gpu_check = _script("gpu_check")
    ok, lines = gpu_check.suite_verdicts([("gpu", str(path))])
    rows = json.loads(path.read_text())
    assert ok and f"{len(rows)} rows of {len(rows)} cases" in lines[0]
    path.write_text(json.dumps(rows[1:]))
    ok, lines = gpu_check.suite_verdicts([("gpu", str(path))])
    assert not ok and rows[0]["case_id"] in "\n".join(lines)


REPLAY_SETUP = """
    gpu_check.REPLAY_SECONDS, gpu_check.REPLAY_LAYERS = 1.0, "0-1"
    gpu_check.REPLAY_POOL_BYTES, gpu_check.REPLAY_DST_BYTES = 16 << 20, 4 << 20
    gpu_check.REPLAY_ROW_BUDGET = 0.02
    import json
    import numpy as np
    from nearlocal.gpu import replay
    from tests.gpu_fakecupy import _Event
    real = replay.run_gpu_replay

    def run(frags, first, arrival, region_bytes, dst_bytes, streams, device=0):
        _Event.done = True  # the double's copies are done when called
        try:
            times = real(frags, first, arrival, region_bytes, dst_bytes, streams, device)
        finally:
            _Event.done = False
        served = times.mover[times.mover >= 0]
        with open({moved!r}, "a") as moved:
            moved.write(json.dumps({{"streams": streams, "served": int(served.size),
                                     "movers": sorted({{int(m) for m in served}}),
                                     "ordered": bool(np.all(times.end_ns >= times.start_ns))}})
                        + "\\n")
        return times

    replay.run_gpu_replay = run
"""


@needs_gxx
def test_replay_with_streams_against_the_simulation_on_the_double(tmp_path):
    """--replay: the movers=k rows measured by the runner and read back from the store, the
    replay at 1, 2 and 4 streams (every request's bytes moved, each on a stream that was free)
    and the simulated vs replayed P50 / P99 in report.md and gpu_check.json. The double's copies
    are done when called, so its end events are done while the replay runs (the timer's start
    events never are: it believes the GPU spins)."""
    moved = tmp_path / "moved.jsonl"
    code, output = _check_on_the_simulated_gpu(
        tmp_path, "--replay", setup=REPLAY_SETUP.format(moved=str(moved)))
    assert code == 0, output[-3000:]
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["replay"]
    assert sorted(data["streams"]) == ["1", "2", "4"] and data["requests_with_hits"] > 0
    assert set(data["contention"]) == {"1", "2", "4"}
    runs = list((tmp_path / "out" / "work" / "check-results").iterdir())
    assert [run.name for run in runs] == [data["run"]]  # the rows the simulation stood on
    calls = [json.loads(line) for line in moved.read_text().splitlines()]
    assert [c["streams"] for c in calls] == [1, 2, 4]
    for call in calls:
        assert call["served"] == data["requests_with_hits"] and call["ordered"]
        assert set(call["movers"]) <= set(range(call["streams"]))
        entry = data["streams"][str(call["streams"])]
        assert entry["replay_reload"]["p50_ns"] > 0 and entry["simulated_reload"]["p99_ns"] > 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Host->GPU replay with 1, 2 and 4 streams" in report
    assert report.count("simulated P50") == 3
