"""Two kernels on one pool (the VM rig's pair stage, docs/vm-rig.md): guest A owns a record store
on a device-dax instance backed by a host file, guest B (another QEMU process mapping the same
file) reads it with the single-writer / multi-reader protocol (nearlocal/rpc/records.py); the
host kills A's QEMU by its PID while A is writing, and B must judge the owner lost with no torn
read. TCG is coherent and has no timing: this proves the protocol between two kernels, not speed.

    vm_pair.py writer DAX OUT      in guest A: set up the store, then write until killed
    vm_pair.py reader DAX OUT      in guest B: read until OUT/stop appears or its limit passes
    vm_pair.py check OUT_A OUT_B   on the host: the facts, one line each; exit 1 if one fails

A and B report through files in their OUT folders (the host's, shared over 9p)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from vm_lib import Facts, read_json

RECORDS, RECORD_BYTES = 8, 64 * 1024  # large records: a write is most of the writer's time
LEASE_S = 2.0  # TCG deschedules a vCPU for tens of ms; the lease outlasts that many times over
PROTOCOL = "flush"  # Beluga's: the two kernels' caches are treated as not coherent
READER_LIMIT_S = 600.0
AFTER_LOSS_S = 20.0  # B goes on reading this long after it judged A lost: nothing torn appears


def _write_json(path: Path, data: dict) -> None:
    from nearlocal.safeio import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(data).encode())  # the host never reads half a report


def _tsc_hz() -> float:
    """The guest's TSC rate against the monotonic clock (a full probe takes minutes under TCG)."""
    from nearlocal.kernels.timer import calibrate_tsc_hz

    return calibrate_tsc_hz(0.5)


def _open(dax: str, nbytes: int):
    from nearlocal.regions import parse_region, region_kind

    spec = parse_region(f"devdax:{dax}")
    return region_kind(spec).open(spec, nbytes, "wb", True)


def writer(dax: str, out: Path) -> int:
    from nearlocal.rpc import records as rec
    from nearlocal.rpc.kernels import records as krec
    from nearlocal.rpc.protocols import protocol_code

    layout = rec.Layout(RECORDS, RECORD_BYTES, readers=1, epochs=64)
    region = _open(dax, layout.nbytes)
    hz = _tsc_hz()
    raw = region.array[:layout.nbytes]
    words = rec.init_store(raw, layout, int(LEASE_S * hz), PROTOCOL)
    code = protocol_code(PROTOCOL)
    krec.writer_run(raw, words, 1, 0, code, 2, 0)  # compile before saying it writes
    _write_json(out / "writer.json", {"tsc_hz": hz, "lease_s": LEASE_S, "records": RECORDS,
                                      "record_bytes": RECORD_BYTES, "pid": os.getpid(),
                                      "writing": True})
    epoch = 2
    while True:  # until the host kills this guest; a fenced owner (a long TCG stall) takes over
        exit_code = krec.writer_run(raw, words, epoch, epoch, code, 0, 0)
        if exit_code == krec.WRITER_STOPPED:
            return 0
        epoch = min(epoch + 1, layout.epochs - 1)


def reader(dax: str, out: Path) -> int:
    import numpy as np

    from nearlocal.rpc import records as rec
    from nearlocal.rpc.kernels import records as krec
    from nearlocal.rpc.protocols import protocol_code

    layout = rec.Layout(RECORDS, RECORD_BYTES, readers=1, epochs=64)
    region = _open(dax, layout.nbytes)
    raw = region.array[:layout.nbytes]
    words = raw.view(np.uint64)
    hz = _tsc_hz()
    code = protocol_code(PROTOCOL)
    start = time.monotonic()
    store = rec.RecordStore(raw, layout, PROTOCOL)
    while int(words[krec.C_MAGIC]) != krec.MAGIC:  # A sets the store up first
        if time.monotonic() - start > READER_LIMIT_S:
            _write_json(out / "reader.json", {"final": True, "error": "no store appeared"})
            return 1
        time.sleep(0.2)
        store = rec.RecordStore(raw, layout, PROTOCOL)
    local, monitor = np.empty(layout.payload_words, np.uint64), np.zeros(4, np.int64)
    timeout = np.uint64(4 * LEASE_S * hz)
    lost_at = None
    beats: list[int] = []
    while True:
        krec.reader_run(raw, words, layout.reader_base(0), local, monitor, timeout,
                       np.uint64(0.5 * hz), code, True)
        counters = store.counters()
        writer_state = store.writer_counters()
        beats = [*beats[-9:], writer_state["heartbeat"]]
        if counters["stale_detections"] and lost_at is None:
            lost_at = time.monotonic()
        report = {**counters, "epoch": writer_state["epoch"], "heartbeats": beats,
                  "writes_completed": writer_state["writes_completed"],
                  "owner_lost_s": None if lost_at is None else round(lost_at - start, 2),
                  "elapsed_s": round(time.monotonic() - start, 2), "final": False}
        done = (lost_at is not None and time.monotonic() - lost_at > AFTER_LOSS_S) or \
            time.monotonic() - start > READER_LIMIT_S or (out / "stop").exists()
        report["final"] = done
        _write_json(out / "reader.json", report)
        if counters["reads_ok"] and len(set(beats)) > 1 and not (out / "reads-ok").exists():
            (out / "reads-ok").write_text("yes\n")  # B reads while A's heartbeat moves: kill A
        if done:
            return 0
        time.sleep(0.05)


def check(out_a: Path, out_b: Path) -> int:
    """The pair's facts from the two guests' reports; prints one line per fact."""
    fact = Facts()
    wrote, read = read_json(out_a / "writer.json"), read_json(out_b / "reader.json")
    kill = read_json(out_a / "killed.json")
    fact(bool(wrote.get("writing")), "guest A set up the store on its devdax and wrote")
    fact(bool(kill.get("pid")), f"guest A's QEMU killed by its PID ({kill.get('pid')}) "
                                f"after B read {kill.get('reads_ok_before', 0)} records")
    fact(read.get("final") is True and not read.get("error"),
         "guest B read to the end: " + (read.get("error") or f"{read.get('elapsed_s')} s"))
    fact(int(read.get("reads_ok", 0)) > 0 and int(kill.get("reads_ok_before", 0)) > 0,
         f"B read A's records through its own devdax ({read.get('reads_ok', 0)} ok, "
         f"{read.get('retries', 0)} retries)")
    fact(int(read.get("stale_detections", 0)) >= 1,
         f"B judged the owner lost ({read.get('stale_detections', 0)} detection(s), "
         f"at {read.get('owner_lost_s')} s; A left a record half-written: "
         f"{'yes' if read.get('stale_marked') else 'no'})")
    fact(int(read.get("torn_reads", -1)) == 0 and int(read.get("torn_reads_returned", -1)) == 0,
         f"no torn read seen or returned ({read.get('torn_reads')} seen, "
         f"{read.get('torn_reads_returned')} returned)")
    beats = read.get("heartbeats") or []
    fact(len(beats) >= 2 and len(set(beats[-2:])) == 1,
         f"A's heartbeat frozen at its last write ({beats[-1] if beats else '?'})")
    return 1 if fact.report("vm_pair: ok   ", "vm_pair: FAIL ") else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] in ("writer", "reader"):
        return (writer if argv[0] == "writer" else reader)(argv[1], Path(argv[2]))
    if len(argv) == 3 and argv[0] == "check":
        return check(Path(argv[1]), Path(argv[2]))
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
