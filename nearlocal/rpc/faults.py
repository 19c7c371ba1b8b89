"""The fault injector: a record store in a shared region, readers reading throughout, and a writer
that is killed (SIGKILL) at random points inside its writes, frozen (SIGSTOP) past its lease, and
has record headers corrupted under it. Every writer is a forked child (so hundreds of kills fit in
seconds), every epoch ends with the injector waiting until each reader has judged the owner lost.

Only one owner runs at a time: like a cluster manager, the injector starts the next writer only
once the previous one is dead or has fenced itself (leases give readers liveness, not mutual
exclusion; a frozen owner may finish the one write it was in before it notices its lapse).

The report counts what the papers' authors ask acceptance to prove: torn reads (must be 0), owner
loss detected (every epoch, by every reader, within the lease bound), records invalidated and the
interrupted writes retried with the same version, fallbacks ("recompute") instead of waiting, and
the longest any read blocked.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rpc import records as rec
from nearlocal.rpc.kernels import records as krec
from nearlocal.rpc.kernels.sync import publish_flag, read_flag
from nearlocal.rpc.protocols import PROTOCOLS, protocol_code
from nearlocal.rpc.shared import share
from nearlocal.rpc.slots import set_parent_death_signal

WRITER_MIN_RUN_S = 0.0005
WRITER_MAX_RUN_S = 0.008
READ_SLICE_S = 0.001
READ_GAP_S = 0.001
FROZEN_RELEASE_S = 5.0  # how long a frozen writer gets, once continued, to fence itself and exit
# how far past the injector's bound (FaultConfig.end_bound_s) a reader goes on reading when it
# was never told to stop: a writer whose host is gone never tells it (docs/rack.md)
READER_MARGIN_S = 10.0


@dataclass(frozen=True)
class FaultConfig:
    region: str = "shm:nearlocal-faults"
    kills: int = 200
    duration_s: float = 30.0  # the run stops at this wall time even if kills are not reached
    lease_s: float = 0.02
    readers: int = 2
    records: int = 64
    record_bytes: int = 16 * 1024
    protocol: str = "flush"
    freeze_every: int = 10  # every Nth fault is a SIGSTOP past the lease instead of a kill
    corrupt_every: int = 7  # every Nth writer epoch also gets one record header corrupted
    read_timeout_s: float | None = None  # default: 5 x lease
    grace_s: float | None = None  # detection allowance beyond the lease; default: the lease
    seed: int = 1
    allow_write: bool = False

    @property
    def read_timeout(self) -> float:
        return self.read_timeout_s if self.read_timeout_s is not None else 5 * self.lease_s

    @property
    def detect_bound_s(self) -> float:
        """A reader judges the owner lost once it has seen no heartbeat for `lease`; the bound
        adds a grace for the reader to get the CPU (readers are not real-time processes)."""
        return self.lease_s + (self.grace_s if self.grace_s is not None else self.lease_s)

    @property
    def detect_wait_s(self) -> float:
        """How long the injector waits for every reader to judge one owner lost (a miss after)."""
        return max(20 * self.lease_s, 2.0, 2 * self.detect_bound_s)

    @property
    def end_bound_s(self) -> float:
        """By when, from its start, a live injector has told its readers to stop: it starts no
        epoch after `duration`, and the last one lasts at most the writer's run, a header
        corruption's pause, the detection wait and a frozen writer's release."""
        return (self.duration_s + 2 * WRITER_MAX_RUN_S + self.detect_wait_s
                + (FROZEN_RELEASE_S if self.freeze_every else 0.0))

    @property
    def reader_deadline_s(self) -> float:
        """How long a reader reads when no one tells it to stop (its writer's host was lost)."""
        return self.end_bound_s + READER_MARGIN_S

    def check(self) -> None:
        if self.kills < 1:
            raise UsageError(f"--kills must be at least 1, got {self.kills}")
        if self.readers < 1 or self.readers > 64:
            raise UsageError(f"--readers must be 1 to 64, got {self.readers}")
        if self.lease_s <= 0 or self.lease_s > 10:
            raise UsageError(f"--lease must be between 0 and 10 s, got {self.lease_s}")
        if self.duration_s <= 0:
            raise UsageError(f"--duration must be positive, got {self.duration_s}")
        if self.records < 1:
            raise UsageError(f"--records must be at least 1, got {self.records}")
        if self.grace_s is not None and self.grace_s < 0:
            raise UsageError(f"--grace must not be negative, got {self.grace_s}")
        if self.read_timeout <= self.lease_s:
            raise UsageError(f"--read-timeout ({self.read_timeout * 1e3:g} ms) must be longer "
                             f"than --lease ({self.lease_s * 1e3:g} ms), or readers time out "
                             "before they can tell a dead owner from a slow one")
        protocol_code(self.protocol)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupted(Exception):
    """A stop signal arrived; raised only at the injector's own check points (see StopSignals)."""


class StopSignals:
    """Ctrl-C / SIGTERM during a fault run are noted, not raised where they land: one landing in
    the middle of os.fork() (its at-fork handlers swallow exceptions: the run went on to its full
    duration) or inside a region's creation would lose the interrupt or strand the shm file. The
    injector checks `pending` at its own points, cleans up, then re-delivers the signal under the
    handler it had before (KeyboardInterrupt for Ctrl-C, termination for SIGTERM)."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.saved: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        with contextlib.suppress(ValueError):  # not the main thread: signals stay as they are
            for signum in STOP_SIGNALS:
                self.saved[signum] = signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, frame) -> None:
        if self.pending is None:
            self.pending = signum

    def check(self) -> None:
        if self.pending is not None:
            raise _Interrupted()

    def __exit__(self, *exc) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)
        if self.pending is not None:
            signal.raise_signal(self.pending)


def _child(body: Callable[[], int]) -> int:
    """Fork; the child runs body under a parent-death SIGKILL and never returns to Python. Ctrl-C
    and SIGTERM take their default action in the child (a writer spinning in compiled code would
    never run a Python handler); the parent, which sees them too, cleans up."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        set_parent_death_signal()
        if os.getppid() == parent:  # else the parent died before the signal was armed
            code = int(body())
    finally:
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> int | None:
    """waitpid with a timeout: the exit status, or None if still running."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0005)


def _reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def warm_up(protocol: int) -> None:
    """Compile (or load) every kernel before forking, so children start at once."""
    layout = rec.Layout(2, 64, 1, 4)
    raw = np.zeros(layout.nbytes + 64, np.uint8)
    raw = raw[(-raw.ctypes.data) % 64:][:layout.nbytes]
    words = rec.init_store(raw, layout, 1 << 40, "coherent")
    words[krec.C_PROTOCOL] = protocol
    krec.writer_run(raw, words, 1, 0, protocol, 4, 0)
    krec.seed_random(0)
    krec.reader_run(raw, words, layout.reader_base(0), np.empty(layout.payload_words, np.uint64),
                   np.zeros(4, np.int64), np.uint64(1 << 30), np.uint64(1), protocol, True)
    store = rec.RecordStore(raw, layout, "flush" if protocol else "coherent")
    store.read(0, 1 << 30)


def _check_room(spec, nbytes: int) -> None:
    """Refuse, before anything is created, a store the region cannot hold (a file on a full tmpfs
    is not an error but a SIGBUS when its pages are first touched, which kills the process and
    strands the file). A region other processes cannot map (dram, numa:N, interleave:) is shared
    through a memfd copy of the store (rpc.shared.share) in 4 KiB pages on the region's node, or
    in ordinary memory: where that is the region's own memory, it has to hold both copies."""
    from nearlocal.regions import check_capacity, parse_region, region_kind
    from nearlocal.regions.host import dram_options

    if region_kind(spec).shared_mapping:
        check_capacity(spec, nbytes)
        return
    options = dram_options(spec) if spec.kind in ("dram", "numa") else {"pages": "", "node": None}
    if options["pages"] in ("4K", "thp"):  # the memfd lands in the same memory as the region
        check_capacity(spec, 2 * nbytes)
        return
    check_capacity(spec, nbytes)
    node = options["node"]
    check_capacity(parse_region(f"numa:{node}" if node is not None else "dram"), nbytes)


def run_faults(config: FaultConfig, tsc_hz: float,
               on_progress: Callable[[dict], None] | None = None) -> dict:
    """Run the injector on config.region; returns the report (see module docstring).

    Everything it creates (the region's file, the children) is gone when it returns or raises,
    also after Ctrl-C or SIGTERM (re-delivered once the cleanup is done, see StopSignals)."""
    from nearlocal.regions import parse_region, region_kind

    config.check()
    protocol = protocol_code(config.protocol)
    epochs = 2 * config.kills + config.kills // max(config.freeze_every - 1, 1) + 64
    layout = rec.Layout(config.records, config.record_bytes, config.readers, epochs)
    spec = parse_region(config.region)
    kind = region_kind(spec)
    if kind.space != "host":
        raise UsageError(f"the fault run needs host memory, not {config.region}")
    if kind.user_owned(spec) and not config.allow_write:
        raise UsageError(f"the fault run writes to {config.region}, which may hold someone's "
                         "data: pass --allow-write")
    _check_room(spec, layout.nbytes)
    with StopSignals() as signals:
        warm_up(protocol)
        signals.check()  # a Ctrl-C during the compile: stop before creating the region
        try:
            region = kind.open(spec, layout.nbytes, "wb", True)
        except OSError as exc:  # e.g. --records / --record-size larger than the memory there is
            raise UsageError(f"cannot map the {layout.nbytes:,} bytes of the record store in "
                             f"{config.region}: {exc.strerror or exc}") from None
        try:
            return inject(config, layout, region, tsc_hz, protocol, signals, on_progress)
        finally:
            region.close()


def inject(config: FaultConfig, layout: rec.Layout, region, tsc_hz: float, protocol: int,
           signals: StopSignals, on_progress: Callable[[dict], None] | None,
           readers_elsewhere: Callable[[], None] | None = None) -> dict:
    """The run itself, on an open region (closed by the caller). readers_elsewhere: the readers
    are other processes (the rack's other hosts), started by calling it once the store is
    written, instead of forked children."""
    from nearlocal.kernels.cpu import tsc_now

    rng = random.Random(config.seed)
    shared = share(region, layout.nbytes)
    try:
        raw = shared.array
        lease_ticks = int(config.lease_s * tsc_hz)
        words = rec.init_store(raw, layout, lease_ticks, config.protocol)
        store = rec.RecordStore(raw, layout, config.protocol)
        signals.check()  # a Ctrl-C while the store was written: stop before forking readers
    except BaseException:
        shared.close()
        raise
    timeout_ticks = np.uint64(config.read_timeout * tsc_hz)
    readers: list[int] = []
    dying: list[int] = []  # killed writers not yet reaped
    writer: int | None = None
    report = {"config": asdict(config), "writer_kills": 0, "kills_mid_write": 0, "freezes": 0,
              "writers_fenced_after_freeze": 0, "frozen_writers_killed": 0, "lease_lapses": 0,
              "writes_after_loss": 0, "header_corruptions": 0, "owners_lost": 0,
              "missed_detections": 0, "detect_ms": [], "stopped_early": ""}
    started = time.monotonic()
    try:
        if readers_elsewhere is not None:
            readers_elsewhere()
        for reader in range(config.readers if readers_elsewhere is None else 0):
            readers.append(_child(lambda reader=reader: _reader_process(
                raw, words, layout, reader, config, timeout_ticks, tsc_hz, protocol)))
        epoch = 0
        fault = 0
        while report["writer_kills"] < config.kills:
            signals.check()
            if time.monotonic() - started > config.duration_s:
                report["stopped_early"] = f"duration {config.duration_s:g} s reached"
                break
            if epoch + 1 >= layout.epochs:
                report["stopped_early"] = "epoch table full"
                break
            epoch += 1
            writer = _child(lambda epoch=epoch: krec.writer_run(
                raw, words, epoch, config.seed * 100_000 + epoch, protocol, 0,
                int((config.duration_s + 60) * tsc_hz)))
            if not _await_owner(store, writer, epoch, signals):
                raise RuntimeError(f"the writer of epoch {epoch} did not take over")
            time.sleep(rng.uniform(WRITER_MIN_RUN_S, WRITER_MAX_RUN_S))
            if config.corrupt_every and epoch % config.corrupt_every == 0:
                index = rng.randrange(config.records)
                field = rng.choice((krec.H_CHECKSUM, krec.H_VERSION))
                store.set_header_word(index, field,
                                      store.header_word(index, field) ^ (1 << rng.randrange(64)))
                report["header_corruptions"] += 1
                time.sleep(rng.uniform(WRITER_MIN_RUN_S, WRITER_MAX_RUN_S))
            fault += 1
            freeze = config.freeze_every and fault % config.freeze_every == 0
            fault_tsc = tsc_now()
            status = _wait(writer, 0)
            if status is not None:  # it fenced itself already: descheduled past its lease
                if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == krec.WRITER_FENCED):
                    raise RuntimeError(f"writer of epoch {epoch} failed (wait status {status})")
                report["lease_lapses"] += 1
                fault_tsc = None
            elif freeze:
                os.kill(writer, signal.SIGSTOP)
                report["freezes"] += 1
            else:
                os.kill(writer, signal.SIGKILL)
                report["writer_kills"] += 1
            report["owners_lost"] += 1
            detected = _await_detection(store, config, epoch, signals)
            if status is None and not freeze:  # dead by now (reaped later, that takes a while)
                dying.append(writer)
                intent = store.writer_counters()["intent_index"]
                report["kills_mid_write"] += int(store.in_progress(intent))
            elif freeze and status is None:
                os.kill(writer, signal.SIGCONT)
                code = _wait(writer, FROZEN_RELEASE_S)
                if code is None:
                    _reap(writer)
                    report["frozen_writers_killed"] += 1  # went on writing: a fencing failure
                elif os.WIFEXITED(code) and os.WEXITSTATUS(code) == krec.WRITER_FENCED:
                    report["writers_fenced_after_freeze"] += 1
                else:
                    raise RuntimeError(f"the frozen writer of epoch {epoch} failed "
                                       f"(wait status {code})")
            if status is not None or freeze:  # it has exited: its last write check is final
                report["writes_after_loss"] += int(
                    detected and _write_after_loss(store, config, epoch))
            writer = None
            if not detected:
                report["missed_detections"] += 1
            elif fault_tsc is not None:
                report["detect_ms"] += [(store.detection_ticks(r, epoch) - fault_tsc) / tsc_hz * 1e3
                                        for r in range(config.readers)]
            dying = [pid for pid in dying if _wait(pid, 0) is None]
            if on_progress:
                on_progress(report)
    except _Interrupted:
        report["stopped_early"] = "interrupted"
    finally:
        for pid in [*dying, *([writer] if writer is not None else [])]:
            _reap(pid)
        publish_flag(words, krec.C_STOP, np.uint64(1), protocol)
        for pid in readers:
            if _wait(pid, 5 + 2 * config.read_timeout) is None:
                _reap(pid)
        report["elapsed_s"] = time.monotonic() - started
        _totals(report, store, config, tsc_hz)
        words = None
        store = None
        raw = None
        shared.close()
    return report


def _write_after_loss(store: rec.RecordStore, config: FaultConfig, epoch: int) -> bool:
    """Did the (exited) owner of `epoch` check its lease for a write at or after the moment the
    first reader judged it lost? Self-fencing must make that impossible."""
    check = store.writer_counters()["write_check_ticks"]
    judged = min(store.detection_ticks(r, epoch) for r in range(config.readers))
    return check >= judged


def run_reader(raw: np.ndarray, words: np.ndarray, layout: rec.Layout, reader: int,
               config: FaultConfig, timeout_ticks: np.uint64, tsc_hz: float, protocol: int,
               recheck: bool = True) -> dict:
    """A reader: reads in slices of READ_SLICE_S with READ_GAP_S asleep in between (a reader is
    a client, not a spinner; on a small box it leaves the CPUs to the writer), until told to
    stop or, when no one tells it (the writer's host is gone), config.reader_deadline_s after
    it started. Returns how it ended: `told_to_stop`, `owner_judged_lost` (the last owner it
    saw was judged lost by this reader) and `read_s`."""
    krec.seed_random(config.seed * 1000 + reader)
    local = np.empty(layout.payload_words, np.uint64)
    monitor = np.zeros(4, np.int64)
    slice_ticks = np.uint64(READ_SLICE_S * tsc_hz)
    gap = min(READ_GAP_S, config.lease_s / 10)
    started = time.monotonic()
    deadline = started + config.reader_deadline_s
    stopped = False
    while time.monotonic() < deadline:
        if krec.reader_run(raw, words, layout.reader_base(reader), local, monitor, timeout_ticks,
                          slice_ticks, protocol, recheck):
            stopped = True
            break
        time.sleep(gap)
    epoch = int(read_flag(raw, words, krec.W_EPOCH, protocol))
    return {"told_to_stop": stopped, "owner_judged_lost": bool(epoch and monitor[krec.M_DEAD] == epoch),
            "read_s": time.monotonic() - started}


def _reader_process(*args) -> int:
    """A forked reader of `nearlocal faults`: run_reader, exit 0 (the parent reads the counters)."""
    run_reader(*args)
    return 0


def _await_owner(store: rec.RecordStore, writer: int, epoch: int, signals: StopSignals,
                 timeout_s: float = 30.0) -> bool:
    """Wait until the new writer has published its epoch: faults hit a running owner."""
    deadline = time.monotonic() + timeout_s
    while store.writer_counters()["epoch"] != epoch:
        if time.monotonic() > deadline or _wait(writer, 0) is not None:
            return False
        signals.check()
        time.sleep(0.0002)
    return True


def _await_detection(store: rec.RecordStore, config: FaultConfig, epoch: int,
                     signals: StopSignals) -> bool:
    """Wait until every reader has judged this epoch's owner lost (or give up: a miss; a
    detection later than the bound but within twice it counts as late, not missed)."""
    deadline = time.monotonic() + config.detect_wait_s
    while time.monotonic() < deadline:
        signals.check()
        if all(store.detection_ticks(r, epoch) for r in range(config.readers)):
            return True
        time.sleep(config.lease_s / 10)
    return False


# What the fault run requires: each check a count of the report that must be 0 (a JUnit case of
# `nearlocal faults --junit`); the run passes when every one holds.
CHECKS = (
    ("no torn read passed the sequence check", "torn_reads"),
    ("no torn read returned to the caller", "torn_reads_returned"),
    ("every owner loss detected", "missed_detections"),
    ("every loss detected within the bound (lease + grace)", "detections_late"),
    ("every frozen writer fenced itself", "frozen_writers_killed"),
    ("no write begun after the owner was judged lost", "writes_after_loss"),
)


def _totals(report: dict, store: rec.RecordStore, config: FaultConfig, tsc_hz: float) -> None:
    per_reader = [store.counters(r) for r in range(config.readers)]
    for name in per_reader[0]:
        report[name] = sum(c[name] for c in per_reader) if name != "max_read_ticks" else \
            max(c[name] for c in per_reader)
    report["max_read_ms"] = report.pop("max_read_ticks") / tsc_hz * 1e3
    report["read_timeout_ms"] = config.read_timeout * 1e3
    report["fallbacks"] = (report["fallbacks_stale"] + report["fallbacks_timeout"]
                           + report["fallbacks_corrupt"])
    report.update({k: v for k, v in store.writer_counters().items()
                   if k not in ("heartbeat", "intent_index")})
    latencies = np.asarray(report.pop("detect_ms"), dtype=np.float64)
    # A writer starved past its lease before the fault is judged lost before it: correct by the
    # lease's rules, but no time-to-detect for the fault.
    report["detected_before_fault"] = int((latencies < 0).sum())
    latencies = latencies[latencies >= 0]
    report["detect_bound_ms"] = config.detect_bound_s * 1e3
    report["detections_timed"] = int(latencies.size)
    if latencies.size:
        report["detect_ms"] = {"min": float(latencies.min()),
                               "median": float(np.median(latencies)),
                               "p99": float(np.percentile(latencies, 99)),
                               "max": float(latencies.max())}
        report["detections_late"] = int((latencies > report["detect_bound_ms"]).sum())
    else:
        report["detect_ms"] = {}
        report["detections_late"] = 0
    report["checks"] = [{"check": name, "count": count, "value": report[count],
                         "passed": report[count] == 0} for name, count in CHECKS]
    report["passed"] = all(check["passed"] for check in report["checks"])


__all__ = ["PROTOCOLS", "FaultConfig", "run_faults"]
