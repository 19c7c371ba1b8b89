"""The single-writer / multi-reader record store: whole records or a fallback, never a torn one;
owner loss found through the lease; readers bounded by their timeout; repairs by the next owner;
and the fault run (hundreds of writer kills) with its `nearlocal faults` front end."""

import ast
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.kernels.cpu import tsc_now
from nearlocal.kernels.timer import calibrate_tsc_hz
from nearlocal.rpc import faults
from nearlocal.rpc import records as rec
from nearlocal.rpc.faults import FaultConfig, run_faults
from nearlocal.rpc.kernels import records as krec

pytestmark = pytest.mark.cpu
OK = rec.OUTCOMES[krec.READ_OK]
STALE = rec.OUTCOMES[krec.FALLBACK_STALE]
TIMEOUT = rec.OUTCOMES[krec.FALLBACK_TIMEOUT]
CORRUPT = rec.OUTCOMES[krec.FALLBACK_CORRUPT]


@pytest.fixture(scope="module")
def tsc_hz() -> float:
    return calibrate_tsc_hz(0.03)


def make_store(protocol: str, lease_s: float, tsc_hz: float, records: int = 8,
               record_bytes: int = 4096):
    layout = rec.Layout(records, record_bytes, 2, 8)
    raw = np.zeros(layout.nbytes + 64, np.uint8)
    raw = raw[(-raw.ctypes.data) % 64:][:layout.nbytes]
    words = rec.init_store(raw, layout, int(lease_s * tsc_hz), protocol)
    return rec.RecordStore(raw, layout, protocol), raw, words


def content(index: int, version: int, nwords: int) -> bytes:
    return np.array([krec.content_word(index, version, w) for w in range(nwords)],
                    np.uint64).tobytes()


@pytest.mark.parametrize("protocol", ["coherent", "flush"])
def test_records_read_back_whole(protocol, tsc_hz):
    store, _, _ = make_store(protocol, 10, tsc_hz)
    store.write(3, 7, 1)
    outcome, version, payload = store.read(3, int(tsc_hz))
    assert (outcome, version) == (OK, 7)
    assert payload == content(3, 7, 512)
    assert store.read(2, int(tsc_hz))[:2] == (OK, 1)  # written by init at version 1
    assert store.counters()["torn_reads"] == 0


def test_in_progress_record_with_live_owner_times_out_not_hangs(tsc_hz):
    """A record left odd while the owner's lease holds: the reader gives up at its timeout."""
    store, raw, words = make_store("flush", 10, tsc_hz)
    krec.writer_run(raw, words, 1, 0, 1, 1, 0)  # an owner (epoch 1) with a fresh heartbeat
    store.set_header_word(4, krec.H_SEQ, store.header_word(4, krec.H_SEQ) | 1)
    timeout_ticks = int(0.2 * tsc_hz)
    outcome, _, payload = store.read(4, timeout_ticks)  # it returns: no hang
    assert (outcome, payload) == (TIMEOUT, None)
    counters = store.counters()
    assert counters["fallbacks_timeout"] == 1 and counters["retries"] > 0
    assert counters["stale_detections"] == 0  # the owner's lease holds: slow, not dead
    # it gave up at its timeout, not before (the read's own clock; how much later is the box's)
    assert counters["max_read_ticks"] > timeout_ticks


def test_dead_owner_is_detected_after_its_lease_and_its_record_recomputed(tsc_hz):
    lease_s = 0.05
    store, raw, words = make_store("flush", lease_s, tsc_hz)
    krec.writer_run(raw, words, 1, 0, 1, 1, 0)
    intent = store.writer_counters()["intent_index"]
    store.set_header_word(intent, krec.H_SEQ, store.header_word(intent, krec.H_SEQ) | 1)
    died = tsc_now()  # from here on nobody beats: the owner is gone mid-write
    outcome, _, payload = store.read(intent, int(10 * tsc_hz))
    assert (outcome, payload) == (STALE, None)  # long before the 10 s timeout
    counters = store.counters()
    assert counters["stale_detections"] == 1 and counters["stale_marked"] == 1
    # never judged before a lease has passed without a heartbeat (how much later: the box's)
    assert store.detection_ticks(0, 1) - died > int(lease_s * tsc_hz)
    # other records stay readable while the owner is dead
    other = (intent + 1) % store.layout.records
    assert store.read(other, int(tsc_hz))[0] == OK


def test_next_owner_invalidates_retries_and_repairs(tsc_hz):
    store, raw, words = make_store("coherent", 0.05, tsc_hz)
    krec.writer_run(raw, words, 1, 0, 0, 3, 0)
    intent = store.writer_counters()["intent_index"]
    version = store.header_word(intent, krec.H_VERSION)
    store.set_header_word(intent, krec.H_SEQ, store.header_word(intent, krec.H_SEQ) + 1)  # cut
    broken = (intent + 1) % store.layout.records
    store.set_header_word(broken, krec.H_CHECKSUM, store.header_word(broken, krec.H_CHECKSUM) ^ 4)
    outcome, _, payload = store.read(broken, int(tsc_hz))
    assert (outcome, payload) == (CORRUPT, None)
    assert store.counters()["checksum_rejects"] == krec.CORRUPT_TRIES
    krec.writer_run(raw, words, 2, 0, 0, 1, 0)  # the next owner takes over
    writer = store.writer_counters()
    assert writer["epoch"] == 2
    assert writer["invalidated"] == 1 and writer["idempotent_retries"] == 1
    assert writer["repaired"] == 1
    for index in (intent, broken):
        outcome, got_version, payload = store.read(index, int(tsc_hz))
        assert outcome == OK and payload == content(index, got_version, 512)
    assert store.header_word(intent, krec.H_VERSION) >= version  # the same write, done again


def shm_leftovers(name: str) -> list[str]:
    """Anything nearlocal left in /dev/shm for the region name (the file or its temp file)."""
    return sorted(str(p) for p in Path("/dev/shm").glob(f"*{name}*"))


def test_fault_run_hundreds_of_kills_no_torn_reads(tsc_hz):
    """200 SIGKILLs at random points of the writers' loop, freezes past the lease, corrupted
    headers, two readers throughout. The test counts: no torn read, every owner loss detected by
    every reader, every kill that landed inside a write seen half-written by every reader, every
    frozen owner fenced. How late a detection came is the report's figure, not a verdict here
    (the grace is 60 s: a loaded box's late reader is not a fault), and the duration is a cap
    far beyond any box's run, so every kill is made."""
    name = f"nearlocal-test-faults-{os.getpid()}"
    config = FaultConfig(region=f"shm:{name}", kills=200, duration_s=3600,
                         lease_s=0.02, grace_s=60.0, records=32, record_bytes=16 * 1024)
    report = run_faults(config, tsc_hz)
    summary = {k: v for k, v in report.items() if k != "config"}
    assert report["writer_kills"] == 200 and report["stopped_early"] == "", summary
    assert report["torn_reads"] == 0 and report["torn_reads_returned"] == 0, summary
    assert report["missed_detections"] == 0, summary
    assert report["owners_lost"] == (report["writer_kills"] + report["freezes"]
                                     + report["lease_lapses"]), summary
    assert report["stale_detections"] == 2 * report["owners_lost"], summary  # every reader
    # a kill inside a write leaves its record half-written until the next owner: every reader
    # judged that owner lost with the record still so (marked stale), whenever the kill landed
    assert report["stale_marked"] >= 2 * report["kills_mid_write"], summary
    # every frozen owner fenced itself, and no owner began a write after a reader judged it lost
    assert report["freezes"] > 0, summary
    assert report["writers_fenced_after_freeze"] == report["freezes"], summary
    assert report["frozen_writers_killed"] == 0 and report["writes_after_loss"] == 0, summary
    assert report["idempotent_retries"] <= report["invalidated"], summary  # each after its own
    assert report["reads_ok"] > 0 and report["fallbacks"] > 0, summary
    assert report["header_corruptions"] > 0 and report["checksum_rejects"] > 0, summary
    assert report["writes_attempted"] >= report["writes_completed"] > 0, summary
    # the verdict is these counts and the lateness bound (a figure of the box, not asserted)
    assert report["passed"] == (report["detections_late"] == 0), summary
    assert shm_leftovers(name) == []


def _shared_store(protocol: str, lease_s: float, tsc_hz: float, records: int = 4,
                  record_bytes: int = 64 * 1024):
    """A store in shared anonymous memory, so a forked writer's stores are the parent's too."""
    import mmap

    layout = rec.Layout(records, record_bytes, 1, 8)
    memory = mmap.mmap(-1, layout.nbytes + 64)  # MAP_SHARED
    raw = np.frombuffer(memory, np.uint8)
    raw = raw[(-raw.ctypes.data) % 64:][:layout.nbytes]
    words = rec.init_store(raw, layout, int(lease_s * tsc_hz), protocol)
    return rec.RecordStore(raw, layout, protocol), raw, words


def _stop_inside_a_write(store: rec.RecordStore, raw, words, protocol: int) -> tuple[int, int]:
    """A writer stopped (SIGSTOP, waited for) at a moment it is inside a write, its record's
    sequence odd: (pid, epoch). At each other moment it is let go and stopped again; one that
    fenced itself meanwhile (a box that starved it past its lease) is followed by a new owner."""
    epoch, writer, stops = 0, None, 0
    while stops < 10_000:
        if writer is None:
            epoch += 1
            writer = faults._child(lambda epoch=epoch: krec.writer_run(raw, words, epoch, epoch,
                                                                      protocol, 0, 0))
            while store.writer_counters()["writes_completed"] == 0 and \
                    os.waitpid(writer, os.WNOHANG) == (0, 0):
                time.sleep(0.001)  # it starts, takes over, writes its first record
        os.kill(writer, signal.SIGSTOP)
        stops += 1
        _, status = os.waitpid(writer, os.WUNTRACED)
        if not os.WIFSTOPPED(status):  # fenced: it exited on its own
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == krec.WRITER_FENCED, status
            writer = None
            continue
        counters = store.writer_counters()
        if counters["epoch"] == epoch and store.in_progress(counters["intent_index"]):
            return writer, epoch
        os.kill(writer, signal.SIGCONT)
    os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    pytest.fail("the writer was never stopped inside a write")


@pytest.mark.parametrize("protocol", ["coherent", "flush"])
def test_a_writer_killed_inside_a_write_is_detected_and_its_write_redone(protocol, tsc_hz):
    """A kill made to land inside a write (the writer stopped there first, then SIGKILLed): the
    reader never returns the half-written record, judges the owner lost once its lease has run
    out and falls back (stale); the other records read whole meanwhile; the next owner
    invalidates the record and writes it again at the version the dead owner meant."""
    lease_s = 0.2
    store, raw, words = _shared_store(protocol, lease_s, tsc_hz)
    code = store.protocol
    writer, epoch = _stop_inside_a_write(store, raw, words, code)
    intent = store.writer_counters()["intent_index"]
    meant = int(krec.read_flag(raw, words, krec.W_INTENT_VERSION, code))
    os.kill(writer, signal.SIGKILL)  # the kill lands with the write half done
    assert os.WIFSIGNALED(os.waitpid(writer, 0)[1])
    assert store.in_progress(intent)
    outcome, _, payload = store.read(intent, int(60 * tsc_hz))
    assert (outcome, payload) == (STALE, None)  # detected, not timed out
    counters = store.counters()
    assert counters["stale_detections"] == 1 and counters["stale_marked"] == 1
    assert counters["torn_reads"] == 0 and counters["torn_reads_returned"] == 0
    assert store.detection_ticks(0, epoch) > 0
    for index in range(store.layout.records):
        if index != intent:
            got, version, payload = store.read(index, int(tsc_hz))
            assert got == OK and payload == content(index, version, store.layout.payload_words)
    assert krec.writer_run(raw, words, epoch + 1, 0, code, 0, 1) == krec.WRITER_DONE  # take over
    writer_counters = store.writer_counters()
    assert writer_counters["invalidated"] == 1 and writer_counters["idempotent_retries"] == 1
    outcome, version, payload = store.read(intent, int(tsc_hz))
    assert (outcome, version) == (OK, meant)
    assert payload == content(intent, meant, store.layout.payload_words)
    assert store.counters()["torn_reads"] == 0


def test_negative_control_without_the_sequence_recheck_reports_torn_reads(tsc_hz, monkeypatch):
    """A fault test that cannot fail proves nothing: with the readers' sequence re-check removed
    (the test-only `recheck=False`), the same run must report torn reads and fail. No header is
    corrupted here, so every checksum reject is a tear the checksum caught."""
    real = krec.reader_run
    monkeypatch.setattr(krec, "reader_run", lambda *args: real(*args[:-1], False))  # forked too
    name = f"nearlocal-test-faults-neg-{os.getpid()}"
    config = FaultConfig(region=f"shm:{name}", kills=30, duration_s=20, lease_s=0.02,
                         grace_s=0.3, records=2, record_bytes=16 * 1024, corrupt_every=0)
    report = run_faults(config, tsc_hz)
    summary = {k: v for k, v in report.items() if k != "config"}
    assert report["torn_reads"] > 0 and not report["passed"], summary
    assert report["torn_reads_returned"] == 0, summary  # the checksum still refuses them
    assert shm_leftovers(name) == []


def test_self_fencing_counts_from_the_last_heartbeat_not_the_last_look(tsc_hz):
    """The flaky-test cause: the owner measured its lapse from its last look at the clock, so a
    write slowed down after a heartbeat, then a freeze, left a gap shorter than the lease while a
    reader had already judged the owner lost; thawed, it went on writing. Now any write check or
    heartbeat more than a lease after the last heartbeat fails, however recent the last look."""
    lease_s = 0.2
    store, raw, words = make_store("flush", lease_s, tsc_hz)
    lease = words[krec.C_LEASE]
    epoch = 0
    while True:  # a take-over preempted past its lease fences itself: take over again
        epoch += 1
        clock = np.array([tsc_now()], np.uint64)
        if krec.take_over(raw, words, epoch, 1, clock):
            break
        assert epoch < 5
    checked = store.writer_counters()["write_check_ticks"]
    renewed = clock[0]
    time.sleep(lease_s / 2)
    krec._lease_held(clock, lease)  # a look at the clock after the heartbeat...
    assert clock[0] == renewed  # ...does not move the lease's start
    deadline = time.monotonic() + 10
    while not store.detection_ticks(0, epoch):  # a reader judges the silent owner lost
        assert store.read(0, int(tsc_hz))[0] == OK  # whole records stay readable meanwhile
        assert time.monotonic() < deadline
    beat = store.writer_counters()["heartbeat"]
    assert not krec._may_write(raw, words, clock, lease, 1)
    assert not krec._beat(raw, words, clock, lease, 1)
    after = store.writer_counters()
    assert after["write_check_ticks"] == checked and after["heartbeat"] == beat
    assert krec.writer_run(raw, words, epoch + 1, 0, 1, 1, 0) in (krec.WRITER_DONE,
                                                               krec.WRITER_FENCED)


def test_writer_kernels_read_shared_words_only_through_invalidation():
    """Under protocol=flush the owner's lines and record headers may have been written last by a
    previous owner on another host: writer-side kernels read them with read_flag (invalidate,
    then load), never with a plain load; only the immutable setup line (C_*) is read plainly
    (take_over, not listed, reads a header or payload plainly only right after invalidating it).
    The in-place initialisers flush their cached stores before publishing."""
    for function in (krec.write_record, krec._invalidate_record, krec._count, krec._beat,
                     krec._may_write, krec.writer_run):
        tree = ast.parse(inspect.getsource(function.py_func))
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    node.value.id == "words":
                index = ast.unparse(node.slice)
                assert isinstance(node.ctx, ast.Load), f"{function.__name__}: store {index}"
                assert index.startswith("C_"), f"{function.__name__}: plain load of {index}"
    from nearlocal.rpc import slots

    for function in (rec.init_store, slots.init_ring):
        source = inspect.getsource(function)
        last_store = max(i for i, line in enumerate(source.splitlines())
                         if line.strip().startswith(("words[", "raw[:]")))
        flush = [i for i, line in enumerate(source.splitlines()) if "flush_written(" in line]
        assert flush and flush[0] > last_store, function.__name__


def test_faults_command(capsys, tmp_path):
    from nearlocal.frontends.cli import main

    name = f"nearlocal-test-faults-cli-{os.getpid()}"
    junit = tmp_path / "faults.xml"
    assert main(["faults", "--kills", "3", "--lease", "30ms", "--grace", "60s",
                 "--region", f"shm:{name}", "--records", "8", "--json", "--junit",
                 str(junit)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["writer_kills"] == 3 and report["torn_reads"] == 0 and report["passed"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == str(len(faults.CHECKS)) and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == [n for n, _ in faults.CHECKS]
    assert main(["faults", "--region", f"shm:{name}", "--junit", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--junit" in err and err.count("\n") == 1  # refused before the run
    for bad in (["--kills", "0"], ["--lease", "soon"], ["--readers", "0"],
                ["--record-size", "100"], ["--lease", "50ms", "--read-timeout", "10ms"],
                ["--records", "100000000000"], ["--kills", "100000000000"],
                ["--record-size", "1PiB"]):
        assert main(["faults", "--region", f"shm:{name}", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, (bad, err)
    assert shm_leftovers(name) == []  # refused before anything was created


def test_faults_junit_fails_the_checks_that_did_not_hold():
    """A case per check (rpc/faults.py CHECKS), failed where its count is not 0; the terminal
    names the failed one."""
    from nearlocal.rpc.commands import FAULTS_FORMATS

    counts = {count: 0 for _, count in faults.CHECKS} | {"missed_detections": 2}
    report = {"config": {"region": "shm:x", "protocol": "flush", "kills": 3}, "elapsed_s": 1.0,
              "stopped_early": "", "checks": [{"check": n, "count": c, "value": counts[c],
                                               "passed": counts[c] == 0}
                                              for n, c in faults.CHECKS]}
    root = ET.fromstring(FAULTS_FORMATS["junit"].report(report).split("?>", 1)[1])
    failed = {c.get("name"): c.find("failure") for c in root.iter("testcase")}
    assert [n for n, f in failed.items() if f is not None] == ["every owner loss detected"]
    assert failed["every owner loss detected"].get("message") == "missed_detections = 2"


def test_store_larger_than_the_filesystem_is_refused_before_creating_it(tsc_hz, monkeypatch, capsys):
    """A full tmpfs is not an error at creation but a SIGBUS when the pages are first touched,
    which kills the process and strands the file: the region's own capacity check runs first
    (here a statvfs, as the region provider sees it, that reports 1 MiB free stands in for a small
    tmpfs)."""
    from nearlocal.frontends.cli import main
    from nearlocal.regions import host

    real = os.statvfs

    class Small:
        f_bavail, f_frsize = 256, 4096

    monkeypatch.setattr(host.os, "statvfs",
                        lambda path: Small() if str(path) == "/dev/shm" else real(path))
    name = f"nearlocal-test-faults-full-{os.getpid()}"
    with pytest.raises(UsageError, match="the file system of /dev/shm has 1MiB free"):
        run_faults(FaultConfig(region=f"shm:{name}", records=64, kills=1), tsc_hz)
    assert shm_leftovers(name) == []
    assert main(["faults", "--region", f"shm:{name}", "--kills", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1MiB free" in err and "Traceback" not in err, err
    assert shm_leftovers(name) == []


def test_store_room_counts_the_memfd_copy_of_a_private_region(monkeypatch):
    """dram and numa:N are shared through a memfd copy in the same memory (two copies there); a
    shared mapping (shm:, file:, devdax:) holds the one store, and a devdax pool is not limited by
    free DRAM at all."""
    from nearlocal.regions import parse_region

    asked = []
    monkeypatch.setattr("nearlocal.regions.check_capacity",
                        lambda spec, size: asked.append((spec.text, size)))
    for text in ("dram", "numa:1", "shm:x", "file:/tmp/x", "devdax:/dev/dax0.0", "dram:2M"):
        faults._check_room(parse_region(text), 1000)
    assert asked == [("dram", 2000), ("numa:1", 2000), ("shm:x", 1000), ("file:/tmp/x", 1000),
                     ("devdax:/dev/dax0.0", 1000), ("dram:2M", 1000), ("dram", 1000)]


def test_signal_landing_inside_fork_is_not_lost():
    """An interrupt handled inside os.fork()'s at-fork callbacks is swallowed by CPython; the
    fault run noted none of the Ctrl-Cs that landed there and ran on to its full duration."""
    armed = [True]

    def interrupt_inside_fork() -> None:
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)

    os.register_at_fork(after_in_parent=interrupt_inside_fork)
    # under a shell's background job (nohup, `&`) SIGINT starts ignored, and the re-delivered
    # signal would be ignored too: this test is about Ctrl-C as an interactive run gets it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        signals = faults.StopSignals()
        with pytest.raises(KeyboardInterrupt), signals:  # re-delivered once the run cleaned up
            child = faults._child(lambda: 0)
            status = os.waitpid(child, 0)[1]
            pending = signals.pending
            interrupted = False
            try:
                signals.check()
            except faults._Interrupted:
                interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not armed and pending == signal.SIGINT and interrupted
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the process"])
def test_faults_interrupted_cleans_up(how, tmp_path):
    """Ctrl-C (SIGINT to the whole process group) or SIGTERM: exit at once, the shm file and
    every child gone, one line and no traceback."""
    name = f"nearlocal-test-faults-int-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(
        [sys.executable, "-m", "nearlocal.frontends.cli", "faults", "--region", f"shm:{name}",
         "--kills", "100000", "--duration", "60s", "--records", "8"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not Path(f"/dev/shm/{name}").exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # writers coming and going
        if how == "ctrl-c to the group":
            os.killpg(process.pid, signal.SIGINT)
        else:
            os.kill(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    err = err.decode()
    assert "Traceback" not in err, err
    if how == "ctrl-c to the group":
        assert process.returncode == 130 and err.strip() == "nearlocal: interrupted"
    else:
        assert process.returncode in (-signal.SIGTERM, 130, 143), (process.returncode, err)
    assert shm_leftovers(name) == []
    with pytest.raises(ProcessLookupError):  # no reader or writer left behind
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)
            time.sleep(0.05)


def test_fault_config_rejects_bad_input():
    with pytest.raises(UsageError):
        FaultConfig(protocol="psychic").check()
    with pytest.raises(UsageError):
        rec.Layout(4, 100, 1, 1)
