"""RPC slots: requests and responses carry the right bytes, in one process and between processes;
the server never outlives its client; the rpc suite stores round-trip and throughput rows."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.rpc import slots
from nearlocal.rpc.kernels import slots as kslots
from nearlocal.rpc.methods import parse_rpc_pattern
from nearlocal.rpc.protocols import protocol_code

pytestmark = pytest.mark.cpu
TSC_HZ = 1e9  # only scales timeouts here
PROTOCOLS = ("coherent", "flush")


def aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 64, np.uint8)
    return raw[(-raw.ctypes.data) % 64:][:nbytes]


def expected_request(seq: int, words: int) -> np.ndarray:
    """Independent of the kernels: the request payload of sequence `seq`, in Python integers."""
    return np.array([(seq * 0x9E3779B97F4A7C15 % 2**64) ^ j for j in range(words)], np.uint64)


def expected_response(seq: int, words: int) -> np.ndarray:
    request = [int(v) for v in expected_request(seq, words)]
    rotated = [((v << 17) | (v >> 47)) % 2**64 for v in request]
    return np.array([v ^ 0xA5A5F00DCAFEBEEF for v in rotated], np.uint64)


def slot_words(words: np.ndarray, slots_n: int, message_bytes: int, k: int):
    msg_words, per_slot, _ = slots.layout(slots_n, message_bytes)
    base = kslots.HEADER_WORDS + (k % slots_n) * per_slot
    half = per_slot // 2
    return (words[base + 8:base + 8 + msg_words], words[base + half + 8:base + half + 8 + msg_words],
            int(words[base]), int(words[base + half]))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("message_bytes", [8, 64, 200])
def test_single_process_round_trip_bytes(protocol, message_bytes):
    slots_n = 4
    msg_words, _, ring_bytes = slots.layout(slots_n, message_bytes)
    raw = aligned(ring_bytes)
    words = slots.init_ring(raw, slots_n, message_bytes, protocol)
    code = protocol_code(protocol)
    k = 0
    for k in range(6):  # wraps the ring
        kslots.post(raw, words, slots_n, msg_words, k, code)
        assert kslots.serve(raw, words, slots_n, msg_words, code, k, np.uint64(10**9), 1) == \
            (k + 1, kslots.DONE)
        assert kslots.await_response(raw, words, slots_n, msg_words, k, code,
                                    np.uint64(10**9)) == kslots.OK
        request, response, req_seq, resp_seq = slot_words(words, slots_n, message_bytes, k)
        assert req_seq == resp_seq == k + 1
        assert np.array_equal(request, expected_request(k + 1, msg_words))
        assert np.array_equal(response, expected_response(k + 1, msg_words))
    assert words[kslots.W_BAD] == 0


def test_wrong_bytes_are_caught_both_ways():
    raw = aligned(slots.layout(2, 64)[2])
    words = slots.init_ring(raw, 2, 64, "coherent")
    kslots.post(raw, words, 2, 8, 0, 0)
    request, _, _, _ = slot_words(words, 2, 64, 0)
    request[3] ^= np.uint64(1)  # a flipped request bit: the server counts it
    kslots.serve(raw, words, 2, 8, 0, 0, np.uint64(10**9), 1)
    assert words[kslots.W_BAD] == 1
    _, response, _, _ = slot_words(words, 2, 64, 0)
    response[0] ^= np.uint64(1 << 40)
    assert kslots.await_response(raw, words, 2, 8, 0, 0, np.uint64(10**9)) == kslots.WRONG_BYTES


def test_client_times_out_without_a_server():
    raw = aligned(slots.layout(2, 64)[2])
    words = slots.init_ring(raw, 2, 64, "flush")
    samples = np.zeros(1, np.uint64)
    start = time.monotonic()
    status = kslots.time_roundtrip(raw, words, 2, 8, 1, np.zeros(1, np.int64), samples,
                                  np.uint64(0.05 * 2.0e9))
    assert status == kslots.TIMEOUT
    assert time.monotonic() - start < 5


def test_bad_ring_and_pattern_input():
    with pytest.raises(UsageError, match="multiple of 8"):
        slots.layout(4, 65)
    with pytest.raises(UsageError, match="at least one slot"):
        slots.layout(0, 64)
    with pytest.raises(UsageError, match="protocol"):
        protocol_code("magic")
    with pytest.raises(UsageError, match="rpc:SLOTSxSIZE"):
        parse_rpc_pattern("rpc:64B")
    pattern = parse_rpc_pattern("rpc:128x64B")
    assert pattern.axes == {"message_bytes": 64, "slots": 128}
    assert pattern.src_span == slots.layout(128, 64)[2]  # the region holds the whole ring
    assert pattern.count == 256 and pattern.fragment_bytes == 64


def test_bad_rpc_parameters_are_usage_errors():
    from nearlocal.rpc.methods import _pick_cpus, int_param

    with pytest.raises(UsageError, match="qd='many' is not a whole number"):
        int_param({"qd": "many"}, "qd", 1)
    assert int_param({"client_cpu": "auto"}, "client_cpu", 3) == 3
    allowed = sorted(os.sched_getaffinity(0))
    with pytest.raises(UsageError, match=r"client_cpu=\d+ is not a CPU this process may run on"):
        _pick_cpus({"client_cpu": str(max(allowed) + 1000)})
    with pytest.raises(UsageError, match="need two different CPUs"):
        _pick_cpus({"client_cpu": str(allowed[0]), "server_cpu": str(allowed[0])})


def test_bad_rpc_parameter_values_are_refused_before_the_run():
    from nearlocal.core.cases import Case, validate
    from nearlocal.probe import probe

    inventory = probe(calibrate=False, gpu=False)
    for method, params, message in (("rpc-throughput", (("qd", "x"),), "qd='x'"),
                                    ("rpc-roundtrip", (("protocol", "psychic"),), "protocol"),
                                    ("rpc-roundtrip", (("server_cpu", "last"),), "server_cpu")):
        with pytest.raises(UsageError, match=message):
            validate(Case(method, "shm:x", "wb", "rpc:8x64B", params=params), inventory)


def test_an_rpc_method_without_an_rpc_pattern_is_a_usage_error(tmp_path, capsys):
    """A plain size (or any pattern that is not rpc:SLOTSxSIZE) is bad input: exit 2, one line,
    before anything runs, not a failed row per case."""
    from nearlocal.frontends.cli import main

    name = f"nearlocal-test-rpc-size-{os.getpid()}"
    for method in ("rpc-roundtrip", "rpc-throughput"):
        assert main(["run", "--method", method, "--region", f"shm:{name}", "--size", "64KiB",
                     "--out", str(tmp_path), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "rpc:SLOTSxSIZE" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir()) and not list(Path("/dev/shm").glob(f"*{name}*"))


def shm_region(tag: str, nbytes: int):
    from nearlocal.regions import parse_region, region_kind

    spec = parse_region(f"shm:nearlocal-test-rpc-{tag}-{os.getpid()}")
    return region_kind(spec).open(spec, nbytes, "wb", False)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_process_round_trip_and_throughput(protocol):
    from nearlocal.rpc.shared import share

    slots_n, message_bytes = 16, 64
    msg_words, _, ring_bytes = slots.layout(slots_n, message_bytes)
    region = shm_region(protocol, ring_bytes)
    shared = share(region, ring_bytes)
    raw = shared.array
    words = slots.init_ring(raw, slots_n, message_bytes, protocol)
    code = protocol_code(protocol)
    cpus = sorted(os.sched_getaffinity(0))
    server = slots.ServerProcess(shared.handle, words, raw, slots_n, message_bytes, protocol,
                                 cpus[-1], 2.0e9)
    process = server.process
    try:
        state = np.zeros(1, np.int64)
        ticks = np.zeros(50, np.uint64)
        timeout = np.uint64(20 * 2.0e9)
        assert kslots.time_roundtrip(raw, words, slots_n, msg_words, code, state, ticks,
                                    timeout) == kslots.OK
        assert state[0] == 50 and (ticks > 0).all()
        last = int(state[0]) - 1
        request, response, _, resp_seq = slot_words(words, slots_n, message_bytes, last)
        assert np.array_equal(request, expected_request(last + 1, msg_words))
        assert resp_seq == last + 1
        assert np.array_equal(response, expected_response(last + 1, msg_words))
        batches = np.zeros(3, np.uint64)
        assert kslots.time_throughput(raw, words, slots_n, msg_words, code, state, 8, 64,
                                     batches, timeout) == kslots.OK
        done = int(state[0])  # 3 batches of 64, plus what was in flight, drained untimed
        assert 50 + 3 * 64 <= done < 50 + 3 * 64 + 8
        _, response, req_seq, resp_seq = slot_words(words, slots_n, message_bytes, done - 1)
        assert req_seq == resp_seq == done  # every request posted was answered
        assert np.array_equal(response, expected_response(done, msg_words))
        assert server.bad_requests() == 0
    finally:
        server.stop()
        shared.close()
        region.close()
    assert process.poll() is not None  # stopped, not orphaned
    assert not Path(f"/dev/shm/nearlocal-test-rpc-{protocol}-{os.getpid()}").exists()


def test_server_dies_with_its_client(tmp_path):
    """A client killed with SIGKILL takes its server with it (parent-death signal)."""
    script = textwrap.dedent(f"""
        import numpy as np, os, sys, time
        from nearlocal.rpc import slots
        from nearlocal.rpc.shared import share
        from nearlocal.regions import parse_region, region_kind
        spec = parse_region("dram")
        region = region_kind(spec).open(spec, slots.layout(2, 64)[2], "wb", True)
        shared = share(region, slots.layout(2, 64)[2])
        words = slots.init_ring(shared.array, 2, 64, "coherent")
        server = slots.ServerProcess(shared.handle, words, shared.array, 2, 64, "coherent",
                                     None, 2.0e9)
        open({str(tmp_path / "pid")!r}, "w").write(str(server.process.pid))
        time.sleep(60)
    """)
    client = subprocess.Popen([sys.executable, "-c", script])
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    server_pid = int(pid_file.read_text())
    os.kill(client.pid, signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server_pid}").exists():
        status = Path(f"/proc/{server_pid}/stat").read_text().split()[2] \
            if Path(f"/proc/{server_pid}/stat").exists() else "X"
        if status == "Z":
            break  # dead, waiting for init to reap it
        assert time.monotonic() < deadline, "the server outlived its client"
        time.sleep(0.05)


def test_rpc_suite_stores_round_trip_and_throughput_rows(tmp_path, monkeypatch):
    from nearlocal.core.methods import get_method
    from nearlocal.frontends.cli import main
    from nearlocal.rpc import methods as rpc_methods
    from nearlocal.store import load

    # the suite's fixed shm:nearlocal-rpc would collide with a concurrent run (another pytest, a
    # user's `nearlocal run --suite rpc`): this test's cases get a name of their own
    region = f"shm:nearlocal-rpc-test-{os.getpid()}"
    monkeypatch.setattr(rpc_methods, "SUITE_REGION", region)
    assert main(["run", "--suite", "rpc", "--budget", "0.01", "--out", str(tmp_path),
                 "--quiet"]) == 0
    cases = load(None, tmp_path).cases
    assert set(cases["status"]) == {"ok"}, cases[["case_id", "reason"]].to_string()
    # a param at the method's default is not stored (it is the same case as no param)
    effective = [{**get_method(m).params, **json.loads(p or "{}")}
                 for m, p in zip(cases["method"], cases["params"], strict=True)]
    cases["protocol"] = [p["protocol"] for p in effective]
    cases["qd"] = [p.get("qd") for p in effective]
    round_trip = cases[cases["method"] == "rpc-roundtrip"]
    throughput = cases[cases["method"] == "rpc-throughput"]
    assert sorted(round_trip["protocol"]) == ["coherent", "flush"]
    assert sorted(zip(throughput["protocol"], throughput["qd"].astype(int), strict=True)) == \
        [(p, q) for p in ("coherent", "flush") for q in (1, 8, 32, 128)]
    assert (cases["region"] == region).all()
    assert not list(Path("/dev/shm").glob(f"*{region[4:]}*"))  # removed after the run
    assert (cases["median_ns"] > 0).all()
    assert (cases["bytes_moved"] == 2 * 64).all()  # a sample is one 64 B request and its reply


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no pidfd (Linux < 5.3)"])
def test_a_launched_server_tells_when_its_client_has_exited(monkeypatch, pidfd):
    """What a server forked from the fork server (not the client's child) watches: false while
    the client runs, true once it has exited; on a kernel without pidfd_open, alike."""
    if not pidfd:
        def no_pidfd(pid, flags=0):
            raise OSError(errno.ENOSYS, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = slots.watch_process(client.pid)
        assert gone is not None and not gone()
    finally:
        client.kill()
        client.wait()
    assert gone()
    assert slots.watch_process(client.pid) is None  # reaped: no such process
