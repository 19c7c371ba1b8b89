"""The single-writer / multi-reader record store: whole records or a fallback, never a torn one;
owner loss found through the lease; readers bounded by their timeout; repairs by the next owner;
and the fault run (hundreds of writer kills) with its `nearlocal faults` front end."""

import json
import time

import numpy as np
import pytest

from nearlocal.errors import UsageError
from nearlocal.kernels.cpu import tsc_now
from nearlocal.kernels.timer import calibrate_tsc_hz
from nearlocal.rpc import records as rec
from nearlocal.rpc.faults import FaultConfig, run_faults

pytestmark = pytest.mark.cpu
OK = rec.OUTCOMES[rec.READ_OK]
STALE = rec.OUTCOMES[rec.FALLBACK_STALE]
TIMEOUT = rec.OUTCOMES[rec.FALLBACK_TIMEOUT]
CORRUPT = rec.OUTCOMES[rec.FALLBACK_CORRUPT]


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
    return np.array([rec.content_word(index, version, w) for w in range(nwords)],
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
    rec.writer_run(raw, words, 1, 0, 1, 1, 0)  # an owner (epoch 1) with a fresh heartbeat
    store.set_header_word(4, rec.H_SEQ, store.header_word(4, rec.H_SEQ) | 1)
    timeout_s = 0.2
    start = time.monotonic()
    outcome, _, payload = store.read(4, int(timeout_s * tsc_hz))
    elapsed = time.monotonic() - start
    assert (outcome, payload) == (TIMEOUT, None)
    assert timeout_s <= elapsed < timeout_s + 1.0  # the slack is for a preempted test process
    counters = store.counters()
    assert counters["fallbacks_timeout"] == 1 and counters["retries"] > 0
    assert counters["max_read_ticks"] / tsc_hz < timeout_s + 1.0


def test_dead_owner_is_detected_within_the_lease_and_its_record_recomputed(tsc_hz):
    lease_s = 0.05
    store, raw, words = make_store("flush", lease_s, tsc_hz)
    rec.writer_run(raw, words, 1, 0, 1, 1, 0)
    intent = store.writer_counters()["intent_index"]
    store.set_header_word(intent, rec.H_SEQ, store.header_word(intent, rec.H_SEQ) | 1)
    died = tsc_now()  # from here on nobody beats: the owner is gone mid-write
    outcome, _, payload = store.read(intent, int(10 * tsc_hz))
    assert (outcome, payload) == (STALE, None)  # long before the 10 s timeout
    counters = store.counters()
    assert counters["stale_detections"] == 1 and counters["stale_marked"] == 1
    detected_after_s = (store.detection_ticks(0, 1) - died) / tsc_hz
    assert lease_s <= detected_after_s < lease_s + 1.0
    # other records stay readable while the owner is dead
    other = (intent + 1) % store.layout.records
    assert store.read(other, int(tsc_hz))[0] == OK


def test_next_owner_invalidates_retries_and_repairs(tsc_hz):
    store, raw, words = make_store("coherent", 0.05, tsc_hz)
    rec.writer_run(raw, words, 1, 0, 0, 3, 0)
    intent = store.writer_counters()["intent_index"]
    version = store.header_word(intent, rec.H_VERSION)
    store.set_header_word(intent, rec.H_SEQ, store.header_word(intent, rec.H_SEQ) + 1)  # cut
    broken = (intent + 1) % store.layout.records
    store.set_header_word(broken, rec.H_CHECKSUM, store.header_word(broken, rec.H_CHECKSUM) ^ 4)
    outcome, _, payload = store.read(broken, int(tsc_hz))
    assert (outcome, payload) == (CORRUPT, None)
    assert store.counters()["checksum_rejects"] == rec.CORRUPT_TRIES
    rec.writer_run(raw, words, 2, 0, 0, 1, 0)  # the next owner takes over
    writer = store.writer_counters()
    assert writer["epoch"] == 2
    assert writer["invalidated"] == 1 and writer["idempotent_retries"] == 1
    assert writer["repaired"] == 1
    for index in (intent, broken):
        outcome, got_version, payload = store.read(index, int(tsc_hz))
        assert outcome == OK and payload == content(index, got_version, 512)
    assert store.header_word(intent, rec.H_VERSION) >= version  # the same write, done again


def test_fault_run_hundreds_of_kills_no_torn_reads(tsc_hz):
    """200 SIGKILLs inside writes, freezes past the lease, corrupted headers, two readers
    throughout. The grace is wide because this box's CPUs are shared with other jobs: it bounds
    how late a preempted reader may notice, the lease itself is 20 ms."""
    config = FaultConfig(region="shm:nearlocal-test-faults", kills=200, duration_s=28,
                         lease_s=0.02, grace_s=0.3, records=32, record_bytes=16 * 1024)
    report = run_faults(config, tsc_hz)
    assert report["torn_reads"] == 0
    assert report["writer_kills"] == 200 or (report["stopped_early"]
                                             and report["writer_kills"] >= 100)
    assert report["missed_detections"] == 0
    assert report["detections_late"] == 0, report["detect_ms"]
    assert report["stale_detections"] == 2 * report["owners_lost"]  # every reader, every owner
    assert report["owners_lost"] >= report["writer_kills"] + report["freezes"]
    assert report["kills_mid_write"] > report["writer_kills"] // 2
    assert report["freezes"] > 0 and report["writers_fenced_after_freeze"] == report["freezes"]
    assert report["frozen_writers_killed"] == 0
    assert report["invalidated"] > 0 and report["idempotent_retries"] > 0
    assert report["reads_ok"] > 0 and report["fallbacks"] > 0
    assert report["header_corruptions"] > 0 and report["checksum_rejects"] > 0
    assert report["writes_attempted"] >= report["writes_completed"] > 0
    assert report["passed"]


def test_faults_command(capsys):
    from nearlocal.cli import main

    assert main(["faults", "--kills", "3", "--lease", "30ms", "--grace", "300ms",
                 "--region", "shm:nearlocal-test-faults-cli", "--records", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["writer_kills"] == 3 and report["torn_reads"] == 0 and report["passed"]
    for bad in (["--kills", "0"], ["--lease", "soon"], ["--readers", "0"],
                ["--record-size", "100"], ["--lease", "50ms", "--read-timeout", "10ms"],
                ["--region", "shm:nearlocal-test-faults-huge", "--records", "100000000000"]):
        assert main(["faults", *bad]) == 2


def test_fault_config_rejects_bad_input():
    with pytest.raises(UsageError):
        FaultConfig(protocol="psychic").check()
    with pytest.raises(UsageError):
        rec.Layout(4, 100, 1, 1)
