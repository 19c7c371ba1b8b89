"""A single-writer / multi-reader record store in shared memory that never exposes a torn record.

Records (e.g. 16 KiB KV blocks) carry a header line: a seqlock sequence (odd while a write is in
progress), the record's version, the writer's epoch, flags and a checksum of index, version and
payload. The writer publishes with the protocol's discipline (sync.py): sequence odd, payload,
header, sequence even. Readers copy the record between two reads of the sequence and accept it only
if the sequence did not move and the checksum matches; otherwise they retry until their timeout.

Owner liveness is a lease: the writer bumps a heartbeat word with every write; a reader that sees
no change for `lease` declares that epoch's owner dead (it never looks at the writer's clock, so
this works between hosts), records when, and answers "recompute" (a fallback) for the record the
dead owner left half-written instead of waiting. The next writer (a new epoch) invalidates records
left odd, retries the interrupted write with the same version (writes are idempotent: the content
of (record, version) is fixed) and rewrites records whose checksum no longer matches. A writer that
finds more than a lease passed since its last heartbeat (frozen, descheduled) stops before writing
again (self-fencing, _lease_held): it can finish the one write it was in, never start another.

Under `flush` every shared word follows sync.py's rule: written with nontemporal stores or
flushed, read after invalidation (the writer's own lines too: the previous owner wrote them).

Layout (uint64 words; each line written by one agent):
    line 0      setup: magic, records, payload words, protocol, lease ticks, stop, readers, epochs
    lines 1-2   writer: epoch, heartbeat, intent record, intent version, counters,
                when it last checked its lease before a write
    reader r    2 counter lines + one detection timestamp per epoch
    records     from a 4 KiB boundary: header line + payload, per record
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.errors import UsageError
from nearlocal.kernels.intrinsics import (
    compiler_barrier,
    lfence,
    pause,
    tsc_begin,
    tsc_begin_nodrain,
    tsc_end,
)
from nearlocal.rpc.sync import (
    WORDS_PER_LINE,
    flush_written,
    invalidate,
    protocol_code,
    publish_flag,
    read_flag,
    write_data,
)

MAGIC = 0x4E4C5245435331  # "NLRECS1"
# setup line
C_MAGIC, C_RECORDS, C_PAYLOAD, C_PROTOCOL, C_LEASE, C_STOP, C_READERS, C_EPOCHS = range(8)
# writer lines
W_EPOCH, W_HEARTBEAT, W_INTENT_INDEX, W_INTENT_VERSION = 8, 9, 10, 11
W_STARTED, W_COMPLETED, W_INVALIDATED, W_RETRIED, W_REPAIRED = 12, 13, 14, 15, 16
W_WRITE_CHECK = 17  # when the owner last checked its lease before a write
READERS_BASE = 24
# reader counters (offsets in a reader's area)
R_READS, R_OK, R_RETRIES, R_REJECTS, R_TORN, R_DETECTIONS, R_MAX_READ, R_MARKED = range(8)
R_FB_STALE, R_FB_TIMEOUT, R_FB_CORRUPT, R_TORN_RETURNED = 8, 9, 10, 11
READER_COUNTERS = 16
# record header
H_SEQ, H_VERSION, H_EPOCH, H_FLAGS, H_CHECKSUM, H_INDEX = range(6)
VALID, STALE = 1, 2
# read outcomes
READ_OK, FALLBACK_STALE, FALLBACK_TIMEOUT, FALLBACK_CORRUPT = 0, 1, 2, 3
OUTCOMES = {READ_OK: "ok", FALLBACK_STALE: "recompute (owner lost or record invalidated)",
            FALLBACK_TIMEOUT: "recompute (timed out)", FALLBACK_CORRUPT: "recompute (checksum)"}
# writer exits
WRITER_STOPPED, WRITER_FENCED, WRITER_DONE = 0, 3, 4
CORRUPT_TRIES = 3
# monitor state (a reader's private int64 array)
M_EPOCH, M_BEAT, M_SINCE, M_DEAD = range(4)


class Layout:
    """Word offsets of one store; everything the kernels need is in the setup line too."""

    def __init__(self, records: int, record_bytes: int, readers: int, epochs: int):
        if records < 1 or readers < 0 or epochs < 1:
            raise UsageError("a record store needs at least one record and one epoch")
        if record_bytes <= 0 or record_bytes % 64:
            raise UsageError(f"record size {record_bytes} B is not valid: use a positive "
                             "multiple of 64 bytes, e.g. 16KiB")
        self.records, self.record_bytes, self.readers, self.epochs = (records, record_bytes,
                                                                      readers, epochs)
        self.payload_words = record_bytes // 8
        self.reader_words = READER_COUNTERS + -(-epochs // WORDS_PER_LINE) * WORDS_PER_LINE
        control_bytes = (READERS_BASE + readers * self.reader_words) * 8
        self.records_word = -(-control_bytes // 4096) * 4096 // 8
        self.record_words = WORDS_PER_LINE + self.payload_words
        self.nbytes = (self.records_word + records * self.record_words) * 8

    def reader_base(self, reader: int) -> int:
        return READERS_BASE + reader * self.reader_words


@njit(cache=True, nogil=True, inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, inline="always")
def content_word(index, version, w):
    """The fixed content of word w of (record, version): what makes retries idempotent and lets
    a reader check an accepted record independently of its checksum."""
    return _mix((np.uint64(index + 1) * np.uint64(0x100000001B3))
                ^ (np.uint64(version) * np.uint64(0x9E3779B97F4A7C15))
                ^ (np.uint64(w) * np.uint64(0xD1B54A32D192ED03)))


@njit(cache=True, nogil=True, inline="always")
def _fold(h, word):
    h = (h ^ word) * np.uint64(0x100000001B3)
    return (h << np.uint64(29)) | (h >> np.uint64(35))


@njit(cache=True, nogil=True, inline="always")
def _seed(index, version):
    """Every bit of index and version reaches the checksum (a shifted version once lost its top
    bits: the torn-read check caught a header corruption the checksum let through)."""
    return _mix(_mix(np.uint64(index) ^ np.uint64(0xC5C5)) ^ np.uint64(version))


@njit(cache=True, nogil=True)
def checksum(payload, index, version):
    h = _seed(index, version)
    for w in range(payload.size):
        h = _fold(h, payload[w])
    return _mix(h)


@njit(cache=True, nogil=True)
def _record_base(words, index):
    record_words = WORDS_PER_LINE + np.int64(words[C_PAYLOAD])
    records_word = np.int64(words.size) - np.int64(words[C_RECORDS]) * record_words
    return records_word + index * record_words


@njit(cache=True, nogil=True)
def _lease_held(clock, lease):
    """Self-fencing: True while at most a lease has passed since clock[0], the time the owner took
    just before publishing its last heartbeat that it confirmed in time (_beat).

    A reader judges the owner lost only at a read made more than a lease after it first saw that
    heartbeat, so a check that passes precedes every such judgement: a frozen owner can finish at
    most the one write it had checked for, never start another. (Measuring from the owner's last
    look at its clock instead let a write slowed down before the freeze shorten the gap, and an
    owner thawed after its loss was judged went on writing.)"""
    return tsc_end() - clock[0] <= lease


@njit(cache=True, nogil=True)
def _may_write(raw, words, clock, lease, protocol):
    """The check before every write: lease held, and when the check was made (W_WRITE_CHECK, so
    the fault run can verify that no write began after a reader judged the owner lost)."""
    now = tsc_end()
    if now - clock[0] > lease:
        return False
    publish_flag(words, W_WRITE_CHECK, now, protocol)
    return True


@njit(cache=True, nogil=True)
def _beat(raw, words, clock, lease, protocol):
    """Renew the lease: publish the next heartbeat, then confirm it became visible within the
    current lease; a beat that came out late (the owner was frozen or descheduled between its
    check and the store) may follow a reader's judgement, so the owner fences itself."""
    before = tsc_end()
    if before - clock[0] > lease:
        return False
    publish_flag(words, W_HEARTBEAT, read_flag(raw, words, W_HEARTBEAT, protocol) + np.uint64(1),
                 protocol)
    if tsc_begin() - clock[0] > lease:  # tsc_begin drains the store first (mfence)
        return False
    clock[0] = before
    return True


@njit(cache=True, nogil=True)
def _count(raw, words, index, protocol):
    """A writer counter: the last value may come from a previous owner (another host), so it is
    read with invalidation like any other shared word."""
    publish_flag(words, index, read_flag(raw, words, index, protocol) + np.uint64(1), protocol)


@njit(cache=True, nogil=True)
def write_record(raw, words, index, version, epoch, protocol):
    """Publish (index, version): intent, sequence odd, payload, header, sequence even."""
    base = _record_base(words, index)
    payload_words = np.int64(words[C_PAYLOAD])
    publish_flag(words, W_INTENT_INDEX, np.uint64(index), protocol)
    publish_flag(words, W_INTENT_VERSION, np.uint64(version), protocol)
    _count(raw, words, W_STARTED, protocol)
    seq = read_flag(raw, words, base + H_SEQ, protocol)  # a previous owner may have written it
    odd = seq + np.uint64(2) if seq & np.uint64(1) else seq + np.uint64(1)
    publish_flag(words, base + H_SEQ, odd, protocol)
    compiler_barrier()
    for w in range(payload_words):
        write_data(words, base + WORDS_PER_LINE + w, content_word(index, version, w), protocol)
    write_data(words, base + H_VERSION, np.uint64(version), protocol)
    write_data(words, base + H_EPOCH, np.uint64(epoch), protocol)
    write_data(words, base + H_FLAGS, np.uint64(VALID), protocol)
    write_data(words, base + H_CHECKSUM, _expected_checksum(index, version, payload_words),
               protocol)
    write_data(words, base + H_INDEX, np.uint64(index), protocol)
    publish_flag(words, base + H_SEQ, odd + np.uint64(1), protocol)
    _count(raw, words, W_COMPLETED, protocol)


@njit(cache=True, nogil=True)
def _invalidate_record(raw, words, base, seq, protocol):
    """Mark a record a dead owner left odd (seq, as just read): stale, sequence even again
    (readers recompute)."""
    write_data(words, base + H_FLAGS, np.uint64(STALE), protocol)
    publish_flag(words, base + H_SEQ, seq + np.uint64(1) if seq & np.uint64(1) else seq,
                 protocol)
    _count(raw, words, W_INVALIDATED, protocol)


@njit(cache=True, nogil=True)
def take_over(raw, words, epoch, protocol, clock):
    """A new owner: publish the epoch, then repair what the previous one left behind.

    clock[0] must be a time taken before this call (the lease starts before the epoch is
    published). Returns False if its own lease lapsed on the way: it must stop."""
    invalidate(raw, words, 0, WORDS_PER_LINE, protocol)  # the setup line, read plainly below
    lease = words[C_LEASE]
    publish_flag(words, W_EPOCH, np.uint64(epoch), protocol)
    if not _beat(raw, words, clock, lease, protocol):
        return False
    payload_words = np.int64(words[C_PAYLOAD])
    invalidate(raw, words, W_INTENT_INDEX, 2, protocol)
    intent_index = np.int64(words[W_INTENT_INDEX])
    intent_version = words[W_INTENT_VERSION]
    for index in range(np.int64(words[C_RECORDS])):
        base = _record_base(words, index)
        seq = read_flag(raw, words, base + H_SEQ, protocol)  # invalidates the header line
        version = words[base + H_VERSION]
        if seq & np.uint64(1):
            if not _may_write(raw, words, clock, lease, protocol):
                return False
            _invalidate_record(raw, words, base, seq, protocol)
            if index == intent_index and intent_version > version:
                version = intent_version
            write_record(raw, words, index, version, epoch, protocol)  # the same write again
            _count(raw, words, W_RETRIED, protocol)
        else:
            invalidate(raw, words, base + WORDS_PER_LINE, payload_words, protocol)
            payload = words[base + WORDS_PER_LINE:base + WORDS_PER_LINE + payload_words]
            if (words[base + H_FLAGS] != VALID or words[base + H_INDEX] != index
                    or checksum(payload, index, version) != words[base + H_CHECKSUM]):
                if not _may_write(raw, words, clock, lease, protocol):
                    return False
                write_record(raw, words, index, version, epoch, protocol)
                _count(raw, words, W_REPAIRED, protocol)
        if not _beat(raw, words, clock, lease, protocol):
            return False
    return True


@njit(cache=True, nogil=True)
def writer_run(raw, words, epoch, seed, protocol, max_writes, max_ticks):
    """The owner's loop: take over, then write random records with new versions until stopped,
    max_writes / max_ticks are reached (0: no limit) or its own lease lapses (self-fencing)."""
    if seed >= 0:
        np.random.seed(seed)
    start = tsc_end()
    clock = np.array([start], np.uint64)  # when the lease was last renewed (_lease_held)
    if not take_over(raw, words, epoch, protocol, clock):
        return WRITER_FENCED
    lease = words[C_LEASE]
    records = np.int64(words[C_RECORDS])
    writes = 0
    while True:
        if not _lease_held(clock, lease):  # frozen or descheduled past the lease
            return WRITER_FENCED
        if read_flag(raw, words, C_STOP, protocol) != 0:
            return WRITER_STOPPED
        if (max_writes and writes >= max_writes) or (max_ticks and tsc_end() - start > max_ticks):
            return WRITER_DONE
        index = np.random.randint(0, records)
        version = read_flag(raw, words, _record_base(words, index) + H_VERSION, protocol) \
            + np.uint64(1)
        if not _may_write(raw, words, clock, lease, protocol):
            return WRITER_FENCED
        write_record(raw, words, index, version, epoch, protocol)
        if not _beat(raw, words, clock, lease, protocol):  # no heartbeat once the lease lapsed
            return WRITER_FENCED
        writes += 1


@njit(cache=True, nogil=True)
def owner_dead(raw, words, monitor, area, now, protocol):
    """A reader's lease check. Returns True while the current epoch's owner is judged dead.

    `now` was taken before the heartbeat is read here, a heartbeat change is timed after it is
    seen: so a judgement always falls more than a lease after the owner took the time of its last
    heartbeat, which is what the owner's self-fencing (_lease_held) relies on. The first time an
    epoch is judged dead the reader publishes when (its detection slot for the epoch) and counts
    whether the owner left a record half-written (marked stale for this reader)."""
    epoch = np.int64(read_flag(raw, words, W_EPOCH, protocol))
    beat = np.int64(read_flag(raw, words, W_HEARTBEAT, protocol))
    if epoch != monitor[M_EPOCH]:
        monitor[M_EPOCH], monitor[M_BEAT], monitor[M_SINCE] = epoch, beat, np.int64(tsc_end())
        return False
    if epoch == 0:
        return False
    if monitor[M_DEAD] == epoch:
        return True
    if beat != monitor[M_BEAT]:
        monitor[M_BEAT], monitor[M_SINCE] = beat, np.int64(tsc_end())
        return False
    if now < np.uint64(monitor[M_SINCE]) or \
            np.uint64(now - np.uint64(monitor[M_SINCE])) <= words[C_LEASE]:
        return False
    monitor[M_DEAD] = epoch
    words[area + R_DETECTIONS] += np.uint64(1)
    if epoch < np.int64(words[C_EPOCHS]):
        publish_flag(words, area + READER_COUNTERS + epoch, now, protocol)
    intent = np.int64(read_flag(raw, words, W_INTENT_INDEX, protocol))
    if intent < np.int64(words[C_RECORDS]) and \
            read_flag(raw, words, _record_base(words, intent) + H_SEQ, protocol) & np.uint64(1):
        words[area + R_MARKED] += np.uint64(1)
    return True


@njit(cache=True, nogil=True)
def _expected_checksum(index, version, payload_words):
    """The checksum of (index, version)'s fixed content: tells an intact header from a damaged one."""
    h = _seed(index, version)
    for w in range(payload_words):
        h = _fold(h, content_word(index, version, w))
    return _mix(h)


@njit(cache=True, nogil=True)
def read_record(raw, words, index, local, monitor, area, timeout_ticks, protocol, recheck):
    """Copy record `index` into `local` if, and only if, it is whole. Returns (outcome, version).

    Never blocks past timeout_ticks: a record that stays in progress, keeps changing or keeps
    failing its checksum ends in a fallback (the caller recomputes it).

    Every copy that passes the sequence check is also compared with the record's fixed content,
    independently of the reader's own checks: one that is not whole although its header is
    intact is a torn read (the seqlock failed; the checksum would still refuse it), one that is
    not whole and accepted is a torn read returned (R_TORN_RETURNED). `recheck=False` drops the
    sequence re-check after the copy: only the negative-control test does that, to show the
    fault run reports the torn reads a broken protocol lets through. That comparison is the
    test's, not the reader's: its time is left out of the read's time (the timeout and
    R_MAX_READ)."""
    base = _record_base(words, index)
    payload_words = np.int64(words[C_PAYLOAD])
    start = tsc_end()
    checking = start - start  # ticks spent on the content comparison, excluded from the read's
    rejects = 0
    words[area + R_READS] += np.uint64(1)
    outcome = READ_OK
    version = np.uint64(0)
    while True:
        now = tsc_end()
        if now - start - checking > timeout_ticks:
            outcome = FALLBACK_TIMEOUT
            break
        dead = owner_dead(raw, words, monitor, area, now, protocol)
        first = read_flag(raw, words, base + H_SEQ, protocol)
        if first & np.uint64(1):
            if dead:
                outcome = FALLBACK_STALE
                break
            words[area + R_RETRIES] += np.uint64(1)
            pause()
            continue
        invalidate(raw, words, base + WORDS_PER_LINE, payload_words, protocol)
        for w in range(payload_words):
            local[w] = words[base + WORDS_PER_LINE + w]
        version = words[base + H_VERSION]
        flags = words[base + H_FLAGS]
        stored = words[base + H_CHECKSUM]
        stored_index = words[base + H_INDEX]
        compiler_barrier()
        lfence()
        if recheck and read_flag(raw, words, base + H_SEQ, protocol) != first:
            words[area + R_RETRIES] += np.uint64(1)
            continue
        if flags & np.uint64(STALE):
            outcome = FALLBACK_STALE
            break
        check_start = tsc_begin_nodrain()  # no drain: its wait would count as the read's
        whole = True
        for w in range(payload_words):  # independent of the checksum: is it really whole?
            if local[w] != content_word(index, version, w):
                whole = False
                break
        if not whole and stored_index == index and \
                stored == _expected_checksum(index, version, payload_words):
            words[area + R_TORN] += np.uint64(1)
        checking += tsc_end() - check_start
        if stored_index != index or checksum(local, index, version) != stored:
            words[area + R_REJECTS] += np.uint64(1)
            rejects += 1
            if rejects >= CORRUPT_TRIES:
                outcome = FALLBACK_CORRUPT
                break
            words[area + R_RETRIES] += np.uint64(1)
            continue
        if not whole:
            words[area + R_TORN_RETURNED] += np.uint64(1)
        words[area + R_OK] += np.uint64(1)
        break
    if outcome == FALLBACK_STALE:
        words[area + R_FB_STALE] += np.uint64(1)
    elif outcome == FALLBACK_TIMEOUT:
        words[area + R_FB_TIMEOUT] += np.uint64(1)
    elif outcome == FALLBACK_CORRUPT:
        words[area + R_FB_CORRUPT] += np.uint64(1)
    took = tsc_end() - start - checking
    if took > words[area + R_MAX_READ]:
        words[area + R_MAX_READ] = took
    return outcome, version


@njit(cache=True)
def seed_random(seed):
    """Seed numba's generator (the one np.random in compiled code uses) in this process."""
    np.random.seed(seed)


@njit(cache=True, nogil=True)
def reader_run(raw, words, area, local, monitor, timeout_ticks, max_ticks, protocol, recheck):
    """A reader: random records for max_ticks or until the stop word is set (returns True then).

    `monitor` (4 int64) and `local` (payload words) persist across calls, so a reader can run in
    slices and sleep between them without losing track of the owner's lease. The reader's counter
    lines are its own (cached stores), written back before it sleeps or goes."""
    invalidate(raw, words, 0, WORDS_PER_LINE, protocol)  # the setup line, read plainly below
    records = np.int64(words[C_RECORDS])
    start = tsc_end()
    stopped = False
    while tsc_end() - start < max_ticks:
        if read_flag(raw, words, C_STOP, protocol) != 0:
            stopped = True
            break
        read_record(raw, words, np.random.randint(0, records), local, monitor, area,
                    timeout_ticks, protocol, recheck)
    flush_written(raw, area, READER_COUNTERS, protocol)
    return stopped


def init_store(raw: np.ndarray, layout: Layout, lease_ticks: int, protocol: str) -> np.ndarray:
    """Zero the store, write the setup line and every record at version 1 (epoch 0, no owner).

    The zeroing and the setup line are cached stores, so under `flush` they are written back
    before the records are published; the magic word goes last."""
    if raw.size < layout.nbytes:
        raise UsageError(f"the record store needs {layout.nbytes} bytes, the region has {raw.size}")
    code = protocol_code(protocol)
    raw = raw[:layout.nbytes]
    raw[:] = 0
    words = raw.view(np.uint64)
    words[C_RECORDS], words[C_PAYLOAD], words[C_PROTOCOL] = (layout.records,
                                                             layout.payload_words, code)
    words[C_LEASE], words[C_READERS], words[C_EPOCHS] = lease_ticks, layout.readers, layout.epochs
    flush_written(raw, 0, words.size, code)
    for index in range(layout.records):
        write_record(raw, words, index, 1, 0, code)
    publish_flag(words, W_STARTED, np.uint64(0), code)
    publish_flag(words, W_COMPLETED, np.uint64(0), code)
    publish_flag(words, C_MAGIC, np.uint64(MAGIC), code)
    return words


class RecordStore:
    """A Python handle on a store: reads for tests and tools (one reader area per handle)."""

    def __init__(self, raw: np.ndarray, layout: Layout, protocol: str, reader: int = 0):
        self.raw = raw[:layout.nbytes]
        self.words = self.raw.view(np.uint64)
        self.layout = layout
        self.protocol = protocol_code(protocol)
        self.area = layout.reader_base(reader)
        self.local = np.empty(layout.payload_words, np.uint64)
        self.monitor = np.zeros(4, np.int64)
        invalidate(self.raw, self.words, 0, WORDS_PER_LINE, self.protocol)  # setup, read plainly

    def read(self, index: int, timeout_ticks: int) -> tuple[str, int, bytes | None]:
        """(outcome, version, payload bytes or None for a fallback)."""
        outcome, version = read_record(self.raw, self.words, index, self.local, self.monitor,
                                       self.area, np.uint64(timeout_ticks), self.protocol, True)
        payload = self.local.tobytes() if outcome == READ_OK else None
        return OUTCOMES[outcome], int(version), payload

    def write(self, index: int, version: int, epoch: int) -> None:
        write_record(self.raw, self.words, index, version, epoch, self.protocol)

    def counters(self, reader: int | None = None) -> dict[str, int]:
        area = self.area if reader is None else self.layout.reader_base(reader)
        invalidate(self.raw, self.words, area, READER_COUNTERS, self.protocol)
        names = {"reads": R_READS, "reads_ok": R_OK, "retries": R_RETRIES,
                 "checksum_rejects": R_REJECTS, "torn_reads": R_TORN,
                 "torn_reads_returned": R_TORN_RETURNED,
                 "stale_detections": R_DETECTIONS, "max_read_ticks": R_MAX_READ,
                 "stale_marked": R_MARKED, "fallbacks_stale": R_FB_STALE,
                 "fallbacks_timeout": R_FB_TIMEOUT, "fallbacks_corrupt": R_FB_CORRUPT}
        return {name: int(self.words[area + offset]) for name, offset in names.items()}

    def detection_ticks(self, reader: int, epoch: int) -> int:
        base = self.layout.reader_base(reader) + READER_COUNTERS
        return int(read_flag(self.raw, self.words, base + epoch, self.protocol))

    def writer_counters(self) -> dict[str, int]:
        invalidate(self.raw, self.words, W_EPOCH, 2 * WORDS_PER_LINE, self.protocol)
        names = {"epoch": W_EPOCH, "heartbeat": W_HEARTBEAT, "intent_index": W_INTENT_INDEX,
                 "writes_attempted": W_STARTED, "writes_completed": W_COMPLETED,
                 "invalidated": W_INVALIDATED, "idempotent_retries": W_RETRIED,
                 "repaired": W_REPAIRED, "write_check_ticks": W_WRITE_CHECK}
        return {name: int(self.words[offset]) for name, offset in names.items()}

    def in_progress(self, index: int) -> bool:
        base = _record_base(self.words, index)
        return bool(read_flag(self.raw, self.words, base + H_SEQ, self.protocol) & 1)

    def header_word(self, index: int, field: int) -> int:
        return int(read_flag(self.raw, self.words, _record_base(self.words, index) + field,
                             self.protocol))

    def set_header_word(self, index: int, field: int, value: int) -> None:
        """Fault injection only: overwrite a header word as a stray writer would."""
        word = _record_base(self.words, index) + field
        self.words[word] = np.uint64(value)
        flush_written(self.raw, word, 1, self.protocol)
