"""The DSA submission path against the software work queue (a test double): encode -> submit ->
poll -> page-fault retry, run by the same compiled code as the hardware path. Also: the
hardware-only instructions compile for a CPU that has them (without running them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from nearlocal.core.cases import Case
from nearlocal.core.methods import SessionContext
from nearlocal.core.patterns import parse_pattern
from nearlocal.dsa import portal, uapi
from nearlocal.dsa.kernels import portal as driver
from nearlocal.dsa.kernels.portal import soft_push
from nearlocal.dsa.methods import Backend, DsaSession
from nearlocal.dsa.softqueue import PAGE, SoftWorkQueue
from nearlocal.errors import UsageError
from nearlocal.regions import MappedRegion, parse_region

TIMEOUT = np.uint64(20 * 10**9)  # ticks: generous, the device is a Python thread
RECORD = uapi.Flag.CRAV | uapi.Flag.RCR


def buffer(size: int, seed: int = 0) -> np.ndarray:
    array = uapi.aligned_empty(size, np.uint8, PAGE)
    array[:] = (np.arange(size) * 7 + seed) % 251 + 1
    return array


def run_one(queue: SoftWorkQueue, desc: np.ndarray, comps: np.ndarray, index: int = 0,
            timeout=TIMEOUT) -> uapi.Completion:
    """Submit one descriptor through the compiled driver and decode its record."""
    stamps = np.zeros(2, np.uint64)
    status = driver.submit_and_wait(soft_push, driver.wait_pause, np.uint64(queue.portal),
                                    np.uint64(uapi.address(desc)),
                                    np.uint64(uapi.address(comps, index)), timeout, stamps)
    done = uapi.decode_completion(comps[index])
    assert done.status == status
    return done


@pytest.fixture()
def queue():
    with SoftWorkQueue() as q:
        yield q


def test_memmove(queue):
    src, dst = buffer(10000), buffer(10000, seed=3)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    uapi.encode_memmove(desc[0], uapi.address(src) + 5, uapi.address(dst) + 9, 9000,
                        uapi.address(comps), RECORD)
    done = run_one(queue, desc, comps)
    assert done.ok and done.result == 0
    assert np.array_equal(dst[9:9009], src[5:9005])
    assert dst[9009] == buffer(10000, seed=3)[9009]  # nothing past the end


def test_memfill(queue):
    dst = buffer(1000)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    pattern = 0x0807060504030201
    uapi.encode_memfill(desc[0], uapi.address(dst) + 3, 101, pattern, uapi.address(comps), RECORD)
    assert run_one(queue, desc, comps).ok
    assert list(dst[3:11]) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert np.array_equal(dst[3:104], np.resize(np.arange(1, 9, dtype=np.uint8), 101))
    assert dst[104] == buffer(1000)[104]


def test_compare_equal_different_and_expected_result(queue):
    a, b = buffer(4096), buffer(4096)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    uapi.encode_compare(desc[0], uapi.address(a), uapi.address(b), 4096, uapi.address(comps),
                        RECORD)
    same = run_one(queue, desc, comps)
    assert same.ok and same.result == 0
    b[1234] ^= 0xFF
    differ = run_one(queue, desc, comps)
    assert differ.code == uapi.Status.SUCCESS and differ.result == 1
    assert differ.bytes_completed == 1234  # offset of the first difference
    uapi.encode_compare(desc[0], uapi.address(a), uapi.address(b), 4096, uapi.address(comps),
                        RECORD | uapi.Flag.CR, expected=0)
    assert run_one(queue, desc, comps).code == uapi.Status.SUCCESS_PRED  # predicate false


def test_noop_drain_and_invalid_opcode(queue):
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    for op in (uapi.Op.NOOP, uapi.Op.DRAIN):
        uapi.encode_simple(desc[0], op, uapi.address(comps), RECORD)
        assert run_one(queue, desc, comps).ok
    uapi.encode_simple(desc[0], 0x3F, uapi.address(comps), RECORD)
    bad = run_one(queue, desc, comps)
    assert bad.code == uapi.Status.BAD_OPCODE and bad.name == "bad_opcode"


def test_record_written_on_success_only_when_requested(queue):
    src, dst = buffer(256), buffer(256, seed=1)
    desc, comps = uapi.descriptors(2), uapi.completion_records(2)
    uapi.encode_memmove(desc[0], uapi.address(src), uapi.address(dst), 256,
                        uapi.address(comps, 0), uapi.Flag.CRAV)  # no RCR: only errors
    uapi.encode_simple(desc[1], uapi.Op.DRAIN, uapi.address(comps, 1), RECORD)
    stamps = np.zeros(2, np.uint64)
    driver.submit(soft_push, np.uint64(queue.portal), np.uint64(uapi.address(desc, 0)), TIMEOUT)
    status = driver.submit_and_wait(soft_push, driver.wait_spin, np.uint64(queue.portal),
                                    np.uint64(uapi.address(desc, 1)),
                                    np.uint64(uapi.address(comps, 1)), TIMEOUT, stamps)
    assert status == uapi.Status.SUCCESS and stamps[0] >= 1
    assert comps[0, 0] == 0 and np.array_equal(dst, src)


def test_batch(queue):
    src, dst = buffer(8 * 512), buffer(8 * 512, seed=9)
    members, mcomps = uapi.descriptors(8), uapi.completion_records(8)
    for i in range(8):
        uapi.encode_memmove(members[i], uapi.address(src) + 512 * i,
                            uapi.address(dst) + 512 * (7 - i), 512, uapi.address(mcomps, i),
                            RECORD)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    uapi.encode_batch(desc[0], uapi.address(members), 8, uapi.address(comps), RECORD)
    done = run_one(queue, desc, comps)
    assert done.ok and done.bytes_completed == 8  # descriptors completed
    assert all(uapi.decode_completion(mcomps[i]).ok for i in range(8))
    for i in range(8):
        assert np.array_equal(dst[512 * (7 - i):512 * (8 - i)], src[512 * i:512 * (i + 1)])

    uapi.encode_batch(desc[0], uapi.address(members), 1, uapi.address(comps), RECORD)
    assert run_one(queue, desc, comps).code == uapi.Status.DESC_CNT_ERANGE
    desc[0]["src_addr"] = uapi.address(members) + 32  # list must be 64-byte aligned
    desc[0]["xfer_size"] = 2
    assert run_one(queue, desc, comps).code == uapi.Status.DESCLIST_ALIGN

    uapi.encode_batch(members[2], uapi.address(members), 2, uapi.address(mcomps, 2), RECORD)
    uapi.encode_batch(desc[0], uapi.address(members), 4, uapi.address(comps), RECORD)
    failed = run_one(queue, desc, comps)
    assert failed.code == uapi.Status.BATCH_FAIL  # a batch inside a batch is not allowed
    assert uapi.decode_completion(mcomps[2]).code == uapi.Status.BAD_OPCODE


@pytest.mark.parametrize("where", ["dst", "src"])
def test_page_fault_partial_completion_and_retry(queue, where):
    src, dst = buffer(6 * PAGE), buffer(6 * PAGE, seed=5)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    scratch, scomp = uapi.descriptors(1), uapi.completion_records(1)
    size = 5 * PAGE + 77
    uapi.encode_memmove(desc[0], uapi.address(src) + 10, uapi.address(dst) + 10, size,
                        uapi.address(comps), RECORD)
    target = dst if where == "dst" else src
    queue.fault_at(uapi.address(target) + 2 * PAGE + 100)
    queue.fault_at(uapi.address(target) + 4 * PAGE)
    first = run_one(queue, desc, comps)
    assert first.partial and first.bytes_completed == 2 * PAGE - 10
    assert first.fault_addr == uapi.address(target) + 2 * PAGE
    assert first.fault_on_write == (where == "dst")
    assert np.array_equal(dst[10:2 * PAGE], src[10:2 * PAGE])
    assert not np.array_equal(dst[2 * PAGE:3 * PAGE], src[2 * PAGE:3 * PAGE])  # not done yet

    counters = np.zeros(4, np.uint64)
    final = driver.finish_partial(
        soft_push, driver.wait_pause, np.uint64(queue.portal), np.uint64(uapi.address(desc)),
        np.uint64(uapi.address(comps)), np.uint64(uapi.address(scratch)),
        np.uint64(uapi.address(scomp)), TIMEOUT, np.zeros(2, np.uint64), counters)
    assert final == uapi.Status.SUCCESS
    assert counters[2] == 2  # two faults, two resubmissions of the remainder
    assert np.array_equal(dst[10:10 + size], src[10:10 + size])
    assert desc[0]["xfer_size"] == size  # the original descriptor is left as built


def test_a_fault_that_touching_does_not_clear_ends_not_loops(queue, monkeypatch):
    src, dst = buffer(2 * PAGE), buffer(2 * PAGE, seed=5)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    scratch, scomp = uapi.descriptors(1), uapi.completion_records(1)
    uapi.encode_memmove(desc[0], uapi.address(src), uapi.address(dst), 2 * PAGE,
                        uapi.address(comps), RECORD)
    monkeypatch.setattr(queue, "_resolve", lambda addr: None)  # the page never comes in
    queue.fault_at(uapi.address(dst) + PAGE)
    assert run_one(queue, desc, comps).partial
    counters = np.zeros(4, np.uint64)
    final = driver.finish_partial(
        soft_push, driver.wait_pause, np.uint64(queue.portal), np.uint64(uapi.address(desc)),
        np.uint64(uapi.address(comps)), np.uint64(uapi.address(scratch)),
        np.uint64(uapi.address(scomp)), TIMEOUT, np.zeros(2, np.uint64), counters)
    assert final & uapi.STATUS_MASK == uapi.Status.PAGE_FAULT_NOBOF
    assert 0 < counters[2] <= 2 * (2 + 2)  # bounded by the pages the copy spans


def test_block_on_fault_completes_without_partial(queue):
    src, dst = buffer(3 * PAGE), buffer(3 * PAGE, seed=2)
    desc, comps = uapi.descriptors(1), uapi.completion_records(1)
    uapi.encode_memmove(desc[0], uapi.address(src), uapi.address(dst), 3 * PAGE,
                        uapi.address(comps), RECORD | uapi.Flag.BOF)
    queue.fault_at(uapi.address(dst) + PAGE)
    assert run_one(queue, desc, comps).ok
    assert np.array_equal(dst, src)


# --- the method's session, end to end over the double -------------------------------------


def _ctx(pattern: str, params: dict, method: str = "dsa-memmove"):
    pat = parse_pattern(pattern)
    spec = parse_region("dram")
    src = MappedRegion(spec, "wb", buffer(max(pat.src_span, 1)), True)
    dst = MappedRegion(spec, "wb", buffer(max(pat.dst_span, 1), seed=4), True)
    # a 10x TSC rate stretches the driver's 2 s timeout: the device is a Python thread on a
    # busy box (the ns values of these samples mean nothing anyway)
    return SessionContext(Case(method, "dram"), pat, src, dst, 2e10, 30.0, params)


def _backend(queue: SoftWorkQueue, max_transfer: int = 1 << 20) -> Backend:
    return Backend(queue.portal, soft_push, lambda flag: flag != "waitpkg", "wq0.0", queue.mode,
                   queue.size, queue.max_batch, max_transfer, "soft")


def _copied(ctx) -> bool:
    return all(np.array_equal(ctx.dst.array[d:d + n], ctx.src.array[s:s + n])
               for s, d, n in ctx.pattern.frags)


def test_session_memmove_queue_depth_and_fault_retry():
    with SoftWorkQueue(size=4) as queue:
        ctx = _ctx("8x4KiB", {"qd": "4", "wait": "pause"})
        session = DsaSession(ctx, batched=False, backend=_backend(queue))
        queue.fault_at(uapi.address(ctx.dst.array) + 3 * PAGE)
        raw, ns = session.sample(3)
        assert raw.shape == ns.shape == (3,) and (raw > 0).all() and (ns >= 0).all()
        assert _copied(ctx)
        info = session.info
        assert info["descriptors"] == 8 and info["qd"] == 4 and info["wait"] == "pause"
        assert info["page_fault_resubmits"] == 1 and info["submit"] == "soft"
        assert {"submit_ns_median", "device_ns_median", "poll_ns_median"} <= set(info)
        session.close()
        assert queue.dropped == 0 and queue.errors == []


def test_session_batch_cuts_a_single_fragment_and_splits_at_max_transfer():
    with SoftWorkQueue(mode="shared", size=8) as queue:
        ctx = _ctx("16KiB", {"batch": "4"}, "dsa-batch")
        session = DsaSession(ctx, batched=True, backend=_backend(queue))
        session.sample(2)
        assert _copied(ctx)
        assert session.info["descriptors"] == 1 and session.info["memmoves"] == 4
        assert session.info["batch"] == 4
        session.close()
        ctx = _ctx("3x10000B", {}, "dsa-memmove")
        session = DsaSession(ctx, batched=False, backend=_backend(queue, max_transfer=4096))
        session.sample(1)
        assert _copied(ctx) and session.info["descriptors"] == 9  # 3 x (4096 + 4096 + 1808)
        session.close()


def test_session_batch_member_fault_is_finished():
    with SoftWorkQueue(size=4) as queue:
        ctx = _ctx("6x4KiB", {"batch": "3", "qd": "2"}, "dsa-batch")
        session = DsaSession(ctx, batched=True, backend=_backend(queue))
        queue.fault_at(uapi.address(ctx.dst.array) + 5 * PAGE)
        session.sample(2)
        assert _copied(ctx) and session.info["page_fault_resubmits"] == 1
        assert session.mcomps[:, 0].sum() == 0  # failed members' records cleared for reuse
        session.close()


def test_shared_queue_full_means_retry():
    with SoftWorkQueue(mode="shared", size=2, delay_s=0.002) as queue:
        ctx = _ctx("8x256B", {"qd": "8"})
        session = DsaSession(ctx, batched=False, backend=_backend(queue))
        session.sample(1)
        assert _copied(ctx) and session.info["enqcmd_retries"] > 0
        session.close()


@pytest.mark.parametrize("params, batched, message", [
    ({"qd": "0"}, False, "qd=0 is out of range"),
    ({"qd": "x"}, False, "qd='x' is not a whole number"),
    ({"qd": "64"}, False, "exceeds the 16 entries of dedicated WQ"),
    ({"batch": "1"}, True, "batch=1 is out of range"),
    ({"batch": "64"}, True, "exceeds wq0.0's max batch size 32"),
    ({"wait": "sleep"}, False, "valid are spin, pause, umwait"),
    ({"depth": "2"}, False, "unknown DSA parameter 'depth'"),
    ({"batch": "4"}, False, "unknown DSA parameter 'batch'"),
])
def test_bad_parameters_are_usage_errors(params, batched, message):
    with SoftWorkQueue() as queue, pytest.raises(UsageError, match=message):
        DsaSession(_ctx("4KiB", params), batched=batched, backend=_backend(queue))


def test_bof_needs_a_wq_that_allows_it():
    with SoftWorkQueue() as queue, pytest.raises(UsageError, match="block_on_fault=1"):
        backend = _backend(queue)
        backend.block_on_fault = False
        DsaSession(_ctx("4KiB", {"bof": "1"}), batched=False, backend=backend)


def test_a_full_shared_queue_gives_up_after_the_timeout():
    with SoftWorkQueue(mode="shared", size=0) as queue:  # never a free entry
        desc = uapi.descriptors(1)
        gave_up = driver.submit(soft_push, np.uint64(queue.portal), np.uint64(uapi.address(desc)),
                                np.uint64(10**6))
        assert gave_up == driver.GAVE_UP
        ctx = _ctx("4KiB", {})
        ctx.tsc_hz = 1e6  # a 2 s timeout becomes 2e6 ticks (about a millisecond)
        session = DsaSession(ctx, batched=False, backend=_backend(queue))
        with pytest.raises(RuntimeError, match="never accepted"):
            session.sample(1)


def test_a_lost_completion_times_out():
    with SoftWorkQueue() as queue:
        ctx = _ctx("4KiB", {})
        ctx.tsc_hz = 1e6
        session = DsaSession(ctx, batched=False, backend=_backend(queue))
        session.top[0]["completion_addr"] += 8  # misaligned: the device writes no record
        with pytest.raises(RuntimeError, match="no completion within the timeout"):
            session.sample(1)
        deadline = time.monotonic() + 10
        while not queue.errors and time.monotonic() < deadline:
            time.sleep(0.01)  # the device thread may not have run yet
        assert "not 32-byte aligned" in queue.errors[0]


def test_umwait_is_refused_without_waitpkg():
    with SoftWorkQueue() as queue, pytest.raises(RuntimeError, match="waitpkg"):
        DsaSession(_ctx("4KiB", {"wait": "umwait"}), batched=False, backend=_backend(queue))


def test_pushes_are_refused_without_their_cpu_flag():
    with pytest.raises(RuntimeError, match="movdir64b"):
        portal.push_for("dedicated", lambda flag: False)
    with pytest.raises(RuntimeError, match="enqcmd"):
        portal.push_for("shared", lambda flag: False)


COMPILE_ONLY = """
from numba import types, typeof
from nearlocal.dsa.kernels import portal as P
u64, arr = types.uint64, types.Array(types.uint64, 1, "C")
P.push_movdir64b.compile((types.UniTuple(u64, 2),))
P.push_enqcmd.compile((types.UniTuple(u64, 2),))
P.wait_umwait.compile((u64, u64, arr))
text = "".join(t for f in (P.push_movdir64b, P.push_enqcmd, P.wait_umwait)
               for t in f.inspect_asm().values())
print(" ".join(i for i in ("movdir64b", "enqcmd", "umonitor", "umwait") if i in text))
P.run_copies.compile((typeof(P.push_enqcmd), typeof(P.wait_umwait), u64, u64, u64, types.int64,
                      u64, u64, types.Array(types.int64, 1, "C"), u64, u64, types.int64, u64,
                      arr, types.Array(types.uint64, 2, "C"), arr, arr))
print("compiled")
"""


def test_hardware_instructions_compile_for_a_cpu_that_has_them(tmp_path):
    """Compiled (never run) for Sapphire Rapids in a child process, so this box's LLVM target
    stays untouched; the assembly holds the real instructions."""
    env = {**os.environ, "NUMBA_CPU_NAME": "sapphirerapids",
           "NUMBA_CPU_FEATURES": "+movdir64b,+enqcmd,+waitpkg", "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", COMPILE_ONLY], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0].split() == ["movdir64b", "enqcmd", "umonitor", "umwait"]
    assert "compiled" in proc.stdout
