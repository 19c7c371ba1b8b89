"""The CPU kernels move exactly the bytes they claim, and run the instructions they claim."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numba
import numpy as np
import pytest

from nearlocal.kernels import cpu
from nearlocal.kernels.cpu import STORE_PATTERN
from nearlocal.probe.cpu import probe_cpu
from nearlocal.sysroot import SysRoot

CPU = probe_cpu(SysRoot())
rng = np.random.default_rng(7)
# Odd sizes and unaligned offsets exercise every head / body / tail path of the range loops.
FRAGS = np.array([[3, 5, 1], [64, 700, 64], [129, 1000, 333], [1024, 2000, 4096],
                  [7000, 9000, 160], [9001, 9300, 0], [12000, 12001, 1000]], dtype=np.int64)
SIZE = 16384


def _buffers():
    return rng.integers(0, 256, SIZE, dtype=np.uint8), np.zeros(SIZE, np.uint8)


def _run(kernel, src, dst, frags=FRAGS, reps=3, drain=True):
    samples = np.zeros(reps, np.uint64)
    sink = np.zeros(1, np.uint64)
    kernel(src, dst, frags, samples, sink, drain)
    return samples, sink


def _expected_writes(frags, value_byte):
    expected = np.zeros(SIZE, np.uint8)
    for _, dst_off, length in frags:
        expected[dst_off:dst_off + length] = value_byte
    return expected


def _xor_reference(array: np.ndarray, offset: int, length: int) -> int:
    """What the read loops fold: 8-byte words at 8-aligned addresses, bytes at the ragged ends."""
    address = array.ctypes.data + offset
    head = min(length, (-address) % 8)
    words_end = head + (length - head) // 8 * 8
    acc = 0
    for b in array[offset:offset + head]:
        acc ^= int(b)
    words = array[offset + head:offset + words_end].view(np.uint64)
    acc ^= int(np.bitwise_xor.reduce(words)) if words.size else 0
    for b in array[offset + words_end:offset + length]:
        acc ^= int(b)
    return acc


@pytest.mark.parametrize("drain", [True, False])
@pytest.mark.parametrize("kernel", [cpu.time_store, cpu.time_nt_store, cpu.time_store_clwb])
def test_store_kernels_write_exactly_the_fragments(kernel, drain):
    if kernel is cpu.time_store_clwb and not CPU.has("clwb"):
        pytest.skip("CPU lacks clwb")
    src, dst = _buffers()
    samples, _ = _run(kernel, src, dst, drain=drain)
    np.testing.assert_array_equal(dst, _expected_writes(FRAGS, 0x5A))
    assert int(STORE_PATTERN) & 0xFF == 0x5A
    assert (samples > 0).all()


@pytest.mark.parametrize("drain", [True, False])
@pytest.mark.parametrize("kernel", [cpu.time_memcpy, cpu.time_nt_copy])  # movdir64b: below
def test_copy_kernels_copy_every_fragment(kernel, drain):
    src, dst = _buffers()
    _run(kernel, src, dst, drain=drain)
    expected = np.zeros(SIZE, np.uint8)
    for s, d, n in FRAGS:
        expected[d:d + n] = src[s:s + n]
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.parametrize("kernel", [cpu.time_load, cpu.time_nt_load, cpu.time_clflush_load,
                                    cpu.time_clflushopt_load])
@pytest.mark.parametrize("drain", [True, False])
def test_read_kernels_read_every_byte_of_every_fragment(kernel, drain):
    if kernel is cpu.time_clflushopt_load and not CPU.has("clflushopt"):
        pytest.skip("CPU lacks clflushopt")
    src, dst = _buffers()
    reps = 3
    _, sink = _run(kernel, src, dst, reps=reps, drain=drain)
    per_rep = 0
    for s, _, n in FRAGS:
        per_rep ^= _xor_reference(src, int(s), int(n))
    warm_passes = 0 if kernel is cpu.time_nt_load else 1
    expected = per_rep if (reps + warm_passes) % 2 else 0
    assert int(sink[0]) == expected
    assert not dst.any(), "a read kernel wrote to its destination"


def test_read_kernel_sees_a_single_changed_byte():
    src, dst = _buffers()
    frags = np.array([[0, 0, SIZE]], np.int64)
    _, before = _run(cpu.time_load, src, dst, frags, reps=1)  # 2 passes: xor cancels to 0
    _, one = _run(cpu.time_load, src, dst, frags, reps=2)  # 3 passes
    src[12345] ^= 0x10
    _, changed = _run(cpu.time_load, src, dst, frags, reps=2)
    assert int(before[0]) == 0
    assert int(one[0]) ^ int(changed[0]) != 0


def test_read_only_mapping_is_accepted_by_read_kernels():
    src, dst = _buffers()
    src.flags.writeable = False
    _, sink = _run(cpu.time_load, src, dst, reps=1)
    assert int(sink[0]) == 0  # two passes cancel


def _asm(kernel) -> str:
    """Assembly of a fresh, uncached compile (numba cannot inspect code loaded from its cache)."""
    fresh = numba.njit(kernel.py_func)
    src, dst = _buffers()
    _run(fresh, src, dst, reps=1)
    return "\n".join(fresh.inspect_asm(sig) for sig in fresh.signatures)


def _sequence(kernel) -> list[str]:
    """The kernel's instructions in layout order (the callees numba inlines included)."""
    return [line.split()[0] for line in _asm(kernel).splitlines()
            if line.startswith("\t") and line.split() and not line.split()[0].startswith(".")]


def _mnemonics(kernel) -> set[str]:
    return set(_sequence(kernel))


FENCES = ("mfence", "sfence", "lfence")


def _fences_after(sequence: list[str], instruction: str) -> set[str]:
    """The first fence that follows each run of `instruction` in the listing."""
    found = set()
    for i, mnemonic in enumerate(sequence):
        if mnemonic == instruction and (i + 1 == len(sequence) or sequence[i + 1] != instruction):
            found.add(next((m for m in sequence[i + 1:] if m in FENCES), "none"))
    return found


def test_timer_is_fenced_rdtscp():
    src, dst = _buffers()
    _run(cpu.time_load, src, dst, reps=1)
    text = _asm(cpu.time_load)
    assert "rdtscp" in text and "lfence" in text and "mfence" in text


@pytest.mark.parametrize(("kernel", "required"), [
    (cpu.time_nt_store, {"sfence"}),
    (cpu.time_store, {"mfence"}),
    (cpu.time_clflush_load, {"clflush", "mfence"}),
    (cpu.time_clflushopt_load, {"clflushopt", "mfence"}),
    (cpu.time_nt_copy, {"sfence"}),
    (cpu.time_store_clwb, {"clwb", "sfence"}),
])
def test_kernels_contain_the_claimed_instructions(kernel, required):
    for flag in ("clflushopt", "clwb"):
        if flag in required and not CPU.has(flag):
            pytest.skip(f"CPU lacks {flag}")
    src, dst = _buffers()
    _run(kernel, src, dst, reps=1)
    mnemonics = _mnemonics(kernel)
    assert required <= mnemonics, f"missing {required - mnemonics}"


def test_clflushopt_load_orders_the_loads_after_the_flushes_with_mfence():
    """sfence does not order later loads: they could hit lines not yet invalidated."""
    if not CPU.has("clflushopt"):
        pytest.skip("CPU lacks clflushopt")
    sequence = _sequence(cpu.time_clflushopt_load)
    assert "clflushopt" in sequence
    assert _fences_after(sequence, "clflushopt") == {"mfence"}
    assert "sfence" not in sequence
    assert _fences_after(_sequence(cpu.time_clflush_load), "clflush") == {"mfence"}


def test_fence_check_catches_an_sfence_after_clflushopt():
    """The check above fails on the old kernel (sfence between the flushes and the loads)."""
    sequence = ["mfence", "lfence", "rdtscp", "lfence", "clflushopt", "clflushopt", "sfence",
                "vmovdqu", "rdtscp", "lfence"]
    assert _fences_after(sequence, "clflushopt") == {"sfence"}


def test_drain_none_starts_the_interval_without_mfence():
    """drain=True: mfence, lfence, rdtscp; drain=False: an rdtscp with no mfence right before."""
    sequence = _sequence(cpu.time_nt_store)
    starts = [tuple(sequence[i - 2:i]) for i, m in enumerate(sequence)
              if m == "rdtscp" and i >= 2 and sequence[i - 1] == "lfence"]
    assert ("mfence", "lfence") in starts
    assert any(before != "mfence" for before, _ in starts)


def test_nt_copy_loads_the_peer_and_stores_nontemporally():
    mnemonics = _mnemonics(cpu.time_nt_copy)
    vector_nt_stores = {"movntdq", "vmovntdq", "movntps", "vmovntps", "movntpd", "vmovntpd"}
    assert vector_nt_stores & mnemonics, "no nontemporal vector store"
    assert {"movnti", "movntiq"} & mnemonics, "8-byte head / tail words are not nontemporal"
    assert {"vmovdqu", "vmovups", "vmovdqu64", "movdqu", "movups"} & mnemonics, "no vector load"
    sequence = _sequence(cpu.time_nt_copy)
    assert _fences_before_closing_rdtscp(sequence) == {"sfence"}  # stores drained, then timed
    last_nt = max(i for i, m in enumerate(sequence) if m in vector_nt_stores | {"movnti",
                                                                                 "movntiq"})
    assert "sfence" in sequence[last_nt:]


def _fences_before_closing_rdtscp(sequence: list[str]) -> set[str]:
    """The last fence before each rdtscp that closes an interval (tsc_end: not right after the
    lfence that opens one), in layout order; "none" when no fence precedes it."""
    found = set()
    for i, mnemonic in enumerate(sequence):
        if mnemonic == "rdtscp" and (i == 0 or sequence[i - 1] != "lfence"):
            found.add(next((m for m in reversed(sequence[:i]) if m in FENCES), "none"))
    return found


def test_closing_fence_check_catches_a_missing_sfence():
    """The nt-copy check fails on a kernel whose nontemporal stores reach the closing rdtscp
    with no sfence (they may still sit in write-combining buffers)."""
    opened = ["mfence", "lfence", "rdtscp", "lfence", "vmovdqu", "vmovntdq", "movntiq"]
    assert _fences_before_closing_rdtscp([*opened, "rdtscp", "lfence"]) == {"lfence"}
    assert _fences_before_closing_rdtscp([*opened, "sfence", "rdtscp", "lfence"]) == {"sfence"}
    assert _fences_before_closing_rdtscp(["vmovntdq", "rdtscp"]) == {"none"}


def test_passes_are_the_timed_intervals_untimed():
    """One pass = one repetition: a threaded harness can run it per thread on its own slice."""
    src, dst = _buffers()
    cpu.nt_copy_pass(src, dst, FRAGS)
    expected = np.zeros(SIZE, np.uint8)
    for s, d, n in FRAGS:
        expected[d:d + n] = src[s:s + n]
    np.testing.assert_array_equal(dst, expected)
    dst[:] = 0
    cpu.nt_store_pass(src, dst, FRAGS)
    np.testing.assert_array_equal(dst, _expected_writes(FRAGS, 0x5A))
    per_rep = 0
    for s, _, n in FRAGS:
        per_rep ^= _xor_reference(src, int(s), int(n))
    assert int(cpu.load_pass(src, dst, FRAGS)) == per_rep


def test_every_cpu_method_declares_its_kernels_and_forms_where_it_registers():
    """Each CPU method declares its timed kernel and its pass once, in its registration; a
    multi-thread form's body is that same pass. Nothing maps method names to kernels."""
    from nearlocal.core.suites import CPU_METHODS
    from nearlocal.cpu.methods import CPU_KERNELS
    from nearlocal.cpu.threads import THREAD_FORMS

    assert set(CPU_KERNELS) == set(CPU_METHODS)
    for name, code in CPU_KERNELS.items():
        timed, one_pass = code.timed(), code.one_pass()
        assert timed.__name__.startswith("time_") and one_pass.__name__.endswith("_pass"), name
        if name in THREAD_FORMS:
            assert THREAD_FORMS[name].body() is one_pass, name
    assert {"load", "store", "nt-store", "nt-copy", "memcpy"} <= set(THREAD_FORMS)
    assert not hasattr(cpu, "PASSES")


def test_nontemporal_kernels_use_nontemporal_moves():
    src, dst = _buffers()
    _run(cpu.time_nt_store, src, dst, reps=1)
    _run(cpu.time_nt_load, src, dst, reps=1)
    # LLVM may pick the float-domain encoding of the same nontemporal vector store
    vector_nt_stores = {"movntdq", "vmovntdq", "movntps", "vmovntps", "movntpd", "vmovntpd"}
    assert vector_nt_stores & _mnemonics(cpu.time_nt_store)
    assert any(m.endswith("movntdqa") for m in _mnemonics(cpu.time_nt_load))
    # the plain store kernel must not be silently nontemporal
    _run(cpu.time_store, src, dst, reps=1)
    assert not any("movnt" in m for m in _mnemonics(cpu.time_store))


def test_read_loop_is_not_deleted():
    src, dst = _buffers()
    _run(cpu.time_load, src, dst, reps=1)
    text = _asm(cpu.time_load)
    assert "vpxor" in text or "pxor" in text or "vxorps" in text


MOVDIR64B_RUN = """
import ctypes, json, sys
import numpy as np
emulator = ctypes.CDLL(sys.argv[1])
emulator.nl_emu_dst.restype = emulator.nl_emu_src.restype = ctypes.c_uint64
emulator.nl_emu_dst.argtypes = emulator.nl_emu_src.argtypes = [ctypes.c_long]
emulator.nl_emu_logged.restype = emulator.nl_emu_refused.restype = ctypes.c_long
assert emulator.nl_emu_install() == 0
from nearlocal.kernels import cpu
frags = np.array(json.loads(sys.argv[2]), np.int64)
src = np.random.default_rng(7).integers(0, 256, int(sys.argv[3]), dtype=np.uint8)
dst = np.zeros(src.size, np.uint8)
samples = np.zeros(int(sys.argv[4]), np.uint64)
cpu.time_movdir64b(src, dst, frags, samples, np.zeros(1, np.uint64), True, 1)
stores = [(emulator.nl_emu_dst(i) - dst.ctypes.data, emulator.nl_emu_src(i) - src.ctypes.data)
          for i in range(emulator.nl_emu_logged())]
asm = "\\n".join(cpu.time_movdir64b.inspect_asm().values())
print(json.dumps({"stores": stores, "refused": emulator.nl_emu_refused(), "dst_base": dst.ctypes.data,
                  "asm_has_movdir64b": "movdir64b" in asm, "timed": bool(samples.all()),
                  "src": src.tolist(), "dst": dst.tolist()}))
"""


def _movdir64b_lines(frags: np.ndarray, dst_base: int) -> list[tuple[int, int]]:
    """(dst offset, src offset) of each 64-byte direct store a pass makes, in order: every whole
    line of each fragment's destination that is 64-byte aligned in memory (the ragged head and
    tail are ordinary stores), from the source bytes at the same place in the fragment."""
    lines = []
    for src_off, dst_off, length in frags.tolist():
        first = dst_off + (-(dst_base + dst_off)) % 64
        lines += [(at, src_off + at - dst_off) for at in range(first, dst_off + length - 63, 64)]
    return lines


@pytest.mark.skipif(shutil.which("cc") is None, reason="cc builds the movdir64b emulator")
def test_movdir64b_kernel_stores_each_aligned_line_once_per_pass(tmp_path):
    """time_movdir64b compiled for this CPU plus movdir64b, as on the Intel boxes that have it
    (the recorded Emerald Rapids guest), and run: where this CPU lacks the instruction (every AMD
    box) a SIGILL handler does what it does and logs it (tests/movdir64b_emulator.c). The kernel
    holds the instruction, every pass issues it once for each 64-byte aligned whole line of each
    fragment, from the matching source bytes, never at a misaligned address, and the ragged ends
    are copied by ordinary stores: the destination holds exactly the fragments' bytes."""
    import json
    import subprocess
    import sys

    import llvmlite.binding as llvm

    library = tmp_path / "movdir64b_emulator.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(library),
                    str(Path(__file__).with_name("movdir64b_emulator.c"))], check=True,
                   timeout=120)
    features = llvm.get_host_cpu_features()
    features["movdir64b"] = True
    env = {**os.environ, "NUMBA_CPU_NAME": llvm.get_host_cpu_name(),
           "NUMBA_CPU_FEATURES": features.flatten(), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    reps = 3
    done = subprocess.run([sys.executable, "-c", MOVDIR64B_RUN, str(library),
                           json.dumps(FRAGS.tolist()), str(SIZE), str(reps)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["asm_has_movdir64b"] and result["timed"] and result["refused"] == 0
    src, dst = np.array(result["src"], np.uint8), np.array(result["dst"], np.uint8)
    expected = np.zeros(SIZE, np.uint8)
    for s, d, n in FRAGS:
        expected[d:d + n] = src[s:s + n]
    np.testing.assert_array_equal(dst, expected)
    stores = [tuple(store) for store in result["stores"]]
    lines = _movdir64b_lines(FRAGS, result["dst_base"])
    if CPU.has("movdir64b") or not stores:
        # the instruction ran itself: cpuid says so, or a VM hides it from cpuid while the CPU
        # executes it (a Zen 5 guest: no SIGILL, nothing logged); the bytes above still hold
        assert stores == []
    else:
        assert len(lines) > 64 and stores == lines * reps


def test_movdir64b_is_offered_where_the_cpu_has_it_and_gated_elsewhere(tmp_path):
    """The recorded Intel guest (movdir64b) plans the case to run; the recorded AMD guest and a
    Westmere plan it skipped, naming the flag: a skipped case never reaches a worker, so the
    kernel is never compiled for a CPU that lacks the instruction (LLVM would abort)."""
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import get_method, load_methods
    from nearlocal.engine.plan import plan_entries
    from nearlocal.probe import probe
    from tests.fakesys import EMERALD_RAPIDS_CPUINFO, EPYC_ZEN4_CPUINFO, WESTMERE_CPUINFO, cxl_box

    load_methods()
    assert "movdir64b" in get_method("movdir64b").cpu_flags
    cases = [Case("movdir64b", "dram", "wb", size, peer="dram") for size in ("64B", "16KiB")]
    for name, cpuinfo, model in (("intel", EMERALD_RAPIDS_CPUINFO, None),
                                 ("amd", EPYC_ZEN4_CPUINFO, "AMD EPYC"),
                                 ("westmere", WESTMERE_CPUINFO, "Westmere E56xx/L56xx/X56xx")):
        inventory = probe(SysRoot(cxl_box(tmp_path / name, cpuinfo=cpuinfo)), calibrate=False,
                          gpu=False)
        assert inventory.cpu.has("movdir64b") is (model is None), name
        for entry in plan_entries(cases, inventory):
            if model is None:
                assert entry.runs and entry.resolved is not None, (name, entry.reason)
            else:
                assert not entry.runs, name
                assert entry.reason.startswith(f"CPU lacks movdir64b ({model}"), entry.reason


def test_the_clock_measured_here_has_a_step_and_an_overhead():
    from nearlocal.kernels.timer import measure_clock  # recorded boxes: tests/test_clock.py

    clock = measure_clock(2000)
    assert clock.overhead_ticks > 0 and clock.quantum_ticks >= 1


def test_rows_say_which_drain_and_what_the_interval_contains(tmp_path):
    from nearlocal.frontends.cli import main
    from nearlocal.store import load
    from nearlocal.store.catalogue import list_runs

    out = tmp_path / "store"
    code = main(["run", "--method", "nt-copy", "--method", "nt-store", "--size", "16KiB",
                 "--param", "drain=none", "--out", str(out), "--budget", "0.02", "--quiet"])
    assert code == 0
    code = main(["run", "--method", "nt-copy", "--size", "16KiB", "--out", str(out),
                 "--budget", "0.02", "--quiet"])
    assert code == 0
    rows = {row.case_id: row for run in sorted(list_runs(out))
            for row in load(str(run)).cases.itertuples()}
    back_to_back = rows["nt-copy/dram/wb/16KiB/drain=none"]
    assert back_to_back.status == "ok" and back_to_back.bytes_moved == 16384
    assert back_to_back.info["drain"] == "none"
    assert "nontemporal" in back_to_back.info["timed"] and "back to back" in back_to_back.info["timed"]
    assert rows["nt-store/dram/wb/16KiB/drain=none"].info["drain"] == "none"
    isolated = rows["nt-copy/dram/wb/16KiB"]  # the default: no parameter in the id
    assert isolated.status == "ok" and isolated.info["drain"] == "before"
    assert "isolated" in isolated.info["timed"]


def test_a_bad_drain_is_a_usage_error(tmp_path, capsys):
    from nearlocal.frontends.cli import main

    code = main(["run", "--method", "load", "--size", "64", "--param", "drain=sometimes",
                 "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "drain='sometimes'" in err and "before" in err and "none" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("kernel", [cpu.time_load, cpu.time_clflush_load])
def test_a_batched_read_sample_reads_every_fragment_once_per_pass(kernel):
    src, dst = _buffers()
    samples, sink = np.zeros(2, np.uint64), np.zeros(1, np.uint64)
    per_pass = 0
    for s, _, n in FRAGS:
        per_pass ^= _xor_reference(src, int(s), int(n))
    for passes in (2, 3):  # with the warm-up pass: 5 and 7 passes, an odd count: the xor itself
        kernel(src, dst, FRAGS, samples, sink, True, passes)
        assert int(sink[0]) == (per_pass if (1 + 2 * passes) % 2 else 0)
    assert not dst.any()


def test_a_batched_store_sample_writes_exactly_the_fragments():
    src, dst = _buffers()
    cpu.time_nt_store(src, dst, FRAGS, np.zeros(2, np.uint64), np.zeros(1, np.uint64), False, 4)
    assert np.array_equal(dst, _expected_writes(FRAGS, 0x5A))


def test_passes_for_spans_the_clock_steps_in_a_power_of_two():
    from nearlocal.cpu.methods import MAX_PASSES, MIN_SAMPLE_STEPS, passes_for

    def take_for(body_ticks: float, overhead: float = 70.0, quantum: float = 24.0):
        def take(ticks, passes):  # a stepped clock: whole steps of `quantum`
            ticks[:] = np.floor((overhead + passes * body_ticks) / quantum) * quantum
        return take

    for body in (3.0, 30.0, 300.0):
        passes = passes_for(take_for(body), 70.0, 24.0)
        assert passes & (passes - 1) == 0 and passes > 1
        assert passes * body >= 0.9 * MIN_SAMPLE_STEPS * 24  # within a step of the target
    assert passes_for(take_for(1e6), 70.0, 24.0) == 1  # long enough alone: one pass
    assert passes_for(take_for(1e-6), 70.0, 24.0) == MAX_PASSES  # never more than the cap
    assert passes_for(take_for(10.0, 40.0, 1.0), 40.0, 1.0) == 128  # 1-tick clock: 20 overheads


def test_a_cpu_session_states_its_passes_and_divides_by_them():
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import load_methods
    from nearlocal.core.methods import ops_per_sample as session_ops
    from nearlocal.engine.worker import open_case

    load_methods()
    tsc_hz = 2e9
    # a clock whose step is 1e5 ticks: any short pass is batched up to the cap
    with open_case(Case("load", "dram", "wb", "64B"), tsc_hz, 0.0, False,
                   quantum_ticks=1e5) as opened:
        session = opened.session
        raw, ns = session.sample(4)
        assert session.passes > 1 and session_ops(session) == session.passes
        assert opened.info["passes_per_sample"] == session.passes
        assert f"{session.passes} passes per timed interval" in opened.info["timed"]
        expected = (raw.astype(float) - session.drain_ticks).clip(0) * 1e9 / tsc_hz / session.passes
        assert np.allclose(ns, expected)
    with open_case(Case("nt-load", "dram", "wb", "64B"), tsc_hz, 0.0, False,
                   quantum_ticks=1e5) as opened:  # its cold state is set per sample: one pass
        assert session_ops(opened.session) == 1 and "passes per" not in opened.info["timed"]
