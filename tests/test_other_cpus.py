"""A CPU the development box is not (issue 36): one lacking AVX2, AVX-512, clflushopt, clwb and
movdir64b, as the VM rig's cpu guest boots (QEMU -cpu Westmere,+rdtscp; docs/vm-rig.md). Here,
without QEMU: the methods' gating from its flags, and the kernels compiled for it (numba's
NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, which this box's CPU can run) hold no instruction it lacks,
and every CPU method is measured or skipped naming the flag (scripts/vm_cpu.py's own facts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nearlocal.core.methods import load_methods
from nearlocal.probe import probe
from nearlocal.sysroot import SysRoot
from tests.fakesys import WESTMERE_CPUINFO, cxl_box

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
# what numba compiled for in that guest: LLVM's name and features for the CPU (recorded there)
WESTMERE_TARGET = {"NUMBA_CPU_NAME": "westmere", "NUMBA_CPU_FEATURES": (
    "+64bit,+aes,+cmov,+crc32,+cx16,+cx8,+fxsr,+mmx,+pclmul,+popcnt,+sahf,+sse,+sse2,+sse3,"
    "+sse4.1,+sse4.2,+ssse3")}
LACKING = ("avx2", "avx512f", "clflushopt", "clwb", "movdir64b")
# the kernels.cpu methods whose instructions a Westmere has (SSE2 vectors, movntdq, movntdqa)
RUNS_ON_WESTMERE = ("load", "store", "nt-store", "nt-copy", "nt-load", "clflush-load", "memcpy")


def test_every_cpu_method_names_the_flags_a_westmere_lacks(tmp_path):
    inventory = probe(SysRoot(cxl_box(tmp_path, cpuinfo=WESTMERE_CPUINFO)), calibrate=False,
                      gpu=False)
    assert inventory.cpu.has("rdtscp") and not any(inventory.cpu.has(f) for f in LACKING)
    gated = set()
    for method in (m for m in load_methods().values() if m.marker == "cpu"):
        reason = method.unavailable(inventory) or ""
        lacks = [flag for flag in method.cpu_flags if not inventory.cpu.has(flag)]
        if lacks:
            gated.add(method.name)
            assert reason.startswith("CPU lacks ") and all(flag in reason for flag in lacks), \
                (method.name, reason)
        else:
            assert "CPU lacks" not in reason, (method.name, reason)
    assert {"clflushopt-load", "store-clwb", "movdir64b"} <= gated
    assert not gated & set(RUNS_ON_WESTMERE)


KERNELS = """
import re, sys
import numpy as np
from nearlocal.kernels import cpu
src, dst = np.ones(1 << 14, np.uint8), np.zeros(1 << 14, np.uint8)
frags = np.array([[0, 0, 4096], [3, 5, 999]], np.int64)
for name in sys.argv[1:]:
    kernel = getattr(cpu, name)
    ticks, sink = np.zeros(3, np.uint64), np.zeros(1, np.uint64)
    try:
        kernel(src, dst, frags, ticks, sink, True, 1)
    except TypeError:  # nt-load takes no passes
        kernel(src, dst, frags, ticks, sink, True)
    asm = "\\n".join(kernel.inspect_asm().values())
    print(name, int(ticks.all()), " ".join(sorted(set(re.findall(r"%([xyz]mm)\\d+", asm)))),
          " ".join(sorted(set(re.findall(r"\\b(v?movnt\\w+)\\b", asm)))), sep="|")
"""


@pytest.mark.slow  # compiles seven kernels for another CPU in a fresh process
def test_kernels_compiled_for_a_westmere_use_its_vectors_and_run(tmp_path):
    """The 64-byte line of the range intrinsics is an <8 x i64>: LLVM splits it into what the
    target has (four xmm on a Westmere), the nontemporal ones as movntdq / movntdqa."""
    kernels = [f"time_{name.replace('-', '_')}" for name in RUNS_ON_WESTMERE]  # kernels.cpu's
    env = {**os.environ, **WESTMERE_TARGET, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", KERNELS, *kernels], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = {name: (timed, registers.split(), ops.split())
            for name, timed, registers, ops in (line.split("|") for line in done.stdout.splitlines())}
    assert set(seen) == set(kernels)
    for name, (timed, registers, ops) in seen.items():
        assert timed == "1", name  # every sample timed: the kernel ran on this box
        assert registers == ["xmm"], (name, registers)  # no ymm / zmm: SSE's 16 bytes
        assert not any(op.startswith("v") for op in ops), (name, ops)  # no VEX encoding
    assert "movntdqa" in seen["time_nt_load"][2]
    assert {"movntdq", "movntiq"} <= set(seen["time_nt_copy"][2])


@pytest.mark.slow  # one run of every CPU method, its kernels compiled for another CPU
def test_every_cpu_method_on_a_westmere_is_measured_or_skipped_naming_the_flag(tmp_path):
    """What the VM rig's cpu guest checks, on this box: the probed CPU is the recorded Westmere
    (a fake /proc/cpuinfo) and numba compiles for it; no process aborts, every row is ok or
    skipped with its reason (figures are never looked at)."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, **WESTMERE_TARGET, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "NEARLOCAL_SYSROOT": str(cxl_box(tmp_path / "box", cpuinfo=WESTMERE_CPUINFO)),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "vm_cpu.py"), "run", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    (out / "cpu.rc").write_text(f"{done.returncode}\n")
    (out / "cpu.err").write_text(done.stderr)
    from vm_cpu import check  # a script, found through sys.path (as it finds vm_lib)

    problems = check(out)
    assert not problems, problems


MODEL = "Westmere E56xx/L56xx/X56xx (Nehalem-C)"
GOOD = {"load": ("ok", ""), "nt-load": ("ok", ""),
        "store-clwb": ("skipped", f"CPU lacks clwb ({MODEL})"),
        "file-read": ("skipped", "storage:x cannot be opened")}


def _cpu_out(tmp_path: Path, rows: dict, rc: int = 0, err: str = "", **flags: bool) -> Path:
    """What the cpu guest writes (scripts/vm_cpu.py run), its rows in a real store."""
    from nearlocal.store.writer import Store

    out = tmp_path / "cpu"
    out.mkdir()
    have = {"rdtscp": True, "sse4_1": True, "clflush": True, **dict.fromkeys(LACKING, False),
            **flags}
    declared = {"load": ["rdtscp"], "nt-load": ["rdtscp", "sse4_1", "clflush"],
                "store-clwb": ["rdtscp", "clwb"], "file-read": ["rdtscp"]}
    methods = {name: {"case": f"{name}/dram/wb/64KiB", "flags": declared[name],
                      "unavailable": GOOD[name][1] or None} for name in GOOD}
    (out / "cpu.json").write_text(json.dumps({
        "model": MODEL, "flags": have, "llvm_cpu": "westmere",
        "llvm_features": ["sse4.1", *(f for f, on in flags.items() if on)], "methods": methods}))
    (out / "cpu.rc").write_text(f"{rc}\n")
    (out / "cpu.err").write_text(err)
    store = Store.create(out / "results", {"host_id": "guest"})
    for name, (status, reason) in rows.items():
        store.add_case({"case_id": f"{name}/dram/wb/64KiB", "method": name, "region": "dram",
                        "attr": "wb", "status": status, "reason": reason}, None, None, None)
    store.finish()
    return out


def test_the_cpu_facts_hold_on_what_a_good_guest_writes(tmp_path):
    from vm_cpu import check  # a script, found through sys.path (as it finds vm_lib)

    assert check(_cpu_out(tmp_path, GOOD)) == []


@pytest.mark.parametrize(("change", "failed"), [
    ({"rows": {**GOOD, "nt-load": ("failed", "the worker died of SIGABRT")}}, ["nt-load measured"]),
    ({"rows": {**GOOD, "store-clwb": ("ok", "")}}, ["store-clwb skipped naming clwb"]),
    ({"rows": {k: v for k, v in GOOD.items() if k != "load"}}, ["load has a row"]),
    ({"rc": 134, "err": "LLVM ERROR: Cannot select: intrinsic %llvm.x86.clwb"},
     ["the run exits 0", "no LLVM error"]),
    ({"avx2": True}, ["lacks avx2", "without avx2"]),
])
def test_an_abort_or_a_method_run_without_its_flag_is_a_failed_cpu_fact(tmp_path, change, failed):
    from vm_cpu import check  # a script, found through sys.path (as it finds vm_lib)

    problems = check(_cpu_out(tmp_path, **{"rows": GOOD, **change}))
    assert len(problems) == len(failed), problems
    assert all(any(text in problem for problem in problems) for text in failed), problems


@pytest.mark.parametrize(("env", "target"), [
    ({}, ("host", None)),
    ({"NUMBA_CPU_NAME": "skylake"}, ("host", None)),  # numba gives it the host's features
    ({"NUMBA_CPU_NAME": "generic"}, ("generic (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)", [])),
    ({"NUMBA_CPU_NAME": "skylake-avx512", "NUMBA_CPU_FEATURES": "+clwb,-avx2, +sse4.1"},
     ("skylake-avx512 (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)", ["clwb", "sse4.1"])),
])
def test_the_compile_target_is_read_as_numba_reads_it(env, target):
    from nearlocal.probe.cpu import compile_target

    assert compile_target(env) == target


def test_a_flag_the_cpu_has_but_numba_does_not_compile_for_is_a_skip_reason(tmp_path, monkeypatch):
    """NUMBA_CPU_NAME=generic (portable caches) on a CPU with clwb: LLVM cannot select clwb for
    that target and aborts the process, and a nontemporal load without +sse4.1 silently
    becomes a plain one. Both are skipped naming what numba compiles for."""
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    inventory = probe(SysRoot(cxl_box(tmp_path)), calibrate=False, gpu=False)
    methods = load_methods()
    assert inventory.cpu.has("clwb") and not inventory.cpu.usable("clwb")
    clwb = methods["store-clwb"].unavailable(inventory)
    assert clwb.startswith("numba compiles for generic") and "+clwb" in clwb
    assert "+sse4.1" in methods["nt-load"].unavailable(inventory)
    assert methods["load"].unavailable(inventory) is None
    assert methods["clflush-load"].unavailable(inventory) is None  # clflush is SSE2: baseline


def test_a_run_under_a_generic_numba_target_skips_what_llvm_cannot_select(tmp_path):
    """It aborted with "LLVM ERROR: Cannot select: intrinsic %llvm.x86.clwb" on a box with clwb."""
    from nearlocal.store import load

    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CPU_FEATURES", None)
    done = subprocess.run([sys.executable, "-m", "nearlocal.frontends.cli", "run", "--method",
                           "store-clwb,nt-load,load", "--size", "4KiB", "--budget", "0.01",
                           "--processes", "1", "--out", str(tmp_path / "out"), "--quiet"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "LLVM ERROR" not in done.stderr, done.stderr[-2000:]
    rows = load(None, tmp_path / "out").cases.set_index("method")
    assert rows.loc["load", "status"] == "ok"
    for method in ("store-clwb", "nt-load"):
        assert rows.loc[method, "status"] == "skipped"
        assert rows.loc[method, "reason"].startswith("numba compiles for generic")
