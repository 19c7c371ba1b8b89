"""The record store's compiled writer and reader (rpc/records.py has the layout, the set-up and the
Python handle; the protocol is described there): the seqlock write, the take-over of a new owner,
the lease (heartbeat, self-fencing), the reader's whole-record copy and its owner-loss judgement.
The word offsets below are the store's layout, which these kernels and the handle share.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import (
    compiler_barrier,
    lfence,
    tsc_begin,
    tsc_begin_nodrain,
    tsc_end,
)
from nearlocal.kernels.spin import WAIT_READY, never, spin_until
from nearlocal.rpc.kernels.sync import (
    WORDS_PER_LINE,
    flush_written,
    invalidate,
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
# writer exits
WRITER_STOPPED, WRITER_FENCED, WRITER_DONE = 0, 3, 4
CORRUPT_TRIES = 3
# monitor state (a reader's private int64 array)
M_EPOCH, M_BEAT, M_SINCE, M_DEAD = range(4)



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
def record_base(words, index):
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
    base = record_base(words, index)
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
        base = record_base(words, index)
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
        version = read_flag(raw, words, record_base(words, index) + H_VERSION, protocol) \
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
            read_flag(raw, words, record_base(words, intent) + H_SEQ, protocol) & np.uint64(1):
        words[area + R_MARKED] += np.uint64(1)
    return True


@njit(cache=True, nogil=True)
def _expected_checksum(index, version, payload_words):
    """The checksum of (index, version)'s fixed content: tells an intact header from a damaged one."""
    h = _seed(index, version)
    for w in range(payload_words):
        h = _fold(h, content_word(index, version, w))
    return _mix(h)


@njit(cache=True, nogil=True, inline="always")
def _record_settled(args):
    """One try of a read's wait for a record no write is in progress on (spin_until's `ready`):
    done with (READ_OK, its sequence) once the sequence is even, with (FALLBACK_STALE, ...) while
    a write is in progress and its owner is judged dead, with (FALLBACK_TIMEOUT, ...) once the
    read took timeout_ticks (the content check's ticks not counted). Every try reads the clock:
    the owner's lease is judged at that try's time (owner_dead's `now`), and the timeout is a
    promise the fault run holds the read to (R_MAX_READ), not a safety net."""
    raw, words, monitor, area, base, protocol, start, checking, timeout_ticks = args
    now = tsc_end()
    if now - start - checking > timeout_ticks:
        return True, (np.int64(FALLBACK_TIMEOUT), np.uint64(0))
    dead = owner_dead(raw, words, monitor, area, now, protocol)
    first = read_flag(raw, words, base + H_SEQ, protocol)
    if not first & np.uint64(1):
        return True, (np.int64(READ_OK), first)
    if dead:
        return True, (np.int64(FALLBACK_STALE), first)
    words[area + R_RETRIES] += np.uint64(1)
    return False, (np.int64(READ_OK), first)


@njit(cache=True, nogil=True)
def read_record(raw, words, index, local, monitor, area, timeout_ticks, protocol, recheck):
    """Copy record `index` into `local` if, and only if, it is whole. Returns (outcome, version).

    Never blocks past timeout_ticks: a record that stays in progress, keeps changing or keeps
    failing its checksum ends in a fallback (the caller recomputes it). A write in progress is
    waited out through spin_until (_record_settled, a pause between tries); a copy the sequence
    re-check or the checksum refuses is tried again at once.

    Every copy that passes the sequence check is also compared with the record's fixed content,
    independently of the reader's own checks: one that is not whole although its header is
    intact is a torn read (the seqlock failed; the checksum would still refuse it), one that is
    not whole and accepted is a torn read returned (R_TORN_RETURNED). `recheck=False` drops the
    sequence re-check after the copy: only the negative-control test does that, to show the
    fault run reports the torn reads a broken protocol lets through. That comparison is the
    test's, not the reader's: its time is left out of the read's time (the timeout and
    R_MAX_READ)."""
    base = record_base(words, index)
    payload_words = np.int64(words[C_PAYLOAD])
    start = tsc_end()
    checking = start - start  # ticks spent on the content comparison, excluded from the read's
    rejects = 0
    words[area + R_READS] += np.uint64(1)
    outcome = READ_OK
    version = np.uint64(0)
    while True:
        why, settled, _ = spin_until(
            _record_settled,
            (raw, words, monitor, area, base, protocol, start, checking, timeout_ticks),
            timeout_ticks, True, never, ())
        state, first = settled
        if why != WAIT_READY:  # spin_until's own deadline: later than the try's, kept as a net
            state = np.int64(FALLBACK_TIMEOUT)
        if state != READ_OK:
            outcome = state
            break
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
